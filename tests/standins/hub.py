"""Stand-in for the Hugging Face hub, on loopback: what huggingface_hub's model_info and
hf_hub_download ask, answered the way the hub answers (this machine cannot reach the hub).

    with HubStandIn() as hub:
        commit = hub.add("org/name", {"config.json": b"{}", "model.safetensors": data})
        env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": ...}   # the real client, pointed here

Endpoints (huggingface_hub 2.x: hf_api.model_info, file_download.get_hf_file_metadata and
http_get):
- GET /api/models/{org}/{name}/revision/{rev}[?blobs=true]: the model's JSON: `id`, `sha`
  (the commit), `siblings` [{rfilename}] and, with blobs=true, each sibling's `blobId`,
  `size` and for an LFS file `lfs` {sha256, size, pointerSize}. As on the hub, an LFS
  file's blobId is the git blob id of its pointer text, its size the real file's.
- HEAD/GET /{org}/{name}/resolve/{rev}/{path}: a small (git) file: 200 with X-Repo-Commit,
  ETag (its git blob id), Content-Length, Accept-Ranges, Range -> 206. An LFS file: 302 to
  the "CDN" (a second loopback port, so another origin: the client neither follows the
  HEAD there nor sends the token there) with X-Repo-Commit, X-Linked-Etag (its sha256),
  X-Linked-Size and Location.
- GET on the CDN: the bytes, Range -> 206 with Content-Range.
Refusals as the hub gives them (X-Error-Code, which the client maps to its errors): an
unknown or private repo without a valid token 401 RepoNotFound; a bad token 401 "Invalid
credentials in Authorization header"; a gated repo 403 GatedRepo; an unknown revision 404
RevisionNotFound; an unknown file 404 EntryNotFound.

Knobs: add(..., token=T) makes the repo private (readable with `Authorization: Bearer T`;
a token no repo has is invalid), gated=True gates it (T: the token of an account let in);
corrupt(repo, path) makes the CDN serve one flipped byte while the listing keeps the true
sha256; `rate` (bytes/s) slows the CDN down after its first `fast` bytes, to catch a
download midway. `requests` records
(method, path, Authorization header, origin) of every request, `ranges` the Range header of
each CDN GET. Standard library only.
"""
import hashlib
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")


def git_blob_id(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256, size):
    """The pointer text git stores for an LFS file (git-lfs spec v1)."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


class Repo:
    def __init__(self, repo_id, files, token=None, gated=False, tags=()):
        self.id, self.token, self.gated = repo_id, token, gated
        self.files = dict(files)
        self.lfs = {p: hashlib.sha256(d).hexdigest() for p, d in self.files.items()
                    if p.endswith(LFS_SUFFIXES)}
        listing = json.dumps({p: git_blob_id(self.stored(p)) for p in sorted(self.files)}).encode()
        self.commit = hashlib.sha1(b"commit " + repo_id.encode() + listing).hexdigest()
        self.refs = {"main": self.commit, **{t: self.commit for t in tags}}
        self.corrupted = set()

    def stored(self, path):
        """What git holds for `path`: the bytes, or an LFS file's pointer text."""
        data = self.files[path]
        return lfs_pointer(self.lfs[path], len(data)) if path in self.lfs else data

    def sibling(self, path, blobs):
        s = {"rfilename": path}
        if blobs:
            data = self.files[path]
            s.update(blobId=git_blob_id(self.stored(path)), size=len(data))
            if path in self.lfs:
                s["lfs"] = {"sha256": self.lfs[path], "size": len(data),
                            "pointerSize": len(self.stored(path))}
        return s

    def info(self, commit, blobs):
        return {"_id": self.commit[:24], "id": self.id, "modelId": self.id, "author": self.id.split("/")[0],
                "sha": commit, "lastModified": "2026-01-01T00:00:00.000Z", "private": self.token is not None,
                "gated": "manual" if self.gated else False, "disabled": False, "downloads": 0, "likes": 0,
                "tags": [], "library_name": "transformers", "createdAt": "2026-01-01T00:00:00.000Z",
                "siblings": [self.sibling(p, blobs) for p in sorted(self.files)]}


