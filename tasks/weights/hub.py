"""An `hf://ORG/NAME@REV` source: the repo's files at one commit, fetched once onto this
machine with the real huggingface_hub client, each verified against what the hub says.

The revision is resolved to a commit first (model_info with files_metadata: the commit
`sha`, every file's size, and for LFS files the LFS sha256), and every file is fetched at
that commit, so a branch moving mid-pull cannot mix two commits. The files land in the
client's own cache on this machine (HF_HOME / HF_HUB_CACHE; a re-pull reads the files
fetched whole from there); the local fan-out then carries them to the hosts, so the
hub is read once however many hosts there are, at the cost of one copy of the model on this
machine's disk. Checks: an LFS file's bytes must hash to the hub's LFS sha256; a small
(git) file's to its git blob id; a mismatch removes the bad copy from the cache and fails
naming the file. The token ([weights] HF_TOKEN) goes to the client in-process (token=),
never on argv or in output.

A file cut off midway (Ctrl-C, kill -9) is fetched again from its start: huggingface_hub 2.x
writes each download to a temporary file of its own (`<etag>.<id>.incomplete`, its PR 4228)
and resumes only within one run. One left by Ctrl-C or a kill is removed by the next pull,
once no download holds its lock.
"""
import fcntl
import hashlib
import importlib
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor

from ..errors import LlmfabError, OperationFailed, UsageError
from .local import OURS, hash_files

INSTALL = "pip install 'llmfab[hub]' (the huggingface_hub client) on this machine"
WORKERS = 4  # files fetched at once


def _client():
    try:
        import huggingface_hub
        from huggingface_hub.utils import disable_progress_bars
    except ImportError:
        raise UsageError(f"[weights] has an hf:// source but huggingface_hub is not installed: "
                         f"{INSTALL}") from None
    disable_progress_bars()  # progress is ours: one line per file
    return huggingface_hub


def _network_errors():
    """The client's HTTP library's connection errors (httpx2 in huggingface_hub 2.x, httpx
    in 1.x), plus the builtin ones."""
    found = [ConnectionError, TimeoutError]
    for name in ("httpx2", "httpx"):
        try:
            m = importlib.import_module(name)
            found += [m.ConnectError, m.TimeoutException, m.RemoteProtocolError]
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _errors(hh):
    """(exception class, exit-1 words: what is wrong and what to do), first match wins."""
    e = hh.errors
    return (
        (e.GatedRepoError, "is a gated repo: accept its conditions on the hub with your account, "
                           'then set [weights] HF_TOKEN = { from_env = "HF_TOKEN" } to a token of it'),
        (e.RepositoryNotFoundError, "no such repo on the hub, or a private one this token cannot "
                                    "read: check ORG/NAME, or set [weights] HF_TOKEN = "
                                    '{ from_env = "HF_TOKEN" } to a token that can'),
        (e.RevisionNotFoundError, "no such revision in the repo: give a branch, tag or commit "
                                  "that exists after @ (none means main)"),
        (getattr(e, "RemoteEntryNotFoundError", e.EntryNotFoundError),
         "a file the repo lists at this commit is not served: pull again"),
        (e.OfflineModeIsEnabled, "HF_HUB_OFFLINE is set on this machine: unset it to pull"),
        (e.HfHubHTTPError, "the hub refused: check [weights] HF_TOKEN (a valid token with read "
                           "access) or try again later"),
        (_network_errors(), "cannot reach the hub (HF_ENDPOINT or the default): check the "
                            "network, then pull again (files fetched whole are kept)"),
    )


def _status(exc):
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    return f" (HTTP {code})" if code else ""


def _fail(w, hh, exc, what=""):
    for cls, words in _errors(hh):
        if isinstance(exc, cls):
            break
    else:
        words = f"the hub client failed ({type(exc).__name__}: {str(exc)[:200]}): pull again"
    return OperationFailed(f'[weights] "{w.path}": {w.source}{what}: {words}{_status(exc)}')


def _token(w):
    if w.token is None:
        return None  # the client's own: HF_TOKEN in this environment or a stored login
    if w.token.value is None:
        raise UsageError(w.token.missing)
    return w.token.value


def _size(n):
    return f"{n} bytes" if n < (1 << 20) else f"{n / (1 << 20):.1f} MiB"


