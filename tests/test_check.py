"""End to end: `fab check` over real SSH reads the target's and the drafter's config.json on the host.

One lab host. The fixture models are written under the host's /root/models, so the shipped
configs/qwen3.6-27b-dflash.toml paths (/root/models/Qwen3.6-27B, ...-DFlash) are the real
ones; the profiles here only extend it to point at the lab host and its stand-in ml-env.
"""
import copy
import json
import re

import pytest

from lab import REPO, HostLab
from test_modelcheck import DRAFT, TARGET

pytestmark = pytest.mark.e2e

CONFIGS = REPO / "configs"
LINE = re.compile(r"^\[h1\] (OK|WARN|FAIL) +(\S+) +(.*)$")


@pytest.fixture(scope="module")
def lab():
    with HostLab(1) as lab:
        models = lab.home("h1") / "models"
        for name, config in (("Qwen3.6-27B", TARGET), ("Qwen3.6-27B-DFlash", DRAFT)):
            (models / name).mkdir(parents=True)
            (models / name / "config.json").write_text(json.dumps(config, indent=1))
        broken = copy.deepcopy(DRAFT)
        broken["dflash_config"]["mask_token_id"] = 248320  # past the target's vocabulary
        (models / "Broken-DFlash").mkdir()
        (models / "Broken-DFlash" / "config.json").write_text(json.dumps(broken))
        yield lab


def profile(lab, name, extends, *extra):
    """A profile extending a shipped config: only host, interpreter and port change."""
    lines = [f'extends = "{CONFIGS / extends}"', "[target]", 'hosts = ["h1"]', f'name = "{name}"',
             "[server]", f'python = "{lab.ml_python}"', "port = 30917"] + list(extra)
    path = lab.root / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def checks(stdout):
    return [m.groups() for m in map(LINE.match, stdout.splitlines()) if m]


def test_seed_drafter_and_target_pass_with_only_the_v2_warning(lab):
    # The base profile plus the DFlash speculative-config, without VLLM_USE_V2_MODEL_RUNNER.
    spec = ('speculative-config = { method = "dflash", model = "/root/models/Qwen3.6-27B-DFlash", '
            "num_speculative_tokens = 15 }")
    r = lab.fab("check", profile=profile(lab, "dflash-nov2", "qwen3.6-27b.toml", "[server.args]", spec))
    assert r.returncode == 0, r.stdout + r.stderr
    got = checks(r.stdout)
    assert [c for c in got if c[0] != "OK"] == [
        ("WARN", "dflash", "/root/models/Qwen3.6-27B-DFlash/config.json: layer_types mixes 4 "
         "sliding_attention with 1 full_attention layers; recent vLLM refuses such drafters without "
         'the V2 model runner (NotImplementedError at engine start): set VLLM_USE_V2_MODEL_RUNNER = "1" '
         "in [server.env]")], r.stdout
    names = [c[1] for c in got]
    for check in ("python", "engine", "path", "config", "spec", "dflash", "context", "tp", "port", "gpu"):
        assert check in names, r.stdout
    assert f"[h1] preflight: {len(got)} checks: {len(got) - 1} OK, 1 WARN, 0 FAIL" in r.stdout


def test_shipped_dflash_profile_is_all_ok(lab):
    r = lab.fab("check", profile=profile(lab, "dflash", "qwen3.6-27b-dflash.toml"))
    assert r.returncode == 0, r.stdout + r.stderr
    got = checks(r.stdout)
    assert {c[0] for c in got} == {"OK"}, r.stdout
    assert "VLLM_USE_V2_MODEL_RUNNER=1 is set" in r.stdout


def test_broken_drafter_fails_naming_file_and_key_and_launches_nothing(lab):
    prof = profile(lab, "dflash-broken", "qwen3.6-27b-dflash.toml", "[server.args]",
                   'speculative-config = { model = "/root/models/Broken-DFlash" }')
    r = lab.fab("check", profile=prof)
    assert r.returncode == 1, r.stdout + r.stderr
    fails = [c for c in checks(r.stdout) if c[0] == "FAIL"]
    assert fails == [("FAIL", "dflash", "/root/models/Broken-DFlash/config.json: "
                      "dflash_config.mask_token_id = 248320 is not below the target's "
                      "text_config.vocab_size = 248320 (/root/models/Qwen3.6-27B/config.json): "
                      "this drafter was made for another tokenizer")], r.stdout
    assert "nothing was launched" in r.stdout
    assert not (lab.home("h1") / "llmfab" / "dflash-broken" / "releases").exists()
    # deploy runs the same preflight: it stops there too, before any release exists.
    r = lab.fab("deploy", profile=prof)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "dflash_config.mask_token_id = 248320" in r.stdout
    assert not (lab.home("h1") / "llmfab" / "dflash-broken" / "releases").exists()
