"""Host side of `fab pull`: what a model directory holds, each received file verified.

Ops (ops.py): weights_plan (which files are present and verified, which partial, free
space, this host's address), weights_prepare, weights_grant / weights_revoke (the pull's
own SSH key, authorised here only while the pull runs), weights_send (stream a verified
file to another host over SSH) and weights_manifest. Bytes arrive through `receive()`,
this very file run as a script (access.py copies it into place as `<pull>.receive.py`,
run as `python3 <pull>.receive.py PULL_ID`): the controller runs it on
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
import stat
import subprocess
import sys
import time

PART = ".llmfab-part"
STAMPS = ".llmfab-verified.json"
CHUNK = 1 << 20
PULL_DIR = os.path.join("~", ".cache", "llmfab", "pull")
# Between hosts, AES-GCM first: with AES-NI it costs about half the CPU per byte of
# OpenSSH's default chacha20-poly1305 (64 MiB host to host on the lab: 0.6 s against 1.5 s);
# the rest stay as the fallback for an sshd without it.
CIPHERS = ("aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,"
           "aes128-ctr,aes256-ctr")


class PullError(Exception):
    def __init__(self, message, kind="failed"):
        super().__init__(message)
        self.kind = kind


def _host_error(message, kind):
    try:
        from ...base.host.hosterrors import HostError
    except ImportError:  # run as a script (receive): no package
        return PullError(message, kind)
    return HostError(message, kind=kind)


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


# llmfab's record of a pull, beside the weights. A hidden name of its own: a model's own
# manifest.json (some repos ship one) is a file like any other and is copied. Pulls before
# this name wrote LEGACY (with "pulled_by": "llmfab"); it is read, and removed once replaced.
MANIFEST = ".llmfab-manifest.json"
LEGACY = "manifest.json"


def ours(rel):
    """llmfab's own names in a model directory (never a user's file, never an extra): its
    bookkeeping, their temporary files, and partial files `.NAME.llmfab-part`."""
    base = os.path.basename(rel)
    if rel in (MANIFEST, STAMPS, MANIFEST + ".tmp"):
        return True
    if rel == base and base.startswith(STAMPS + ".") and base.endswith(".tmp"):
        return True
    return base.startswith(".") and base.endswith(PART)


def _walk(root, inner=()):
    """Every file under `root`, as paths relative to it (sorted); not under `inner` (paths
    relative to `root` of other destinations of the pull nested inside it: theirs)."""
    found = []
    skip = set(inner)
    for top, subdirs, names in os.walk(root):
        rel_top = os.path.relpath(top, root)
        subdirs[:] = sorted(d for d in subdirs
                            if (d if rel_top == "." else os.path.join(rel_top, d)) not in skip)
        for name in sorted(names):
            found.append(name if rel_top == "." else os.path.join(rel_top, name))
    return found


def read_manifest(root, name=MANIFEST):
    """The record an earlier `fab pull` wrote in `root` ({source, commit, files}), or None."""
    try:
        with open(os.path.join(root, name)) as f:
            data = json.load(f)
        if data.get("pulled_by") != "llmfab" or not isinstance(data.get("files"), list):
            return None
        return data
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _previous(root):
    """{path: {path, size, sha256}} of the manifest an earlier `fab pull` wrote here, or {}."""
    data = read_manifest(root) or read_manifest(root, LEGACY) or {"files": []}
    try:
        return {f["path"]: f for f in data["files"]}
    except (KeyError, TypeError):
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


def leftovers(root, wanted, stamps, inner=()):
    """Files under `root` the source (paths `wanted`) lacks: -> (stale, extra). `stale`: an
    earlier pull's, unchanged (the pull removes them); `extra`: anything else (a user's own:
    never removed, only reported). llmfab's own names are neither; nor is what lies under
    `inner` (the pull's other destinations nested in `root`)."""
    if not os.path.isdir(root):
        return [], []
    prev = _previous(root)
    stale, extra = [], []
    for rel in _walk(root, inner):
        if rel in wanted or ours(rel):
            continue
        if rel == LEGACY and read_manifest(root, LEGACY) is not None:
            stale.append(rel)  # an earlier llmfab's record, replaced by MANIFEST
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
    """Keep what the verification found (a cache: where it cannot be written, a read-only
    model directory, the next pull hashes again)."""
    tmp = os.path.join(root, STAMPS + ".%d.tmp" % os.getpid())
    try:
        with open(tmp, "w") as f:
            json.dump(stamps, f)
        os.rename(tmp, os.path.join(root, STAMPS))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


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


def op_weights_plan(dirs, verify=False):
    """For each model dir in `dirs` [{path, files: [{path, size, sha256}]}]: per file `ok`
    (present and verified), `part` (bytes of a partial file to resume from), `bad` (present,
    wrong); `need` (bytes still to receive), `free` (bytes free there). `verify`: re-hash
    every file. Also this host's SSH address and the files the receiver needs."""
    verify, wanted, dirs = bool(verify), dirs, []
    for d in wanted:
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
            _save_stamps(root, stamps)
        dirs.append({"path": root, "files": out, "need": need, "free": _free(root)})
    ip, port = _address()
    return {"dirs": dirs, "ip": ip, "port": port, "receiver": os.path.abspath(__file__)}


def op_weights_send(pull, peer, root, file, offset):
    """Stream `file` ({path, ...}) of `root` from byte `offset` to host `peer` {ip, port, user}
    with the pull's key, into its receiver; -> the receiver's answer and the seconds taken."""
    base = os.path.expanduser(PULL_DIR)
    order = json.dumps({"root": root, "file": file, "offset": offset},
                       separators=(",", ":"), sort_keys=True)
    argv = ["ssh", "-F", "/dev/null", "-i", os.path.join(base, pull + ".key"),
            "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", "UserKnownHostsFile=" + os.path.join(base, pull + ".known_hosts"),
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10",
            "-o", "ServerAliveInterval=15", "-c", CIPHERS, "-p", str(peer["port"]), "-l", peer["user"],
            peer["ip"], order]
    start = time.monotonic()
    with open(os.path.join(root, file["path"]), "rb") as f:
        f.seek(offset)
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


def op_weights_manifest(path, source, files, commit=None, inner=()):
    """Once every file of the source is here and verified: remove the files an earlier pull
    put here that the source lacks (checked again: only those still unchanged) and partial
    files of names the source lacks; then manifest.json beside the weights: source,
    commit, files (path, size, sha256). -> `removed` (paths), `extra` (what stays)."""
    root = path
    wanted = {f["path"] for f in files}
    stamps = _stamps(root)
    stale, extra = leftovers(root, wanted, stamps, inner)
    partials = [rel for rel in _walk(root, inner) if rel not in (MANIFEST, STAMPS) and ours(rel)
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
    data = {"source": source, "commit": commit, "files": files,
            "pulled_by": "llmfab"}
    tmp = os.path.join(root, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.rename(tmp, os.path.join(root, MANIFEST))
    return {"ok": True, "removed": stale, "extra": extra}


# -- the receiver (this file run as a script) ---------------------------------------------

def _allowed_roots(pull):
    with open(os.path.join(os.path.expanduser(PULL_DIR), pull + ".json")) as f:
        return json.load(f)["roots"]


def _refused(pull, root, rel):
    if root not in _allowed_roots(pull) or rel.startswith("/") or ".." in rel.split("/"):
        return {"ok": False, "bytes": 0, "reason": "refused: %s/%s is not this pull's" % (root, rel)}
    return None


def _take(root, f, offset, stdin, sync=True):
    """Write file `f` {path, size, sha256} of `root` from `offset` on, its bytes read from
    `stdin`, into its partial file; verify. -> (answer, partial file) (answer ok: verified,
    not yet renamed). `sync`: fsync it here (a batch syncs once for all its files)."""
    part = os.path.join(root, part_name(f["path"]))
    h = hashlib.sha256()
    got = 0
    try:
        # nothing planted under root leads elsewhere: no directory on the way is a link (the
        # real path stays under root), and the partial file itself is never followed
        real_root = os.path.realpath(root)
        if os.path.dirname(os.path.realpath(part)) != os.path.realpath(os.path.dirname(part)) or \
                not os.path.realpath(os.path.dirname(part)).startswith(real_root.rstrip("/") + "/") and \
                os.path.realpath(os.path.dirname(part)) != real_root:
            raise OSError(errno.ELOOP, "a directory above it is a symbolic link")
        fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.ELOOP, "not a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "r+b") as out:
            have = os.fstat(out.fileno()).st_size
            if offset > min(have, f["size"]):
                offset = 0
            if offset:
                sha256_of(part, h, limit=offset)
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
            if sync:
                os.fsync(out.fileno())
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR):
            return {"ok": False, "bytes": got, "reason": "refused: %s, or a directory above it under "
                    "%s, is a symbolic link or not a regular file (llmfab never writes through one; "
                    "remove it)" % (part, root)}, part
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return {"ok": False, "bytes": got, "kind": "disk_full",
                    "reason": "disk full writing %s after %d bytes (%d bytes free there)"
                              % (part, got, _free(root))}, part
        return {"ok": False, "bytes": got, "reason": "cannot write %s: %s" % (part, e.strerror or e)}, part
    size = offset + got
    if size != f["size"]:
        return {"ok": False, "bytes": got, "kind": "short",
                "reason": "got %d of %d bytes" % (size, f["size"])}, part
    if h.hexdigest() != f["sha256"]:
        os.unlink(part)
        return {"ok": False, "bytes": got, "kind": "corrupt",
                "reason": "sha256 %s, expected %s" % (h.hexdigest(), f["sha256"])}, part
    return {"ok": True, "bytes": got}, part


def receive(pull, order, stdin):
    """Receive one file of pull `pull`: `order` {root, file: {path, size, sha256}, offset};
    the bytes from `offset` on come on `stdin`. -> {ok, bytes, reason}. Or a batch of whole
    files (`order` {root, batch: true}): `stdin` starts with one JSON line, the files
    [{path, size, sha256}], then their bytes one after the other; each is written and
    verified, then all are synced at once and renamed (one receiver for many small files).
    -> {ok, bytes, files: [{path, ok, bytes, reason}]}."""
    root = order["root"]
    if order.get("batch"):
        return _receive_batch(pull, root, json.loads(stdin.readline()), stdin)
    f, offset = order["file"], int(order["offset"])
    refused = _refused(pull, root, f["path"])
    if refused:
        return refused
    answer, part = _take(root, f, offset, stdin)
    if answer["ok"]:
        stamps = _stamps(root)
        os.rename(part, os.path.join(root, f["path"]))
        stamps[f["path"]] = [f["sha256"]] + _stamp(os.stat(os.path.join(root, f["path"])))
        _save_stamps(root, stamps)
    return answer


def _receive_batch(pull, root, files, stdin):
    out, total, done = [], 0, []
    for f in files:
        refused = _refused(pull, root, f["path"])
        if refused:
            out.append(dict(refused, path=f["path"]))
            break  # its bytes are not read: what follows would be misread
        answer, part = _take(root, f, 0, stdin, sync=False)
        total += answer["bytes"]
        out.append(dict(answer, path=f["path"]))
        if answer["ok"]:
            done.append((f, part))
        elif answer.get("kind") != "corrupt":
            break  # short or unwritable: the stream is no longer at a file's start
    if done:
        os.sync()  # one flush for the batch, before any final name
        stamps = _stamps(root)
        for f, part in done:
            final = os.path.join(root, f["path"])
            os.rename(part, final)
            stamps[f["path"]] = [f["sha256"]] + _stamp(os.stat(final))
        _save_stamps(root, stamps)
    for f in files[len(out):]:
        out.append({"path": f["path"], "ok": False, "bytes": 0, "reason": "not received (an earlier file of its batch failed)"})
    return {"ok": all(a["ok"] for a in out), "bytes": total, "files": out}


def _words(e):
    """An error in words, as hosterrors.error_words puts it (this file runs alone: no imports)."""
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
