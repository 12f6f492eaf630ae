"""End to end: `fab check` over real SSH reads the target's and the drafter's config.json on the host.

One lab host. The fixture models are written under the host's /root/models, so the shipped
configs/qwen3.6-27b-dflash.toml paths (/root/models/Qwen3.6-27B, ...-DFlash) are the real
ones; the profiles here only extend it to point at the lab host and its stand-in ml-env.
"""
import copy
import json
import re

import pytest

from hostlab import REPO, HostLab
from helpers import DRAFT, TARGET, flat

pytestmark = pytest.mark.e2e

CONFIGS = REPO / "configs"
LINE = re.compile(r"^\[h1\] (OK|WARN|FAIL) +(\S+) *(.*)$")


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


def checks(stdout, *, exposure=False):
    """(status, check, message) per preflight line. The shipped base profile listens on
    0.0.0.0 without a key, so every check here warns about that; it is left out unless
    `exposure` (test_an_open_port_without_a_key_warns_with_both_fixes asserts it)."""
    got = []
    for line in stdout.splitlines():
        m = LINE.match(line)
        if m:
            got.append(list(m.groups()))
        elif got and line.startswith("[h1]      "):  # a finding's further lines, fix and source
            got[-1][2] += " " + line[len("[h1]"):].strip()
    got = [tuple(c) for c in got]
    return got if exposure else [c for c in got if c[1] != "exposure"]


def test_an_open_port_without_a_key_warns_with_both_fixes(lab):
    base = profile(lab, "open-port", "qwen3.6-27b.toml")
    r = lab.fab("check", "--json", profile=base)
    assert r.returncode == 0, r.stdout + r.stderr
    warn = [c for c in checks(r.stderr, exposure=True) if c[1] == "exposure"]
    assert warn == [("WARN", "exposure",
                     "the server listens on 0.0.0.0:30917 with no API key: anyone who can reach port "
                     "30917 can use it. Either set a key from your environment ([server.env] "
                     'VLLM_API_KEY = { from_env = "VLLM_API_KEY" }), or bind [server] host = '
                     '"127.0.0.1" and reach it through an SSH tunnel (ssh -L 30917:127.0.0.1:30917 HOST)')]
    record = json.loads(r.stdout)
    assert record["host"] == "h1" and record["ok"] is True
    assert {"status": "WARN", "check": "exposure", "message": warn[0][2]} in record["checks"]
    keyed = profile(lab, "open-port-keyed", "qwen3.6-27b.toml", "[server.env]",
                    'VLLM_API_KEY = { from_env = "LAB_KEY" }')
    r = lab.fab("check", profile=keyed, env={"LAB_KEY": "k"})
    # vLLM's key guards /v1 and a few prefixes only: the warning says what stays open.
    warn = [c for c in checks(r.stdout, exposure=True) if c[1] == "exposure"]
    assert r.returncode == 0 and len(warn) == 1, r.stdout + r.stderr
    assert warn[0][0] == "WARN" and "/metrics, /health" in warn[0][2] and "/invocations" in warn[0][2]
    local = profile(lab, "open-port-local", "qwen3.6-27b.toml", 'host = "127.0.0.1"')
    r = lab.fab("check", profile=local)
    assert r.returncode == 0 and "exposure" not in r.stdout, r.stdout + r.stderr


def test_seed_drafter_on_the_base_profile_warns_only_about_prefix_caching(lab):
    # The base profile plus the DFlash speculative-config, without VLLM_USE_V2_MODEL_RUNNER:
    # vLLM 0.33 (the stand-in's version) picks the V2 runner for this drafter by itself, so the
    # doctor (tasks/doctor/host/spec_rules.py) only warns about the base's prefix caching.
    spec = ('speculative-config = { method = "dflash", model = "/root/models/Qwen3.6-27B-DFlash", '
            "num_speculative_tokens = 15 }")
    r = lab.fab("check", profile=profile(lab, "dflash-nov2", "qwen3.6-27b.toml", "[server.args]", spec))
    assert r.returncode == 0, r.stdout + r.stderr
    got = checks(r.stdout)
    assert [c[:2] for c in got if c[0] != "OK"] == [("WARN", "vllm-dflash-prefix-caching")], r.stdout
    warn = [c for c in got if c[0] != "OK"][0][2]
    assert warn.startswith("DFlash on vLLM 0.33.0 with automatic prefix caching on "
                           "(server.args.enable-prefix-caching = true)")
    assert " fix: set enable-prefix-caching = false in [server.args]" in warn
    assert " source: vllm-project/vllm issue #47930" in warn
    names = [c[1] for c in got]
    for check in ("python", "engine", "path", "config", "spec", "dflash", "context", "tp", "port", "gpu"):
        assert check in names, r.stdout
    # + the exposure warning (0.0.0.0 without a key), left out of `got`
    assert f"[h1] preflight: {len(got) + 1} checks: {len(got) - 1} OK, 2 WARN, 0 FAIL" in r.stdout


def test_shipped_dflash_profile_is_all_ok(lab):
    r = lab.fab("check", profile=profile(lab, "dflash", "qwen3.6-27b-dflash.toml"))
    assert r.returncode == 0, r.stdout + r.stderr
    got = checks(r.stdout)
    assert {c[0] for c in got} == {"OK"}, r.stdout
    assert any("layer_types: 4 of 5 sliding_attention" in c[2] for c in got), r.stdout


def test_broken_drafter_fails_naming_file_and_key_and_launches_nothing(lab):
    prof = profile(lab, "dflash-broken", "qwen3.6-27b-dflash.toml", "[server.args]",
                   'speculative-config = { model = "/root/models/Broken-DFlash" }')
    r = lab.fab("check", profile=prof)
    assert r.returncode == 1, r.stdout + r.stderr
    fails = [c for c in checks(r.stdout) if c[0] == "FAIL"]
    assert [f[:2] for f in fails] == [("FAIL", "spec-mask-token")], r.stdout
    assert fails[0][2].startswith("/root/models/Broken-DFlash/config.json: "
                                  "dflash_config.mask_token_id = 248320 is not below the target's "
                                  "text_config.vocab_size = 248320 (/root/models/Qwen3.6-27B/config.json): "
                                  "this drafter was made for another tokenizer fix: "), r.stdout
    assert "nothing was launched" in r.stdout
    assert not (lab.home("h1") / "llmfab" / "dflash-broken" / "releases").exists()
    # deploy runs the same preflight: it stops there too, before any release exists.
    r = lab.fab("deploy", profile=prof)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "dflash_config.mask_token_id = 248320" in flat(r.stdout)
    assert not (lab.home("h1") / "llmfab" / "dflash-broken" / "releases").exists()
