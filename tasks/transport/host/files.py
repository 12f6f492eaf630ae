"""Writing files on the host over the agent's channel (op put_file).
"""
import base64

from ...base.host.safefile import replace


def op_put_file(path, data, mode):
    """Write `data` (base64) to the absolute `path`, byte for byte, with `mode`.

    How llmfab pushes a file (tasks/transport/agent.py Host.put): on the agent's own channel,
    so a deploy needs one remote command, not a second one for SFTP. A new release's own
    files come with op new_release instead (tasks/release/host/release_dirs.py)."""
    return {"bytes": write_file(path, base64.b64decode(data), mode)}


def write_file(path, data, mode):
    """`data` (bytes) to `path` with `mode` whatever the umask, in one rename and never through
    a link or onto a FIFO or device planted there (safefile.replace); HostError write_failed."""
    replace(path, data, mode)
    return len(data)

