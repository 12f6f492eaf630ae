"""`fab pull` (issue 30) on 8 real lab hosts: the fan-out, verification, resume, a full disk,
Ctrl-C, and no access left between hosts.

The model is generated here: a multi-shard safetensors model (real safetensors headers,
random tensor bytes, an index, config.json), LLMFAB_PULL_TEST_MIB in all (default 1024,
~75 s for the module). One 8-host lab for the module; h8's model directory is a small
tmpfs (the full disk).
"""
import hashlib
import json
import os
import signal
from pathlib import Path

import pytest

from genmodel import make_model
from helpers import Background, fab, flat, write_profile
from hostlab import HostLab, wait_for

HOSTS = [f"h{i}" for i in range(1, 9)]
MODEL = "/root/models/gen-model"
MIB = int(os.environ.get("LLMFAB_PULL_TEST_MIB", "1024"))
SHARDS = 4


@pytest.fixture(scope="module")
def lab():
    from conftest import require_lab
    require_lab()
    with HostLab(8) as the_lab:
        yield the_lab


@pytest.fixture(scope="module")
def model(lab):
    return make_model(Path(lab.root) / "source" / "gen-model", MIB, SHARDS)


@pytest.fixture(scope="module")
def profile(lab, model):
    return write_profile(lab, "pull", [
        "[target]", f"hosts = {json.dumps(HOSTS)}", 'name = "pull"',
        "[server]", 'engine = "vllm"', 'python = "/usr/bin/python3"', f'model = "{MODEL}"',
        "[weights]", f'"{MODEL}" = "local:{model}"'])


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def source_files(model):
    return {p.name: sha(p) for p in sorted(model.iterdir())}


def on_host(lab, host, rel=""):
    return Path(lab.home(host)) / MODEL[len("/root/"):] / rel


def objects(stdout):
    return {o["host"]: o for o in map(json.loads, stdout.splitlines())}


def no_access_left(lab, hosts=HOSTS):
    for h in hosts:
        keys = Path(lab.home(h)) / ".ssh" / "authorized_keys"
        text = keys.read_text() if keys.exists() else ""
        assert "llmfab-pull" not in text, f"{h}: the pull's key is still authorised:\n{text}"
        left = list((Path(lab.home(h)) / ".cache" / "llmfab" / "pull").glob("*.key"))
        assert not left, f"{h}: the pull's private key is still there: {left}"


def all_final_names_verified(lab, host, want):
    """Every file under its final name holds the source's bytes (a half file never does)."""
    d = on_host(lab, host)
    for p in d.iterdir() if d.exists() else ():
        if p.name in want:
            assert sha(p) == want[p.name], f"{host}: {p.name} under its final name is not the source's"


