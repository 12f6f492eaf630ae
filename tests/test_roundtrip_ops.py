"""The agent's put_file op (tasks/hostside/releases.py), which Host.put uses for files up to
transport.AGENT_PUT_MAX bytes so a deploy needs one remote command (no SFTP subsystem)."""
import base64
import os
import stat

import pytest

from tasks.hostside import releases
from tasks.hostside.common import HostError


def test_put_file_writes_bytes_exactly_with_the_mode(tmp_path):
    data = bytes(range(256)) * 3 + b"\r\n\x00 end"
    path = tmp_path / "launch.py"
    path.write_bytes(b"an older, longer content " * 100)  # truncated, not appended to
    old = os.umask(0o077)
    try:
        out = releases.op_put_file({"path": str(path), "mode": 0o755,
                                    "data": base64.b64encode(data).decode()})
    finally:
        os.umask(old)
    assert out == {"bytes": len(data)} and path.read_bytes() == data
    assert stat.S_IMODE(path.stat().st_mode) == 0o755  # the mode as asked, whatever the umask


def test_put_file_error_names_the_path_and_the_reason(tmp_path):
    missing = tmp_path / "no-such-release" / "argv.json"
    with pytest.raises(HostError) as e:
        releases.op_put_file({"path": str(missing), "mode": 0o600, "data": ""})
    assert str(e.value) == f"could not write {missing}: No such file or directory"
    assert e.value.kind == "write_failed"

