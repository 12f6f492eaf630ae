"""Stopping a deployment on the host: TERM the group, wait, KILL, sweep stragglers.

Stragglers are processes that left the server's process group (e.g. a worker that
called setsid) but still carry the launcher's `LLMFAB_RELEASE` environment marker.
"""
import os
import signal
import time

from . import gpu
from .common import cmdline, expand, group_members, pid_alive, read_json

MARKER = b"LLMFAB_RELEASE="


def marked(ddir):
    """Live pids whose environment says they belong to a release under ddir."""
    prefix = MARKER + os.path.join(ddir, "releases").encode() + b"/"
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                env = f.read()
        except OSError:
            continue
        if any(item.startswith(prefix) for item in env.split(b"\0")) and pid_alive(int(name)):
            out.append(int(name))
    return out


def _signal(pids, pgid, sig):
    if pgid:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_gone(pids, deadline):
    while True:
        alive = [p for p in pids if pid_alive(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def stop(ddir, grace):
    server = read_json(os.path.join(ddir, "server.json")) or {}
    pgid = server.get("pgid")
    targets = set(marked(ddir))
    if pgid:
        targets.update(group_members(pgid))
    if not targets:
        return {"already_stopped": True, "server": server or None, "terminated": [], "killed": []}
    names = {p: cmdline(p) for p in targets}
    t0 = time.monotonic()
    _signal(sorted(targets), pgid, signal.SIGTERM)
    left = _wait_gone(sorted(targets), t0 + grace)
    killed = []
    if left:
        # Anything that joined the group or was spawned meanwhile goes too.
        left = sorted(set(left) | set(marked(ddir)) | set(group_members(pgid) if pgid else ()))
        _signal(left, pgid, signal.SIGKILL)
        killed = left
        left = _wait_gone(left, time.monotonic() + 5)
    return {
        "already_stopped": False,
        "server": server,
        "terminated": sorted(p for p in targets if p not in killed),
        "killed": killed,
        "survivors": left,
        "names": {str(k): v for k, v in names.items()},
        "seconds": round(time.monotonic() - t0, 3),
    }


def op_stop(req):
    ddir = expand(req["deploy_dir"])
    out = stop(ddir, float(req.get("grace", 30)))
    if req.get("nvidia_smi"):
        out["gpus"] = gpu.select(gpu.read_gpus(req["nvidia_smi"]), req.get("devices"))
    return out


OPS = {"stop": op_stop}
