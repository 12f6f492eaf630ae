"""Writing files on the host over the agent's channel (op put_file).
"""
import base64
import errno
import os

from .common import HostError


def op_put_file(req):
    """Write `data` (base64) to the absolute `path`, byte for byte, with `mode` (0o644).

    How llmfab pushes a file (tasks/transport/agent.py Host.put): on the agent's own channel,
    so a deploy needs one remote command, not a second one for SFTP. A new release's own
    files come with op new_release instead (tasks/release/host/release_dirs.py)."""
    return {"bytes": write_file(req["path"], base64.b64decode(req["data"]), req.get("mode", 0o644))}


def write_file(path, data, mode):
    """`data` (bytes) to `path` with `mode` whatever the umask; HostError write_failed."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), mode)
    except OSError as e:
        hint = " (is the disk full?)" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        raise HostError("could not write %s: %s%s" % (path, e.strerror or e, hint), kind="write_failed")
    return len(data)

