"""Host side of `fab pull`: what a model directory holds, each received file verified.

Ops (ops.py): weights_plan (which files are present and verified, which partial, free
space, this host's address), weights_prepare, weights_grant / weights_revoke (the pull's
own SSH key, authorised here only while the pull runs), weights_send (stream a verified
file to another host over SSH) and weights_manifest. Bytes arrive through `receive()`,
this very file run as a script (`python3 weights.py PULL_ID`): the controller runs it on
its own SSH connection, another host reaches it as the forced command of the pull's key.
It appends to `.NAME.llmfab-part` from the offset asked, checks size and sha256, and only
then renames to NAME. A file counts as verified without re-hashing when its size, mtime
and inode match what the last verification recorded (`.llmfab-verified.json`); `verify`
re-hashes all. Standard library only, no package imports (it runs alone); Python >= 3.9.
"""
import errno
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import time

PART = ".llmfab-part"
STAMPS = ".llmfab-verified.json"
CHUNK = 1 << 20
MARK = "llmfab-pull"                     # comment of every authorized_keys line a pull adds
PULL_DIR = os.path.join("~", ".cache", "llmfab", "pull")
# Between hosts, AES-GCM first: with AES-NI it costs about half the CPU per byte of
# OpenSSH's default chacha20-poly1305 (64 MiB host to host on the lab: 0.6 s against 1.5 s);
# the rest stay as the fallback for an sshd without it.
CIPHERS = ("aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,"
           "aes128-ctr,aes256-ctr")
SAFE = re.compile(r"^[A-Za-z0-9_./+-]+$")  # what may stand in an authorized_keys command=


class PullError(Exception):
    def __init__(self, message, kind="failed"):
        super().__init__(message)
        self.kind = kind


def _host_error(message, kind):
    try:
        from ...transport.host.common import HostError
    except ImportError:  # run as a script (receive): no package
        return PullError(message, kind)
    return HostError(message, kind=kind)


# Every file this module writes is opened without following a link, and a new one with O_EXCL
# (the model directory may be writable by others, and llmfab may run as root): a planted
# `.NAME.llmfab-part` or `sub/` link never makes it write outside the directory.
NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


def _create(path, mode):
    """A fresh file at `path` (fd), replacing a stale one of the same name, never through a link."""
    try:
        os.unlink(path)  # a link is removed itself, never followed
    except FileNotFoundError:
        pass
    return os.open(path, NEW, mode)


