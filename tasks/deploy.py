"""`fab deploy` for one host: lock, preflight, push a release, launch, wait until ready."""
import getpass
import json
import os
import socket

from .argv import server_argv
from .errors import ExitCode, LockHeld, OperationFailed, PreflightFailed
from .fanout import HostResult, report_error
from .gpuwait import profile_devices
from .launcher import render_argv_json, render_launcher, render_secrets
from .profile.types import JsonTable, Profile
from .modelcheck import models_request
from .agentclient import AgentError
from .wait import NotReadyInTime, call_resilient, wait_ready


def deploy_dir(profile: Profile):
    return f"{profile.target.workdir.rstrip('/')}/{profile.target.name}"


def model_paths(profile: Profile):
    """(key, absolute path) pairs the host must have: the model and any drafter/model path in args."""
    out = []
    s = profile.server
    if s.model and s.model.startswith("/"):
        out.append(("server.model", s.model))
    for name, value in s.args:
        key = f"server.args.{name}"
        if isinstance(value, JsonTable):
            obj = value.value()
            if isinstance(obj, dict):
                for k, v in obj.items():
                    if (k == "model" or k.endswith("model_path") or k.endswith("-model-path")) \
                            and isinstance(v, str) and v.startswith("/"):
                        out.append((f"{key}.{k}", v))
        elif (name.replace("_", "-").endswith("model-path") or name == "model") \
                and isinstance(value, str) and value.startswith("/"):
            out.append((key, value))
    return out


def preflight_request(profile: Profile, state=None):
    """The host's preflight request. `state` (the agent's "state" answer) tells whether this
    deployment is running on the same port: then the port counts as ours, to be freed by the
    stop that precedes the launch, not as taken."""
    s = profile.server
    req = dict(
        engine=s.engine,
        argv0=s.command[0] if s.engine == "command" and s.command else None,
        paths=model_paths(profile),
        host=s.host, port=s.port, deploy_dir=deploy_dir(profile),
        nvidia_smi=profile.gpu.nvidia_smi,
        devices=list(profile.gpu.devices) if profile.gpu.devices is not None else None,
        min_free_mib=profile.gpu.min_free_mib,
        models=models_request(profile),
    )
    server = (state or {}).get("server") or {}
    if state and state.get("alive") and server.get("port") == s.port:
        req["port_owner_pgid"] = server["pgid"]
    return req


def release_files(profile: Profile):
    """[(name, bytes, mode)] pushed into a new release directory."""
    files = [
        ("launch.py", render_launcher(profile).encode(), 0o700),
        ("argv.json", render_argv_json(profile), 0o600),
        ("profile.toml", profile.resolved_toml.encode(), 0o600),
    ]
    secrets = render_secrets(profile)
    if secrets:
        files.append(("secrets.json", secrets, 0o600))
    for path in profile.server.files:
        with open(path, "rb") as f:
            files.append((os.path.basename(path), f.read(), 0o700 if os.access(path, os.X_OK) else 0o600))
    return files


def dry_run_text(profile: Profile):
    argv = server_argv(profile)
    lines = [f"profile: {profile.path} (sha256 {profile.digest[:12]})",
             f"deployment: {deploy_dir(profile)}",
             "argv (one element per line, exactly as the server receives it):"]
    lines += [f"  [{i}] {json.dumps(a, ensure_ascii=False)}" for i, a in enumerate(argv)]
    if profile.secrets:
        lines.append("secrets (names only; values go to secrets.json, mode 0600): "
                     + ", ".join(sorted(profile.secrets)))
    lines.append("--- launch.py ---")
    lines += render_launcher(profile).splitlines()
    return lines


def lock_info():
    try:
        user = getpass.getuser()
    except Exception:
        user = "?"
    return {"user": user, "client": socket.gethostname()}


def take_lock(host, ddir, task, stale_agent=None):
    """Take the deployment's lock, or raise LockHeld naming its holder.

    `stale_agent`: pid of this task's own agent from before a lost connection; if that
    agent still holds the lock (the host has not noticed the connection died), it is ended.
    Returns the host's answer ({path, ended_stale_agent})."""
    try:
        return host.call("lock", deploy_dir=ddir, task=task, stale_agent=stale_agent, **lock_info())
    except AgentError as e:
        if e.kind != "lock_held":
            raise
        h = e.data.get("holder", {})
        raise LockHeld(f"deployment {ddir} is locked by {h.get('user', '?')}@{h.get('from', '?')} "
                       f"({h.get('task', '?')}, agent pid {h.get('pid', '?')} on {h.get('host', '?')}) "
                       f"since {h.get('since', '?')}; try again when it is done (if that task's "
                       f"connection died, its agent ends when the host notices, or end it now "
                       f"with `kill {h.get('pid', 'PID')}` there)") from None


def print_checks(reporter, name, checks):
    for c in checks:
        reporter.line(name, f"{c['status']:<4} {c['check']:<8} {c['message']}")


