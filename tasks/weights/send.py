"""Bytes from this machine into a host's receiver (tasks/weights/host/receiver.py), on the
task's own SSH connection (a second session on it) or to a local receiver process
(tasks/transport/stream.py).

One file at a time (`one`) for large files, resuming from an offset; small files in batches
(`batch`): one session and one receiver start for many files, their bytes one after the
other, so 5,000 files of a few bytes cost about as much as `scp -r` rather than 5,000 SSH
execs. Every byte read here is hashed as it is sent: a file whose bytes are no longer the
sha256 listed at the start of the pull (changed during the pull, or before it with its mtime
kept, so that the cached hash was stale) fails with "the source changed while it was being
read" at once, rather than as a corrupt copy retried three times.
"""
import hashlib
import json
import time

BATCH_FILES = 2000            # files in one batch at most
BATCH_BYTES = 64 << 20        # bytes in one batch at most
CHUNK = 1 << 20


def _changed(local, want, got):
    return (f"{local}: the source changed while it was being read (its bytes now hash to "
            f"{got[:12]}..., listed as {want[:12]}... at the start of this pull; a change that "
            "kept its mtime is seen only here): pull again; its cached hash is dropped")


def _answer(out, err, rc):
    try:
        return json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"ok": False, "bytes": 0, "reason": f"the receiver exited {rc}: "
                + err.decode("utf-8", "replace").strip()[-400:]}


def _argv(st, pull_id, order):
    return [st.python, "-S", st.prepared["receiver"], pull_id,
            json.dumps(order, separators=(",", ":"), sort_keys=True)]


def _pump(stream, src, h, left):
    """Send `left` bytes of `src` (fewer if it ends first), hashing them into `h`."""
    while left > 0:
        data = src.read(min(CHUNK, left))
        if not data:
            break
        h.update(data)
        stream.send(data)
        left -= len(data)


def one(st, order, local, pull_id):
    """Stream `local` from the order's offset into the host's receiver. -> its answer (kind
    "source" when the source's bytes are not those listed), with `seconds`."""
    start = time.monotonic()
    f = order["file"]
    h = hashlib.sha256()
    with open(local, "rb") as src:
        left = order["offset"]
        while left > 0:  # the part already there is hashed here too, to check the whole file
            data = src.read(min(CHUNK, left))
            if not data:
                break
            h.update(data)
            left -= len(data)
        src.seek(order["offset"])
        stream = st.host.stream(_argv(st, pull_id, order))
        broken = None
        try:
            _pump(stream, src, h, f["size"] - order["offset"])
        except OSError as e:  # the receiver ended early (disk full): its answer tells why
            broken = e
        answer = _answer(*stream.finish(broken))
        if broken is None and src.read(1):
            h.update(b"\0")  # longer than listed: changed
    if broken is None and h.hexdigest() != f["sha256"]:
        answer = {"ok": False, "bytes": answer.get("bytes", 0), "kind": "source",
                  "reason": _changed(local, f["sha256"], h.hexdigest())}
    answer["seconds"] = time.monotonic() - start
    return answer


def batches(keys, files):
    """Split the file keys `keys` into batches of at most BATCH_FILES files and BATCH_BYTES."""
    out, cur, size = [], [], 0
    for k in keys:
        n = files[k]["size"]
        if cur and (len(cur) >= BATCH_FILES or size + n > BATCH_BYTES):
            out.append(cur)
            cur, size = [], 0
        cur.append(k)
        size += n
    return out + ([cur] if cur else [])


def batch(st, root, listed, pull_id):
    """Send whole files `listed` [{path, size, sha256, local}] of model directory `root` in
    one receiver. -> ({path: answer}, seconds); a file whose source bytes are not those
    listed answers kind "source"."""
    start = time.monotonic()
    head = json.dumps([{k: f[k] for k in ("path", "size", "sha256")} for f in listed],
                      separators=(",", ":")).encode() + b"\n"
    stream = st.host.stream(_argv(st, pull_id, {"root": root, "batch": True}))
    changed, broken = {}, None
    try:
        stream.send(head)
        for f in listed:
            h = hashlib.sha256()
            with open(f["local"], "rb") as src:
                _pump(stream, src, h, f["size"])
                if src.read(1):
                    h.update(b"\0")
            if h.hexdigest() != f["sha256"]:
                changed[f["path"]] = _changed(f["local"], f["sha256"], h.hexdigest())
                break  # a short file leaves the stream misaligned: the rest go one by one
    except OSError as e:
        broken = e
    answer = _answer(*stream.finish(broken))
    per = {a["path"]: a for a in answer.get("files", ()) if isinstance(a, dict) and "path" in a}
    out = {}
    for f in listed:
        a = per.get(f["path"]) or {"ok": False, "bytes": 0,
                                   "reason": answer.get("reason") or "not received"}
        if f["path"] in changed:
            a = {"ok": False, "bytes": a.get("bytes", 0), "kind": "source", "reason": changed[f["path"]]}
        out[f["path"]] = a
    return out, time.monotonic() - start
