"""End to end: the speculative-decoding doctor through `fab check`, `fab deploy`, `fab status`
and `fab bench` over real SSH, with stand-in vLLMs of several versions side by side (one
venv each, tests/standins build_ml_env(vllm_version=...)), each behaving as that release
does (tests/standins/specversions.py).

The drafter is z-lab's Qwen3.6-27B-DFlash config (4 sliding + 1 full attention layers,
target_layer_ids [1, 16, 31, 46, 61]) under the host's /root/models, so the shipped
profile configs/qwen3.6-27b-dflash.toml is used as is, only pointed at the lab.
"""
import copy
import json
import re

import pytest

from helpers import flat
from hostlab import REPO, HostLab
from standins import build_ml_env
from helpers import DRAFT, TARGET

pytestmark = pytest.mark.e2e

CONFIGS = REPO / "configs"
VERSIONS = ("0.19.1", "0.20.1", "0.21.0", "0.22.0", "0.24.0", "0.25.0", "0.26.0", "0.33.0")
FULL = "/root/models/Full-DFlash"       # the same drafter with every layer full attention
BAD = "/root/models/Broken-DFlash"      # mask_token_id past the target's vocabulary
DEEP = "/root/models/Deep-DFlash"       # a target layer id past the target's 64 layers
EMPTY = "/root/models/Empty-DFlash"     # no config.json
LINE = re.compile(r"^\[h1\] (OK|WARN|FAIL) +(\S+) *(.*)$")


@pytest.fixture(scope="module")
def lab():
    with HostLab(1) as lab:
        models = lab.home("h1") / "models"
        full = dict(copy.deepcopy(DRAFT), layer_types=["full_attention"] * 5)
        bad = copy.deepcopy(DRAFT)
        bad["dflash_config"]["mask_token_id"] = 248320
        deep = copy.deepcopy(DRAFT)
        deep["dflash_config"]["target_layer_ids"] = [1, 16, 31, 46, 64]
        for name, config in (("Qwen3.6-27B", TARGET), ("Qwen3.6-27B-DFlash", DRAFT),
                             ("Full-DFlash", full), ("Broken-DFlash", bad), ("Deep-DFlash", deep),
                             ("Empty-DFlash", None)):
            (models / name).mkdir(parents=True)
            if config is not None:
                (models / name / "config.json").write_text(json.dumps(config, indent=1))
        lab.envs = {v: build_ml_env(lab.root / f"ml-env-{v}", vllm_version=v) for v in VERSIONS}
        yield lab


def profile(lab, name, version, *, env=None, drafter=None, caching=None, accept=(), port=30931,
            extra=()):
    """The shipped Qwen3.6-27B + DFlash profile on the lab host with stand-in vLLM `version`: env VLLM_USE_V2_MODEL_RUNNER
    (None: as the profile has it, "" : removed), another drafter, prefix caching."""
    lines = [f'extends = "{CONFIGS / "qwen3.6-27b-dflash.toml"}"', "[target]", 'hosts = ["h1"]',
             f'name = "{name}"', "[server]", f'python = "{lab.envs[version]}"', f"port = {port}"]
    args = []
    if drafter:
        args.append(f'speculative-config = \'{{"method": "dflash", "model": "{drafter}", '
                    f'"num_speculative_tokens": 15}}\'')
    if caching is not None:
        args.append(f"enable-prefix-caching = {'true' if caching else 'false'}")
    lines += ["[server.args]"] + args + list(extra)
    if accept:
        lines += ["[check]", "accept = [%s]" % ", ".join(f'"{a}"' for a in accept)]
    path = lab.root / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    text = path.read_text()
    if env is not None:  # the base sets VLLM_USE_V2_MODEL_RUNNER = "1": override it in a copy
        base = (CONFIGS / "qwen3.6-27b-dflash.toml").read_text()
        base = base.replace('extends = "qwen3.6-27b.toml"', f'extends = "{CONFIGS / "qwen3.6-27b.toml"}"')
        base = base.replace('VLLM_USE_V2_MODEL_RUNNER = "1"',
                            f'VLLM_USE_V2_MODEL_RUNNER = "{env}"' if env else "")
        mine = lab.root / f"{name}-base.toml"
        mine.write_text(base)
        path.write_text(text.replace(str(CONFIGS / "qwen3.6-27b-dflash.toml"), str(mine)))
    return path


