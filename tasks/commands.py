"""Task bodies: turn flags into per-host operations and run them through the boundary."""
import os
import sys

from invoke.exceptions import Exit

from .runner import load, run_task
from .errors import ExitCode
from .fanout import HostResult


def _float(opts, key, minimum=0.0):
    value = opts.get(key)
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise Exit(f"error: --{key.replace('_', '-')} expects a number of seconds (got {value!r})",
                   code=ExitCode.BAD_INPUT) from None
    if value < minimum:
        raise Exit(f"error: --{key.replace('_', '-')} must be >= {minimum}", code=ExitCode.BAD_INPUT)
    return value


def deploy(c, opts):
    from .deploy import deploy_host, dry_run_text
    profile = load(c, opts.get("profile"))
    opts["timeout"] = _float(opts, "timeout", 0.0)
    if opts.get("dry_run"):
        try:
            sys.stdout.write("\n".join(dry_run_text(profile)) + "\n")
            sys.stdout.flush()
        except BrokenPipeError:  # `fab deploy --dry-run | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return
    if profile.cluster is not None:  # one head; the workers come from the profile (tasks/cluster.py)
        from .runner import hosts_for
        from .cluster import check_hosts
        check_hosts(hosts_for(c, profile), profile)
    json_mode = opts.get("json")
    launched = opts["launched"] = {}  # host -> server record, filled by deploy_host

    def op(host, reporter):
        if profile.cluster is not None:  # the head of a Ray cluster (tasks/cluster.py)
            from .cluster import deploy_head
            res = deploy_head(host, profile, opts, reporter)
        else:
            res = deploy_host(host, profile, opts, reporter)
        if json_mode:
            reporter.emit_json(dict({"host": host.name, "ok": True}, **res.data))
        return res

    def still_running():
        from .wait import fab_hint
        return [(h, f"interrupted: release {s['release']} (pid {s['pid']}) keeps running; stop "
                    f"it with `{fab_hint(profile, 'stop')}`") for h, s in list(launched.items())]
    run_task(c, profile, op, opts, title="deploy", json_mode=json_mode, on_interrupt=still_running)


def check(c, opts):
    from .deploy import deploy_dir, preflight_request, run_preflight
    profile = load(c, opts.get("profile"))

    def op(host, reporter):
        hello = host.start()
        reporter.line(host.name, f"connected: {hello['user']}@{hello['hostname']}")
        state = host.call("state", deploy_dir=deploy_dir(profile))
        checks = run_preflight(host, reporter, preflight_request(profile, state))
        warns = sum(c["status"] == "WARN" for c in checks)
        return HostResult(host.name, 0, f"{len(checks)} checks OK" + (f", {warns} warning(s)" if warns else ""))
    run_task(c, profile, op, opts, title="check")


def stop(c, opts):
    """Body of `fab stop`: TERM, wait --grace (default 30 s), KILL, sweep, GPU memory back."""
    from .deploy import deploy_dir, take_lock
    from .stop import stop_deployment
    profile = load(c, opts.get("profile"))
    grace = _float(opts, "grace", 0.0)
    ddir = deploy_dir(profile)

    def op(host, reporter):
        host.start()
        take_lock(host, ddir, "stop")
        res = stop_deployment(host, ddir, reporter, grace=grace)
        if profile.cluster is not None:  # then Ray on every node (tasks/cluster.py)
            from .cluster import stop_cluster
            stop_cluster(host, profile, reporter, ddir=ddir, grace=grace)
        if res["already_stopped"]:
            release = (res["server"] or {}).get("release")
            reporter.line(host.name, f"not running (release {release}): nothing to stop" if release
                          else f"not deployed here ({ddir}): nothing to stop")
            return HostResult(host.name, 0, "already stopped")
        summary = f"stopped in {res['seconds']:.1f} s"
        if res["memory_s"] is not None:
            summary += f", GPU memory back after {res['memory_s']:.1f} s"
        return HostResult(host.name, 0, summary, {"stop": res})
    run_task(c, profile, op, opts, title="stop")


def _uptime(server, state):
    """Seconds since server.json's started_at, by the host's clock (None if unknown)."""
    import datetime
    try:
        started = datetime.datetime.fromisoformat(server["started_at"]).timestamp()
        return max(0, round(state["now"] - started))
    except (KeyError, TypeError, ValueError):
        return None


