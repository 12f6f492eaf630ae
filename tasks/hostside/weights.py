"""Host side of `fab pull`: what a model directory holds, and each received file verified.

Ops (ops.py): weights_plan (which files are present and verified, which partial, free
space) and weights_commit (hash a received `.part` file, rename it into place, write
manifest.json). A file counts as verified without re-hashing when its size and mtime match
what the last verification recorded (`.llmfab-verified.json`); `verify` re-hashes all.
Standard library only; Python >= 3.9. (Belongs in tasks/weights/ once the per-capability
layout ships packages to the host.)
"""
import hashlib
import json
import os

from .common import HostError

PART = ".llmfab-part"
STAMPS = ".llmfab-verified.json"
CHUNK = 1 << 20


def part_name(rel):
    head, tail = os.path.split(rel)
    return os.path.join(head, "." + tail + PART)


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            data = f.read(CHUNK)
            if not data:
                break
            h.update(data)
    return h.hexdigest()


def _stamps(root):
    try:
        with open(os.path.join(root, STAMPS)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _save_stamps(root, stamps):
    tmp = os.path.join(root, STAMPS + ".tmp")
    with open(tmp, "w") as f:
        json.dump(stamps, f)
    os.rename(tmp, os.path.join(root, STAMPS))


def _stamp(st):
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _free(root):
    d = root
    while not os.path.isdir(d):
        d = os.path.dirname(d) or "/"
    st = os.statvfs(d)
    return st.f_bavail * st.f_frsize


def op_weights_plan(req):
    """For model dir `path` and `files` [{path, size, sha256}]: per file `ok` (present and
    verified), `part` (bytes of a partial file to resume from), `bad` (present, wrong);
    `need` (bytes still to receive), `free` (bytes free there). `verify`: re-hash every file."""
    root, verify = req["path"], bool(req.get("verify"))
    stamps = _stamps(root)
    out, need = [], 0
    for f in req["files"]:
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
                rec["part"] = min(os.path.getsize(os.path.join(root, part_name(f["path"]))), f["size"])
            except OSError:
                pass
            need += f["size"] - rec["part"]
        out.append(rec)
    if os.path.isdir(root):
        _save_stamps(root, stamps)
    return {"files": out, "need": need, "free": _free(root)}


def op_weights_prepare(req):
    """Create the directories the files go in (`path`, `dirs`) and return `home`."""
    try:
        for d in [""] + list(req.get("dirs", ())):
            os.makedirs(os.path.join(req["path"], d), exist_ok=True)
    except OSError as e:
        raise HostError("cannot create %s: %s" % (req["path"], e.strerror or e), kind="write_failed")
    return {"ok": True}


def op_weights_commit(req):
    """The `.part` of file `file` {path, size, sha256} under `path`: verified by size and
    sha256, then renamed to its name (a bad one is removed: `ok` false, `reason`)."""
    root, f = req["path"], req["file"]
    part = os.path.join(root, part_name(f["path"]))
    final = os.path.join(root, f["path"])
    size = os.path.getsize(part)
    if size != f["size"]:
        reason = "size %d, expected %d" % (size, f["size"])
    else:
        got = sha256_of(part)
        reason = None if got == f["sha256"] else "sha256 %s, expected %s" % (got, f["sha256"])
    if reason:
        os.unlink(part)
        return {"ok": False, "reason": reason}
    with open(part, "rb") as fh:
        os.fsync(fh.fileno())
    os.rename(part, final)
    stamps = _stamps(root)
    stamps[f["path"]] = [f["sha256"]] + _stamp(os.stat(final))
    _save_stamps(root, stamps)
    return {"ok": True}


def op_weights_manifest(req):
    """manifest.json beside the weights: source, commit, files (path, size, sha256)."""
    data = {"source": req["source"], "commit": req.get("commit"), "files": req["files"]}
    tmp = os.path.join(req["path"], "manifest.json.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.rename(tmp, os.path.join(req["path"], "manifest.json"))
    return {"ok": True}
