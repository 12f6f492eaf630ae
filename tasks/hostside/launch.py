"""Running a release's launch.py (no shell), pointing `current` at it, pruning.

launch.py runs as `PYTHON launch.py` would. When PYTHON is the very command this agent
was started with (the usual case: both are the profile's server.python), it runs in a
forked child of the agent instead of a new interpreter: the same program with the same
environment, working directory and interpreter, its stdin /dev/null, its stdout and
stderr a pipe read here, every other descriptor closed (the deploy lock and the SSH
channel included), without the ~20-40 ms of CPU an interpreter start and the
launcher's imports cost every host on every deploy. One difference: like the agent it
runs without `site` (python -S), which launch.py and the supervisor beside it, standard
library only, never need; the server itself starts its own interpreter as always.
Otherwise (another interpreter, Python < 3.10 without sys.orig_argv) it is a subprocess,
as before.
"""
import json
import os
import select
import sys
import time

from .common import HostError, expand
from .releases import point_current, prune

LAUNCH_TIMEOUT_S = 60


def op_launch(req):
    """Run the release's launch.py (no shell), point `current` at it, prune old releases."""
    ddir = expand(req["deploy_dir"])
    release = req["release"]
    rpath = os.path.join(ddir, "releases", release)
    launcher = os.path.join(rpath, "launch.py")
    if not os.path.isfile(launcher):
        raise HostError("%s is missing" % launcher)
    point_current(ddir, release)
    python = req.get("python") or "python3"
    if same_interpreter(python):
        code, out, err = run_forked(python, launcher)
    else:
        code, out, err = run_subprocess(python, launcher)
    lines = out.decode("utf-8", "replace").strip().splitlines()
    try:
        record = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise HostError("launch.py failed (exit %d): %s" % (
            code, (err or out).decode("utf-8", "replace").strip()[-2000:]))
    if "error" in record:
        raise HostError(record["error"], kind="launch_failed")
    removed = prune(ddir, int(req.get("keep", 5)))
    return {"server": record, "pruned": removed}


def same_interpreter(python):
    """True when `python` is the command word this agent was started with: resolved through
    the same PATH, it is this interpreter (sys.orig_argv: Python >= 3.10)."""
    orig = getattr(sys, "orig_argv", None)
    return bool(orig) and orig[0] == python


def run_subprocess(python, launcher):
    import subprocess
    proc = subprocess.run([python, launcher], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=LAUNCH_TIMEOUT_S)
    return proc.returncode, proc.stdout, proc.stderr


def run_forked(python, launcher):
    """(exit code, stdout, stderr) of launch.py run in a forked child of this agent."""
    try:  # here, not in the child: whatever the child allocates first costs it copied pages
        with open(launcher, "rb") as f:
            program = compile(f.read(), launcher, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, OSError):  # as the interpreter would report it: exit 1
        import traceback
        return 1, b"", traceback.format_exc().encode("utf-8", "replace")
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    import warnings
    with warnings.catch_warnings():  # 3.12+ warns of fork with threads: the watchdog's poll() holds no lock
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child never returns into the agent
        code = 1
        try:
            code = _child(python, launcher, program, out_w, err_w)
        except BaseException:
            try:
                import traceback
                os.write(2, traceback.format_exc().encode("utf-8", "replace"))
            except BaseException:
                pass
        finally:
            os._exit(code)
    os.close(out_w)
    os.close(err_w)
    try:
        out, err = _read_both(out_r, err_r, time.monotonic() + LAUNCH_TIMEOUT_S)
    except TimeoutError:
        _kill(pid)
        raise HostError("launch.py did not return within %d s" % LAUNCH_TIMEOUT_S)
    finally:
        os.close(out_r)
        os.close(err_r)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out, err


def _child(python, launcher, program, out_w, err_w):
    """In the forked child: look like a fresh `python launch.py`, run it, give its exit code."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.closerange(3, _max_fd())  # the lock file, the agent's pipes, these ends
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False, errors="backslashreplace")
    here = os.path.dirname(launcher)
    agent_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:] = [here] + [p for p in sys.path if os.path.abspath(p or ".") != agent_dir]
    sys.argv[:] = [launcher]
    namespace = {"__name__": "__main__", "__file__": launcher, "__builtins__": __builtins__}
    _retitle([python, launcher])
    try:
        exec(program, namespace)
        rc = 0
    except SystemExit as e:  # what the interpreter would make of it
        if e.code is None or isinstance(e.code, int):
            rc = e.code or 0
        else:
            sys.stderr.write("%s\n" % (e.code,))
            rc = 1
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return rc


def _retitle(words):
    """Make /proc/self/cmdline (what `ps`, `fab stop` and kill-gpu-procs show) read `words`, as
    for a fresh `PYTHON launch.py`: a forked child's argument area still holds the agent's
    command line. Written through /proc/self/mem (the area is at least as long: the agent's
    bootstrap is on it); left as it is where that is refused."""
    new = b"\0".join(w.encode("utf-8", "surrogateescape") for w in words) + b"\0"
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: fields 48 and 49
        if len(new) <= end - start:
            with open("/proc/self/mem", "r+b", buffering=0) as mem:
                mem.seek(start)
                mem.write(new.ljust(end - start, b"\0"))
    except (OSError, ValueError, IndexError):
        pass


def _max_fd():
    try:
        return max(int(n) for n in os.listdir("/proc/self/fd")) + 1
    except (OSError, ValueError):
        return os.sysconf("SC_OPEN_MAX")


def _read_both(out_r, err_r, deadline):
    """Both pipes to EOF (the child and, until it redirects, the reaper it forks hold them)."""
    chunks = {out_r: [], err_r: []}
    open_fds = [out_r, err_r]
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        ready, _, _ = select.select(open_fds, [], [], left)
        for fd in ready:
            data = os.read(fd, 65536)
            if data:
                chunks[fd].append(data)
            else:
                open_fds.remove(fd)
    return b"".join(chunks[out_r]), b"".join(chunks[err_r])


def _kill(pid):
    import signal
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except OSError:
        pass