def check(lab, prof):
    r = lab.fab("check", "--json", profile=prof)
    objs = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert len(objs) == 1, r.stdout + r.stderr
    lines = [m.groups() for m in map(LINE.match, r.stderr.splitlines()) if m]
    return r, objs[0], lines


# (version, profile options, rules that must be found, rules that must not)
MATRIX = [
    ("0.19.1", {"caching": True}, {"vllm-dflash-unsupported"},
     {"vllm-dflash-layer-offset", "vllm-dflash-swa-ignored", "vllm-dflash-prefix-caching"}),
    ("0.20.1", {"drafter": FULL, "caching": False, "env": "0"},
     {"vllm-dflash-layer-offset"}, {"vllm-dflash-unsupported"}),
    ("0.21.0", {"env": "0", "caching": False}, {"vllm-dflash-layer-offset", "vllm-dflash-swa-ignored"}, set()),
    ("0.22.0", {"env": "0", "caching": False}, {"vllm-dflash-swa-ignored"}, {"vllm-dflash-layer-offset"}),
    ("0.24.0", {"caching": False}, {"vllm-dflash-swa-ignored"}, {"vllm-dflash-swa-refused"}),
    ("0.25.0", {"caching": False}, {"vllm-dflash-swa-refused"},
     {"vllm-dflash-swa-ignored", "vllm-dflash-swa-needs-v2"}),
    ("0.26.0", {"env": "0", "caching": False}, {"vllm-dflash-swa-needs-v2"}, {"vllm-dflash-swa-refused"}),
    ("0.26.0", {"env": "", "caching": False}, set(), {"vllm-dflash-swa-needs-v2"}),
    ("0.33.0", {"drafter": FULL, "caching": True}, {"vllm-dflash-prefix-caching"}, {"spec-mask-token"}),
    ("0.33.0", {"drafter": BAD, "caching": False}, {"spec-mask-token"}, {"vllm-dflash-prefix-caching"}),
    ("0.33.0", {"drafter": DEEP, "caching": False}, {"spec-layer-out-of-range"}, {"spec-drafter-config"}),
    ("0.33.0", {"drafter": EMPTY, "caching": False}, {"spec-drafter-config"}, {"spec-layer-out-of-range"}),
    # a table-valued flag is one value: the child writes the whole speculative-config
    ("0.33.0", {"caching": False, "extra": ['speculative-config = { method = "dflash", model = '
                                            '"/root/models/Qwen3.6-27B-DFlash", num_speculative_tokens = 16 }']},
     {"spec-draft-length"}, set()),
    ("0.33.0", {}, set(), {"spec-draft-length", "vllm-dflash-swa-needs-v2", "vllm-dflash-prefix-caching",
                           "vllm-dflash-swa-refused", "vllm-dflash-swa-ignored", "spec-mask-token",
                           "spec-layer-out-of-range", "spec-drafter-config", "vllm-dflash-unsupported"}),
]


@pytest.mark.parametrize("version,opts,found,absent", MATRIX,
                         ids=[f"{m[0]}-{'-'.join(sorted(m[2])) or 'clear'}" for m in MATRIX])
def test_check_reports_each_rule_on_both_sides_of_its_range(lab, version, opts, found, absent):
    r, obj, lines = check(lab, profile(lab, f"doc-{version.replace('.', '')}", version, **opts))
    got = {f["rule"] for f in obj["findings"]}
    assert found <= got and not (absent & got), (got, r.stderr)
    assert f"vllm {version}" in r.stderr
    for f in obj["findings"]:
        assert set(f) >= {"rule", "severity", "message", "fix", "source", "evidence"}
        assert (f["severity"], f["rule"]) in {(s, c) for s, c, _ in lines}, r.stderr
    fails = {f["rule"] for f in obj["findings"] if f["severity"] == "FAIL"}
    assert (r.returncode == 1) == bool(fails), r.stderr


