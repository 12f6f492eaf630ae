"""llmfab's state files on a host: read_json (a damaged file is Damaged, never absent), atomic
writes (write_atomically, write_json, through safefile.replace), and the small file helpers
beside them (expand, not_writable, remove_tree, utc_iso). Standard library only (ships to hosts)."""
import json
import os
import time

from .hosterrors import Damaged
from .safefile import replace


def utc_iso(t=None):
    """2026-12-01T11:00:00+00:00: datetime's isoformat(timespec="seconds") in UTC, without
    importing datetime on every agent start."""
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t))


def remove_tree(path):
    """shutil.rmtree(path, ignore_errors=True) for a release directory, without importing
    shutil (it loads bz2 and lzma: ~4 ms of the deploy that prunes). Walks by directory
    descriptors (os.fwalk) and never follows a symlink, as shutil's own safe version."""
    try:
        walk = os.fwalk(path, topdown=False, follow_symlinks=False)
        for _root, dirs, files, fd in walk:
            for name in files:
                _ignore(os.unlink, name, dir_fd=fd)
            for name in dirs:  # a symlink to a directory is listed here: unlinked, not entered
                try:
                    os.rmdir(name, dir_fd=fd)
                except NotADirectoryError:
                    _ignore(os.unlink, name, dir_fd=fd)
                except OSError:
                    pass
        os.rmdir(path)
    except OSError:
        pass


def _ignore(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except OSError:
        pass


def expand(path):
    return os.path.abspath(os.path.expanduser(path))


def not_writable(path):
    """Why nothing can be written under `path` (its nearest existing ancestor: what would be
    created there), or None: a read-only file system, or no write permission for this user.
    Reads only: a check creates nothing."""
    path = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "%s is on a read-only file system" % path
    except OSError as e:
        return "cannot look at %s: %s" % (path, e.strerror or e)
    if not os.path.isdir(path):
        return "%s is not a directory" % path
    if not os.access(path, os.W_OK | os.X_OK):
        import pwd
        try:
            user = pwd.getpwuid(os.geteuid()).pw_name
        except KeyError:
            user = "uid %d" % os.geteuid()
        return "%s is not writable by %s" % (path, user)
    return None


def read_json(path, default=None):
    """The JSON object in `path` (a state file of llmfab's), or `default` where there is none.
    Raises Damaged where the file is there and unreadable, not JSON, or not an object."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return default
    except OSError as e:
        raise Damaged(path, "cannot be read: %s" % (e.strerror or e))
    try:
        value = json.loads(data.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError included
        raise Damaged(path, "not JSON: %s" % e)
    if not isinstance(value, dict):
        raise Damaged(path, "a JSON %s, not an object" % type(value).__name__)
    return value


def write_atomically(path, data, mode=0o644):
    """Replace `path` with `data` (bytes or text) in one rename: a reader sees the old file or
    the new one, never half of one. The file gets exactly `mode` whatever the umask; on a
    failure nothing is left behind. Every state file llmfab writes goes through here: never
    through a link or onto a FIFO or device planted at its name (safefile.replace)."""
    return replace(path, data, mode)


def write_json(path, data, mode=0o644):
    """`data` as one line of JSON in `path`, replaced atomically."""
    return write_atomically(path, json.dumps(data) + "\n", mode)
