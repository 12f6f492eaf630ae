"""The deployment's lock (host side): a flock on <workdir>/<name>/.lock that dies with
its agent, naming its holder; a stale agent of this very task may be ended.
"""
import fcntl
import json
import os
import signal
import time

from .common import CONTEXT, HostError, expand, utc_iso


def op_lock(req):
    """Take the deployment's lock (flock: dies with this agent) or report its holder."""
    ddir = expand(req["deploy_dir"])
    os.makedirs(ddir, mode=0o700, exist_ok=True)
    path = os.path.join(ddir, ".lock")
    locks = CONTEXT.setdefault("locks", {})
    if path in locks:
        return {"path": path}
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    ended = None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _holder(fd)
        ended = _end_stale_agent(fd, holder, req.get("stale_agent"))
        if ended is None:
            os.close(fd)
            raise HostError("locked", kind="lock_held", holder=holder)
    info = {
        "user": req.get("user") or "?",
        "from": req.get("client") or "?",
        "host": os.uname().nodename,  # what socket.gethostname() says, without importing socket
        "pid": os.getpid(),
        "task": req.get("task") or "?",
        "since": utc_iso(),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    locks[path] = fd
    return {"path": path, "ended_stale_agent": ended}


def _holder(fd):
    raw = os.pread(fd, 4096, 0).decode("utf-8", "replace")
    try:
        return json.loads(raw)
    except ValueError:
        return {"raw": raw}


def _end_stale_agent(fd, holder, stale_pid):
    """The client lost its connection to the agent `stale_pid` (a hung, half-open SSH
    session the host has not noticed) and came back. If that very agent still holds the
    lock, end it and take the lock: it serves nobody. Returns its pid, or None."""
    if not stale_pid or not isinstance(holder, dict) or holder.get("pid") != stale_pid \
            or holder.get("host") != os.uname().nodename or stale_pid == os.getpid():
        return None
    try:
        with open("/proc/%d/cmdline" % stale_pid, "rb") as f:
            if b"llmfab_host" not in f.read():  # the pid was reused: not our agent
                return None
        os.kill(stale_pid, signal.SIGKILL)
    except OSError:
        pass
    deadline = time.monotonic() + 5
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return stale_pid
        except OSError:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)


def op_unlock(req):
    path = os.path.join(expand(req["deploy_dir"]), ".lock")
    fd = CONTEXT.setdefault("locks", {}).pop(path, None)
    if fd is not None:
        os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor drops the flock
    return {}

