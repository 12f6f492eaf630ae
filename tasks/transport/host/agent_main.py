"""The host-side agent: one long-lived process per task and host.

llmfab sends exactly one remote command per task and host: the profile's Python
with a short bootstrap (tasks/transport/agent_bootstrap.py, minified) that finds this package's
code cached on the host (or receives it once) and calls `serve()`. Requests then
flow as JSON lines over the same channel, so a poll tick costs no new remote
command and no shell start-up. Every op is a row of ops.py (module, function), called
with the request's arguments as keywords once they fit its parameters; a module is
imported when the first request for one of its ops arrives, so a task pays only for
the code it uses.
The agent exits when its stdin closes (the SSH session ended), at once even
mid-operation (a watchdog thread), which also releases any lock it holds.
Standard library only; Python >= 3.9.
"""
import json
import os
import select
import sys
import threading

from ...base.host.hosterrors import HostError
from ...base.host.hostenv import CONTEXT
from .ops import OPS

VERSION = 2
_FUNCTIONS = {}  # op -> function, filled as modules are imported on demand
_ORIGIN = {}  # how the bootstrap found this code: agent_dir, code (cached / sent / temporary)


def op_hello():
    return dict(_ORIGIN, agent=VERSION, python="%d.%d.%d" % sys.version_info[:3],
                executable=sys.executable, hostname=os.uname()[1], user=_user(),
                home=os.path.expanduser("~"), pid=os.getpid())


def _user():
    try:
        import pwd
        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())


def op_batch(calls):
    """Several requests in one message, answered together: the round trips of a deploy's
    steps that need nothing from each other's answers. `calls` names each request
    ({name: {"op": ..., its arguments}}); the answer is {name: its result}. They run in the
    order given and the first failure ends the batch, so what follows it never runs (no
    launch after a failed GPU baseline); its error names the call (`batch_call`)."""
    out = {}
    for name, sub in calls.items():
        if sub.get("op") == "batch":
            raise HostError("a batch cannot hold a batch", kind="internal")
        try:
            out[name] = handle(sub)
        except HostError as e:
            e.data = dict(e.data, batch_call=name)
            raise
    return out


def lookup(name):
    """The function serving op `name` (ops.py), importing its module on first use (only that one)."""
    fn = _FUNCTIONS.get(name)
    if fn is None:
        info = OPS.get(name)
        if info is None:
            raise HostError("unknown agent operation %r" % name, kind="internal")
        import importlib
        root = __package__.rsplit(".", 2)[0]  # llmfab_host on a host, tasks here (its tests)
        module = importlib.import_module(root + "." + info.module)
        fn = _FUNCTIONS[name] = getattr(module, info.function)
    return fn


def handle(request):
    """Run request {"op": name, its arguments...}: op_<name>(**arguments)."""
    name = request.get("op")
    fn = lookup(name)
    args = {k: v for k, v in request.items() if k != "op"}
    _check_arguments(name, fn, args)
    return fn(**args)


def _check_arguments(name, fn, args):
    """A request whose arguments do not fit the op's parameters is refused naming the op and
    the argument; bound before the call, so a TypeError raised inside the op stays its own."""
    import inspect
    sig = inspect.signature(fn)
    try:
        sig.bind(**args)
        return
    except TypeError:
        pass
    params = sig.parameters
    takes = ", ".join(params) or "nothing"
    unknown = [k for k in args if k not in params]
    if unknown:
        raise HostError("op %s: unknown argument %r (it takes: %s)" % (name, unknown[0], takes),
                        kind="internal", op=name, argument=unknown[0])
    missing = [p for p, v in params.items() if v.default is v.empty and p not in args]
    raise HostError("op %s: missing argument %r (it takes: %s)" % (name, (missing or ["?"])[0], takes),
                    kind="internal", op=name, argument=(missing or [None])[0])


def _cleanup():
    """A temporary copy of the code (no writable cache on this host) goes with the agent."""
    if _ORIGIN.get("code") == "temporary":
        import shutil
        shutil.rmtree(_ORIGIN["agent_dir"], ignore_errors=True)


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
                _cleanup()
                os._exit(0)  # the flock goes with us; servers live on in their own sessions


def _start_watchdog(stdin, stdout):
    try:
        fds = [stdin.fileno(), stdout.fileno()]
    except (AttributeError, OSError, ValueError):  # in-memory streams (tests): nothing to watch
        return
    threading.Thread(target=_watchdog, args=(fds,), name="watchdog", daemon=True).start()


def serve(stdin, stdout, greet=None):
    """Answer JSON-line requests until stdin closes (or the client is gone: _watchdog).

    greet: the bootstrap's facts about the code (agent_dir, code); the hello record
    is then written first, unasked, which saves the client a round trip per start.
    """
    CONTEXT.clear()
    _start_watchdog(stdin, stdout)
    try:
        if greet is not None:
            _ORIGIN.update(greet)
            if not _write(stdout, {"ok": True, "result": op_hello()}):
                return
        for line in stdin:
            if not _write(stdout, _answer(line)):
                return
    finally:
        _cleanup()


def _answer(line):
    try:
        return {"ok": True, "result": handle(json.loads(line))}
    except HostError as e:
        return {"ok": False, "error": str(e), "kind": e.kind, "data": e.data}
    except Exception as e:  # report, never die mid-task
        import traceback
        return {"ok": False, "error": "%s: %s" % (type(e).__name__, e), "kind": "internal",
                "data": {"traceback": traceback.format_exc()}}


def _write(stdout, resp):
    try:
        stdout.write(json.dumps(resp).encode() + b"\n")
        stdout.flush()
        return True
    except (BrokenPipeError, OSError):
        return False
