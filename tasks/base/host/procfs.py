"""Reading /proc, once for every host module (the supervisor's included): pids, a process's
stat fields, command line, open descriptors, whether it is alive, its group's members, and the
live processes whose environment carries a marker. Standard library only (ships to hosts)."""
import os


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
