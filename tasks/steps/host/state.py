"""What runs now: server.json, whether its process is alive, how it ended.
"""
import os
import time

from ...supervise.host import supervisor_state
from ...runtime.host import runtimes
from ...runtime.host.runtimes import server_alive
from ...base.host.layout import FAILED_FILE, current_release, read_exit, releases_sorted
from ...base.host.statefiles import expand, read_json


def last_failed(ddir, current):
    """The failure record (start-failed.json) of the last deploy, with its release: of `current`
    if it has one, else of the newest release (a failed deploy whose old release was put back),
    else None."""
    names = releases_sorted(ddir)
    for name in ([current] if current else []) + names[-1:]:
        record = read_json(os.path.join(ddir, "releases", name, FAILED_FILE))
        if record:
            return dict(record, release=name)
    return None


def op_state(deploy_dir):
    """server.json, whether its process group is alive, and how the server ended if it did."""
    ddir = expand(deploy_dir)
    server = read_json(os.path.join(ddir, "server.json"))
    current = current_release(ddir)
    out = {"deploy_dir": ddir, "exists": os.path.isdir(ddir), "server": server,
           "current": current, "alive": False, "exit": None, "failed": last_failed(ddir, current)}
    out["runtime"] = (server or {}).get("runtime") or "process"
    runtime, now = runtimes.for_server(server), None
    if runtime is not None:  # a systemd unit or a container: its state says (tasks/runtime/host/)
        now = runtime.state(ddir, server)
        out.update({k: v for k, v in now.items() if k in ("unit", "container")})
        if now.get("pid") and now["pid"] != server.get("pid"):  # restarted by the runtime
            server = out["server"] = dict(server, pid=now["pid"], pgid=now["pid"])
    if server:
        out["alive"] = now["alive"] if now is not None else server_alive(ddir, server)
        out["exit"] = read_exit(os.path.join(ddir, "releases", server["release"]), server["pid"])
        out["now"] = time.time()
        out["supervisor"] = supervisor_state.read(ddir, server)
        # the start's phases, kept by the deploy that waited for it (startup/host/phases.py)
        out["startup"] = read_json(os.path.join(ddir, "releases", server["release"], "startup.json"))
        if now is not None and out["exit"] is None and not out["alive"] and now.get("exit"):
            out["exit"] = now["exit"]  # the runtime's word on how it ended (a container's exit code)
    out["runtime"] = (server or {}).get("runtime") or "process"
    return out

