"""Deployment directory, releases, the deploy lock and the launch itself (host side).

    <workdir>/<name>/releases/<UTC stamp>/   launch.py argv.json profile.toml server.log
    <workdir>/<name>/current -> releases/<stamp>
    <workdir>/<name>/server.json
    <workdir>/<name>/.lock
"""
import base64
import datetime
import errno
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import time

from .common import CONTEXT, HostError, expand, pid_alive, read_json

STAMP_FORMAT = "%Y%m%dT%H%M%SZ"


def _deploy_dir(req):
    return expand(req["deploy_dir"])


def op_lock(req):
    """Take the deployment's lock (flock: dies with this agent) or report its holder."""
    ddir = _deploy_dir(req)
    os.makedirs(ddir, mode=0o700, exist_ok=True)
    path = os.path.join(ddir, ".lock")
    locks = CONTEXT.setdefault("locks", {})
    if path in locks:
        return {"path": path}
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    ended = None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _holder(fd)
        ended = _end_stale_agent(fd, holder, req.get("stale_agent"))
        if ended is None:
            os.close(fd)
            raise HostError("locked", kind="lock_held", holder=holder)
    info = {
        "user": req.get("user") or "?",
        "from": req.get("client") or "?",
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "task": req.get("task") or "?",
        "since": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    locks[path] = fd
    return {"path": path, "ended_stale_agent": ended}


def _holder(fd):
    raw = os.pread(fd, 4096, 0).decode("utf-8", "replace")
    try:
        return json.loads(raw)
    except ValueError:
        return {"raw": raw}


def _end_stale_agent(fd, holder, stale_pid):
    """The client lost its connection to the agent `stale_pid` (a hung, half-open SSH
    session the host has not noticed) and came back. If that very agent still holds the
    lock, end it and take the lock: it serves nobody. Returns its pid, or None."""
    if not stale_pid or not isinstance(holder, dict) or holder.get("pid") != stale_pid \
            or holder.get("host") != socket.gethostname() or stale_pid == os.getpid():
        return None
    try:
        with open("/proc/%d/cmdline" % stale_pid, "rb") as f:
            if b"llmfab_host" not in f.read():  # the pid was reused: not our agent
                return None
        os.kill(stale_pid, signal.SIGKILL)
    except OSError:
        pass
    deadline = time.monotonic() + 5
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return stale_pid
        except OSError:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)


def op_unlock(req):
    path = os.path.join(_deploy_dir(req), ".lock")
    fd = CONTEXT.setdefault("locks", {}).pop(path, None)
    if fd is not None:
        os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor drops the flock
    return {}


def op_new_release(req):
    """Create releases/<UTC stamp>[-N] (0700) and return its absolute path."""
    ddir = _deploy_dir(req)
    rdir = os.path.join(ddir, "releases")
    os.makedirs(rdir, mode=0o700, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime(STAMP_FORMAT)
    for n in range(1, 1000):
        name = stamp if n == 1 else "%s-%d" % (stamp, n)
        path = os.path.join(rdir, name)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        os.chmod(path, 0o700)
        return {"release": name, "path": path, "deploy_dir": ddir}
    raise HostError("could not allocate a release directory under %s" % rdir)


def op_discard_release(req):
    """Remove a release that never launched (e.g. the push failed). Never the current one."""
    ddir = _deploy_dir(req)
    path = os.path.join(ddir, "releases", req["release"])
    if _current_release(ddir) != req["release"] and os.path.isdir(path) \
            and not os.path.exists(os.path.join(path, "server.log")):
        shutil.rmtree(path, ignore_errors=True)
    return {}


def _current_release(ddir):
    try:
        return os.path.basename(os.readlink(os.path.join(ddir, "current")))
    except OSError:
        return None


def _point_current(ddir, release):
    tmp = os.path.join(ddir, ".current.tmp")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(os.path.join("releases", release), tmp)
    os.replace(tmp, os.path.join(ddir, "current"))


def releases_sorted(ddir):
    try:
        names = [n for n in os.listdir(os.path.join(ddir, "releases")) if not n.startswith(".")]
    except FileNotFoundError:
        return []

    def key(n):
        base, _, suffix = n.partition("-")
        return (base, int(suffix) if suffix.isdigit() else 0)
    return sorted(names, key=key)


def prune(ddir, keep):
    """Remove the oldest releases beyond `keep`; never the current one or the one before it."""
    names = releases_sorted(ddir)
    current = _current_release(ddir)
    protected = {current}
    if current in names:
        idx = names.index(current)
        if idx > 0:
            protected.add(names[idx - 1])
    removed = []
    excess = len(names) - keep
    for n in names:
        if excess <= 0:
            break
        if n in protected:
            continue
        shutil.rmtree(os.path.join(ddir, "releases", n), ignore_errors=True)
        removed.append(n)
        excess -= 1
    return removed


def op_launch(req):
    """Run the release's launch.py (no shell), point `current` at it, prune old releases."""
    ddir = _deploy_dir(req)
    release = req["release"]
    rpath = os.path.join(ddir, "releases", release)
    launcher = os.path.join(rpath, "launch.py")
    if not os.path.isfile(launcher):
        raise HostError("%s is missing" % launcher)
    _point_current(ddir, release)
    proc = subprocess.run(
        [req.get("python") or "python3", launcher], stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60,
    )
    lines = proc.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        record = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise HostError("launch.py failed (exit %d): %s" % (
            proc.returncode, (proc.stderr or proc.stdout).decode("utf-8", "replace").strip()[-2000:]))
    if "error" in record:
        raise HostError(record["error"], kind="launch_failed")
    removed = prune(ddir, int(req.get("keep", 5)))
    return {"server": record, "pruned": removed}


def op_state(req):
    """server.json, whether its process group is alive, and how the server ended if it did."""
    ddir = _deploy_dir(req)
    server = read_json(os.path.join(ddir, "server.json"))
    current = _current_release(ddir)
    out = {"deploy_dir": ddir, "exists": os.path.isdir(ddir), "server": server,
           "current": current, "alive": False, "exit": None}
    if server:
        out["alive"] = pid_alive(server["pid"])
        out["exit"] = read_json(os.path.join(ddir, "releases", server["release"], "exit.json"))
        out["now"] = time.time()
    return out


def op_put_file(req):
    """Write `data` (base64) to the absolute `path`, byte for byte, with `mode` (0o644).

    How llmfab pushes a release's files (tasks/transport.py Host.put): on the agent's own
    channel, so a deploy needs one remote command, not a second one for SFTP."""
    path, mode = req["path"], req.get("mode", 0o644)
    data = base64.b64decode(req["data"])
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), mode)
    except OSError as e:
        hint = " (is the disk full?)" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        raise HostError("could not write %s: %s%s" % (path, e.strerror or e, hint), kind="write_failed")
    return {"bytes": len(data)}


OPS = {
    "put_file": op_put_file,
    "lock": op_lock,
    "unlock": op_unlock,
    "new_release": op_new_release,
    "discard_release": op_discard_release,
    "launch": op_launch,
    "state": op_state,
}
