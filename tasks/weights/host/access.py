"""Host side of `fab pull`: its locks and the access it grants between hosts.

Ops (ops.py): weights_prepare (lock the destinations, create them, install this pull's
receiver, drop what pulls that are no longer running left authorised), weights_grant and
weights_revoke (the pull's own SSH key, authorised here only while the pull runs).

Two pulls at once on one host: each pull holds a flock on `<pull id>.lock` for as long as
its agent lives (the flock dies with it, however the pull ends), so a later pull removes
only what a pull that is no longer running left (its authorized_keys line, its key files),
never a running pull's. Each destination is locked too: exclusively for the pull that
writes it, shared on each directory above it (a pull of /m and one of /m/drafter exclude
each other; /m/a and /m/b run side by side); a destination another running pull holds is
refused, naming that pull. authorized_keys is edited under a lock of its own, so two
pulls' edits never lose each other's lines. Standard library only; Python >= 3.9.
"""
import fcntl
import hashlib
import json
import os
import sys
import time

from .receiver import PULL_DIR, _host_error
from ...base.host.statefiles import not_writable

MARK = "llmfab-pull"                     # comment of every authorized_keys line a pull adds
SAFE = __import__("re").compile(r"^[A-Za-z0-9_./+-]+$")  # what may stand in an authorized_keys command=
_HELD = {}                               # lock file -> fd, held for the agent's life


def _base():
    base = os.path.expanduser(PULL_DIR)
    os.makedirs(base, mode=0o700, exist_ok=True)
    return base


def _flock(path, mode):
    """Take `mode` (LOCK_EX / LOCK_SH) on `path` without waiting: -> fd, or None when another
    holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _running(pull):
    """Is pull `pull` still running on this host (an agent holds its lock)?"""
    path = os.path.join(_base(), pull + ".lock")
    if path in _HELD:
        return True
    if not os.path.exists(path):
        return False
    fd = _flock(path, fcntl.LOCK_EX)
    if fd is None:
        return True
    os.close(fd)
    return False


def _dest_lock(path):
    key = hashlib.sha256(os.path.normpath(path).encode()).hexdigest()[:24]
    locks = os.path.join(_base(), "locks")
    os.makedirs(locks, mode=0o700, exist_ok=True)
    return os.path.join(locks, key + ".lock")


def _holder(path):
    try:
        with open(os.path.join(os.path.dirname(path), os.path.basename(path) + ".who")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def lock_destinations(pull, paths):
    """This pull's locks: its own, then each destination (see the module docstring). A
    destination held by another running pull -> HostError (kind busy) naming it."""
    base = _base()
    me = os.path.join(base, pull + ".lock")
    if me not in _HELD:
        fd = _flock(me, fcntl.LOCK_EX)
        if fd is None:
            raise _host_error("pull %s is already running here" % pull, "busy")
        _HELD[me] = fd
    own = {os.path.normpath(p) for p in paths}
    above = set()
    for p in own:
        head = os.path.dirname(p)
        while head and head not in above:
            above.add(head)
            if head == "/":
                break
            head = os.path.dirname(head)
    wanted = [(p, fcntl.LOCK_EX) for p in sorted(own)] + [
        (p, fcntl.LOCK_SH) for p in sorted(above - own)]
    who = {"pull": pull, "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "from": (os.environ.get("SSH_CONNECTION", "").split() or ["this host"])[0],
           "paths": sorted(own)}
    for p, mode in wanted:
        lock = _dest_lock(p)
        if lock in _HELD:
            continue
        fd = _flock(lock, mode)
        if fd is None:
            other = _holder(lock) if mode == fcntl.LOCK_EX else {}
            busy = [q for q in other.get("paths", ()) if q == p or q.startswith(p.rstrip("/") + "/")
                    or p.startswith(q.rstrip("/") + "/")] if other else []
            named = ("pull %s (started %s from %s, agent pid %s)"
                     % (other["pull"], other.get("since"), other.get("from"), other.get("pid"))
                     if other.get("pull") else "another fab pull")
            raise _host_error(
                "%s is being written by %s%s: two pulls never write one directory at once; "
                "wait for it to end, then pull again (pulls of other directories run side by side)"
                % (p, named, " (%s)" % ", ".join(busy) if busy and busy != [p] else ""), "busy")
        _HELD[lock] = fd
        if mode == fcntl.LOCK_EX:
            tmp = lock + ".who.%d.tmp" % os.getpid()
            with open(tmp, "w") as f:
                json.dump(who, f)
            os.rename(tmp, lock + ".who")
    return who


def unlock_destinations(pull):
    """Release every lock this agent holds for pull `pull` (its own and the destinations')."""
    for path, fd in list(_HELD.items()):
        os.close(fd)
        del _HELD[path]


def op_weights_lock(pull, paths):
    """Take pull `pull`'s locks on `paths` before anything there is read or written (the plan
    records verified files): -> who holds them now; a busy one is a HostError naming its pull."""
    if not SAFE.match(pull):
        raise _host_error("bad pull id %r" % pull, "bad_input")
    return lock_destinations(pull, paths)


def op_weights_prepare(pull, dirs):
    """Lock the destinations (`dirs`: [{path, subdirs}]), create each and the subdirectories
    its files go in; install this file's sibling receiver (the agent's own copy, as it was
    shipped) as pull `pull`'s receiver; remove what pulls no longer running left authorised.
    -> `receiver`, `stale_removed`."""
    if not SAFE.match(pull):
        raise _host_error("bad pull id %r" % pull, "bad_input")
    lock_destinations(pull, [d["path"] for d in dirs])
    try:
        for d in dirs:
            for sub in [""] + list(d.get("subdirs", ())):
                os.makedirs(os.path.join(d["path"], sub), exist_ok=True)
    except OSError as e:
        raise _host_error("cannot create %s: %s" % (d["path"], e.strerror or e), "write_failed")
    for d in dirs:  # there already, but what it lacks cannot be written into it
        why = not_writable(d["path"]) if d.get("need", 1) else None
        if why:
            raise _host_error("cannot pull into %s: %s; choose a writable destination" % (d["path"], why),
                              "write_failed")
    base = _base()
    removed = _revoke(None)
    receiver = os.path.join(base, pull + ".receive.py")
    tmp = receiver + ".%d.tmp" % os.getpid()
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "receiver.py")
    with open(here, "rb") as src, open(tmp, "wb") as f:
        f.write(src.read())
    os.rename(tmp, receiver)
    roots = os.path.join(base, pull + ".json")
    with open(roots + ".tmp", "w") as f:
        json.dump({"roots": [d["path"] for d in dirs]}, f)
    os.rename(roots + ".tmp", roots)
    return {"receiver": receiver, "stale_removed": removed}


