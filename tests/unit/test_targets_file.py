"""`fab targets` without a host: the address it writes, and --out: a regular file replaced in one
rename, a device, FIFO or descriptor written in place, anything else refused; never through a
link (issue 38: as root, `--out /dev/full` became a regular file, `/dev/stdout` a file, a
planted `<out>.<pid>.tmp` link was written through)."""
import os
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from tasks.errors import OperationFailed, UsageError
from tasks.targets import address, out_path, out_target, write_out


def test_out_path_and_write_out(tmp_path):
    with pytest.raises(UsageError, match="is a directory"):
        out_path(tmp_path)
    path = write_out(tmp_path / "t.json", "[1]\n")
    assert open(path).read() == "[1]\n" and os.listdir(tmp_path) == ["t.json"]
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o644)


def test_a_planted_temporary_link_is_never_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    out = tmp_path / "t.json"
    for name in (f"t.json.{os.getpid()}.tmp", "t.json.tmp"):  # the names of the old code, and any
        os.symlink(victim, tmp_path / name)
    write_out(out, "[2]\n")
    assert victim.read_text() == "keep me\n" and out.read_text() == "[2]\n"
    assert not out.is_symlink()


def test_a_symlink_out_is_refused_before_any_host(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    os.symlink(victim, tmp_path / "link.json")
    with pytest.raises(UsageError, match="is a symbolic link"):
        out_target(tmp_path / "link.json")
    assert victim.read_text() == "keep me\n" and (tmp_path / "link.json").is_symlink()


def test_a_character_device_stays_a_device_and_its_error_is_words():
    # /dev/null: written in place, still a device; /dev/full: ENOSPC in words, still a device
    assert out_target("/dev/null") == ("in place", "/dev/null")
    write_out("/dev/null", "[]\n")
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")
    with pytest.raises(OperationFailed, match="could not write /dev/full: no space left on device"):
        write_out("/dev/full", "[]\n")
    assert not os.path.isfile("/dev/full")


def test_a_fifo_is_written_in_place_not_replaced(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()))
    reader.start()
    write_out(fifo, "[3]\n")
    reader.join(10)
    assert got == ["[3]\n"] and not fifo.is_file() and fifo.exists()


def test_out_dev_stdout_and_a_descriptor_path_reach_the_descriptor():
    # A real process: its stdout is a pipe; `--out /dev/stdout` and /proc/self/fd/1 land there
    code = ("import sys; from tasks.targets import write_out; write_out(sys.argv[1], '[4]\\n')")
    for name in ("/dev/stdout", "/proc/self/fd/1", "/dev/fd/1"):
        r = subprocess.run([sys.executable, "-c", code, name], capture_output=True, text=True,
                           cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
        assert r.returncode == 0 and r.stdout == "[4]\n", (name, r.stderr)
    with pytest.raises(UsageError, match="descriptor 987 is not open"):
        out_target("/dev/fd/987")


def test_a_socket_is_refused_in_words(tmp_path):
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp_path / "sock"))
    try:
        with pytest.raises(UsageError, match="is a socket"):
            out_target(tmp_path / "sock")
    finally:
        s.close()


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


def test_an_unwritable_directory_is_refused_in_words_before_any_host(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() == 0:  # root writes anywhere but on a read-only file system
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(folder)], check=True)
        says = "read-only file system"
    else:
        folder.chmod(0o555)
        says = "permission denied"
    try:
        with pytest.raises(UsageError, match=f"cannot write in {folder}: {says}"):
            out_target(folder / "t.json")
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(folder)], check=True)
