"""The pull's receiver (tasks/weights/host/receiver.py, run as the script it is on a host) never
writes through what it did not create (issue 38: a planted `.w.bin.llmfab-part` link made it
overwrite a file outside the model directory, as root). A real process, real files and links."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

RECEIVER = Path(__file__).resolve().parents[2] / "tasks" / "weights" / "host" / "receiver.py"
DATA = b"weights " * 1000


@pytest.fixture
def host(tmp_path):
    """A home with the pull's grant of `root`, as weights_prepare leaves it."""
    home, root = tmp_path / "home", tmp_path / "model"
    (home / ".cache" / "llmfab" / "pull").mkdir(parents=True)
    root.mkdir()
    (home / ".cache" / "llmfab" / "pull" / "p1.json").write_text(json.dumps({"roots": [str(root)]}))
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    return home, root, victim


def receive(home, root, rel, data=DATA, offset=0):
    order = {"root": str(root), "offset": offset,
             "file": {"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
    r = subprocess.run([sys.executable, "-S", str(RECEIVER), "p1", json.dumps(order)],
                       input=data[offset:], capture_output=True, env=dict(os.environ, HOME=str(home)))
    return json.loads(r.stdout.decode().splitlines()[-1])


def test_a_file_is_received_whole_and_verified(host):
    home, root, _ = host
    (root / "sub").mkdir()
    assert receive(home, root, "sub/w.bin")["ok"]
    assert (root / "sub" / "w.bin").read_bytes() == DATA and not (root / "sub" / ".w.bin.llmfab-part").exists()


def test_a_planted_part_link_is_refused_and_its_target_untouched(host):
    home, root, victim = host
    os.symlink(victim, root / ".w.bin.llmfab-part")
    answer = receive(home, root, "w.bin")
    assert not answer["ok"] and "symbolic link" in answer["reason"], answer
    assert victim.read_text() == "keep me\n" and not (root / "w.bin").exists()


def test_a_planted_subdirectory_link_is_refused(host, tmp_path):
    home, root, _ = host
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, root / "sub")
    answer = receive(home, root, "sub/w.bin")
    assert not answer["ok"] and "symbolic link" in answer["reason"], answer
    assert os.listdir(elsewhere) == []


def test_a_planted_fifo_is_refused_without_hanging(host):
    home, root, _ = host
    os.mkfifo(root / ".w.bin.llmfab-part")
    answer = receive(home, root, "w.bin")
    assert not answer["ok"] and "not a regular file" in answer["reason"], answer


def test_a_link_at_the_final_name_is_replaced_never_followed(host):
    home, root, victim = host
    os.symlink(victim, root / "w.bin")
    assert receive(home, root, "w.bin")["ok"]
    assert victim.read_text() == "keep me\n" and not (root / "w.bin").is_symlink()
    assert (root / "w.bin").read_bytes() == DATA


def test_a_partial_file_resumes_from_its_own_bytes(host):
    home, root, _ = host
    (root / ".w.bin.llmfab-part").write_bytes(DATA[:1000])
    answer = receive(home, root, "w.bin", offset=1000)
    assert answer == {"ok": True, "bytes": len(DATA) - 1000}
    assert (root / "w.bin").read_bytes() == DATA