def run_preflight(host, reporter, req):
    """Run the host's preflight; print one line per check; raise PreflightFailed on any FAIL."""
    checks = host.call("preflight", timeout=120, **req)["checks"]
    print_checks(reporter, host.name, checks)
    counts = {s: sum(c["status"] == s for c in checks) for s in ("OK", "WARN", "FAIL")}
    reporter.line(host.name, f"preflight: {len(checks)} checks: {counts['OK']} OK, "
                             f"{counts['WARN']} WARN, {counts['FAIL']} FAIL")
    failed = [c for c in checks if c["status"] == "FAIL"]
    if failed:
        raise PreflightFailed(f"preflight failed ({len(failed)} check(s)); nothing was launched",
                              details=[c["message"] for c in failed])
    return checks


def push_release(host, profile, ddir):
    rel = host.call("new_release", deploy_dir=ddir)
    try:
        for name, data, mode in release_files(profile):
            host.put(data, f"{rel['path']}/{name}", mode)
    except Exception:
        try:
            host.call("discard_release", deploy_dir=ddir, release=rel["release"])
        except Exception:
            pass
        raise
    return rel


def stop_running(host, ddir, reporter, grace=30):
    """Stop the running release exactly as `fab stop` does (tasks/stop.py), GPU check included."""
    from .stop import stop_deployment
    return stop_deployment(host, ddir, reporter, grace=grace)


def deploy_host(host, profile, opts, reporter, before_launch=None):
    name = host.name
    ddir = deploy_dir(profile)
    hello = host.start()
    reporter.line(name, f"connected: {hello['user']}@{hello['hostname']}, Python {hello['python']}")
    take_lock(host, ddir, "deploy")
    state = host.call("state", deploy_dir=ddir)
    running = state["alive"]
    run_preflight(host, reporter, preflight_request(profile, state))
    rel = push_release(host, profile, ddir)
    if running:
        reporter.line(name, f"release {state['current']} is running: stopping it first")
        stop_running(host, ddir, reporter)
    if before_launch is not None:  # e.g. bring up the Ray cluster of a [cluster] profile (tasks/cluster.py)
        before_launch()
    # What the GPUs hold without this server: `fab stop` waits until they are back to it.
    # Nothing stopped or started since preflight: its reading is it (no second nvidia-smi).
    reuse_s = None if running or before_launch is not None else 2.0
    host.call("gpu_baseline", deploy_dir=ddir, release=rel["release"], nvidia_smi=profile.gpu.nvidia_smi,
              devices=profile_devices(profile), reuse_s=reuse_s, timeout=60)
    launched = host.call("launch", deploy_dir=ddir, release=rel["release"],
                         python=profile.server.interpreter, keep=profile.target.keep_releases)
    server = launched["server"]
    reporter.line(name, f"launched release {server['release']}: pid {server['pid']}, "
                        f"log {rel['path']}/server.log")
    result = HostResult(name, ExitCode.OK, f"launched {server['release']} (pid {server['pid']})",
                        {"release": server["release"], "pid": server["pid"]})
    if opts.get("no_wait"):
        return result

    agent = {"pid": hello.get("pid")}

    def relock():
        reporter.line(name, "connection re-opened; still waiting")
        took = take_lock(host, ddir, "deploy", stale_agent=agent["pid"])
        if took.get("ended_stale_agent"):
            reporter.line(name, f"ended agent pid {took['ended_stale_agent']} of the lost connection "
                                "(it still held the lock)")
        agent["pid"] = host.hello.get("pid")

    launched = opts.get("launched", {})  # what Ctrl-C leaves running (tasks/commands.py)
    launched[name] = server
    try:
        facts = wait_ready(host, profile, ddir, server, reporter, timeout=opts.get("timeout"),
                           on_reconnect=relock)
    except NotReadyInTime as e:
        if not opts.get("stop_on_timeout"):
            raise
        reporter.line(name, "--stop-on-timeout: stopping the server")
        call_resilient(host, "stop", deploy_dir=ddir, grace=30, timeout=90)
        launched.pop(name, None)
        raise NotReadyInTime(f"{e.what}; stopped it (--stop-on-timeout); its log stays in "
                             f"release {server['release']}", details=e.details) from None
    except OperationFailed as e:
        launched.pop(name, None)
        report_error(reporter, name, e)  # the verdict first; the clean-up below may take seconds
        # A server that failed is of no use; free its GPUs. Its log stays in the release.
        try:
            call_resilient(host, "stop", deploy_dir=ddir, grace=10, timeout=60, budget=10)
        except Exception:
            pass
        raise
    reporter.line(name, f"ready in {facts['seconds']:.1f} s: {profile.served_name or 'server'} "
                        f"on port {profile.server.port}")
    result.summary = f"ready in {facts['seconds']:.1f} s ({server['release']})"
    result.data["ready_s"] = round(facts["seconds"], 3)
    return result
