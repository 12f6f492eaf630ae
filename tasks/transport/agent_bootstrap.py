"""The host agent's first stage: runs on the host as `PYTHON -S -c <this file, minified> DIGEST`.

Never imported on the client: tasks/transport/agent_code.py reads this text, strips its comments,
docstrings and blank lines (tasks/transport/agent_code.py `minify`) and sends the result as the one remote
command of a task. It is ordinary Python so that it can be read, and it runs the same
unminified (tests/unit/test_agent_code.py runs both against a real interpreter).

What it does, with DIGEST the sha256 of the agent's files (tasks/transport/agent_code.py `digest`):
  1. Look for ~/.cache/llmfab/agent/<DIGEST[:32]>/llmfab_host/ (XDG_CACHE_HOME respected):
     used when the directory is the user's own, not writable by group or others, and its
     files hash to DIGEST.
  2. Otherwise print {"need": 1}, read the files (one JSON line) from stdin, write them into
     a fresh 0700 directory, check the hash again and rename the directory into place (old
     and half-written copies are moved aside and removed, never run). Where the cache
     cannot be written (a read-only home) it runs from a private temporary copy instead.
  3. Import the agent from there (bytecode is cached beside it) and serve requests on
     stdin/stdout; the first line out is the hello record. When the client closes the
     channel, end at once (os._exit: every answer is flushed).
Standard library only; Python >= 3.9; no f-strings (they would not survive the minifier on
every Python the client may run).
"""
import json
import os
import sys

# sha256 from the built-in module where there is one: hashlib loads OpenSSL (~2.5 ms).
try:
    from _sha2 import sha256
except ImportError:
    try:
        from _sha256 import sha256
    except ImportError:
        from hashlib import sha256

DAY = 86400


def py_files(directory, prefix=""):
    """Every .py file under `directory` (bytecode caches aside), as paths with "/"."""
    out = []
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if name.endswith(".py"):
            out.append(prefix + name)
        elif name != "__pycache__" and os.path.isdir(path) and not os.path.islink(path):
            out.extend(py_files(path, prefix + name + "/"))
    return out


def files_digest(directory):
    """sha256 over (path, length, bytes) of each .py file, sorted by path: what
    tasks/transport/agent_code.py `digest` computes on the client."""
    h = sha256()
    for name in sorted(py_files(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        h.update(b"%s\0%d\0" % (name.encode(), len(data)) + data)
    return h.hexdigest()


def trusted(version_dir, digest):
    """The cached copy may be run: ours, not writable by others, and the right files."""
    try:
        st = os.stat(version_dir)
        return (st.st_uid == os.getuid() and not st.st_mode & 0o22
                and files_digest(os.path.join(version_dir, "llmfab_host")) == digest)
    except OSError:
        return False


def remove_old(root, replaced, keep):
    """Move aside and delete what is stale in the cache: the copy being `replaced`, unfinished
    copies older than an hour, versions unused for 30 days (a move first, so a racing
    start never sees half a tree); never `keep`, the new copy."""
    import shutil
    import tempfile
    import time
    for entry in os.listdir(root):
        path = os.path.join(root, entry)
        try:
            max_age = 3600 if entry.startswith("tmp") else 30 * DAY
            if path != keep and (path == replaced or os.stat(path).st_mtime < time.time() - max_age):
                trash = tempfile.mkdtemp(dir=root)
                os.rename(path, os.path.join(trash, "old"))
                shutil.rmtree(trash, True)
        except OSError:
            pass


def receive(stdin, stdout, root, version_dir, digest):
    """Ask for the files, write them, check them, put them in place. -> (directory, how)."""
    import shutil
    import tempfile
    stdout.write(b'{"need": 1}\n')
    stdout.flush()
    files = json.loads(stdin.readline())
    how = "sent"
    try:
        os.makedirs(root, 0o700, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=root)
    except OSError:  # no writable cache: a private copy for this run only
        tmp = tempfile.mkdtemp(prefix="llmfab-agent-")
        how = "temporary"
    package = os.path.join(tmp, "llmfab_host")
    os.mkdir(package, 0o700)
    for name, text in files:
        if name.startswith("/") or ".." in name.split("/"):
            sys.exit("llmfab agent: refusing a file outside the package: %r" % name)
        path = os.path.join(package, *name.split("/"))
        if not os.path.isdir(os.path.dirname(path)):
            os.makedirs(os.path.dirname(path), 0o700)
        with open(path, "wb") as f:
            f.write(text.encode())
    if files_digest(package) != digest:
        sys.exit("llmfab agent: the code received does not match its hash %s" % digest)
    if how == "temporary":
        return tmp, how
    remove_old(root, version_dir, tmp)
    try:
        os.rename(tmp, version_dir)
    except OSError:  # another start put the same version in place first: use it if sound
        shutil.rmtree(tmp, True)
        if not trusted(version_dir, digest):
            raise
    return version_dir, how


def main(digest):
    root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                        "llmfab", "agent")
    version_dir = os.path.join(root, digest[:32])
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    if trusted(version_dir, digest):
        agent_dir, how = version_dir, "cached"
        try:
            os.utime(version_dir)  # in use: not pruned as unused for 30 days
        except OSError:
            pass
    else:
        agent_dir, how = receive(stdin, stdout, root, version_dir, digest)
    sys.path.insert(0, agent_dir)
    sys.dont_write_bytecode = False  # our own directory: compile once, even under PYTHONDONTWRITEBYTECODE
    from llmfab_host.transport.host import agent_main
    agent_main.serve(stdin, stdout, greet={"agent_dir": agent_dir, "code": how})
    stdout.flush()
    os._exit(0)  # nothing needs an orderly interpreter shutdown (a few ms of CPU per task)


if __name__ == "__main__":  # `python -c` runs as __main__ too; importing this file runs nothing
    main(sys.argv[1])
