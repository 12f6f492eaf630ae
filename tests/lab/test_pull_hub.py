"""`fab pull` of `hf://ORG/NAME@REV` sources (issue 30) onto 3 lab hosts, the real
huggingface_hub client reading the hub stand-in on loopback (tests/standins/hub.py,
HF_ENDPOINT): the commit recorded, the hub read once, a re-pull sending nothing, a corrupted
download refused by its LFS sha256, Ctrl-C mid-download, refusals (revision, repo, token,
network) as exit codes, and the token reaching the hub as a Bearer header and nowhere else.
"""
import hashlib
import json
import os
import signal
from pathlib import Path

import pytest

from helpers import Background, fab, write_profile
from hostlab import HostLab, wait_for
from standins.hub import HubStandIn

HOSTS = ["h1", "h2", "h3"]
MODEL = "/root/models/hub-model"
TOKEN = "hf_labSecretToken0123456789"   # the private repo's token, given as $LAB_HUB_TOKEN
SHARD = 3 << 20


@pytest.fixture(scope="module")
def lab():
    from conftest import require_lab
    require_lab()
    with HostLab(3) as the_lab:
        yield the_lab


def model_files(seed):
    shards = {f"model-{i:05d}-of-00002.safetensors": hashlib.sha256(f"{seed}{i}".encode()).digest() * (SHARD // 32)
              for i in (1, 2)}
    return {"config.json": json.dumps({"model_type": "qwen3", "seed": seed}).encode(),
            "tokenizer_config.json": b"{}", **shards}


@pytest.fixture(scope="module")
def hub(lab):
    with HubStandIn() as h:
        h.files = model_files("a")
        h.commit = h.add("org/model", h.files, token=TOKEN)
        h.add("org/other", model_files("b"), token=TOKEN)
        h.add("org/slow", {"config.json": b"{}", "model.safetensors": os.urandom(12 << 20)}, token=TOKEN)
        h.env = {"HF_ENDPOINT": h.endpoint, "HF_HOME": str(Path(lab.root) / "hf-home"),
                 "LAB_HUB_TOKEN": TOKEN, "HF_HUB_DISABLE_TELEMETRY": "1"}
        yield h


def profile(lab, name, source, token='HF_TOKEN = { from_env = "LAB_HUB_TOKEN" }'):
    return write_profile(lab, name, [
        "[target]", f"hosts = {json.dumps(HOSTS)}", f'name = "{name}"',
        "[server]", 'engine = "vllm"', 'python = "/usr/bin/python3"', f'model = "{MODEL}"',
        "[weights]", f'"{MODEL}" = "{source}"'] + ([token] if token else []))


def on_host(lab, host, rel=""):
    return Path(lab.home(host)) / MODEL[len("/root/"):] / rel


def objects(stdout):
    return {o["host"]: o for o in map(json.loads, stdout.splitlines())}


def cdn_gets(hub):
    return [p for m, p, _, origin in hub.requests if origin == "cdn" and m == "GET"]


def test_pull_from_the_hub_to_3_hosts_records_the_commit_and_reads_the_hub_once(lab, hub):
    p = profile(lab, "hub", "hf://org/model@main")
    r = fab(lab, "pull", "--json", profile=p, env=hub.env, timeout=300)
    out = objects(r.stdout)
    want = {n: hashlib.sha256(d).hexdigest() for n, d in hub.files.items()}
    for h in HOSTS:
        assert out[h]["ok"] is True and out[h]["dirs"][0]["commit"] == hub.commit, out[h]
        got = {q.name: hashlib.sha256(q.read_bytes()).hexdigest()
               for q in on_host(lab, h).iterdir() if not q.name.startswith(".")}
        manifest = json.loads(on_host(lab, h, ".llmfab-manifest.json").read_text())
        assert got == want, h
        assert manifest["commit"] == hub.commit and manifest["source"] == "hf://org/model@main"
        assert {f["path"]: f["sha256"] for f in manifest["files"]} == want
    assert f"main is commit {hub.commit}" in r.stderr
    # The hub was read once: each LFS file fetched once, at the resolved commit.
    assert sorted(cdn_gets(hub)) == sorted(set(cdn_gets(hub))) and len(cdn_gets(hub)) == 2
    assert all(f"/resolve/{hub.commit}/" in q for m, q, _, o in hub.requests if "/resolve/" in q)
    # The token reached the hub as a Bearer header, the CDN never, and no output shows it.
    assert set(hub.auth_seen("hub")) == {f"Bearer {TOKEN}"} and hub.auth_seen("cdn") == []
    assert TOKEN not in r.stdout + r.stderr

    # An unchanged re-pull sends 0 bytes to the hosts and fetches nothing from the hub.
    before = len(hub.requests)
    r = fab(lab, "pull", "--json", profile=p, env=hub.env)
    out = objects(r.stdout)
    assert all(out[h]["bytes_received"] == 0 and out[h]["files_present"] == len(want) for h in HOSTS), out
    assert "every file already in this machine's hub cache" in r.stderr
    assert [q for m, q, _, o in hub.requests[before:] if "/resolve/" in q or o == "cdn"] == []


def test_a_corrupted_download_is_refused_by_its_lfs_sha256_and_fetched_again_next_time(lab, hub):
    p = profile(lab, "hub-corrupt", "hf://org/other")
    shard = "model-00002-of-00002.safetensors"
    hub.corrupt("org/other", shard)
    r = fab(lab, "pull", profile=p, env=hub.env, code=1)
    text = r.stdout + r.stderr
    assert f'[weights] "{MODEL}": hf://org/other: {shard}: sha256 ' in text, text
    assert "the hub's LFS sha256 is" in text and "Traceback" not in text
    for h in HOSTS:  # nothing went to the hosts from a source that did not verify
        m = on_host(lab, h, ".llmfab-manifest.json")
        assert not m.exists() or json.loads(m.read_text())["source"] != "hf://org/other"
    hub.repos["org/other"].corrupted.clear()
    r = fab(lab, "-H", "h1", "pull", "--json", profile=p, env=hub.env)
    assert objects(r.stdout)["h1"]["ok"] is True
    assert f"{shard} (3.0 MiB) fetched from the hub in " in r.stderr  # the bad copy was not kept

    # A copy gone bad in this machine's cache, size and mtime unchanged: --verify hashes it again.
    blob = Path(hub.env["HF_HOME"]) / "hub" / "models--org--other" / "blobs" / hashlib.sha256(
        hub.repos["org/other"].files[shard]).hexdigest()
    st = blob.stat()
    with open(blob, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0x01]))
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    fab(lab, "-H", "h1", "pull", profile=p, env=hub.env)  # trusted by its size and mtime
    r = fab(lab, "-H", "h1", "pull", "--verify", profile=p, env=hub.env, code=1)
    assert f"{shard}: sha256 " in r.stderr and "the hub's LFS sha256 is" in r.stderr, r.stderr
    r = fab(lab, "-H", "h1", "pull", profile=p, env=hub.env)
    assert f"{shard} (3.0 MiB) fetched from the hub in " in r.stdout  # the bad copy was not kept


