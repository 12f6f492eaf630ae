"""Host ops that save a deploy work on the host (measured by benchmarks/run.py):

- put_file (tasks/transport/host/files.py): Host.put sends files up to transport.AGENT_PUT_MAX
  bytes on the agent's channel, so a deploy needs one remote command (no SFTP subsystem);
- gpu_baseline's reuse_s (tasks/gpu/host/nvsmi.py): when nothing was stopped since preflight,
  its nvidia-smi reading is the baseline (one nvidia-smi run per deploy, not two).
"""
import base64
import json
import os
import stat

import pytest

from tasks.transport.host import files
from tasks.gpu.host import nvsmi
from tasks.base.host.hosterrors import HostError


def test_put_file_writes_bytes_exactly_with_the_mode(tmp_path):
    data = bytes(range(256)) * 3 + b"\r\n\x00 end"
    path = tmp_path / "launch.py"
    path.write_bytes(b"an older, longer content " * 100)  # truncated, not appended to
    old = os.umask(0o077)
    try:
        out = files.op_put_file(**{"path": str(path), "mode": 0o755,
                                    "data": base64.b64encode(data).decode()})
    finally:
        os.umask(old)
    assert out == {"bytes": len(data)} and path.read_bytes() == data
    assert stat.S_IMODE(path.stat().st_mode) == 0o755  # the mode as asked, whatever the umask


def test_put_file_error_names_the_path_and_the_reason(tmp_path):
    missing = tmp_path / "no-such-release" / "argv.json"
    with pytest.raises(HostError) as e:
        files.op_put_file(**{"path": str(missing), "mode": 0o600, "data": ""})
    assert str(e.value) == f"could not write {missing}: no such file or directory"
    assert e.value.kind == "write_failed"



@pytest.fixture
def counting_smi(tmp_path):
    """An nvidia-smi that answers --query-gpu and counts its runs in `runs`."""
    runs = tmp_path / "runs"
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho run >> %s\necho '0, GPU-0, NVIDIA H100, 4, 81559, 0'\n" % runs)
    smi.chmod(0o755)
    (tmp_path / "d" / "releases" / "r1").mkdir(parents=True)
    return smi, runs


def _baseline(tmp_path, smi, **req):
    out = nvsmi.op_gpu_baseline(**dict(deploy_dir=str(tmp_path / "d"), release="r1", nvidia_smi=str(smi), **req))
    saved = json.loads((tmp_path / "d" / "releases" / "r1" / "gpu-baseline.json").read_text())
    assert saved["gpus"] == out["gpus"]
    return out


def test_gpu_baseline_reuses_a_fresh_reading_only_when_asked(tmp_path, counting_smi):
    smi, runs = counting_smi
    gpus, err = nvsmi.query_gpus(str(smi))  # what preflight's GPU check does
    nvsmi.query_apps(str(smi), gpus)  # and its holders (whose memory is it)
    assert err is None and gpus[0]["used_mib"] == 4
    assert _baseline(tmp_path, smi, reuse_s=2.0)["gpus"] == gpus
    assert runs.read_text().count("run") == 2  # no further nvidia-smi
    _baseline(tmp_path, smi)  # a redeploy stopped something: read again (GPUs and processes)
    assert runs.read_text().count("run") == 4
    _baseline(tmp_path, smi, reuse_s=1e-9)  # too old to reuse
    assert runs.read_text().count("run") == 6


# -- batch and new_release with files: fewer round trips per deploy --------------------------

def test_a_batch_runs_in_order_and_stops_at_the_first_failure(tmp_path):
    from tasks.transport.host import agent_main
    ddir = tmp_path / "d"
    new = {"op": "new_release", "deploy_dir": str(ddir)}
    calls = {"first": new, "put": {"op": "put_file", "path": str(tmp_path / "missing" / "x"), "mode": 0o600,
                                   "data": ""}, "third": new}
    with pytest.raises(HostError) as e:
        agent_main.handle({"op": "batch", "calls": calls})
    assert e.value.kind == "write_failed" and e.value.data["batch_call"] == "put"
    assert len(os.listdir(ddir / "releases")) == 1  # the third never ran
    got = agent_main.handle({"op": "batch", "calls": {"one": new, "two": new}})
    assert list(got) == ["one", "two"] and got["one"]["release"] != got["two"]["release"]
    assert len(os.listdir(ddir / "releases")) == 3
    with pytest.raises(HostError, match="a batch cannot hold a batch"):
        agent_main.handle({"op": "batch", "calls": {"inner": {"op": "batch", "calls": {}}}})


def test_new_release_writes_its_files_or_leaves_no_release(tmp_path):
    from tasks.release.host import release_dirs
    ddir = tmp_path / "d"
    out = release_dirs.op_new_release(**{"deploy_dir": str(ddir), "files": [
        ["launch.py", 0o700, base64.b64encode(b"print(1)\n").decode()],
        ["secrets.json", 0o600, base64.b64encode(b'{"K": "v"}').decode()]]})
    rel = ddir / "releases" / out["release"]
    assert (rel / "launch.py").read_bytes() == b"print(1)\n"
    assert stat.S_IMODE((rel / "launch.py").stat().st_mode) == 0o700
    assert stat.S_IMODE((rel / "secrets.json").stat().st_mode) == 0o600
    with pytest.raises(HostError, match="not a file name for a release"):
        release_dirs.op_new_release(**{"deploy_dir": str(ddir), "files": [["../escape", 0o600, ""]]})
    with pytest.raises(ValueError):  # the second file's data is not base64: nothing is kept
        release_dirs.op_new_release(**{"deploy_dir": str(ddir), "files": [
            ["argv.json", 0o600, base64.b64encode(b"[]").decode()], ["profile.toml", 0o600, "not base64!"]]})
    assert os.listdir(ddir / "releases") == [out["release"]]


def test_remove_tree_removes_a_release_and_never_follows_its_symlinks(tmp_path):
    from tasks.base.host.statefiles import remove_tree
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("precious")
    rel = tmp_path / "rel"
    (rel / "sub" / "deeper").mkdir(parents=True)
    (rel / "server.log").write_text("log")
    (rel / "sub" / "x.json").write_text("{}")
    (rel / "sub" / "dirlink").symlink_to(outside)
    (rel / "filelink").symlink_to(outside / "keep")
    remove_tree(str(rel))
    assert not rel.exists() and (outside / "keep").read_text() == "precious"
    remove_tree(str(tmp_path / "never-was"))  # nothing there: nothing happens