def _replace(path, text, mode=0o644):
    """`text` into `path` in one rename, from a fresh name nobody could have planted."""
    tmp = "%s.%d.%s.tmp" % (path, os.getpid(), os.urandom(4).hex())
    try:
        with os.fdopen(os.open(tmp, NEW, mode), "w") as f:
            f.write(text)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _open_under(root, head):
    """A descriptor of directory `head` (relative) under `root`, each step opened without
    following a link: a subdirectory planted as a link to elsewhere is refused (ELOOP/ENOTDIR)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for name in [p for p in head.split("/") if p]:
        try:
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        finally:
            os.close(fd)
        fd = nxt
    return fd


def part_name(rel):
    head, tail = os.path.split(rel)
    return os.path.join(head, "." + tail + PART)


def sha256_of(path, h=None, limit=None):
    h = h or hashlib.sha256()
    left = limit
    with open(path, "rb") as f:
        while left is None or left > 0:
            data = f.read(CHUNK if left is None else min(CHUNK, left))
            if not data:
                break
            h.update(data)
            if left is not None:
                left -= len(data)
    return h.hexdigest()


MANIFEST = "manifest.json"


def ours(rel):
    """llmfab's own names in a model directory (never a user's file, never an extra): its
    bookkeeping, their temporary files, and partial files `.NAME.llmfab-part`."""
    base = os.path.basename(rel)
    if rel in (MANIFEST, STAMPS, MANIFEST + ".tmp"):
        return True
    if rel == base and base.startswith((STAMPS + ".", MANIFEST + ".")) and base.endswith(".tmp"):
        return True
    return base.startswith(".") and base.endswith(PART)


def _walk(root):
    """Every file under `root`, as paths relative to it (sorted)."""
    found = []
    for top, subdirs, names in os.walk(root):
        subdirs.sort()
        rel_top = os.path.relpath(top, root)
        for name in sorted(names):
            found.append(name if rel_top == "." else os.path.join(rel_top, name))
    return found


def _previous(root):
    """{path: {path, size, sha256}} of the manifest an earlier `fab pull` wrote here, or {}."""
    try:
        with open(os.path.join(root, MANIFEST)) as f:
            data = json.load(f)
        if data.get("pulled_by") != "llmfab":
            return {}
        return {f["path"]: f for f in data["files"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _still_pulled(root, rel, rec, stamps):
    """Is `rel` still the very file an earlier pull put here (its size and sha256 as the
    manifest lists them)? A file the user replaced under the same name is not."""
    full = os.path.join(root, rel)
    try:
        st = os.stat(full)
        if st.st_size != rec["size"]:
            return False
        return stamps.get(rel) == [rec["sha256"]] + _stamp(st) or sha256_of(full) == rec["sha256"]
    except (OSError, KeyError):
        return False


def leftovers(root, wanted, stamps):
    """Files under `root` the source (paths `wanted`) lacks: -> (stale, extra). `stale`: an
    earlier pull's, unchanged (the pull removes them); `extra`: anything else (a user's own:
    never removed, only reported). llmfab's own names are neither."""
    if not os.path.isdir(root):
        return [], []
    prev = _previous(root)
    stale, extra = [], []
    for rel in _walk(root):
        if rel in wanted or ours(rel):
            continue
        if rel in prev and _still_pulled(root, rel, prev[rel], stamps):
            stale.append(rel)
        else:
            extra.append(rel)
    return stale, extra