def test_ctrl_c_mid_download_exits_at_once_and_a_killed_downloads_leftover_goes(lab, hub):
    p = profile(lab, "hub-slow", "hf://org/slow")
    blobs = Path(hub.env["HF_HOME"]) / "hub" / "models--org--slow" / "blobs"
    shard = hashlib.sha256(hub.repos["org/slow"].files["model.safetensors"]).hexdigest()

    def partial():  # the client writes what it receives in 10 MiB pieces
        return next((f for f in blobs.glob("*.incomplete") if f.stat().st_size >= 10 << 20), None)

    hub.fast, hub.rate = 10 << 20, 256 << 10  # its last 2 MiB take 8 s: Ctrl-C and kill -9 land midway
    leftovers = []
    for sig in (signal.SIGINT, signal.SIGKILL):
        bg = Background(lab, "-H", "h1", "pull", profile=p, env=hub.env)
        try:
            leftovers.append(wait_for(partial, 60, "a partial download in this machine's hub cache"))
            bg.proc.send_signal(sig)
            code = bg.finish()
        finally:
            bg.close()
        if sig == signal.SIGINT:  # at once, not once the shard is in (the download threads)
            assert code == 130 and "interrupted (Ctrl-C) while fetching from the hub" in bg.text, bg.text
        assert not (blobs / shard).exists()
    assert all(f.exists() for f in leftovers)  # huggingface_hub 2.x leaves them, never resumes them
    hub.rate = None
    r = fab(lab, "-H", "h1", "pull", "--json", profile=p, env=hub.env)
    assert objects(r.stdout)["h1"]["ok"] is True and (blobs / shard).exists()
    assert not any(f.exists() for f in leftovers)  # the next pull removed them


@pytest.mark.parametrize("source, token, env, code, words", [
    ("hf://org/model@no-such-branch", "default", {}, 1, "no such revision in the repo"),
    ("hf://org/missing", None, {}, 1, "no such repo on the hub, or a private one"),
    ("hf://org/model", "default", {"LAB_HUB_TOKEN": "hf_wrongToken"}, 1, "the hub refused: check [weights] HF_TOKEN"),
    ("hf://org/model", "default", {"LAB_HUB_TOKEN": None}, 2, "weights.HF_TOKEN: reads $LAB_HUB_TOKEN"),
    ("hf://org/model", "default", {"HF_ENDPOINT": "http://127.0.0.1:1"}, 1, "cannot reach the hub"),
])
def test_what_the_hub_refuses_is_an_exit_code_naming_the_key_and_the_source(lab, hub, source, token, env, code,
                                                                             words):
    p = profile(lab, "hub-refused", source, **({} if token else {"token": None}))
    assert "LAB_HUB_TOKEN" not in os.environ  # fab's environment is os.environ + `full`
    full = {k: v for k, v in dict(hub.env, **env).items() if v is not None}
    r = fab(lab, "pull", "--json", profile=p, env=full, code=code)
    text = " ".join(r.stderr.split())
    assert words in text, text
    if code == 1:
        assert f'[weights] "{MODEL}": {source}: ' in text
        out = objects(r.stdout)  # every host's pull failed: one object each
        assert set(out) == set(HOSTS) and all(o["ok"] is False and o["code"] == 1 and words in o["error"]
                                              for o in out.values()), out
    assert "Traceback" not in text and TOKEN not in text and "hf_wrongToken" not in text