def test_pull_to_8_hosts_fans_out_and_a_full_disk_fails_alone(lab, model, profile):
    h8_models = Path(lab.home("h8")) / "models"
    h8_models.mkdir(parents=True, exist_ok=True)
    lab.exec("h8", ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", "/root/models"], check=True)
    r = fab(lab, "pull", "--json", profile=profile, code=1, timeout=600)
    out = objects(r.stdout)
    assert set(out) == set(HOSTS)
    assert out["h8"]["ok"] is False and out["h8"]["code"] == 1
    need = sum(p.stat().st_size for p in model.iterdir())
    assert f"needs {need} bytes" in out["h8"]["error"] and "free" in out["h8"]["error"]
    assert f"[h8] error: not enough space for {MODEL}: it needs {need} bytes" in r.stderr
    want = source_files(model)
    fed_here = 0
    for h in HOSTS[:7]:
        o = out[h]
        assert o["ok"] is True and o["files_received"] == len(want) and o["bytes_received"] == need
        fed_here += o["from"].get("here", 0)
        got = {p.name: sha(p) for p in on_host(lab, h).iterdir() if not p.name.startswith(".")}
        manifest = json.loads(on_host(lab, h, ".llmfab-manifest.json").read_text())
        assert got == want, h
        assert {f["path"]: f["sha256"] for f in manifest["files"]} == want
        assert manifest["source"] == f"local:{model}"
    # This machine sent each file about once; the hosts fed each other the rest.
    assert fed_here < 2 * need, (fed_here, need, {h: out[h]["from"] for h in HOSTS[:7]})
    assert sum(sum(v for k, v in out[h]["from"].items() if k != "here") for h in HOSTS[:7]) >= 5 * need
    assert "MB/s" in r.stderr and "left" in r.stderr
    no_access_left(lab)

    # An unchanged re-pull sends 0 bytes.
    r = fab(lab, "-H", ",".join(HOSTS[:7]), "pull", "--json", profile=profile)
    out = objects(r.stdout)
    assert all(out[h]["bytes_received"] == 0 and out[h]["files_present"] == len(want)
               for h in HOSTS[:7]), out
    assert "up to date: 0 bytes sent" in r.stdout + r.stderr
    lab.exec("h8", ["umount", "/root/models"], check=True)


def test_a_flipped_byte_is_found_and_fetched_again(lab, model, profile):
    shard = sorted(model.glob("*.safetensors"))[1].name
    want = source_files(model)
    for h, keep_mtime in (("h3", False), ("h4", True)):
        p = on_host(lab, h, shard)
        st = p.stat()
        with open(p, "r+b") as f:
            f.seek(st.st_size // 2)
            b = f.read(1)
            f.seek(st.st_size // 2)
            f.write(bytes([b[0] ^ 0x01]))
        if keep_mtime:  # the same size and mtime: only --verify's re-hash sees it
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = fab(lab, "-H", "h3,h4", "pull", "--json", profile=profile)
    out = objects(r.stdout)
    assert out["h3"]["refetched"] == [f"{MODEL}/{shard}"] and out["h3"]["files_received"] == 1
    assert sha(on_host(lab, "h3", shard)) == want[shard]
    assert out["h4"]["files_received"] == 0
    r = fab(lab, "-H", "h3,h4", "pull", "--verify", "--json", profile=profile)
    out = objects(r.stdout)
    assert out["h4"]["refetched"] == [f"{MODEL}/{shard}"] and out["h4"]["files_received"] == 1
    assert out["h3"]["files_received"] == 0 and out["h4"]["verified"] is True
    assert sha(on_host(lab, "h4", shard)) == want[shard]
    assert "present but wrong (size or sha256); fetching it again" in r.stderr


def test_resume_after_kill_9_mid_file(lab, model, profile):
    shard = sorted(model.glob("*.safetensors"))[0]
    size = shard.stat().st_size
    on_host(lab, "h5", shard.name).unlink()
    part = on_host(lab, "h5", "." + shard.name + ".llmfab-part")
    bg = Background(lab, "-H", "h5", "pull", profile=profile)
    try:
        wait_for(lambda: part.exists() and part.stat().st_size >= (1 << 20), 60, "a partial file on h5")
        bg.proc.send_signal(signal.SIGKILL)
        bg.finish()
    finally:
        bg.close()
    had = wait_for(lambda: part.stat().st_size if part.exists() else None, 10, "the part file")
    assert 0 < had < size and not on_host(lab, "h5", shard.name).exists()
    r = fab(lab, "-H", "h5", "pull", "--json", profile=profile)
    o = objects(r.stdout)["h5"]
    # The receiver may have written a little more after the kill (bytes in flight).
    assert o["files_received"] == 1 and o["bytes_received"] <= size - had
    assert "(resuming " in r.stderr and "already here)" in r.stderr
    assert sha(on_host(lab, "h5", shard.name)) == sha(shard) and not part.exists()


@pytest.mark.parametrize("sig, code, words", [(signal.SIGINT, 130, "Ctrl-C"),
                                              (signal.SIGTERM, 143, "SIGTERM"),
                                              (signal.SIGHUP, 129, "SIGHUP")])
def test_ctrl_c_or_a_kill_leaves_no_half_file_and_no_access(lab, model, profile, sig, code, words):
    want = source_files(model)
    for h in ("h6", "h7"):
        for p in on_host(lab, h).glob("*.safetensors"):
            p.unlink()
    bg = Background(lab, "-H", "h6,h7", "pull", profile=profile)
    try:
        keys = Path(lab.home("h7")) / ".ssh" / "authorized_keys"
        wait_for(lambda: keys.exists() and "llmfab-pull" in keys.read_text()
                 and any(on_host(lab, h).glob(".*.llmfab-part") for h in ("h6", "h7")), 60,
                 "the pull's key authorised and a copy under way")
        bg.proc.send_signal(sig)
        assert bg.finish() == code, bg.text
    finally:
        bg.close()
    assert f"interrupted ({words})" in bg.text
    no_access_left(lab, ("h6", "h7"))
    for h in ("h6", "h7"):
        all_final_names_verified(lab, h, want)
    fab(lab, "-H", "h6,h7", "pull", profile=profile)
    for h in ("h6", "h7"):
        assert {p.name: sha(p) for p in on_host(lab, h).glob("*.safetensors")} == {
            k: v for k, v in want.items() if k.endswith(".safetensors")}


def test_preflight_names_fab_pull_for_a_missing_pulled_model(lab, profile):
    assert not on_host(lab, "h8").exists()  # the full disk's host never got it
    r = fab(lab, "-H", "h8", "check", profile=profile, code=1)
    assert f"server.model: {MODEL} does not exist on this host; fix: `fab pull`" in flat(r.stdout), r.stdout


def _pull_profile(lab, name, source):
    return write_profile(lab, name, [
        "[target]", f"hosts = {json.dumps(HOSTS)}", 'name = "pull"',
        "[server]", 'engine = "vllm"', 'python = "/usr/bin/python3"', f'model = "{MODEL}"',
        "[weights]", f'"{MODEL}" = "local:{source}"'])


def test_a_repull_removes_the_earlier_pulls_files_and_keeps_the_users(lab, model):
    # The next revision: the last shard gone, a small new one instead, the index rewritten.
    # The shards it keeps are hard links (same inode: neither hashed nor sent again).
    rev2 = Path(lab.root) / "source" / "gen-model-rev2"
    rev2.mkdir()
    shards = sorted(model.glob("*.safetensors"))
    for p in shards[:-1] + [model / "config.json"]:
        os.link(p, rev2 / p.name)
    small = make_model(Path(lab.root) / "source" / "small", 1, 1)
    new = "model-00005-of-00005.safetensors"
    os.rename(small / "model-00001-of-00001.safetensors", rev2 / new)
    index = json.loads((model / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v if v != shards[-1].name else new for k, v in index["weight_map"].items()}
    (rev2 / "model.safetensors.index.json").write_text(json.dumps(index))
    old = shards[-1].name
    on_host(lab, "h1", "NOTES.md").write_text("the user's own file\n")
    on_host(lab, "h2", f".{old}.llmfab-part").write_bytes(b"\0" * 4096)  # llmfab's own partial file
    r = fab(lab, "-H", "h1,h2", "pull", "--json", profile=_pull_profile(lab, "pull-rev2", rev2))
    out = objects(r.stdout)
    want = source_files(rev2)
    for h in ("h1", "h2"):
        o = out[h]
        assert o["ok"] is True and o["files_received"] == 2, o  # the new shard and the new index
        assert o["removed"] == [f"{MODEL}/{old}"], o
        got = {p.name: sha(p) for p in on_host(lab, h).iterdir() if not p.name.startswith(".")}
        manifest = json.loads(on_host(lab, h, ".llmfab-manifest.json").read_text())
        assert {f["path"]: f["sha256"] for f in manifest["files"]} == want
        assert manifest["source"] == f"local:{rev2}"
        assert got == dict(want, **({"NOTES.md": sha(on_host(lab, "h1", "NOTES.md"))} if h == "h1" else {}))
    assert out["h1"]["extra_files"] == [f"{MODEL}/NOTES.md"] and out["h2"]["extra_files"] == []
    assert not on_host(lab, "h2", f".{old}.llmfab-part").exists()
    text = flat(r.stderr + r.stdout)
    assert text.count(f"removed 1 file of the earlier pull not in the source: {MODEL}/{old}") == 2, text
    assert text.count("WARN: 1 file not in the source that llmfab") == 1, text
    assert (f"WARN: 1 file not in the source that llmfab did not put there, left in place: "
            f"{MODEL}/NOTES.md; remove them by hand or move them out of {MODEL}") in text, text

    # No index in the source: an extra shard the user left would be loaded as weights (vLLM
    # globs *.safetensors): exit 1 naming it, and still never deleted.
    rev3 = Path(lab.root) / "source" / "gen-model-rev3"
    rev3.mkdir()
    for p in rev2.iterdir():
        if p.name != "model.safetensors.index.json":
            os.link(p, rev3 / p.name)
    on_host(lab, "h1", "lora.safetensors").write_bytes(b"\0" * 4096)
    r = fab(lab, "-H", "h1", "pull", "--json", profile=_pull_profile(lab, "pull-rev3", rev3), code=1)
    o = objects(r.stdout)["h1"]
    assert o["ok"] is False and o["code"] == 1, o
    assert o["removed"] == [f"{MODEL}/model.safetensors.index.json"], o
    assert o["extra_files"] == [f"{MODEL}/NOTES.md", f"{MODEL}/lora.safetensors"], o
    assert o["error"].startswith(f"{MODEL}/lora.safetensors: not in the source and not put there "
                                 "by llmfab; vLLM loads every *.safetensors"), o
    assert on_host(lab, "h1", "lora.safetensors").exists() and on_host(lab, "h1", "NOTES.md").exists()
    r = fab(lab, "-H", "h1", "pull", "--verify", "--json", profile=_pull_profile(lab, "pull-rev3", rev3),
            code=1)
    assert objects(r.stdout)["h1"]["extra_files"] == [f"{MODEL}/NOTES.md", f"{MODEL}/lora.safetensors"]


def test_a_read_only_destination_is_refused_in_words(lab, model):
    """A destination that exists on a read-only file system: the pull says so before any
    byte is sent (it once ended in `OSError: [Errno 30] Read-only file system`), and gives
    no access."""
    ro = "/root/romodels"
    (Path(lab.home("h7")) / "romodels" / "gen-model").mkdir(parents=True, exist_ok=True)
    lab.exec("h7", ["mount", "--bind", ro, ro], check=True)
    lab.exec("h7", ["mount", "-o", "remount,bind,ro", ro], check=True)
    try:
        prof = write_profile(lab, "pull-ro", [
            "[target]", 'hosts = ["h7"]', 'name = "pull-ro"',
            "[server]", 'engine = "vllm"', 'python = "/usr/bin/python3"', f'model = "{ro}/gen-model"',
            "[weights]", f'"{ro}/gen-model" = "local:{model}"'])
        r = fab(lab, "pull", profile=prof, code=1, timeout=300)
        text = flat(r.stdout + r.stderr)
        assert f"cannot pull into {ro}/gen-model: {ro}/gen-model is on a read-only file system" in text, text
        assert "Errno" not in text and "Traceback" not in text
        no_access_left(lab, ["h7"])
    finally:
        lab.exec("h7", ["umount", ro], check=True)
