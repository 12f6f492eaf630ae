"""The deployment's lock (host side): a flock on <workdir>/<name>/.lock that dies with
its agent, naming its holder; a stale agent of this very task may be ended.

The holder's `phase` says what it does: "changing" the host (a stop, a launch: bounded), or
"waiting" for readiness (up to [ready] timeout). `fab stop` and `fab kill-gpu-procs` are
never refused by a deploy's lock: a holder that only waits is ended (its client learns that
the server was stopped, tasks/steps/wait.py), one that changes the host is waited for.
"""
import fcntl
import json
import os
import signal
import time

from ...base.host.hosterrors import HostError
from ...base.host.hostenv import CONTEXT
from ...base.host.statefiles import expand, not_writable, utc_iso

PREEMPTING = ("stop", "kill-gpu-procs")
PREEMPT_WAIT_S = 120.0  # a holder changing the host (a stop's grace, a launch) is waited for


def op_lock(deploy_dir, task=None, user=None, client=None, stale_agent=None, create=True, phase=None,
            preempt_wait=PREEMPT_WAIT_S):
    """Take the deployment's lock (flock: dies with this agent) or report its holder.

    `create` False (a task that only acts on what is there: stop, rollback, releases --keep):
    a deployment directory that does not exist is not made, and the answer says `absent`
    (there is nothing to lock, nor to act on). `user`@`client` and `task` name the holder
    to whoever finds the lock taken; `phase` (None: "changing") what it does now."""
    ddir = expand(deploy_dir)
    path = os.path.join(ddir, ".lock")
    try:
        if create:
            os.makedirs(ddir, mode=0o700, exist_ok=True)
        elif not os.path.isdir(ddir):
            return {"path": None, "absent": True}
        locks = CONTEXT.setdefault("locks", {})
        if path in locks:
            return {"path": path}
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)  # never a planted link
    except OSError as e:
        why = not_writable(ddir) or e.strerror or str(e)
        raise HostError("cannot take the deployment's lock %s: %s; choose a writable target.workdir "
                        "(or remount it read-write)" % (path, why), kind="write_failed")
    ended = preempted = None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _holder(fd)
        ended = _end_stale_agent(fd, holder, stale_agent)
        if ended is None and task in PREEMPTING:
            ended = _preempt(fd, float(preempt_wait))
            preempted = holder if ended else None
        if ended is None:
            os.close(fd)
            raise HostError("locked", kind="lock_held", holder=holder)
    info = {
        "user": user or "?",
        "from": client or "?",
        "host": os.uname().nodename,  # what socket.gethostname() says, without importing socket
        "pid": os.getpid(),
        "task": task or "?",
        "phase": phase or "changing",
        "since": utc_iso(),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    locks[path] = fd
    return {"path": path, "ended_stale_agent": ended, "preempted": preempted}


def _preempt(fd, wait_s):
    """For `fab stop`: take the lock from a holder that only waits for readiness (its agent is
    ended), or once a holder that changes the host lets go. Returns the ended pid (or 0 when
    the holder let go by itself), or None after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return 0
        except OSError:
            pass
        holder = _holder(fd)
        if isinstance(holder, dict) and holder.get("phase") == "waiting" \
                and holder.get("host") == os.uname().nodename:
            ended = _end_stale_agent(fd, holder, holder.get("pid"))
            if ended is not None:
                return ended
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def op_lock_phase(deploy_dir, phase=None):
    """The lock holder (this agent) says what it does now: "waiting" (for readiness: a
    `fab stop` may end it) or "changing" the host."""
    path = os.path.join(expand(deploy_dir), ".lock")
    fd = CONTEXT.setdefault("locks", {}).get(path)
    if fd is None:
        return {"held": False}
    info = _holder(fd)
    # only a deploy or rollback may be ended by a stop; a sweep (`fab tune`) holds the lock
    # across many deploys and puts its hosts back itself
    if isinstance(info, dict) and info.get("task") in ("deploy", "rollback"):
        info["phase"] = phase or "changing"
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
    return {"held": True}


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


def op_unlock(deploy_dir):
    path = os.path.join(expand(deploy_dir), ".lock")
    fd = CONTEXT.setdefault("locks", {}).pop(path, None)
    if fd is not None:
        os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor drops the flock
    return {}

