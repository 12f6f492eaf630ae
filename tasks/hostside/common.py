"""Shared by the host-side modules: the error type, per-agent state, small file helpers."""
import json
import os
import sys
import time

# State that lives as long as the agent process (e.g. open lock files).
CONTEXT = {}


class HostError(Exception):
    """An expected failure, reported to llmfab as a message (not a traceback)."""

    def __init__(self, message, kind="failed", **data):
        super().__init__(message)
        self.kind = kind
        self.data = data


def site_packages():
    """Put the interpreter's site-packages (and its .pth files) on sys.path, once.

    The agent runs with `python -S` (tasks/agentpayload.py AGENT_FLAGS): most tasks need only the
    standard library, and an ML environment's site start-up (dozens of .pth files) is paid
    by every task on every host otherwise. What looks up an installed package (the engine's
    version, Ray) calls this first; site.main() is what the interpreter would have run."""
    if sys.flags.no_site and not CONTEXT.get("site"):
        import site
        site.main()
    CONTEXT["site"] = True


def utc_iso(t=None):
    """2026-12-01T11:00:00+00:00: datetime's isoformat(timespec="seconds") in UTC, without
    importing datetime on every agent start."""
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t))


def which(name):
    """shutil.which(name) for an executable, without importing shutil (bz2, lzma, fnmatch)."""
    if os.sep in name:
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    for d in (os.environ.get("PATH") or os.defpath).split(os.pathsep):
        path = os.path.join(d or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def remove_tree(path):
    """shutil.rmtree(path, ignore_errors=True) for a release directory, without importing
    shutil (it loads bz2 and lzma: ~4 ms of the deploy that prunes). Walks by directory
    descriptors (os.fwalk) and never follows a symlink, as shutil's own safe version."""
    try:
        walk = os.fwalk(path, topdown=False, follow_symlinks=False)
        for _root, dirs, files, fd in walk:
            for name in files:
                _ignore(os.unlink, name, dir_fd=fd)
            for name in dirs:  # a symlink to a directory is listed here: unlinked, not entered
                try:
                    os.rmdir(name, dir_fd=fd)
                except NotADirectoryError:
                    _ignore(os.unlink, name, dir_fd=fd)
                except OSError:
                    pass
        os.rmdir(path)
    except OSError:
        pass


def _ignore(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except OSError:
        pass


def expand(path):
    return os.path.abspath(os.path.expanduser(path))


def read_json(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


# A release's end as the reaper (or the supervisor) records it, and the stop that caused it:
# whoever stops a server on purpose (`fab stop`, a redeploy, a rollback) writes STOP_FILE
# into its release first, so what the server prints while it shuts down (vLLM 0.32 can log
# `EngineDeadError` on SIGTERM) is never read as a failure. Keyed by the server's pid: a
# later run of the same release (rollback relaunches it) is not covered by an old stop.
EXIT_FILE, STOP_FILE = "exit.json", "stopped.json"


def read_exit(rdir, pid=None):
    """exit.json of the release directory `rdir` (None while it runs or if it never ran), with
    `stopped` = the stop record when the run of `pid` (default: any) was stopped on purpose."""
    ex = read_json(os.path.join(rdir, EXIT_FILE))
    if ex is None:
        return None
    stop = read_json(os.path.join(rdir, STOP_FILE))
    if stop and (pid is None or stop.get("pid") in (None, pid)):
        ex["stopped"] = stop
    return ex


def write_json(path, data, mode=0o644):
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
        f.write("\n")
    os.replace(tmp, path)


def pid_alive(pid):
    """True if pid exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def group_members(pgid):
    """Live pids whose process group is pgid."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(name))
    return out


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _mount_ns(pid="self"):
    try:
        return os.stat("/proc/%s/ns/mnt" % pid).st_ino
    except OSError:
        return None


def pids_marked(matches):
    """Live pids, other than this agent, one of whose environment items satisfies matches(item).

    Only processes that see this agent's filesystem count: the same marker path in another
    mount namespace (a container sharing the PID namespace) belongs to another deployment.
    """
    me, mnt = os.getpid(), _mount_ns()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        if mnt is not None and _mount_ns(name) != mnt:
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if any(matches(item) for item in env) and pid_alive(int(name)):
            out.append(int(name))
    return out