def _duration(seconds):
    if seconds is None:
        return "?"
    d, rest = divmod(int(seconds), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return (f"{d}d{h:02d}h" if d else f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s")


def _fatal_line(host, ddir, release):
    """(line, reason) of the first fatal line in the last 400 lines of the release's log, or None."""
    import base64
    from .logscan import LogScanner
    from .agentclient import AgentError
    try:
        tail = host.call("log_tail", deploy_dir=ddir, release=release, lines=400)
    except AgentError:
        return None
    return LogScanner().feed(base64.b64decode(tail["data"]).decode("utf-8", "replace"))


def status(c, opts):
    from .deploy import deploy_dir
    from .gpuwait import profile_devices
    profile = load(c, opts.get("profile"))
    json_mode = opts.get("json")
    ddir = deploy_dir(profile)

    def op(host, reporter):
        host.start()
        st = host.call("state", deploy_dir=ddir)
        server = st.get("server") or {}
        record = {"host": host.name, "running": bool(st["alive"]), "pid": server.get("pid"),
                  "release": server.get("release"), "port": server.get("port"),
                  "health": None, "served_name": None, "gpus": None, "spec": None,
                  "generation_tokens_per_s": None}
        record["uptime_s"] = _uptime(server, st) if st["alive"] else None
        record.update(exit=None, fatal=None)  # how and why a stopped server ended (below)
        gpus = host.call("gpus", nvidia_smi=profile.gpu.nvidia_smi, devices=profile_devices(profile))
        record["gpus"] = [{"index": g["index"], "used_mib": g["used_mib"], "total_mib": g["total_mib"]}
                          for g in (gpus["gpus"] or [])] or None
        if st["alive"]:
            poll = host.call("poll", deploy_dir=ddir, release=server["release"], pid=server["pid"],
                             port=server["port"], host=profile.server.host,
                             health_path=profile.ready.health_path,
                             models_path=profile.ready.models_path, log_offset=1 << 62)
            record["health"] = poll["health"]
            models = poll.get("models") or []
            record["served_name"] = models[0] if len(models) == 1 else (models or None)
        spec_lines = []
        if st["alive"] and record["health"] == 200:
            from .metrics import status_metrics
            m = status_metrics(host, profile, server)
            record["spec"], record["generation_tokens_per_s"] = m["spec"], m["generation_tokens_per_s"]
            spec_lines = m["lines"]
        healthy = st["alive"] and record["health"] == 200
        cluster_lines = []
        if profile.cluster is not None:  # the Ray cluster under the server (tasks/cluster.py)
            from .cluster import cluster_status
            record["cluster"], cluster_lines, cluster_ok = cluster_status(host, profile, ddir)
            healthy = healthy and cluster_ok
        if st["alive"]:
            reporter.line(host.name, f"running: release {record['release']}, pid {record['pid']}, "
                                     f"up {_duration(record['uptime_s'])}, "
                                     f"port {record['port']}, health {record['health']}, "
                                     f"model {record['served_name']}")
        elif server:
            ex = st.get("exit") or {}
            how = f"exited with status {ex['returncode']} at {ex['ended_at']}" if ex else "not running"
            reporter.line(host.name, f"not running: release {record['release']} {how}")
            fatal = _fatal_line(host, ddir, server["release"])
            record.update(exit=ex or None, fatal=fatal and fatal[0])
            if fatal:  # why it died: an engine crash can exit 0, so the log says more than the code
                reporter.line(host.name, f"  why: {fatal[1]}: {fatal[0].strip()}")
        else:
            reporter.line(host.name, "not deployed")
        if json_mode:
            reporter.emit_json(record)
        for g in record["gpus"] or []:
            reporter.line(host.name, f"  GPU {g['index']}: {g['used_mib']} / {g['total_mib']} MiB")
        reporter.lines(host.name, ["  " + t for t in spec_lines])
        reporter.lines(host.name, cluster_lines)
        return HostResult(host.name, 0 if healthy else ExitCode.FAILED,
                          "healthy" if healthy else ("unhealthy" if st["alive"] else "not running"))
    run_task(c, profile, op, opts, title="status", json_mode=json_mode)