def git_blob_id(path):
    """The git object id of a file (sha1 of "blob <size>\\0" + bytes): a small file's id."""
    h = hashlib.sha1()
    h.update(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as f:
        for data in iter(lambda: f.read(1 << 20), b""):
            h.update(data)
    return h.hexdigest()


def list_files(w, line, verify=False):
    """-> (commit, [{path, size, sha256, local}]) for the hf:// source `w`, every file fetched
    here and verified (`verify`: the copies already in the cache hashed again too);
    `line(text)` reports progress. OperationFailed (exit 1) naming the
    [weights] key and source for what the hub refuses or a file that does not verify."""
    hh = _client()
    token = _token(w)
    try:
        info = hh.HfApi().model_info(w.repo, revision=w.revision, files_metadata=True, token=token)
    except Exception as exc:
        raise _fail(w, hh, exc) from None
    commit, siblings = info.sha, list(info.siblings or ())
    if not commit or not siblings:
        raise OperationFailed(f'[weights] "{w.path}": {w.source}: the hub answered no commit or no '
                              "files for this revision: check the repo on the hub")
    for s in siblings:
        if s.rfilename in OURS:
            raise OperationFailed(f'[weights] "{w.path}": {w.source}: the repo holds {s.rfilename}, '
                                  "the name fab pull keeps its own record under: pull it another way")
    line(f"{w.source}: {w.revision} is commit {commit}; {len(siblings)} files")
    _drop_partials(hh, w.repo)

    def fetch(s):
        cached = isinstance(hh.try_to_load_from_cache(w.repo, s.rfilename, revision=commit), str)
        start = time.monotonic()
        try:
            got = hh.hf_hub_download(w.repo, s.rfilename, revision=commit, token=token)
        except Exception as exc:
            raise _fail(w, hh, exc, f": {s.rfilename}") from None
        return s, os.path.realpath(got), None if cached else time.monotonic() - start

    fetched, took = [], 0
    pool = ThreadPoolExecutor(max_workers=WORKERS)
    try:
        for s, blob, secs in pool.map(fetch, siblings):
            if secs is not None:
                size = os.path.getsize(blob)
                took += size
                rate = f", {size / max(secs, 1e-6) / 1e6:.0f} MB/s" if size >= (1 << 20) else ""
                line(f"{s.rfilename} ({_size(size)}) fetched from the hub in {secs:.1f} s{rate}")
            fetched.append((s, blob))
    except KeyboardInterrupt:
        # The downloads run in threads the executor would wait for: a 50 GB shard would hold
        # Ctrl-C for minutes. Stop here; their temporary files go at the next pull.
        from ..interrupts import leave, words
        line(f"interrupted ({words()}) while fetching from the hub: nothing was sent to the hosts; "
             "the files fetched whole stay in this machine's hub cache")
        leave()
    pool.shutdown()
    if not took:
        line(f"{w.source}: every file already in this machine's hub cache")
    files = hash_files([(s.rfilename, blob) for s, blob in fetched], fresh=verify)
    for (s, blob), f in zip(fetched, files):
        bad = _mismatch(s, blob, f)
        if bad:
            _forget(hh, w, s, commit, blob)
            raise OperationFailed(f'[weights] "{w.path}": {w.source}: {s.rfilename}: {bad}; the '
                                  "copy was removed from this machine's cache: pull again (a "
                                  "mismatch that stays means the hub serves other bytes than it lists)")
    return commit, files


TEMP = re.compile(r"^(?P<etag>[0-9a-f]{40,64})\.[0-9a-f]{8}\.incomplete$")  # 2.x: one per download


def _drop_partials(hh, repo):
    """Remove the client's per-download temporary files of `repo` whose blob no download
    holds the lock of (left by Ctrl-C or a kill): nothing ever resumes them, and each can be
    as large as a shard."""
    from huggingface_hub.file_download import repo_folder_name
    folder = repo_folder_name(repo_id=repo, repo_type="model")
    blobs = os.path.join(hh.constants.HF_HUB_CACHE, folder, "blobs")
    try:
        names = os.listdir(blobs)
    except OSError:
        return
    for name in names:
        m = TEMP.match(name)
        if not m:
            continue
        path = os.path.join(blobs, name)
        lock = os.path.join(hh.constants.HF_HUB_CACHE, ".locks", folder, m["etag"] + ".lock")
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o664)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the client's FileLock is flock(2)
            _unlink(path)
        except OSError:
            pass  # a download in another fab (or other tool) is writing it
        finally:
            os.close(fd)


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _mismatch(s, blob, f):
    """Why the file fetched is not the one the hub lists, or None."""
    if s.lfs is not None:
        if f["size"] != s.lfs.size:
            return f"{f['size']} bytes fetched, the hub lists {s.lfs.size}"
        if f["sha256"] != s.lfs.sha256:
            return f"sha256 {f['sha256']} of the bytes fetched, the hub's LFS sha256 is {s.lfs.sha256}"
        return None
    if s.size is not None and f["size"] != s.size:
        return f"{f['size']} bytes fetched, the hub lists {s.size}"
    if s.blob_id and git_blob_id(blob) != s.blob_id:
        return f"the bytes fetched are not git blob {s.blob_id} the hub lists"
    return None


def _forget(hh, w, s, commit, blob):
    """Remove a bad file from the client's cache (its blob and the snapshot's link), so the
    next pull fetches it again rather than trusting it."""
    try:
        link = hh.try_to_load_from_cache(w.repo, s.rfilename, revision=commit)
        for p in (link if isinstance(link, str) else None, blob):
            if p and os.path.lexists(p):
                os.unlink(p)
    except (OSError, LlmfabError):
        pass
