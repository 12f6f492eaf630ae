"""Stopping processes on a host, whoever asks: the grace times every stop uses, one signal to
each process (the group by killpg, never a second SIGTERM), waiting until they are gone, and
`stop_own_group`, a stop from inside the group it stops (the supervisor ending what is left of
a crashed attempt). Deployments are stopped by tasks/steps/host/procs.py. Standard library only
(ships to hosts)."""
import os
import signal
import time

from .procfs import group_members, kill_each, pid_alive

DEFAULT_GRACE_S = 30.0  # SIGTERM -> SIGKILL of every stop (fab stop, deploy, supervisor, Ray): the one default
KILL_GPU_GRACE_S = 10.0  # fab kill-gpu-procs: SIGTERM -> SIGKILL of processes that are not ours
KILL_WAIT_S = 5.0  # after SIGKILL: the kernel needs a moment to reap a big CUDA process
REAPER_WAIT_S = 2.0


def signal_pids(pids, pgid, sig):
    """`sig` once to each process: the group by killpg, then each pid outside the group.

    A process must never get a second SIGTERM: servers built on uvicorn read it as
    "stop now, skip the graceful shutdown", and a handler that takes a lock deadlocks.
    """
    if pgid:
        in_group = set(group_members(pgid))
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            in_group = set()
        pids = [p for p in pids if p not in in_group]
    kill_each(pids, sig)


def wait_gone(pids, deadline, sleep=time.sleep):
    while True:
        alive = [p for p in pids if pid_alive(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        sleep(0.05)


def stop_own_group(marked, grace, sleep=time.sleep):
    """`stop`, done from inside the group it stops: the supervisor leads its server's process
    group, so it TERMs the group once with itself spared, then each process `marked()` names
    (its release's marker) outside the group; waits `grace` s, KILLs what is left and what
    appeared meanwhile. `sleep(s)` waits (the supervisor's notices a stop request).
    Returns {"terminated": [...], "killed": [...]}."""
    me = os.getpid()
    group = set(group_members(me)) - {me}
    targets = group | set(marked())
    if targets:
        if group:
            _term_own_group()
        signal_pids(sorted(set(marked()) - set(group_members(me))), None, signal.SIGTERM)
        wait_gone(sorted(targets), time.monotonic() + grace, sleep)
    # The sweep: survivors of TERM, and anything of ours that appeared meanwhile.
    left = sorted(p for p in (targets | set(marked()) | set(group_members(me))) - {me} if pid_alive(p))
    signal_pids(left, None, signal.SIGKILL)
    wait_gone(left, time.monotonic() + KILL_WAIT_S, sleep)
    return {"terminated": sorted(targets - set(left)), "killed": left}


def _term_own_group():
    """SIGTERM to this process's group, itself spared: blocked, then the pending one consumed."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        os.killpg(os.getpgid(0), signal.SIGTERM)
        signal.sigtimedwait({signal.SIGTERM}, 0)
    except (ProcessLookupError, PermissionError):
        pass
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
