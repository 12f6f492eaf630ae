"""A `local:` source: the files of a directory on this machine, each with size and sha256.

Hashes are kept in ~/.cache/llmfab/pull-hashes.json by (path, size, mtime, inode), so a
re-pull of an unchanged model reads nothing twice. What a pull itself leaves in a model
directory (manifest.json, the verified-stamps file, partial files) is never a source file.
"""
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor

from ..errors import UsageError

CACHE = os.path.join("~", ".cache", "llmfab", "pull-hashes.json")
OURS = ("manifest.json", ".llmfab-verified.json")
CHUNK = 1 << 20


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


def list_files(source, directory):
    """[{path, size, sha256, local}] of every regular file under `directory`, sorted by path;
    UsageError (exit 2) naming the [weights] source when it is not a readable directory."""
    if not os.path.isdir(directory):
        raise UsageError(f"[weights] source {source!r}: {directory} is not a directory on this "
                         "machine (give the directory that holds config.json and the weights)")
    found = []
    for top, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            full = os.path.join(top, name)
            rel = os.path.relpath(full, directory)
            if rel in OURS or name.endswith(".llmfab-part") or not os.path.isfile(full):
                continue
            found.append((rel, full))
    if not found:
        raise UsageError(f"[weights] source {source!r}: {directory} holds no files")
    try:
        return hash_files(found)
    except OSError as e:
        raise UsageError(f"[weights] source {source!r}: cannot read {e.filename}: {e.strerror}") from None


def hash_files(found, fresh=False):
    """[(path in the model dir, file here)] -> [{path, size, sha256, local}], hashed at most
    once per (file, size, mtime, inode) across pulls (the cache file; `fresh`: hash all
    again, for --verify); OSError as raised."""
    cache_path = os.path.expanduser(CACHE)
    cache = _load_cache(cache_path)

    def one(item):
        rel, full = item
        st = os.stat(full)
        key = [st.st_size, st.st_mtime_ns, st.st_ino]
        hit = cache.get(full)
        sha = hit[3] if hit and hit[:3] == key and not fresh else _sha256(full)
        cache[full] = key + [sha]
        return {"path": rel, "size": st.st_size, "sha256": sha, "local": full}

    with ThreadPoolExecutor(max_workers=4) as pool:
        files = list(pool.map(one, found))
    try:
        os.makedirs(os.path.dirname(cache_path), exist_ok=True)
        from ..transport.host.safefile import replace
        replace(cache_path, json.dumps(cache), 0o644)
    except OSError:
        pass  # a cache only
    return files