class HubStandIn:
    def __init__(self):
        self.repos = {}
        self.requests = []
        self.ranges = []      # the Range header of each CDN GET (None: the whole file)
        self.rate = None      # bytes/s of the CDN after its first `fast` bytes of a response
        self.fast = 0
        self._lock = threading.Lock()
        self._servers = []

    def add(self, repo_id, files, **kw):
        """Serve `files` {path: bytes} as the repo `repo_id` (one commit, `main`); -> commit."""
        self.repos[repo_id] = Repo(repo_id, files, **kw)
        return self.repos[repo_id].commit

    def corrupt(self, repo_id, path):
        self.repos[repo_id].corrupted.add(path)

    def auth_seen(self, origin="hub"):
        return [a for _, _, a, o in self.requests if o == origin and a]

    def __enter__(self):
        self.hub = self._serve("hub")
        self.cdn = self._serve("cdn")
        self.endpoint = f"http://127.0.0.1:{self.hub.server_address[1]}"
        self.cdn_url = f"http://127.0.0.1:{self.cdn.server_address[1]}"
        return self

    def __exit__(self, *exc):
        for s in self._servers:
            s.shutdown()
            s.server_close()

    def _serve(self, origin):
        standin = self

        class Handler(_Handler):
            pass
        Handler.standin, Handler.origin = standin, origin
        server = _Server(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._servers.append(server)
        return server


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client gone midway: as the hub
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    standin = origin = None

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self._answer(body=False)

    def do_GET(self):
        self._answer(body=True)

    # -- answers ---------------------------------------------------------------------------

    def _send(self, code, data=b"", headers=None, body=True):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not (body and data):
            return
        rate = self.standin.rate if self.origin == "cdn" else None
        fast = min(self.standin.fast, len(data)) if rate else len(data)
        self.wfile.write(data[:fast])
        for at in range(fast, len(data), 64 << 10):
            self.wfile.write(data[at:at + (64 << 10)])
            time.sleep((64 << 10) / rate)  # a slow link (the CDN's pace), not a wait on anything

    def _error(self, code, error_code, message, body, extra=None):
        headers = {"Content-Type": "application/json", "X-Error-Message": message, **(extra or {})}
        if error_code:
            headers["X-Error-Code"] = error_code
        self._send(code, json.dumps({"error": message}).encode(), headers, body)

    def _bytes(self, data, headers, body):
        """200, or 206 for `Range: bytes=A-[B]`."""
        rng = self.headers.get("Range")
        headers = dict(headers, **{"Accept-Ranges": "bytes"})
        if self.origin == "cdn" and body:
            with self.standin._lock:
                self.standin.ranges.append(rng)
        if rng and rng.startswith("bytes="):
            a, _, b = rng[len("bytes="):].partition("-")
            a = int(a or 0)
            b = min(int(b), len(data) - 1) if b else len(data) - 1
            headers["Content-Range"] = f"bytes {a}-{b}/{len(data)}"
            return self._send(206, data[a:b + 1], headers, body)
        self._send(200, data, headers, body)

    def _answer(self, body):
        url = urlparse(self.path)
        path = unquote(url.path)
        with self.standin._lock:
            self.standin.requests.append((self.command, self.path, self.headers.get("Authorization"),
                                          self.origin))
        if self.origin == "cdn":
            return self._cdn(path, body)
        if path.startswith("/api/models/"):
            return self._model_info(path[len("/api/models/"):], parse_qs(url.query), body)
        parts = path.lstrip("/").split("/", 4)
        if len(parts) == 5 and parts[2] == "resolve":
            return self._resolve(f"{parts[0]}/{parts[1]}", parts[3], parts[4], body)
        self._error(404, None, "Sorry, we can't find the page you are looking for.", body)

    def _repo(self, repo_id, body):
        """The repo if this request may read it, else None after answering the refusal."""
        repos = self.standin.repos
        repo = repos.get(repo_id)
        auth = self.headers.get("Authorization") or ""
        given = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        if given is not None and given not in {r.token for r in repos.values()}:
            self._error(401, None, "Invalid credentials in Authorization header", body)
            return None
        if repo is None or (repo.token and not repo.gated and given != repo.token):
            self._error(401, "RepoNotFound", "Repository not found", body)
            return None
        if repo.gated and given != repo.token:
            self._error(401 if given is None else 403, "GatedRepo", f"Access to model {repo_id} is "
                        "restricted. You must have access to it and be authenticated to access it. "
                        "Please log in.", body)
            return None
        return repo

    def _model_info(self, rest, query, body):
        repo_id, _, rev = rest.partition("/revision/")
        repo = self._repo(repo_id, body)
        if repo is None:
            return
        commit = repo.refs.get(rev or "main", rev if rev == repo.commit else None)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", body)
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        self._send(200, json.dumps(repo.info(commit, blobs)).encode(),
                   {"Content-Type": "application/json; charset=utf-8"}, body)

    def _resolve(self, repo_id, rev, path, body):
        repo = self._repo(repo_id, body)
        if repo is None:
            return
        commit = repo.refs.get(rev, rev if rev == repo.commit else None)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", body)
        if path not in repo.files:
            return self._error(404, "EntryNotFound", f"{path} does not exist on \"{rev}\"", body,
                               {"X-Repo-Commit": commit})
        data = repo.files[path]
        common = {"X-Repo-Commit": commit, "ETag": f'"{git_blob_id(repo.stored(path))}"'}
        if path in repo.lfs:
            sha = repo.lfs[path]
            location = f"{self.standin.cdn_url}/repos/{sha}?repo={repo_id}&path={path}&X-Amz-Signature=standin"
            return self._send(302, b"Found. Redirecting to " + location.encode(), dict(
                common, **{"X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)),
                           "Location": location, "Content-Type": "text/plain; charset=utf-8"}), body)
        self._bytes(data, dict(common, **{"Content-Type": "application/octet-stream"}), body)

    def _cdn(self, path, body):
        sha = path.rsplit("/", 1)[-1]
        for repo in self.standin.repos.values():
            for p, s in repo.lfs.items():
                if s == sha:
                    data = repo.files[p]
                    if p in repo.corrupted:
                        mid = len(data) // 2
                        data = data[:mid] + bytes([data[mid] ^ 0x01]) + data[mid + 1:]
                    return self._bytes(data, {"ETag": f'"{sha}"', "Content-Type": "binary/octet-stream"},
                                       body)
        self._send(403, b"<Error><Code>AccessDenied</Code></Error>", {"Content-Type": "application/xml"}, body)
