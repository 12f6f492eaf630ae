"""`fab stop`: stop the deployment on every host (tasks/steps/shutdown.py), then its Ray cluster."""
from .steps.shutdown import stop_deployment


def stop(c, opts):
    """Body of `fab stop` (opts: tasks.options.StopOptions): TERM, wait --grace, KILL, sweep,
    GPU memory back; then Ray on every node for a [cluster] profile."""
    from .fleet.fanout import HostResult
    from .steps.lock import locked
    from .steps.preflight import deploy_dir
    from .fleet.runner import load, run_task
    from .interrupts import Spot, left_lines
    from .output import fab_hint
    profile = load(c, opts.profile)
    ddir = deploy_dir(profile)
    spots = {}  # host -> where a Ctrl-C leaves it (tasks/interrupts.py)

    def op(host, reporter):
        host.start()
        answers = locked(host, ddir, "stop", create=False, then={"state": ("state", {"deploy_dir": ddir})})
        took, state = answers["lock"], answers["state"]
        if took.get("absent") and profile.cluster is None:
            reporter.line(host.name, f"not deployed here ({ddir}): nothing to stop")
            return HostResult(host.name, 0, "already stopped",
                              json_record({"already_stopped": True, "server": None}))
        held = took.get("preempted")
        if held:  # a deploy or rollback waiting for readiness: ended, it reports the stop
            reporter.line(host.name, f"ended the `fab {held.get('task', '?')}` of {held.get('user', '?')}@"
                                     f"{held.get('from', '?')} that waited for readiness (agent pid "
                                     f"{held.get('pid', '?')}); stopping what it launched")
        spot = spots.setdefault(host.name, Spot(old=(state.get("server") or {}).get("release")
                                                if state.get("alive") else None))
        res = stop_deployment(host, ddir, reporter, grace=opts.grace, spot=spot)
        if profile.cluster is not None:  # then Ray on every node (tasks/fleet/ray_cluster.py)
            from .fleet.ray_cluster import stop_cluster
            stop_cluster(host, profile, reporter, ddir=ddir, grace=opts.grace)
        if res["already_stopped"]:
            release = (res["server"] or {}).get("release")
            reporter.line(host.name, f"not running (release {release}): nothing to stop" if release
                          else f"not deployed here ({ddir}): nothing to stop")
            return HostResult(host.name, 0, "already stopped", json_record(res))
        summary = f"stopped in {res['seconds']:.1f} s"
        if res["memory_s"] is not None:
            summary += f", GPU memory back after {res['memory_s']:.1f} s"
        return HostResult(host.name, 0, summary, json_record(res))
    # --json: the fan-out prints {host, ok, ...json_record} per host (tasks/fleet/fanout.py)
    run_task(c, profile, op, opts, title="stop", json_mode=opts.json,
             on_interrupt=lambda: left_lines(spots, lambda t: fab_hint(profile, t)))


def json_record(res):
    """What `fab stop --json` says of one host after {host, ok}: whether a server was stopped,
    which, the pids that ended on SIGTERM and those SIGKILL ended, how long it took, and how
    long until the GPU memory was back (null: not checked)."""
    server = res.get("server") or {}
    return {"stopped": not res["already_stopped"], "release": server.get("release"),
            "pid": server.get("pid"), "terminated": res.get("terminated") or [],
            "killed": res.get("killed") or [], "seconds": res.get("seconds"),
            "memory_s": res.get("memory_s")}