def _stamps(root):
    try:
        with open(os.path.join(root, STAMPS)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _save_stamps(root, stamps):
    _replace(os.path.join(root, STAMPS), json.dumps(stamps))


def _stamp(st):
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _free(root):
    d = root
    while not os.path.isdir(d):
        d = os.path.dirname(d) or "/"
    st = os.statvfs(d)
    return st.f_bavail * st.f_frsize


def _address():
    """(ip, port) this host was reached at over SSH (SSH_CONNECTION), or (None, None)."""
    parts = os.environ.get("SSH_CONNECTION", "").split()
    return (parts[2], int(parts[3])) if len(parts) == 4 else (None, None)


def op_weights_plan(req):
    """For each model dir in `dirs` [{path, files: [{path, size, sha256}]}]: per file `ok`
    (present and verified), `part` (bytes of a partial file to resume from), `bad` (present,
    wrong); `need` (bytes still to receive), `free` (bytes free there). `verify`: re-hash
    every file. Also this host's SSH address and the files the receiver needs."""
    verify = bool(req.get("verify"))
    dirs = []
    for d in req["dirs"]:
        root = d["path"]
        stamps = _stamps(root)
        out, need = [], 0
        for f in d["files"]:
            full = os.path.join(root, f["path"])
            rec = {"path": f["path"], "ok": False, "part": 0, "bad": False}
            try:
                st = os.stat(full)
            except OSError:
                st = None
            if st is not None:
                known = stamps.get(f["path"])
                if not verify and known == [f["sha256"]] + _stamp(st):
                    rec["ok"] = True
                elif st.st_size == f["size"] and sha256_of(full) == f["sha256"]:
                    rec["ok"] = True
                    stamps[f["path"]] = [f["sha256"]] + _stamp(st)
                else:
                    rec["bad"] = True
                    stamps.pop(f["path"], None)
            if not rec["ok"]:
                try:
                    rec["part"] = min(os.path.getsize(os.path.join(root, part_name(f["path"]))),
                                      f["size"])
                except OSError:
                    pass
                need += f["size"] - rec["part"]
            out.append(rec)
        if os.path.isdir(root):
            try:
                _save_stamps(root, stamps)
            except OSError:
                pass  # a cache only; an unwritable directory is said by weights_prepare
        dirs.append({"path": root, "files": out, "need": need, "free": _free(root)})
    ip, port = _address()
    return {"dirs": dirs, "ip": ip, "port": port, "receiver": os.path.abspath(__file__)}


def op_weights_prepare(req):
    """Create each model directory and the subdirectories its files go in (`dirs`:
    [{path, subdirs}]); install this file (the agent's own copy, as it was shipped) as the
    receiver of pull `pull`; remove what an earlier pull left authorised (`revoke_stale`). -> `receiver`."""
    try:
        for d in req["dirs"]:
            for sub in [""] + list(d.get("subdirs", ())):
                os.makedirs(os.path.join(d["path"], sub), exist_ok=True)
                if not os.access(os.path.join(d["path"], sub), os.W_OK | os.X_OK):
                    raise OSError(errno.EROFS if _read_only(d["path"]) else errno.EACCES,
                                  "read-only file system" if _read_only(d["path"])
                                  else "not writable by this user")
    except OSError as e:
        raise _host_error("cannot write in %s: %s (choose a writable [weights] path)"
                          % (d["path"], (e.strerror or str(e)).lower()), "write_failed")
    base = os.path.expanduser(PULL_DIR)
    os.makedirs(base, mode=0o700, exist_ok=True)
    removed = _revoke(None)
    receiver = os.path.join(base, "receive.py")
    with open(__file__) as src:
        _replace(receiver, src.read())
    _replace(os.path.join(base, req["pull"] + ".json"),
             json.dumps({"roots": [d["path"] for d in req["dirs"]]}))
    return {"receiver": receiver, "stale_removed": removed}


def _read_only(path):
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _authorized_keys():
    return os.path.expanduser(os.path.join("~", ".ssh", "authorized_keys"))


def op_weights_grant(req):
    """Authorise the pull's public key `public` here for hosts `sources` (IPs) only, as the
    forced command `python receive.py PULL` (no pty, no forwarding), expiring at `expiry`
    (UTC, YYYYMMDDHHMM); and keep its private key `private` here to feed other hosts."""
    pull = req["pull"]
    receiver = os.path.join(os.path.expanduser(PULL_DIR), "receive.py")
    for value in [sys.executable, receiver, pull] + list(req["sources"]):
        if not SAFE.match(value):
            raise _host_error("cannot authorise the pull's key: %r holds characters an "
                              "authorized_keys command may not" % value, "bad_input")
    opts = ('from="%s",command="%s -S %s %s",no-pty,no-port-forwarding,no-agent-forwarding,'
            'no-X11-forwarding,no-user-rc,expiry-time="%sZ"'
            % (",".join(req["sources"]), sys.executable, receiver, pull, req["expiry"]))
    line = "%s %s %s:%s\n" % (opts, req["public"].strip(), MARK, pull)
    path = _authorized_keys()
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "a") as f:
        f.write(line)
    key = os.path.join(os.path.expanduser(PULL_DIR), pull + ".key")
    with os.fdopen(_create(key, 0o600), "w") as f:
        f.write(req["private"])
    kh = os.path.join(os.path.expanduser(PULL_DIR), pull + ".known_hosts")
    with os.fdopen(_create(kh, 0o600), "w") as f:
        f.write("".join(l + "\n" for l in req["known_hosts"]))
    return {"key": key, "known_hosts": kh}


def _revoke(pull):
    """Remove the authorized_keys lines of pull `pull` (None: of every pull) and its key
    files; -> how many lines went."""
    path = _authorized_keys()
    removed = 0
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError:
        lines = None
    if lines is not None:
        def ours(l):
            tail = l.rstrip("\n").rsplit(" ", 1)[-1]
            return tail.startswith(MARK + ":") and (pull is None or tail == MARK + ":" + pull)
        keep = [l for l in lines if not ours(l)]
        removed = len(lines) - len(keep)
        if removed:
            _replace(path, "".join(keep), os.stat(path).st_mode & 0o777)
    base = os.path.expanduser(PULL_DIR)
    try:
        names = os.listdir(base)
    except OSError:
        names = []
    for name in names:
        if name.endswith((".key", ".known_hosts", ".json")) and (
                pull is None or name.split(".")[0] == pull):
            try:
                os.unlink(os.path.join(base, name))
            except OSError:
                pass
    return removed