def test_seed_case_end_to_end(lab):
    """vLLM 0.20.1, the Qwen3.6-27B + DFlash profile as it was first deployed (~1.1% acceptance) (no runner env, prefix caching on in
    the base profile, which the shipped one now turns off): check names the offset and the sliding window; deployed anyway (the
    FAIL accepted), the start-up log shows the unshifted tuple; at ~1.1% acceptance bench says
    broken (its greedy probe too) and status, without greedy evidence, unconfirmed, listing
    those findings as causes."""
    seed = profile(lab, "seed", "0.20.1", env="", caching=True)
    r, obj, _ = check(lab, seed)
    assert r.returncode == 1
    assert {"vllm-dflash-layer-offset", "vllm-dflash-swa-ignored", "vllm-dflash-prefix-caching"} \
        == {f["rule"] for f in obj["findings"]}, r.stderr
    prof = profile(lab, "seed", "0.20.1", env="", caching=True, accept=["vllm-dflash-swa-ignored"],
                   port=30932)
    prof.write_text(prof.read_text() + '[server.env]\nSTANDIN_TOKENS_PER_S = "4000"\n'
                    'STANDIN_PREFIX_HIT_RATE = "0.4"\n')
    d = lab.fab("deploy", "--json", profile=prof)
    try:
        assert d.returncode == 0, d.stdout + d.stderr
        assert "WARN vllm-dflash-swa-ignored" in d.stderr and "(accepted in the profile)" in flat(d.stderr)
        assert "spec log: V1 model runner; aux layers (1, 16, 31, 46, 61) from the config = the " \
               "drafter's target_layer_ids unshifted" in d.stderr, d.stderr
        dep = json.loads(d.stdout.splitlines()[-1])
        log = [f for f in dep["findings"] if f["evidence"] == "log"]
        assert [f["rule"] for f in log] == ["vllm-dflash-layer-offset"], dep["findings"]
        b = lab.fab("bench", "--json", "--requests", "4", "--max-tokens", "64", profile=prof)
        assert b.returncode == 0, b.stdout + b.stderr
        spec = json.loads(b.stdout.splitlines()[-1])["spec"]
        assert spec["acceptance_rate"] == pytest.approx(0.011, abs=0.01)
        assert spec["verdict"] == "broken" and spec["evidence"]["drafts"] >= 100, spec
        # sampled at the server's default: the greedy probe confirms it (the stand-in's
        # acceptance ignores sampling, as a drafter this broken does)
        assert spec["evidence"]["greedy_probe"]["verdict"] == "broken", spec
        s = lab.fab("status", "--json", profile=prof)
        status = json.loads(s.stdout.splitlines()[-1])
        st = status["spec"]
        # status sends no request, so no greedy evidence: unconfirmed, its causes still listed
        assert status["sampling"]["source"] == "server default", status
        assert st["verdict"] == "unconfirmed" and st["evidence"]["window_verdict"] == "broken", st
        rules = [f["rule"] for f in st["findings"]]
        assert rules[0] == "vllm-dflash-swa-ignored" and "vllm-dflash-layer-offset" in rules, rules
        assert [f["evidence"] for f in st["findings"] if f["rule"] == "vllm-dflash-layer-offset"] == ["log"]
        assert st["evidence"]["prefix_cache_hit_rate"] == pytest.approx(0.4, abs=0.01)
        assert re.search(r"prefix cache hit rate (39|40)\.\d% over the same window", s.stderr), s.stderr
        assert "verdict: unconfirmed" in flat(s.stderr) and "`fab bench --temperature 0`" in flat(s.stderr)
        assert re.search(r"likely cause 1: WARN vllm-dflash-swa-ignored \((version|log)\): .* fix: "
                         r"upgrade vLLM .* source: vllm-project/vllm issue #40898", flat(s.stderr)), s.stderr
    finally:
        lab.fab("stop", "--grace", "5", profile=prof)


