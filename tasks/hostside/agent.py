"""The host-side agent: one long-lived process per task and host.

llmfab sends exactly one remote command per task and host: the profile's Python
with a short bootstrap (`tasks.transport.BOOTSTRAP`) that reads this package's
sources from stdin and calls `serve()`. Requests then flow as JSON lines over the
same channel, so a poll tick costs no new remote command and no shell start-up.
The agent exits when its stdin closes (the SSH session ended), at once even
mid-operation (a watchdog thread), which also releases any lock it holds.
Standard library only; Python >= 3.9.
"""
import json
import os
import platform
import select
import socket
import sys
import threading
import traceback

from . import (bench, files, gpu, gpuprocs, history, launch, lock, logs, oomkill, preflight, probe,
               procs, ray_node, releases, state)
from .common import CONTEXT, HostError

VERSION = 1


def op_hello(req):
    return {
        "agent": VERSION,
        "python": platform.python_version(),
        "executable": sys.executable,
        "hostname": socket.gethostname(),
        "user": _user(),
        "home": os.path.expanduser("~"),
        "pid": os.getpid(),
    }


def _user():
    try:
        import pwd
        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())


OPS = {"hello": op_hello}
for _module in (lock, files, releases, launch, state, probe, gpu, gpuprocs, procs, preflight, logs, oomkill,
                history, bench, ray_node):
    OPS.update(getattr(_module, "OPS", {}))
from . import speclog  # noqa: E402  the speculative-decoding doctor
OPS.update(speclog.OPS)


def handle(req):
    op = OPS.get(req.get("op"))
    if op is None:
        raise HostError("unknown agent operation %r" % req.get("op"), kind="internal")
    return op(req)


def _watchdog(fds):
    """Exit the moment the client is gone, even in the middle of a long operation.

    sshd closes our pipes when the connection dies (client killed, network gone).
    Between requests the loop below sees EOF at once, but an operation such as a
    30 s stop grace would otherwise keep running, and keep holding the deploy lock,
    for nobody. poll() with no events still reports POLLHUP/POLLERR.
    """
    p = select.poll()
    for fd in fds:
        p.register(fd, 0)
    while True:
        for _fd, ev in p.poll():
            if ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                os._exit(0)  # the flock goes with us; servers live on in their own sessions


def _start_watchdog(stdin, stdout):
    try:
        fds = [stdin.fileno(), stdout.fileno()]
    except (AttributeError, OSError, ValueError):  # in-memory streams (tests): nothing to watch
        return
    threading.Thread(target=_watchdog, args=(fds,), name="watchdog", daemon=True).start()


def serve(stdin, stdout):
    """Answer JSON-line requests until stdin closes (or the client is gone: _watchdog)."""
    CONTEXT.clear()
    _start_watchdog(stdin, stdout)
    for line in stdin:
        try:
            req = json.loads(line)
            resp = {"ok": True, "result": handle(req)}
        except HostError as e:
            resp = {"ok": False, "error": str(e), "kind": e.kind, "data": e.data}
        except Exception as e:  # report, never die mid-task
            resp = {"ok": False, "error": "%s: %s" % (type(e).__name__, e), "kind": "internal",
                    "data": {"traceback": traceback.format_exc()}}
        try:
            stdout.write(json.dumps(resp).encode() + b"\n")
            stdout.flush()
        except (BrokenPipeError, OSError):
            return
