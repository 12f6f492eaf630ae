"""The deployment's lock, from the client: take it on the host or say who holds it.

The host side (tasks/steps/host/flock.py) holds a flock that dies with its agent.
"""
import getpass
import socket

from ..transport.agent import AgentError
from ..errors import LockHeld

# Tasks that are never refused by a deploy's lock: the host ends a deploy (or rollback) that
# only waits for readiness, and they go on (steps/host/flock.py). Everything else waits its turn.
PREEMPTING = ("stop", "kill-gpu-procs")


def lock_info():
    try:
        user = getpass.getuser()
    except Exception:
        user = "?"
    return {"user": user, "client": socket.gethostname()}


def take_lock(host, ddir, task, stale_agent=None, create=True, phase=None):
    """Take the deployment's lock, or raise LockHeld naming its holder.

    `stale_agent`: pid of this task's own agent from before a lost connection; if that
    agent still holds the lock (the host has not noticed the connection died), it is ended.
    `create` False: a deployment directory that is not there is not made (the answer has
    `absent`: nothing deployed there). `phase`: "waiting" when only readiness is waited for
    (`fab stop` may then end this task, steps/host/flock.py), else changing the host.
    Returns the host's answer ({path, ended_stale_agent, preempted})."""
    return locked(host, ddir, task, stale_agent=stale_agent, create=create, phase=phase)["lock"]


def locked(host, ddir, task, stale_agent=None, then=None, create=True, phase=None):
    """take_lock, and in the same round trip the requests `then` ({name: (op, kwargs)}), run
    on the host once the lock is held: {"lock": the lock's answer, name: its result...}."""
    lock = ("lock", dict(deploy_dir=ddir, task=task, stale_agent=stale_agent, create=create,
                         phase=phase, **lock_info()))
    try:
        if then:
            return host.batch(dict(lock=lock, **then))
        return {"lock": host.call(lock[0], **lock[1])}
    except AgentError as e:
        if e.kind != "lock_held" or e.data.get("batch_call", "lock") != "lock":
            raise
        h = e.data.get("holder", {})
        raise LockHeld.naming(h, f"deployment {ddir} is locked by {h.get('user', '?')}@{h.get('from', '?')} "
                       f"({h.get('task', '?')}, agent pid {h.get('pid', '?')} on {h.get('host', '?')}) "
                       f"since {h.get('since', '?')}; try again when it is done (if that task's "
                       f"connection died, its agent ends when the host notices, or end it now "
                       f"with `kill {h.get('pid', 'PID')}` there)") from None
