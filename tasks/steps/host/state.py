"""What runs now: server.json, whether its process is alive, how it ended.
"""
import os
import time

from ...runtime.host import container
from ...supervise.host import supervisor_state
from ...transport.host.common import expand, read_exit, read_json, server_alive
from ...release.host.release_dirs import FAILED_FILE, current_release, releases_sorted


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


def op_state(req):
    """server.json, whether its process group is alive, and how the server ended if it did."""
    ddir = expand(req["deploy_dir"])
    server = read_json(os.path.join(ddir, "server.json"))
    current = current_release(ddir)
    out = {"deploy_dir": ddir, "exists": os.path.isdir(ddir), "server": server,
           "current": current, "alive": False, "exit": None, "failed": last_failed(ddir, current)}
    if server:
        out["alive"] = server_alive(ddir, server)
        if container.is_container(server):  # a restart by the engine brought server.json up to date
            server = out["server"] = read_json(os.path.join(ddir, "server.json")) or server
        out["exit"] = read_exit(os.path.join(ddir, "releases", server["release"]), server["pid"])
        out["now"] = time.time()
        out["supervisor"] = supervisor_state.read(ddir, server)
        # the start's phases, kept by the deploy that waited for it (startup/host/phases.py)
        out["startup"] = read_json(os.path.join(ddir, "releases", server["release"], "startup.json"))
        if container.is_container(server):  # the engine's word on it: status, exit code, restarts
            out["container"] = st = container.state(server)
            if out["exit"] is None and not out["alive"] and st["status"] in ("exited", "stopped", "dead"):
                out["exit"] = {"returncode": container.returncode(st["exit_code"]),
                               "ended_at": st.get("finished_at")}
    out["runtime"] = (server or {}).get("runtime") or "process"
    return out

