"""Writing files without going through what llmfab did not create (host and local side alike).

llmfab often runs as root, in directories others can write to (a shared model directory, /tmp),
so a name it writes to may be a symbolic link, a FIFO or a device planted there. Every file it
creates or appends to is opened here:

- a new file: O_CREAT | O_EXCL | O_NOFOLLOW, never through a link or onto an existing file;
- a replaced file (`replace`): written under a fresh unguessable name beside it, then renamed
  over the old one. Renaming onto a regular file, a new name or a symbolic link (the link
  itself is replaced, never followed) is safe; onto anything else (a FIFO, a device, a
  directory) it would destroy what is there, so that is refused in words;
- an appended or rewritten file (`open_append`, `open_rewrite`): O_NOFOLLOW | O_NONBLOCK, and
  refused unless what was opened is a regular file (a FIFO would block, a device take the bytes).

Failures are `UnsafeFile` (a HostError and an OSError at once, so both kinds of caller catch it)
whose message names the path and says what to do. Standard library only (it ships to hosts).
"""
import errno
import os
import stat

from .hosterrors import HostError, error_words

NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
EXISTING = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

# What a non-regular file is, in words (stat.S_IFMT -> name).
KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
         stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symbolic link"}


class UnsafeFile(HostError, OSError):
    """A file llmfab will not write through, or could not write; the message says which and why."""

    def __init__(self, message, err=None):
        HostError.__init__(self, message, kind="write_failed")
        self.errno = err


def kind(mode):
    """`a FIFO`, `a character device`, ... for a stat mode; None for a regular file."""
    return None if stat.S_ISREG(mode) else KINDS.get(stat.S_IFMT(mode), "not a regular file")


def failed(path, e, doing="write"):
    """An OSError of writing `path` in words: `could not write /x: read-only file system`."""
    if isinstance(e, UnsafeFile):
        return e
    words = error_words(e)
    hint = {errno.EROFS: " (the file system is mounted read-only: choose a writable directory)",
            errno.ENOSPC: " (is the disk full?)", errno.EDQUOT: " (is the disk quota full?)",
            errno.EACCES: " (not writable by this user)", errno.ELOOP: " (a symbolic link: "
            "llmfab never writes through one; remove it)"}.get(getattr(e, "errno", None), "")
    return UnsafeFile("could not %s %s: %s%s" % (doing, path, words, hint), getattr(e, "errno", None))


def refuse_kind(path, mode):
    what = kind(mode)
    return UnsafeFile("%s is %s, not a file llmfab wrote: it never writes into or replaces one; "
                      "remove it (or name another path)" % (path, what))


def open_new(path, mode=0o644):
    """A new file at `path` (fd): never an existing one, never through a link."""
    try:
        return os.open(path, NEW, mode)
    except OSError as e:
        raise failed(path, e, "create")


def _open_existing_regular(path, flags, mode):
    try:
        fd = os.open(path, EXISTING | flags, mode)
    except OSError as e:
        if e.errno == errno.ENXIO:  # a FIFO with no reader (or a device gone): say which
            try:
                raise refuse_kind(path, os.lstat(path).st_mode) from None
            except FileNotFoundError:
                pass
        raise failed(path, e) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refuse_kind(path, st.st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_append(path, mode=0o644):
    """`path` opened to append (created if missing): a regular file, never through a link."""
    return _open_existing_regular(path, os.O_APPEND | os.O_CREAT, mode)


def open_rewrite(path, mode=0o644):
    """`path` emptied and opened to write in place (created if missing): a regular file, never
    through a link. For a file whose inode must stay (one another process holds open)."""
    fd = _open_existing_regular(path, os.O_CREAT, mode)
    try:
        os.ftruncate(fd, 0)
    except OSError as e:
        os.close(fd)
        raise failed(path, e)
    return fd


def temp_name(path):
    """A fresh name beside `path` nobody could have planted: `<path>.<pid>.<random>.tmp`."""
    return "%s.%d.%s.tmp" % (path, os.getpid(), os.urandom(4).hex())


def writable_dir(path):
    """UnsafeFile naming the directory of `path` when no file can be created in it (read-only
    file system, permissions): said before anything is done, not after."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if not os.access(folder, os.W_OK | os.X_OK):
        try:  # access(2) says no; the errno says why (EROFS, EACCES)
            os.close(os.open(folder, os.O_RDONLY | os.O_DIRECTORY))
            probe = os.statvfs(folder)
            ro = bool(probe.f_flag & os.ST_RDONLY)
        except OSError:
            ro = False
        raise UnsafeFile("cannot write in %s: %s" % (folder, "read-only file system (choose a "
                         "writable directory)" if ro else "permission denied (not writable by "
                         "this user)"), errno.EROFS if ro else errno.EACCES)


def check_replaceable(path):
    """UnsafeFile unless `path` is absent, a regular file or a symbolic link (which a rename
    replaces without following)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise failed(path, e)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise refuse_kind(path, st.st_mode)


def replace(path, data, mode=0o644):
    """Replace `path` with `data` (bytes or text) in one rename: a reader sees the old file or
    the new one, never half of one. The file gets exactly `mode` whatever the umask; on a
    failure nothing is left behind. UnsafeFile naming the path otherwise."""
    check_replaceable(path)
    tmp = temp_name(path)
    try:
        fd = os.open(tmp, NEW, mode)
    except OSError as e:
        raise failed(path, e) from None  # the path asked for, not the temporary name
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise failed(path, e) from None
        raise
    return path


def append(path, data, mode=0o644):
    """Append `data` (bytes or text) to `path` (created if missing), see open_append."""
    fd = open_append(path, mode)
    try:
        with os.fdopen(fd, "ab") as f:
            f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
    except OSError as e:
        raise failed(path, e) from None
