"""Ctrl-C that never leaves a host half-way, and the words for where it left each host.

A request that changes a host (stop a release, launch one) runs to its end on the host
whatever the client does: the agent finishes it, then sees its connection gone. So the
client waits for its answer too (`changing()`), and only then leaves: it can say where
each host is. A Ctrl-C while nothing changes leaves at once (reading, waiting for
readiness). A second Ctrl-C leaves at once whatever runs; the words say what was in flight.

SIGTERM and SIGHUP end a task exactly as Ctrl-C does (`kill`, a closed terminal, a CI job's
timeout): the same deferral while a host is being changed, the same put-back and removal, the
same last lines naming the signal, and exit 128 + its number (143, 129; Ctrl-C 130). A parent
that ignores SIGHUP (`nohup fab deploy`) keeps it ignored.

Where a run cannot unwind (worker threads that cannot be interrupted, a closed pipe, Ctrl-C
while llmfab loads), `leave` ends the process: the one exit of every such path.

Tasks that change hosts keep one `Spot` per host (what ran before, the release being brought
up, the step reached); `left_lines` turns them into the last lines of an interrupted run:
per host, old release, new one, or stopped, and the command that restores it.
"""
import contextlib
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Optional

NOTE = ("\n{what}: waiting for the step in flight on the host(s) (a stop or a launch) to finish, "
        "so each ends on a known release; Ctrl-C again to leave now\n")

# The signals that end a task as Ctrl-C does, and how the last lines name each.
ENDING = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}
_RECEIVED = []  # SIGTERM / SIGHUP received by this process, in order


def cause():
    """The signal that ended this run: the first SIGTERM or SIGHUP received, else SIGINT."""
    return _RECEIVED[0] if _RECEIVED else signal.SIGINT


def words():
    """`Ctrl-C`, `SIGTERM` or `SIGHUP`: for "interrupted (...)" lines."""
    return ENDING[cause()]


def exit_status(code=130):
    """The process's exit status for an interrupted run's `code` (130): 128 + the signal
    that ended it, as a shell reports a process that signal killed. Other codes unchanged."""
    return 128 + int(cause()) if int(code) == 130 else int(code)


