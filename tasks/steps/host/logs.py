"""Reading a release's server.log on the host, for `fab tail-log` (host side).

Bytes travel base64-encoded and untouched: llmfab decodes them (invalid UTF-8 shown
with replacement characters) and assembles lines, so nothing here depends on how
the server encodes its output. Offsets are byte offsets into server.log, which is
only ever appended to, so a follower that reconnects resumes exactly where it was.
Standard library only; Python >= 3.9.
"""
import base64
import os
import re
import time

from ...base.host.hosterrors import HostError
from ...base.host.layout import current_release, releases_sorted
from ...base.host.statefiles import expand

BLOCK = 64 * 1024
TAIL_MAX_BYTES = 4 * 1024 * 1024   # most bytes one `tail` answer carries
READ_MAX_BYTES = 256 * 1024        # most bytes one `read_from` answer carries
WAIT_MAX_S = 5.0                   # longest a `read_from` blocks waiting for growth
SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def _b64(data):
    return base64.b64encode(data).decode("ascii")


def resolve(ddir, release):
    """(release, path of its server.log); `release` None means the current one."""
    names = releases_sorted(ddir)
    if release is None:
        release = current_release(ddir)
        if release is None:
            raise HostError("nothing deployed in %s yet (no `current` release)" % ddir,
                            kind="no_release", available=names)
    elif not SAFE_NAME.match(release) or release in (".", "..") or release not in names:
        raise HostError("no release %r in %s" % (release, ddir), kind="no_release",
                        available=names)
    return release, os.path.join(ddir, "releases", release, "server.log")


def last_lines(f, end, n, match=None, max_bytes=TAIL_MAX_BYTES):
    """The last n lines (each ending in b"\\n") of f[:end] that `match` accepts.

    f[:end] must end at a line boundary. Reads backwards block by block, so a huge
    log costs only what is needed. Returns (bytes, clipped): clipped when max_bytes
    cut the oldest of the chosen lines (or the start of one enormous line).
    """
    picked, total, pos, carry, cut = [], 0, end, b"", False
    while pos > 0 and len(picked) < n and total < max_bytes:
        step = min(BLOCK, pos)
        pos -= step
        f.seek(pos)
        parts = (f.read(step) + carry).split(b"\n")
        # The text read ends at a line boundary, so parts[-1] == b"". parts[0] is
        # incomplete unless we reached the start: carry it (with its newline) back.
        if pos > 0:
            carry, parts = parts[0] + b"\n", parts[1:-1]
            if len(carry) > max_bytes:  # one enormous line: keep only its end
                carry, pos, cut = carry[-max_bytes:], 0, True
                parts.insert(0, carry[:-1])
        else:
            parts = parts[:-1]
        for line in reversed(parts):
            if match is None or match(line):
                picked.append(line + b"\n")
                total += len(line) + 1
                if len(picked) >= n or total >= max_bytes:
                    break
    data = b"".join(reversed(picked))
    clipped = cut or len(data) > max_bytes or (total >= max_bytes and len(picked) < n)
    return data[-max_bytes:], clipped


def line_end(f, size):
    """Offset just past the last newline of f[:size] (0 if none): where a follower starts."""
    pos = size
    while pos > 0:
        step = min(BLOCK, pos)
        pos -= step
        f.seek(pos)
        nl = f.read(step).rfind(b"\n")
        if nl >= 0:
            return pos + nl + 1
    return 0


def _matcher(pattern):
    if not pattern:
        return None
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise HostError("bad regular expression %r: %s" % (pattern, e), kind="bad_grep")
    return lambda line: rx.search(line.decode("utf-8", "replace")) is not None


def op_log_tail(deploy_dir, release=None, lines=50, grep=None):
    """Last `lines` complete lines (optionally only those matching `grep`) and the offsets.

    Returns {release, path, exists, size, end, data (b64), partial (b64), clipped}: `end`
    is the offset just past the last complete line (where a follower starts); `partial`
    the bytes after it (a line still being written), shown by a plain tail only.
    """
    ddir = expand(deploy_dir)
    release, path = resolve(ddir, release)
    out = {"release": release, "path": path, "exists": False, "size": 0, "end": 0,
           "data": "", "partial": "", "clipped": False, "current": current_release(ddir)}
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return out
    match = _matcher(grep)
    with f:
        size = os.fstat(f.fileno()).st_size
        end = line_end(f, size)
        f.seek(max(end, size - READ_MAX_BYTES))
        partial = f.read(READ_MAX_BYTES)
        if partial and match is not None and not match(partial):
            partial = b""
        data, clipped = (b"", False)
        n = int(lines)
        if n > 0:
            data, clipped = last_lines(f, end, n, match)
    out.update(exists=True, size=size, end=end, data=_b64(data), partial=_b64(partial),
               clipped=clipped)
    return out


def op_log_read(deploy_dir, release, offset=0, max_bytes=READ_MAX_BYTES, wait=0):
    """Bytes of the release's log from `offset`, waiting up to `wait` s for some to appear.

    Returns {data (b64), offset (just past data), size, exists, truncated, current}.
    `truncated`: the file is shorter than `offset` (someone truncated it); reading
    starts over at 0. The wait lets a follower ask again at once without busy polling.
    """
    ddir = expand(deploy_dir)
    release, path = resolve(ddir, release)
    offset = int(offset)
    limit = min(int(max_bytes), READ_MAX_BYTES)
    deadline = time.monotonic() + min(float(wait), WAIT_MAX_S)
    while True:
        try:
            size = os.path.getsize(path)
        except OSError:
            size = None
        if (size is not None and size != offset) or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    out = {"release": release, "exists": size is not None, "size": size or 0, "data": "",
           "offset": offset, "truncated": False, "current": current_release(ddir)}
    if size is None or size == offset:
        return out
    if size < offset:
        out["truncated"] = True
        offset = 0
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(limit)
    out.update(data=_b64(data), offset=offset + len(data))
    return out

