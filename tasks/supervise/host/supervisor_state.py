"""The agent's view of a release's supervisor (tasks/supervise/host/supervisor.py, run by launch.py's reaper).

`read(ddir, server)` gives the `supervisor` object of `fab status --json`; `end(ddir,
server)` is the first step of every stop: SIGUSR1 to the supervisor, then wait until
its supervisor.json reads "off" (from then on it launches nothing), so nothing restarts
during or after a stop, also while it waits out a backoff.
"""
import os
import signal
import time

from ...base.host.procfs import cmdline, pid_alive
from ...base.host.statefiles import read_json

ACTIVE = ("running", "backoff", "waiting-for-gpu")
ACK_TIMEOUT_S = 10.0  # the supervisor acknowledges between looks (a health probe takes <= 5 s)


def _path(ddir, server):
    return os.path.join(ddir, "releases", server["release"], "supervisor.json")


def _reaper_alive(ddir, server, sup):
    """True if sup's pid is this release's reaper: the group leader of server.json, running
    a launch.py (a reused pid after a reboot must never get our SIGUSR1: its default kills)."""
    pid = sup.get("pid")
    if not pid or pid != server.get("pgid") or not pid_alive(pid):
        return False
    return "launch.py" in cmdline(pid)


def read(ddir, server):
    """{restart, restarts, state, last, next_attempt_in_s, reason} or None when unsupervised.

    An active state whose reaper is gone (killed, rebooted) reads "off"."""
    if not server or not server.get("release"):
        return None
    sup = read_json(_path(ddir, server))
    if not sup:
        return None
    state = sup.get("state")
    if state in ACTIVE and not _reaper_alive(ddir, server, sup):
        state = "off"
    nxt = sup.get("next_attempt_at")
    return {"restart": sup.get("restart"), "restarts": sup.get("restarts", 0), "state": state,
            "last": sup.get("last"),
            "next_attempt_in_s": round(max(0.0, nxt - time.time()), 1) if state == "backoff" and nxt else None,
            "reason": sup.get("reason")}


def end(ddir, server):
    """Make the supervisor launch nothing more; returns its state before ("off" if none ran)."""
    if not server or not server.get("release"):
        return None
    path = _path(ddir, server)
    sup = read_json(path)
    if not sup or sup.get("state") not in ACTIVE or not _reaper_alive(ddir, server, sup):
        return None
    before = sup["state"]
    try:
        os.kill(sup["pid"], signal.SIGUSR1)
    except (ProcessLookupError, PermissionError):
        return before
    deadline = time.monotonic() + ACK_TIMEOUT_S
    while time.monotonic() < deadline:
        now = read_json(path) or {}
        if now.get("state") not in ACTIVE or not pid_alive(sup["pid"]):
            break
        time.sleep(0.02)
    return before