def _authorized_keys():
    return os.path.expanduser(os.path.join("~", ".ssh", "authorized_keys"))


class _KeysLock:
    """authorized_keys is read, changed and renamed by one pull at a time (waits: an edit
    takes milliseconds)."""

    def __enter__(self):
        self.fd = os.open(os.path.join(_base(), "authorized_keys.lock"),
                          os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def op_weights_grant(pull, public, private, sources, known_hosts, expiry):
    """Authorise the pull's public key `public` here for hosts `sources` (IPs) only, as the
    forced command `python <pull>.receive.py PULL` (no pty, no forwarding), expiring at
    `expiry` (UTC, YYYYMMDDHHMM); and keep its private key `private` here to feed other hosts."""
    receiver = os.path.join(_base(), pull + ".receive.py")
    for value in [sys.executable, receiver, pull] + list(sources):
        if not SAFE.match(value):
            raise _host_error("cannot authorise the pull's key: %r holds characters an "
                              "authorized_keys command may not" % value, "bad_input")
    opts = ('from="%s",command="%s -S %s %s",no-pty,no-port-forwarding,no-agent-forwarding,'
            'no-X11-forwarding,no-user-rc,expiry-time="%sZ"'
            % (",".join(sources), sys.executable, receiver, pull, expiry))
    line = "%s %s %s:%s\n" % (opts, public.strip(), MARK, pull)
    path = _authorized_keys()
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with _KeysLock():
        with open(path, "a") as f:
            f.write(line)
    key = os.path.join(_base(), pull + ".key")
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(private)
    kh = os.path.join(_base(), pull + ".known_hosts")
    with open(kh, "w") as f:
        f.write("".join(l + "\n" for l in known_hosts))
    return {"key": key, "known_hosts": kh}


def _pull_of(line):
    tail = line.rstrip("\n").rsplit(" ", 1)[-1]
    return tail[len(MARK) + 1:] if tail.startswith(MARK + ":") else None


def _revoke(pull):
    """Remove the authorized_keys lines of pull `pull` and its files (None: of every pull
    that is no longer running; a running pull's stay); -> how many lines went."""
    def gone(p):
        return p == pull if pull is not None else not _running(p)

    path = _authorized_keys()
    removed = 0
    with _KeysLock():
        try:
            with open(path) as f:
                lines = f.readlines()
        except OSError:
            lines = None
        if lines is not None:
            keep = [l for l in lines if _pull_of(l) is None or not gone(_pull_of(l))]
            removed = len(lines) - len(keep)
            if removed:
                tmp = path + ".llmfab.tmp"
                with open(tmp, "w") as f:
                    f.writelines(keep)
                os.chmod(tmp, os.stat(path).st_mode & 0o777)
                os.rename(tmp, path)
    base = _base()
    try:
        names = os.listdir(base)
    except OSError:
        names = []
    for name in names:
        owner = name.split(".")[0]
        if name.endswith((".key", ".known_hosts", ".json", ".receive.py", ".lock")) and \
                name != "authorized_keys.lock" and gone(owner):
            try:
                os.unlink(os.path.join(base, name))
            except OSError:
                pass
    return removed


def op_weights_revoke(pull=None, unlock=False):
    """Remove what pull `pull` authorised here (None: what every pull no longer running
    left), and with `unlock` its locks: -> `removed` lines."""
    removed = _revoke(pull)
    if pull and unlock:
        unlock_destinations(pull)
    return {"removed": removed}