def test_fixed_version_at_62_percent_is_healthy(lab):
    prof = profile(lab, "fixed", "0.33.0", caching=False, port=30933)
    prof.write_text(prof.read_text() + '[server.env]\nSTANDIN_TOKENS_PER_S = "4000"\n'
                    'STANDIN_ACCEPT_RATE = "0.62"\n')
    d = lab.fab("deploy", profile=prof)
    try:
        assert d.returncode == 0, d.stdout + d.stderr
        assert "aux layers (2, 17, 32, 47, 62) from the config = the drafter's target_layer_ids + 1" \
            in d.stdout, d.stdout
        # the preflight's facts, kept with the release for the ready line, status and bench
        kept = lab.home("h1") / "llmfab" / "fixed" / "current" / "spec-facts.json"
        facts = json.loads(kept.read_text())
        assert facts["version"] == "0.33.0" and facts["layer_ids"] == [1, 16, 31, 46, 61], facts
        s0 = lab.fab("status", "--json", profile=prof)
        assert json.loads(s0.stdout.splitlines()[-1])["spec"]["verdict"] is None  # no drafts yet
        b = lab.fab("bench", "--json", "--repeat", "2", "--requests", "8", "--max-tokens", "256",
                    profile=prof)
        assert b.returncode == 0, b.stdout + b.stderr
        rec = json.loads(b.stdout.splitlines()[-1])
        assert rec["repeat"]["n"] == 2 and "output tok/s" in rec["repeat"]["spread"]
        assert rec["spec"]["verdict"] == "healthy" and rec["spec"]["findings"] == []
        s = lab.fab("status", "--json", profile=prof)
        st = json.loads(s.stdout.splitlines()[-1])["spec"]
        assert st["acceptance_rate"] == pytest.approx(0.62, abs=0.01)
        assert st["verdict"] == "healthy" and st["findings"] == [] and st["evidence"]["k"] == 15
        kept.write_text('{"version": ')  # damaged: status computes the facts again
        s = lab.fab("status", "--json", profile=prof)
        st = json.loads(s.stdout.splitlines()[-1])["spec"]
        assert st["verdict"] == "healthy" and st["findings"] == [] and st["evidence"]["k"] == 15, s.stderr
    finally:
        lab.fab("stop", "--grace", "5", profile=prof)


def test_refusing_versions_fail_at_start_with_the_real_text(lab):
    """0.25.0 refuses the mixed drafter; 0.26.0 on the V1 runner too: the deploy (with the
    FAIL accepted) fails fast with the engine's own NotImplementedError."""
    for version, env, text in (
            ("0.25.0", None, "NotImplementedError: DFlash does not yet support mixed sliding/full "
                             "attention via layer_types"),
            ("0.26.0", "0", "NotImplementedError: DFlash drafters with mixed sliding/full attention "
                            "require the V2 model runner")):
        rule = "vllm-dflash-swa-refused" if version == "0.25.0" else "vllm-dflash-swa-needs-v2"
        prof = profile(lab, f"refuse-{version.replace('.', '')}", version, env=env, caching=False,
                       accept=[rule], port=30934)
        d = lab.fab("deploy", profile=prof)
        assert d.returncode == 1, d.stdout + d.stderr
        assert text in d.stdout + d.stderr


def test_prefix_caching_ab_decides(lab, tmp_path):
    """The rule's A/B recipe: the same DFlash deployment with prefix caching on (40% of the
    prompt tokens hit the cache) and off, each benched twice; --compare's last line says the
    side without caching wins on acceptance, beyond the spread."""
    sides = {}
    for caching in (True, False):
        name = "ab-on" if caching else "ab-off"
        prof = profile(lab, name, "0.33.0", caching=caching, port=30935)
        prof.write_text(prof.read_text() + '[server.env]\nSTANDIN_TOKENS_PER_S = "4000"\n'
                        'STANDIN_PREFIX_HIT_RATE = "0.4"\n')
        d = lab.fab("deploy", profile=prof)
        try:
            assert d.returncode == 0, d.stdout + d.stderr
            assert ("WARN vllm-dflash-prefix-caching" in d.stdout) is caching
            b = lab.fab("bench", "--json", "--repeat", "2", "--requests", "4", "--max-tokens", "128",
                        profile=prof)
            assert b.returncode == 0, b.stdout + b.stderr
            sides[name] = tmp_path / f"{name}.json"
            sides[name].write_text(b.stdout)
            rec = json.loads(b.stdout)
            if caching:
                assert rec["spec"]["evidence"]["prefix_cache_hit_rate"] == pytest.approx(0.4, abs=0.01)
                assert [f["rule"] for f in rec["spec"]["findings"]] == ["vllm-dflash-prefix-caching"]
            else:
                assert "prefix_cache_hit_rate" not in rec["spec"]["evidence"]
        finally:
            lab.fab("stop", "--grace", "5", profile=prof)
    cmp = lab.fab("bench", "--compare", f"{sides['ab-on']},{sides['ab-off']}")
    assert cmp.returncode == 0, cmp.stderr
    last = cmp.stdout.splitlines()[-1]
    # 0.62 against 0.62 * (1 - 0.4): +67% (medians rounded to 3 digits)
    assert re.search(r"acceptance: ab-off better by 6[67]\.\d% \(beyond the spread\)$", last), cmp.stdout
