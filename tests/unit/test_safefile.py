"""Every file llmfab creates, replaces or appends to, here or on a host, is opened without
following a link and never written into a FIFO or device planted at its name (issue 38: as
root, a planted `<name>.<pid>.tmp` link made llmfab overwrite a file outside its directory).
Real files, links and FIFOs in a temporary directory; the host module itself (stdlib)."""
import os
import time

import pytest

from tasks.base.host import safefile, statefiles
from tasks.base.host.hosterrors import HostError


@pytest.fixture
def victim(tmp_path):
    v = tmp_path / "victim"
    v.write_text("keep me\n")
    return v


def test_replace_never_writes_through_a_planted_temporary_link(tmp_path, victim):
    state = tmp_path / "server.json"
    for name in (f"server.json.{os.getpid()}.tmp", "server.json.tmp"):
        os.symlink(victim, tmp_path / name)
    statefiles.write_json(str(state), {"pid": 1})
    assert victim.read_text() == "keep me\n" and state.read_text() == '{"pid": 1}\n'


def test_replace_replaces_a_planted_link_itself_never_its_target(tmp_path, victim):
    state = tmp_path / "exit.json"
    os.symlink(victim, state)
    statefiles.write_json(str(state), {"returncode": 0})
    assert victim.read_text() == "keep me\n" and not state.is_symlink()


def test_replace_refuses_a_fifo_or_a_directory_in_words(tmp_path):
    fifo = tmp_path / "supervisor.json"
    os.mkfifo(fifo)
    with pytest.raises(HostError, match=r"supervisor.json is a FIFO, not a file llmfab wrote"):
        statefiles.write_json(str(fifo), {})
    assert fifo.exists() and not fifo.is_file()
    (tmp_path / "d.json").mkdir()
    with pytest.raises(OSError, match="is a directory"):
        statefiles.write_json(str(tmp_path / "d.json"), {})
    assert sorted(os.listdir(tmp_path)) == ["d.json", "supervisor.json"]  # nothing left behind


def test_append_refuses_a_link_and_never_blocks_on_a_fifo(tmp_path, victim):
    log = tmp_path / "server.log"
    os.symlink(victim, log)
    with pytest.raises(OSError, match="never writes through one"):
        safefile.append(str(log), "x\n")
    assert victim.read_text() == "keep me\n"
    fifo = tmp_path / "restarts.jsonl"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(HostError, match="is a FIFO"):  # opened without a reader: no hang
        safefile.append(str(fifo), "x\n")
    assert time.monotonic() - t0 < 2


def test_append_creates_and_appends_a_regular_file(tmp_path):
    log = tmp_path / "results.jsonl"
    safefile.append(str(log), "a\n")
    safefile.append(str(log), b"b\n")
    assert log.read_text() == "a\nb\n"


def test_open_new_never_opens_an_existing_name(tmp_path, victim):
    os.symlink(victim, tmp_path / "key")
    with pytest.raises(OSError, match="could not create"):
        safefile.open_new(str(tmp_path / "key"), 0o600)
    assert victim.read_text() == "keep me\n"


def test_a_write_error_is_words_naming_the_path(tmp_path):
    with pytest.raises(HostError) as e:
        statefiles.write_json(str(tmp_path / "gone" / "server.json"), {})
    assert str(e.value) == f"could not write {tmp_path}/gone/server.json: no such file or directory"
    assert isinstance(e.value, OSError) and e.value.kind == "write_failed"