def op_weights_revoke(req):
    """Remove what pull `pull` authorised here (None: every pull's): -> `removed` lines."""
    return {"removed": _revoke(req.get("pull"))}


def op_weights_send(req):
    """Stream file `rel` of `root` from byte `offset` to host `peer` {ip, port, user} with
    the pull's key, into its receiver; -> the receiver's answer and the seconds taken."""
    base = os.path.expanduser(PULL_DIR)
    pull, peer = req["pull"], req["peer"]
    order = json.dumps({"root": req["root"], "file": req["file"], "offset": req["offset"]},
                       separators=(",", ":"), sort_keys=True)
    argv = ["ssh", "-F", "/dev/null", "-i", os.path.join(base, pull + ".key"),
            "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", "UserKnownHostsFile=" + os.path.join(base, pull + ".known_hosts"),
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10",
            "-o", "ServerAliveInterval=15", "-c", CIPHERS, "-p", str(peer["port"]), "-l", peer["user"],
            peer["ip"], order]
    start = time.monotonic()
    with open(os.path.join(req["root"], req["file"]["path"]), "rb") as f:
        f.seek(req["offset"])
        try:
            p = subprocess.run(argv, stdin=f, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as e:
            raise _host_error("cannot run ssh here: %s" % (e.strerror or e), "failed")
    seconds = time.monotonic() - start
    try:
        answer = json.loads(p.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        err = p.stderr.decode("utf-8", "replace").strip()[-400:]
        answer = {"ok": False, "bytes": 0, "reason": "ssh to %s exited %d: %s"
                  % (peer["ip"], p.returncode, err or "no answer")}
    answer["seconds"] = seconds
    return answer


def _remove(root, rel):
    os.unlink(os.path.join(root, rel))
    head = os.path.dirname(rel)
    while head:  # a subdirectory the removal left empty goes too
        try:
            os.rmdir(os.path.join(root, head))
        except OSError:
            break
        head = os.path.dirname(head)


def op_weights_manifest(req):
    """Once every file of the source is here and verified: remove the files an earlier pull
    put here that the source lacks (checked again: only those still unchanged) and partial
    files of names the source lacks; then manifest.json beside the weights: source,
    commit, files (path, size, sha256). -> `removed` (paths), `extra` (what stays)."""
    root = req["path"]
    wanted = {f["path"] for f in req["files"]}
    stamps = _stamps(root)
    stale, extra = leftovers(root, wanted, stamps)
    partials = [rel for rel in _walk(root) if rel not in (MANIFEST, STAMPS) and ours(rel)
                and os.path.basename(rel).endswith(PART)
                and os.path.join(os.path.dirname(rel), os.path.basename(rel)[1:-len(PART)])
                not in wanted]
    try:
        for rel in stale + partials:
            _remove(root, rel)
            stamps.pop(rel, None)
    except OSError as e:
        raise _host_error("cannot remove %s/%s (a file of the earlier pull the source lacks): %s"
                          % (root, rel, e.strerror or e), "write_failed")
    _save_stamps(root, stamps)
    data = {"source": req["source"], "commit": req.get("commit"), "files": req["files"],
            "pulled_by": "llmfab"}
    _replace(os.path.join(root, MANIFEST), json.dumps(data, indent=1, sort_keys=True))
    return {"ok": True, "removed": stale, "extra": extra}


# -- the receiver (this file run as a script) ---------------------------------------------

def _allowed_roots(pull):
    with open(os.path.join(os.path.expanduser(PULL_DIR), pull + ".json")) as f:
        return json.load(f)["roots"]


def receive(pull, order, stdin):
    """Receive one file of pull `pull`: `order` {root, file: {path, size, sha256}, offset};
    the bytes from `offset` on come on `stdin`. -> {ok, bytes, reason}."""
    root, f = order["root"], order["file"]
    rel = f["path"]
    if root not in _allowed_roots(pull) or rel.startswith("/") or ".." in rel.split("/"):
        return {"ok": False, "bytes": 0, "reason": "refused: %s/%s is not this pull's" % (root, rel)}
    part = os.path.join(root, part_name(rel))
    try:
        # The file's directory by descriptor, each step opened without following a link; the
        # part file and the rename inside it: nothing planted under root leads elsewhere.
        dfd = _open_under(root, os.path.dirname(rel))
    except OSError as e:
        return _write_failed(e, root, part, 0)
    try:
        return _receive_in(dfd, root, part, os.path.basename(rel), f, int(order["offset"]), stdin)
    finally:
        os.close(dfd)


def _write_failed(e, root, part, got):
    if e.errno in (errno.ELOOP, errno.ENOTDIR):
        return {"ok": False, "bytes": got, "reason": "refused: %s, or a directory above it under "
                "%s, is a symbolic link (llmfab never writes through one; remove it)" % (part, root)}
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return {"ok": False, "bytes": got, "kind": "disk_full",
                "reason": "disk full writing %s after %d bytes (%d bytes free there)"
                          % (part, got, _free(root))}
    return {"ok": False, "bytes": got, "reason": "cannot write %s: %s" % (part, e.strerror or e)}


def _receive_in(dfd, root, part, name, f, offset, stdin):
    partname = "." + name + PART
    h = hashlib.sha256()
    got = 0
    try:
        fd = os.open(partname, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644,
                     dir_fd=dfd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device planted at the part's name
            os.close(fd)
            return {"ok": False, "bytes": 0, "reason": "refused: %s is not a regular file "
                    "(llmfab did not create it; remove it)" % part}
        os.set_blocking(fd, True)
        with os.fdopen(fd, "r+b") as out:
            if offset > min(st.st_size, f["size"]):
                offset = 0
            left = offset
            while left > 0:  # what is already here, hashed from the very file opened
                data = out.read(min(CHUNK, left))
                if not data:
                    break
                h.update(data)
                left -= len(data)
            out.truncate(offset)
            out.seek(offset)
            left = f["size"] - offset
            while left > 0:
                data = stdin.read(min(CHUNK, left))
                if not data:
                    break
                out.write(data)
                h.update(data)
                got += len(data)
                left -= len(data)
            out.flush()
            os.fsync(out.fileno())
    except OSError as e:
        return _write_failed(e, root, part, got)
    size = offset + got
    if size != f["size"]:
        return {"ok": False, "bytes": got, "reason": "got %d of %d bytes" % (size, f["size"])}
    if h.hexdigest() != f["sha256"]:
        os.unlink(partname, dir_fd=dfd)
        return {"ok": False, "bytes": got, "kind": "corrupt",
                "reason": "sha256 %s, expected %s" % (h.hexdigest(), f["sha256"])}
    # a link at the final name is replaced by the rename, never followed
    os.rename(partname, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    stamps = _stamps(root)
    stamps[f["path"]] = [f["sha256"]] + _stamp(os.stat(name, dir_fd=dfd, follow_symlinks=False))
    _save_stamps(root, stamps)
    return {"ok": True, "bytes": got}


def _words(e):
    """An error in words, as common.error_words puts it (this file runs alone: no imports)."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror[:1].lower() + e.strerror[1:]
    return str(e) or type(e).__name__


def main(argv):
    pull = argv[1]
    order = os.environ.get("SSH_ORIGINAL_COMMAND") if len(argv) < 3 else argv[2]
    try:
        answer = receive(pull, json.loads(order), sys.stdin.buffer)
    except Exception as e:  # one line the sender reads, whatever went wrong
        answer = {"ok": False, "bytes": 0, "reason": _words(e)}
    sys.stdout.write(json.dumps(answer) + "\n")
    return 0 if answer["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
