"""A `local:` source: the files of a directory on this machine, each with size and sha256.

Every file the engine could read is listed, or the pull is refused naming it (never skipped
quietly): dot-files and dot-directories are files like any other; a link that stays inside
the source is listed as what it points to (the engine opens it through the link); a link
out of the source, a dangling link, a link loop and anything not a regular file (a FIFO,
a socket, a device) are refused (exit 2), so a pull never hangs on a FIFO or copies less
than the engine would read. Only llmfab's own bookkeeping (OURS, partial files) is left out.

Hashes are kept in ~/.cache/llmfab/pull-hashes.json by (path, size, mtime, inode), so a
re-pull of an unchanged model reads nothing twice; `fresh` (--verify) hashes every file
again, and `forget` drops a file whose bytes no longer match (changed with its mtime kept).
"""
import hashlib
import json
import os
import stat
from concurrent.futures import ThreadPoolExecutor

from ..errors import OperationFailed, UsageError

CACHE = os.path.join("~", ".cache", "llmfab", "pull-hashes.json")
# llmfab's own names in a model directory (tasks/weights/host/receiver.py): a source that
# was itself pulled holds them; they are bookkeeping, never weights.
OURS = (".llmfab-manifest.json", ".llmfab-verified.json")
PART = ".llmfab-part"
CHUNK = 1 << 20
SHOWN = 5
SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
           (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for data in iter(lambda: f.read(CHUNK), b""):
            h.update(data)
    return h.hexdigest()


def _load_cache(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def ours(rel):
    base = os.path.basename(rel)
    return rel in OURS or (base.startswith(".") and base.endswith(PART))


def _kind(st):
    return next((what for test, what in SPECIAL if test(st.st_mode)), "not a regular file")


def walk_source(directory):
    """-> ([(path in the model dir, file here to read)], [(path, why refused)]) for every
    entry under `directory` (see the module docstring); OSError as raised."""
    top = os.path.realpath(directory)
    found, refused = [], []

    def inside(path):
        return path == top or path.startswith(top.rstrip("/") + "/")

    def walk(real_dir, rel_dir, seen):
        for name in sorted(os.listdir(real_dir)):
            rel = os.path.join(rel_dir, name) if rel_dir else name
            path = os.path.join(real_dir, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                target = os.path.realpath(path)
                if not inside(target):
                    refused.append((rel, f"a symlink out of the source (to {target})"))
                    continue
                try:
                    st = os.stat(target)
                except OSError as e:
                    refused.append((rel, f"a dangling link (to {target}: {e.strerror or e})"))
                    continue
                path = target
            if ours(rel):
                continue
            if stat.S_ISDIR(st.st_mode):
                real = os.path.realpath(path)
                if real in seen:
                    refused.append((rel, f"a link back to {real} (a loop)"))
                    continue
                walk(real, rel, seen | {real})
            elif stat.S_ISREG(st.st_mode):
                found.append((rel, path))
            else:
                refused.append((rel, _kind(st)))

    walk(top, "", {top})
    return found, refused


def list_files(source, directory, fresh=False):
    """[{path, size, sha256, local}] of every file under `directory` the engine could read,
    sorted by path; UsageError (exit 2) naming the [weights] source when it is not a
    readable directory or holds something that cannot be copied as it is."""
    if not os.path.isdir(directory):
        raise UsageError(f"[weights] source {source!r}: {directory} is not a directory on this "
                         "machine (give the directory that holds config.json and the weights)")
    try:
        found, refused = walk_source(directory)
    except OSError as e:
        raise UsageError(f"[weights] source {source!r}: cannot read {e.filename}: "
                         f"{e.strerror or e}") from None
    if refused:
        shown = "; ".join(f"{os.path.join(directory, rel)}: {why}" for rel, why in refused[:SHOWN])
        more = f" (and {len(refused) - SHOWN} more)" if len(refused) > SHOWN else ""
        raise UsageError(
            f"[weights] source {source!r}: cannot copy what the engine would read: {shown}{more}. "
            "Copy the files the link points to into the source (cp -rL), or remove what is not "
            "part of the model; nothing was copied")
    if not found:
        raise UsageError(f"[weights] source {source!r}: {directory} holds no files")
    try:
        return hash_files(found, fresh=fresh)
    except OSError as e:
        raise UsageError(f"[weights] source {source!r}: cannot read {e.filename}: {e.strerror}") from None


class SourceChanged(OperationFailed):
    """A file's size or mtime changed while it was hashed (exit 1: pull again)."""


def _save_cache(cache_path, cache):
    try:
        os.makedirs(os.path.dirname(cache_path), exist_ok=True)
        from ..base.host.safefile import replace
        replace(cache_path, json.dumps(cache), 0o644)
    except OSError:
        pass  # a cache only


def hash_files(found, fresh=False):
    """[(path in the model dir, file here)] -> [{path, size, sha256, local}], hashed at most
    once per (file, size, mtime, inode) across pulls (the cache file; `fresh`: hash all
    again, for --verify); OSError as raised, SourceChanged when a file changed under us."""
    cache_path = os.path.expanduser(CACHE)
    cache = _load_cache(cache_path)

    def one(item):
        rel, full = item
        st = os.stat(full)
        key = [st.st_size, st.st_mtime_ns, st.st_ino]
        hit = cache.get(full)
        if hit and hit[:3] == key and not fresh:
            sha = hit[3]
        else:
            sha = _sha256(full)
            after = os.stat(full)
            if [after.st_size, after.st_mtime_ns, after.st_ino] != key:
                raise SourceChanged(f"{full}: the source changed while it was being read (its "
                                    "size or mtime moved during hashing): pull again once it "
                                    "is complete")
        cache[full] = key + [sha]
        return {"path": rel, "size": st.st_size, "sha256": sha, "local": full}

    with ThreadPoolExecutor(max_workers=4) as pool:
        files = list(pool.map(one, found))
    _save_cache(cache_path, cache)
    return files


def forget(full):
    """Drop the cached hash of `full` (its bytes no longer match it): the next pull reads it."""
    cache_path = os.path.expanduser(CACHE)
    cache = _load_cache(cache_path)
    if cache.pop(full, None) is not None:
        _save_cache(cache_path, cache)
