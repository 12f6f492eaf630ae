"""Running a release's launch.py (no shell), pointing `current` at it, pruning.

launch.py runs as its own process, `PYTHON -I -S launch.py` with the profile's interpreter
(LAUNCHER_FLAGS; run by hand without them it restarts itself so): stdin /dev/null, stdout
and stderr read here, no descriptor of the agent's inherited (the deploy lock and the SSH
channel stay with the agent). It forks the reaper that leads the server's session and returns
at once, printing the server record as its last line of output.
"""
import errno
import json
import os
import subprocess

from ...base.host.hosterrors import HostError, exit_words
from ...base.host.statefiles import expand
from ...base.host.layout import FAILED_FILE, KEEP_RELEASES, PYTHON, point_current
from .release_dirs import prune
from ...base.host.statefiles import utc_iso, write_json
from ...runtime.host import runtimes

LAUNCH_TIMEOUT_S = 60
# Isolated, without site: neither the host's PYTHONPATH/PYTHONHOME nor a site's .pth files nor a
# file in the release directory can change what launch.py and its supervisor import. The
# server's own environment is untouched (launch.py passes it on as it is).
LAUNCHER_FLAGS = ("-I", "-S")

# Why a server's command could not even be executed, by errno: (cause, fix), `{argv0}` the
# program. Anything else: the system's own words. (execve(2) lists them.)
EXEC_FAILURES = {
    "EACCES": ("{argv0} cannot be executed: permission denied (not executable, or a directory "
               "on its path is not searchable)",
               "make it executable on the host (`chmod +x {argv0}`), or start it through its "
               "interpreter in server.command"),
    "ENOENT": ("{argv0} does not exist on the host (or its #! interpreter does not)",
               "install it there, or correct the path in server.command / server.python"),
    "E2BIG": ("the server's argv and environment are too long for the kernel (argument list "
              "too long: more than the host's ARG_MAX in all, or one value over 128 KiB)",
              "shorten what [server.args] / [server.env] send (pass a long value in a file, "
              "e.g. through [server] files)"),
    "ENOEXEC": ("{argv0} is not a program the kernel can run (no #! line, or built for another "
                "machine)", "add a #! line, or name its interpreter first in server.command"),
    "ETXTBSY": ("{argv0} is being written by another process", "wait until it is written, then deploy again"),
}
LAUNCHER_FIX = "run it by hand on the host to see why: {python} {launcher}"


def exec_failure(report):
    """(rule, cause, fix) for launch.py's report of an exec that failed."""
    if report.get("fix"):  # a container engine's refusal (tasks/runtime/host/container.py)
        return report.get("rule") or "cannot-exec", report["error"], report["fix"]
    name = errno.errorcode.get(report.get("errno"), "")
    words = EXEC_FAILURES.get(name)
    argv0 = report.get("argv0") or "the server's command"
    if words is None:
        return "cannot-exec", report["error"], "correct server.command (or server.python) for this host"
    return "cannot-exec", words[0].format(argv0=argv0), words[1].format(argv0=argv0)


def failed(rpath, rule, cause, fix, line=None, **data):
    """Record in the release that its server did not start (start-failed.json: `fab releases`,
    `fab status` and `fab rollback` read it), then the HostError to raise. Written here, on the
    host, so the record exists even when the client that asked is gone."""
    record = {"failed_at": utc_iso(), "rule": rule, "cause": cause, "fix": fix, "line": line}
    try:
        write_json(os.path.join(rpath, FAILED_FILE), record)
    except OSError:
        pass
    return HostError(cause, kind="launch_failed", rule=rule, fix=fix, line=line, **data)


def op_launch(deploy_dir, release, python=PYTHON, keep=KEEP_RELEASES):
    """Run the release's launch.py (no shell) with `python`, point `current` at it, and
    keep the newest `keep` releases."""
    ddir = expand(deploy_dir)
    rpath = os.path.join(ddir, "releases", release)
    launcher = os.path.join(rpath, "launch.py")
    if not os.path.isfile(launcher):
        raise HostError("%s is missing" % launcher)
    point_current(ddir, release)
    python = python or PYTHON
    fix = LAUNCHER_FIX.format(python=python, launcher=launcher)
    runtime, spec = runtimes.for_release(rpath)
    if runtime is not None:  # a systemd unit or a container runs it (tasks/runtime/host/)
        try:
            record = runtime.launch(ddir, rpath, spec, python)
        except HostError as e:
            raise failed(rpath, e.data.get("rule") or "runtime-failed", str(e), e.data.get("fix") or fix,
                         line=e.data.get("line")) from None
        return {"server": record, "pruned": prune(ddir, int(keep))}
    try:
        code, out, err = run_launcher(python, launcher)
    except HostError as e:  # the interpreter cannot run, or launch.py hangs
        raise failed(rpath, "launcher-failed", str(e), fix, errno=e.data.get("errno")) from None
    lines = out.decode("utf-8", "replace").strip().splitlines()
    try:
        record = json.loads(lines[-1])
    except (IndexError, ValueError):
        text = (err or out).decode("utf-8", "replace").strip()
        raise failed(rpath, "launcher-failed", "launch.py failed (%s): %s" % (
            _how(code), text[-2000:] or "no output"), fix, line=(text.splitlines() or [None])[-1]) from None
    if "error" in record:
        rule, cause, fix = exec_failure(record)
        raise failed(rpath, rule, cause, fix, line=record["error"],
                     errno=errno.errorcode.get(record.get("errno")))
    removed = prune(ddir, int(keep))
    return {"server": record, "pruned": removed}


def run_launcher(python, launcher):
    """(exit code, stdout, stderr) of `python -I -S launcher`. close_fds (subprocess's default)
    keeps the agent's descriptors out of it and of the server it starts."""
    try:
        proc = subprocess.run([python, *LAUNCHER_FLAGS, launcher], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise HostError("launch.py did not return within %g s" % LAUNCH_TIMEOUT_S)
    except OSError as e:
        raise HostError("cannot run %s %s: %s" % (python, launcher, e.strerror or e),
                        errno=errno.errorcode.get(e.errno))
    return proc.returncode, proc.stdout, proc.stderr


def _how(code):
    """`exit 1`, or `killed by SIGKILL` (hosterrors.exit_words: one wording for every end)."""
    return "exit %d" % code if code >= 0 else exit_words(code)
