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

    The agent runs with `python -S` (tasks/transport/agent_code.py AGENT_FLAGS): most tasks need only the
    standard library, and an ML environment's site start-up (dozens of .pth files) is paid
    by every task on every host otherwise. What looks up an installed package (the engine's
    version, Ray) calls this first; site.main() is what the interpreter would have run."""
    if sys.flags.no_site and not CONTEXT.get("site"):
        import site
        site.main()
    CONTEXT["site"] = True


def signal_name(num):
    """SIGKILL for 9; `signal 77` for a number with no name."""
    import signal
    try:
        return signal.Signals(num).name
    except ValueError:
        return "signal %d" % num


def exit_words(returncode):
    """How a process ended, in the one wording every llmfab message uses (status, releases,
    explanations, the supervisor's restart marker): `exited with status 3`, `killed by SIGKILL`.
    `returncode` as Popen gives it (negative: the signal)."""
    if returncode is None:
        return "ended with no exit status"
    if returncode < 0:
        return "killed by " + signal_name(-returncode)
    return "exited with status %d" % returncode


# What an OSError (a socket, a file, a URL) means, in the words a person reads: never Python's
# "[Errno 111] Connection refused" or "<urlopen error ...>". errno values: errno(3) / Linux.
ERRNO_WORDS = {
    "ECONNREFUSED": "connection refused",
    "ETIMEDOUT": "timed out",
    "EHOSTUNREACH": "no route to host",
    "EHOSTDOWN": "host is down",
    "ENETUNREACH": "network unreachable",
    "ECONNRESET": "connection reset",
    "ECONNABORTED": "connection aborted",
    "EPIPE": "connection closed",
    "EADDRINUSE": "address already in use",
    "EADDRNOTAVAIL": "address not available on this host",
    "ENOENT": "no such file or directory",
    "EACCES": "permission denied",
    "ENOSPC": "no space left on device",
}
# Errors with no errno, by type name (http.client's, without importing it): what happened.
TYPE_WORDS = {
    "RemoteDisconnected": "the server closed the connection without answering",
    "IncompleteRead": "the answer ended early",
    "BadStatusLine": "not an HTTP answer",
    "LineTooLong": "not an HTTP answer (a line too long)",
}


def error_words(e):
    """One failure in words for a human line (and an `error` string in JSON): `connection
    refused`, `timed out`, `no route to host`, `name not resolved`; from the errno or the
    exception's type, never its repr. A URLError is worded by the error it wraps."""
    import _socket  # the C module: socket.py's enums cost ~5 ms at import
    import errno
    for _ in range(4):  # URLError(reason=OSError(...)), at most a few deep
        reason = getattr(e, "reason", None)
        if isinstance(reason, BaseException):
            e = reason
        elif isinstance(reason, str) and isinstance(e, OSError) and e.errno is None:
            return reason  # URLError("unknown url type: ...")
        else:
            break
    if isinstance(e, _socket.gaierror):
        return "name not resolved"
    if isinstance(e, (_socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(e, OSError) and isinstance(e.errno, int) and e.errno > 0:
        words = ERRNO_WORDS.get(errno.errorcode.get(e.errno, ""))
        if words:
            return words
        if e.strerror:
            return e.strerror[:1].lower() + e.strerror[1:]
    words = TYPE_WORDS.get(type(e).__name__)
    if words:
        return words
    return str(e).strip() or ("connection closed" if isinstance(e, EOFError) else type(e).__name__)


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


class Damaged(HostError):
    """A state file llmfab wrote (server.json, a release's exit.json, ...) that is there but is
    not the JSON object it wrote: a disk that filled, an editor, a hand. Never read as absent
    (a running server would look "not deployed"), never a traceback."""

    def __init__(self, path, why):
        super().__init__("%s is damaged (%s): llmfab wrote it as a JSON object and cannot tell what it "
                         "held, so nothing was changed; move it aside and run the task again (`fab stop` "
                         "then ends this deployment's processes by their identity)"
                         % (path, why), kind="damaged", path=path)


def not_writable(path):
    """Why nothing can be written under `path` (its nearest existing ancestor: what would be
    created there), or None: a read-only file system, or no write permission for this user.
    Reads only: a check creates nothing."""
    path = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "%s is on a read-only file system" % path
    except OSError as e:
        return "cannot look at %s: %s" % (path, e.strerror or e)
    if not os.path.isdir(path):
        return "%s is not a directory" % path
    if not os.access(path, os.W_OK | os.X_OK):
        import pwd
        try:
            user = pwd.getpwuid(os.geteuid()).pw_name
        except KeyError:
            user = "uid %d" % os.geteuid()
        return "%s is not writable by %s" % (path, user)
    return None


def read_json(path, default=None):
    """The JSON object in `path` (a state file of llmfab's), or `default` where there is none.
    Raises Damaged where the file is there and unreadable, not JSON, or not an object."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return default
    except OSError as e:
        raise Damaged(path, "cannot be read: %s" % (e.strerror or e))
    try:
        value = json.loads(data.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError included
        raise Damaged(path, "not JSON: %s" % e)
    if not isinstance(value, dict):
        raise Damaged(path, "a JSON %s, not an object" % type(value).__name__)
    return value


# A release's end as the reaper (or the supervisor) records it, and the stop that caused it:
# whoever stops a server on purpose (`fab stop`, a redeploy, a rollback) writes STOP_FILE
# into its release first, so what the server prints while it shuts down (vLLM 0.32 can log
# `EngineDeadError` on SIGTERM) is never read as a failure. Keyed by the server's pid: a
# later run of the same release (rollback relaunches it) is not covered by an old stop.
EXIT_FILE, STOP_FILE = "exit.json", "stopped.json"


def read_stop(rdir, pid=None):
    """The stop record (STOP_FILE) of the run of `pid` (default: any), or None."""
    stop = read_json(os.path.join(rdir, STOP_FILE))
    return stop if stop and (pid is None or stop.get("pid") in (None, pid)) else None


def read_exit(rdir, pid=None):
    """exit.json of the release directory `rdir` (None while it runs or if it never ran), with
    `stopped` = the stop record when the run of `pid` (default: any) was stopped on purpose."""
    ex = read_json(os.path.join(rdir, EXIT_FILE))
    if ex is None:
        return None
    stop = read_stop(rdir, pid)
    if stop:
        ex["stopped"] = stop
    return ex


def write_atomically(path, data, mode=0o644):
    """Replace `path` with `data` (bytes or text) in one rename: a reader sees the old file or
    the new one, never half of one. The file gets exactly `mode` whatever the umask; on a
    failure nothing is left behind. Every state file llmfab writes goes through here: never
    through a link or onto a FIFO or device planted at its name (safefile.replace)."""
    from .safefile import replace
    return replace(path, data, mode)


def write_json(path, data, mode=0o644):
    """`data` as one line of JSON in `path`, replaced atomically."""
    return write_atomically(path, json.dumps(data) + "\n", mode)


# Reading /proc, once for every module of this package (the supervisor's included).
PROC = "/proc"
GONE = ("Z", "X")  # zombie or dead: the pid exists but the process does not run


def pids(proc_root=PROC):
    """Every pid of this PID namespace."""
    return [int(name) for name in os.listdir(proc_root) if name.isdigit()]


def read_bytes(path):
    """The bytes of a file, or None when it cannot be read (gone, not ours)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def proc_read(pid, name, proc_root=PROC):
    """The bytes of /proc/<pid>/<name>, or None when the process is gone or not ours to read."""
    return read_bytes("%s/%s/%s" % (proc_root, pid, name))


def stat_fields(pid, proc_root=PROC):
    """/proc/<pid>/stat after the command name: [state, ppid, pgrp, ...], or None if gone."""
    data = proc_read(pid, "stat", proc_root)
    fields = data.rsplit(b")", 1)[1].decode().split() if data and b")" in data else None
    return fields or None


def fd_targets(pid, proc_root=PROC):
    """What the open descriptors of `pid` point at ("socket:[123]", "/dev/nvidia0", ...);
    [] when it is gone or not ours to read."""
    fd_dir = "%s/%s/fd" % (proc_root, pid)
    out = []
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return out
    for fd in fds:
        try:
            out.append(os.readlink(os.path.join(fd_dir, fd)))
        except OSError:
            continue
    return out


def pid_alive(pid):
    """True if pid exists and is not a zombie."""
    fields = stat_fields(pid)
    return bool(fields) and fields[0] not in GONE


# In the environment of every process a launcher starts (launch.py): which release it serves.
MARKER = b"LLMFAB_RELEASE="


def release_marker(ddir, release=None):
    """The marker item's prefix for the releases under ddir (or that one release)."""
    path = os.path.join(ddir, "releases", release) if release else os.path.join(ddir, "releases")
    return MARKER + path.encode()


def group_members(pgid):
    """Live pids whose process group is pgid."""
    out = []
    for pid in pids():
        fields = stat_fields(pid)
        if fields and int(fields[2]) == pgid and fields[0] not in GONE:
            out.append(pid)
    return out


def kill_each(pids, sig):
    """`sig` once to each pid; one already gone, or not ours to signal, is passed over."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def cmdline(pid, proc_root=PROC):
    """The process's argv joined by spaces ("" when gone; kernel threads have none)."""
    raw = proc_read(pid, "cmdline", proc_root) or b""
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()


def _mount_ns(pid="self"):
    try:
        return os.stat("/proc/%s/ns/mnt" % pid).st_ino
    except OSError:
        return None


def pids_marked(matches):
    """Live pids, other than this process, one of whose environment items satisfies matches(item).

    Only processes that see this process's filesystem count: the same marker path in another
    mount namespace (a container sharing the PID namespace) belongs to another deployment.
    """
    me, mnt = os.getpid(), _mount_ns()
    out = []
    for pid in pids():
        if pid == me or (mnt is not None and _mount_ns(pid) != mnt):
            continue
        env = (proc_read(pid, "environ") or b"").split(b"\0")
        if any(matches(item) for item in env) and pid_alive(pid):
            out.append(pid)
    return out
