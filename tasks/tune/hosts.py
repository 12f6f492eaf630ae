"""The hosts of a sweep: alike or refused before anything changes, and put back after.

`survey` reads each host once (no lock, nothing changed): the engine and its version, the
GPUs' names, and which release of the deployment runs now. Hosts that differ in GPU name,
GPU count or engine version would measure different things, so the sweep refuses them
(exit 2, naming each host and what it has).

`put_back` ends a sweep on one host: `--keep previous` relaunches the release that ran
before from its own files (as `fab rollback` does), or stops the deployment if nothing ran;
`--keep winner` deploys the tuned profile as `fab deploy` would.
"""
from ..errors import UsageError
from ..fleet.fanout import HostResult
from ..steps.preflight import engine_request


def survey_op(profile, ddir):

    def op(host):
        host.start()
        answers = host.batch({
            # the engine check of deploy's preflight: the server's interpreter and [server.env]
            "facts": ("host_facts", dict(engine_request(profile), nvidia_smi=profile.gpu.nvidia_smi)),
            "state": ("state", {"deploy_dir": ddir})})
        facts, state = answers["facts"], answers["state"]
        server = state.get("server") or {}
        running = server.get("release") if state.get("alive") else None
        return HostResult(host.name, 0, facts["engine"], {"facts": facts, "running": running})
    return op


def describe(facts):
    gpus = facts.get("gpus")
    if gpus is None:
        kind = "no GPU (no nvidia-smi)"
    else:
        names = sorted(set(gpus))
        kind = f"{len(gpus)} x {', '.join(names)}" if gpus else "0 GPUs"
    return f"{facts['engine']}, {kind}"


def check_alike(found):
    """found: {host: facts}; UsageError naming the hosts unless all are alike."""
    groups = {}
    for host, facts in found.items():
        groups.setdefault(describe(facts), []).append(host)
    if len(groups) > 1:
        parts = [f"{', '.join(hosts)}: {what}" for what, hosts in groups.items()]
        raise UsageError("the hosts are not alike, so their numbers would not compare ("
                         + "; ".join(parts) + "); tune on alike hosts (same GPU name and count, "
                         "same engine version), e.g. one group with -H (nothing was done)")


def put_back(host, base, before, reporter, *, keep, tuned=None, stale_agent=None):
    """Leave `host` running `before` (a release, or nothing) or, with keep == "winner", the
    tuned profile. `stale_agent`: the sweep's own agent on this host (Ctrl-C), ended if it
    still holds the lock. Returns a phrase saying what runs now."""
    from ..steps.lock import take_lock
    from ..options import DeployOptions, RollbackOptions
    from ..steps.preflight import deploy_dir
    from ..releases import rollback_host
    from ..steps.shutdown import stop_deployment
    ddir = deploy_dir(base)
    host.start()
    take_lock(host, ddir, "tune", stale_agent=stale_agent)
    if keep == "winner" and tuned is not None:
        from ..deploy import deploy_host
        res = deploy_host(host, tuned, DeployOptions(), reporter, restore=False)
        return f"the winner runs: release {res.data['release']} ({tuned.path.name})"
    state = host.call("state", deploy_dir=ddir)
    now = (state.get("server") or {}).get("release") if state.get("alive") else None
    if before is None:
        if now is not None:
            stop_deployment(host, ddir, reporter)
        return "nothing runs (nothing ran before)"
    if now == before:
        return f"release {before} runs, as before"
    rollback_host(host, base, RollbackOptions(), reporter, to=before)
    return f"release {before} runs again, as before"


def stop_slot(host, base, k, stale_agent, reporter):
    """After Ctrl-C: stop slot k's own deployment (`<name>-s<K>`), ending the sweep's agent
    that held its lock."""
    from ..steps.lock import take_lock
    from ..steps.shutdown import stop_deployment
    from .slots import slot_name
    ddir = f"{base.target.workdir.rstrip('/')}/{slot_name(base.target.name, k)}"
    take_lock(host, ddir, "tune", stale_agent=stale_agent)
    stop_deployment(host, ddir, reporter)
