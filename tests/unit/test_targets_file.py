"""`fab targets` without a host: the address it writes, and the file written atomically."""
import os
from types import SimpleNamespace
import pytest
from tasks.errors import UsageError
from tasks.targets import address, out_path, write_atomically


def test_out_path_and_write_atomically(tmp_path):
    with pytest.raises(UsageError, match="is a directory"):
        out_path(tmp_path)
    path = write_atomically(tmp_path / "t.json", "[1]\n")
    assert open(path).read() == "[1]\n" and os.listdir(tmp_path) == ["t.json"]


def test_address_is_the_ssh_config_hostname_bracketed_for_ipv6():
    class H:
        local = False

        def __init__(self, name):
            self.cxn = SimpleNamespace(host=name)

        def connect(self):
            pass

    assert address(H("10.0.0.5"), "0.0.0.0") == "10.0.0.5"
    assert address(H("fd00::5"), "0.0.0.0") == "[fd00::5]"
    assert address(SimpleNamespace(local=True), "0.0.0.0") == "127.0.0.1"
    assert address(SimpleNamespace(local=True), "10.1.2.3") == "10.1.2.3"
