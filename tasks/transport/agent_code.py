"""The host agent's code as it travels: every host package of tasks/, hashed, and its bootstrap.

Each capability keeps its host half beside its client half, in a `host/` package
(tasks/doctor/host/, tasks/gpu/host/, ...). Those packages, and nothing else, are the code
that runs on hosts: standard library only, Python >= 3.9 (tests/unit/test_lint.py).
The payload is every `*.py` of every `host/` package under tasks/ (found, not listed: a
module or package added there travels without editing anything; which op each serves is
the table in tasks/transport/host/ops.py), laid out on the host as the package
`llmfab_host` with the same sub-paths (llmfab_host/doctor/host/spec_check.py). The
capability packages above them are empty there: their client modules never travel. Its
content hash names the copy on the host. A supervised release carries the same files
(tasks/release/launcher.py): one way of shipping code.

The one remote command per task and host is `PYTHON -S -c BOOTSTRAP DIGEST`, BOOTSTRAP
being tasks/transport/agent_bootstrap.py (readable, commented) minified here at run time. The
bootstrap looks for `~/.cache/llmfab/agent/<digest>/` (XDG_CACHE_HOME respected),
checks that the directory is the user's own, not writable by others, and that its
files hash to DIGEST, then imports the agent from there, so the profile's Python
caches the bytecode beside it (`__pycache__`) and compiles nothing on later starts.
Otherwise it prints `{"need": 1}` and reads the payload (one JSON line) from stdin,
writes it into a fresh 0700 directory, verifies the hash again and renames it into
place; a tampered or half-written copy is moved aside and removed, never run. Where
the cache cannot be written (read-only home) it runs from a private temporary copy.
Its first output line after that is the agent's hello record (agent.serve(greet=...)).
When the client closes the channel the agent ends at once (os._exit: every answer is
flushed and nothing else needs an orderly interpreter shutdown, which cost each task
a few ms of CPU per host).
Bytecode is written even under PYTHONDONTWRITEBYTECODE: the cache directory is ours,
and compiling ~90 KB of sources is most of a cold start.
"""
import functools
import hashlib
import json
import threading
from pathlib import Path

TASKS = Path(__file__).resolve().parent.parent  # the package whose host/ folders travel
HOST_PACKAGE = "llmfab_host"  # their package's name on the host

# -S: no site start-up. The agent needs only the standard library, and an ML environment's
# site (its .pth files) would cost every task on every host; what looks up an installed
# package calls base.host.hostenv.site_packages() first.
AGENT_FLAGS = ("-S",)

# The first stage, kept readable in tasks/transport/agent_bootstrap.py (never imported here) and sent
# minified as one argv word through the remote shell on every task.
BOOTSTRAP_FILE = Path(__file__).with_name("agent_bootstrap.py")


@functools.lru_cache(maxsize=None)
def bootstrap():
    """The `-c` text of the remote command: tasks/transport/agent_bootstrap.py, minified."""
    return minify(BOOTSTRAP_FILE.read_text(encoding="utf-8"))


def minify(source):
    """Python source -> the same program, shorter: no comments, docstrings or blank lines,
    one space per indentation level, a space between tokens only where two words would
    merge. As mitogen's minimize_source does for its first stage, from Python's own tokens,
    so strings and line structure are exactly the source's. F-strings are refused: their
    tokens differ between Python versions (3.12 splits them)."""
    import io
    import tokenize
    lines: list = []
    words: list = []
    depth = line_depth = 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        kind, text = tok.type, tok.string
        if kind == tokenize.INDENT:
            depth += 1
        elif kind == tokenize.DEDENT:
            depth -= 1
        elif kind == tokenize.NEWLINE:
            if not all(k == tokenize.STRING for k, _ in words):  # a lone string: a docstring
                lines.append((line_depth, _join(words)))
            words = []
        elif kind not in (tokenize.COMMENT, tokenize.NL, tokenize.ENDMARKER):
            fstring = kind == getattr(tokenize, "FSTRING_START", None) or (
                kind == tokenize.STRING and "f" in text[:len(text) - len(text.lstrip("rRbBuUfF"))].lower())
            if fstring:
                raise ValueError("minify: line %d has an f-string; use %% formatting" % tok.start[0])
            if not words:
                line_depth = depth
            words.append((kind, text))
    out = []
    for i, (level, text) in enumerate(lines):
        out.append(" " * level + text)
        # A block whose only statement was a docstring keeps a body.
        if text.endswith(":") and (i + 1 == len(lines) or lines[i + 1][0] <= level):
            out.append(" " * (level + 1) + "pass")
    return "\n".join(out) + "\n"


def _join(words):
    text = ""
    for _, word in words:
        if text and (text[-1].isalnum() or text[-1] == "_") and (word[0].isalnum() or word[0] == "_"):
            text += " "
        text += word
    return text


def digest(files):
    """sha256 over (name, length, bytes) of each file, sorted by name: what the bootstrap computes."""
    h = hashlib.sha256()
    for name, data in sorted(files):
        h.update(b"%s\0%d\0" % (name.encode(), len(data)) + data)
    return h.hexdigest()


def host_files(root=TASKS):
    """[(path inside llmfab_host/, bytes)], sorted: every module of every `host/` package under
    `root`, and an empty `__init__.py` for each package above one (on the host they only hold
    the path: the client's capability modules never travel)."""
    files = {"__init__.py": b""}
    for init in sorted(Path(root).rglob("host/__init__.py")):
        package = init.parent
        rel = package.relative_to(root).parts
        if "__pycache__" in rel:
            continue
        for depth in range(1, len(rel)):
            files.setdefault("/".join(rel[:depth] + ("__init__.py",)), b"")
        for module in sorted(package.glob("*.py")):
            files["/".join(rel + (module.name,))] = module.read_bytes()
    return sorted(files.items())


class Payload:
    """files: [(path inside llmfab_host/, bytes)]; digest; line: the JSON line the bootstrap reads."""

    def __init__(self, directory=TASKS):
        self.files = host_files(directory)
        self.digest = digest(self.files)

    @property
    def line(self):
        """Built only for a host that lacks this version (most starts never need it)."""
        return json.dumps([(n, d.decode("utf-8")) for n, d in self.files]).encode() + b"\n"


_cache: dict = {}
_cache_lock = threading.Lock()


def payload(directory=TASKS):
    """The payload of `directory`, built once per process (every host's thread asks at once)."""
    key = str(directory)
    with _cache_lock:
        if key not in _cache:
            _cache[key] = Payload(directory)
        return _cache[key]