def leave(code=None):
    """End this process now, with `code` (default: the interrupted run's status, 128 + the
    signal that ended it): the one exit of every Ctrl-C and closed-pipe path that cannot
    unwind. Worker threads (a host's request, a copy, a download) cannot be interrupted and
    the interpreter's exit would wait for them; their sockets close with the process. What
    stdout and stderr hold is flushed first (a flush whose reader has gone, or one that a
    signal handler's call would re-enter, is let go)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, RuntimeError):
            pass
    os._exit(exit_status() if code is None else int(code))


def _quiet_if_hung_up():
    """After a terminal hang-up, writing to it fails (EIO): stdout and stderr that were that
    terminal go to /dev/null, so the put-back and removal still run to their end."""
    import stat
    for fd in (1, 2):
        try:
            if stat.S_ISCHR(os.fstat(fd).st_mode) and not os.isatty(fd):
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, fd)
                os.close(null)
        except OSError:
            pass


def _as_sigint(signum, frame):
    """SIGTERM / SIGHUP: recorded, then handled by whatever handles SIGINT right now."""
    _RECEIVED.append(signum)
    if signum == signal.SIGHUP:
        _quiet_if_hung_up()
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        return handler(signal.SIGINT, frame)
    if handler != signal.SIG_IGN:
        raise KeyboardInterrupt


def _end_like_sigint():
    """SIGTERM and SIGHUP take the SIGINT path from here on (a parent's SIG_IGN is kept)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _as_sigint)


class CtrlC:
    """SIGINT, deferred while a host is being changed (see the module docstring)."""

    def __init__(self):
        self._lock = threading.RLock()  # the handler may run while this thread holds it
        self.pressed = False
        self.busy = 0

    def handler(self, signum, frame):
        with self._lock:
            again, busy = self.pressed, self.busy
            self.pressed = True
        if again or not busy:
            raise KeyboardInterrupt
        try:
            os.write(sys.stderr.fileno(), NOTE.format(what=words()).encode())
        except (OSError, ValueError):
            pass

    @contextlib.contextmanager
    def changing(self):
        with self._lock:
            if self.pressed:  # never start changing a host once Ctrl-C was pressed
                raise KeyboardInterrupt
            self.busy += 1
        try:
            yield
        finally:
            with self._lock:
                self.busy -= 1
        if self.pressed:
            raise KeyboardInterrupt

    def settle(self, wait):
        """After Ctrl-C reached the main thread: no host starts changing any more; wait
        (`wait(predicate)`) until none is being changed. False if a second Ctrl-C cut it short."""
        with self._lock:
            self.pressed = True
        try:
            wait(lambda: self.busy == 0)
            return True
        except KeyboardInterrupt:
            return False


CTRL_C = CtrlC()

# What the first lines of the program are: `fab` (Fabric's script, or `python -m fabric`) and
# the installed `llmfab` (tasks/program.py).
PROGRAMS = ("fab", "llmfab")
PROGRAM_MODULES = ("fabric.__main__",)
INTERRUPTED_EARLY = "interrupted ({what}): nothing was done on any host"


def early_words():
    """The one line of a run interrupted before any host was touched."""
    return INTERRUPTED_EARLY.format(what=words())


def _early_handler(signum, frame):
    try:
        os.write(sys.stderr.fileno(), ("\n" + early_words() + "\n").encode())
    except (OSError, ValueError):
        pass
    leave()


def exit_130_until_a_task_runs():
    """A Ctrl-C from llmfab's first line until the executor starts a task (our imports,
    Invoke's parsing, --help and --list) ends the program at once with 130 and one line, no
    traceback: Invoke turns a KeyboardInterrupt there into exit 1. Nothing has touched a host
    yet. `task_begins()` hands SIGINT back to Python (KeyboardInterrupt) for the task, whose
    own boundary makes it 130 (tasks/fleet/executor.py, tasks/fleet/runner.py). Only in the
    program itself: importing llmfab elsewhere (a test, a notebook) changes no signal."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if (os.path.basename(sys.argv[0] if sys.argv else "") in PROGRAMS
            or getattr(spec, "name", None) in PROGRAM_MODULES):
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, _early_handler)
            _end_like_sigint()


def task_begins():
    """The executor starts a task: Ctrl-C raises KeyboardInterrupt again (see above)."""
    if signal.getsignal(signal.SIGINT) is _early_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def changing():
    """Around a request that changes a host: a Ctrl-C meanwhile waits for its answer."""
    return CTRL_C.changing()


@dataclass
class Spot:
    """Where one host is in a task that changes it."""
    old: Optional[str] = None       # the release that ran when the task began (None: nothing)
    new: Optional[str] = None       # the release being brought up (deploy: new; rollback: the older one)
    step: str = "untouched"         # untouched | stopping | stopped | launching | launched
    pid: Optional[int] = None


def left_line(spot, hint):
    """The last line for one interrupted host: where it is, and the command that restores it.
    `hint(task)` is the exact `fab TASK --profile ...`."""
    old, new, step = spot.old, spot.new, spot.step
    back = f"restore it with `{hint(f'rollback --release {old}')}`" if old else ""
    if step == "untouched":
        return (f"interrupted: still on release {old}, as before (nothing was changed)" if old else
                "interrupted: nothing ran here and nothing was launched (nothing was changed)")
    if step in ("stopping", "stopped"):
        how = "is being stopped (the host finishes the stop)" if step == "stopping" else "was stopped"
        what = f"release {old} {how}" if old else "nothing ran"
        launched = f" and {new} was not launched" if new else ""
        return f"interrupted: stopped: {what}{launched}; " + (back or "nothing to restore")
    if step == "launching":
        now = f"release {new} is being launched (the host finishes the launch) and keeps running"
    else:
        now = (f"release {new} (pid {spot.pid}) keeps running (launched by this task, not waited "
               "for until ready)")
    return f"interrupted: {now}; " + (
        f"go back to {old} with `{hint(f'rollback --release {old}')}`" if old and old != new
        else f"stop it with `{hint('stop')}`")


def left_lines(spots, hint):
    """[(host, line)] for every host a task had begun to change."""
    return [(h, left_line(s, hint)) for h, s in list(spots.items())]
