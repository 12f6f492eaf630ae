"""The doctor's rule table, evaluated over real config.json files: each rule on both sides of
its version range (and of its condition), the version-range logic, accepting a FAIL, and
the start-up log evidence."""
import copy
import json

import pytest

from tasks.doctor.host import spec_evidence, spec_check, spec_facts, versions
from tasks.doctor.host.spec_rules import LOG_RULES, RULES
from helpers import DRAFT, TARGET


def _dirs(tmp_path, draft=DRAFT, target=TARGET):
    for name, config in (("target", target), ("draft", draft)):
        (tmp_path / name).mkdir(exist_ok=True)
        if config is not None:
            (tmp_path / name / "config.json").write_text(
                config if isinstance(config, str) else json.dumps(config))
    return str(tmp_path / "draft"), str(tmp_path / "target")


def request(tmp_path, draft=DRAFT, target=TARGET, **over):
    """The `doctor` section tasks/doctor/host_request.py builds for configs/qwen3.6-27b-dflash.toml."""
    d, t = _dirs(tmp_path, draft, target)
    req = {"engine": "vllm", "method": "dflash", "method_key": "server.args.speculative-config.method",
           "draft": d, "draft_key": "server.args.speculative-config.model", "target": t,
           "k": {"value": 15, "key": "server.args.speculative-config.num_speculative_tokens", "over": 0},
           "v2_env": "1", "prefix_caching": {"value": False, "key": "server.args.enable-prefix-caching"},
           "accept": []}
    req.update(over)
    return req


def ids(req, version):
    return [f["rule"] for f in spec_check.evaluate(spec_facts.facts(req, version), req["accept"])]


ALL_FULL = dict(copy.deepcopy(DRAFT), layer_types=["full_attention"] * 5)

# (rule, request changes, drafter config, a version inside the range, one outside it)
CASES = [
    ("vllm-dflash-unsupported", {}, ALL_FULL, "0.19.1", "0.20.0"),
    ("vllm-dflash-layer-offset", {"v2_env": "0"}, ALL_FULL, "0.21.0", "0.22.0"),
    ("vllm-dflash-layer-offset", {"v2_env": "0"}, ALL_FULL, "0.20.0", "0.19.1"),
    ("vllm-dflash-swa-ignored", {}, DRAFT, "0.24.0", "0.25.0"),
    ("vllm-dflash-swa-ignored", {}, DRAFT, "0.20.1", "0.19.1"),
    ("vllm-dflash-swa-refused", {}, DRAFT, "0.25.0", "0.26.0"),
    ("vllm-dflash-swa-refused", {}, DRAFT, "0.25.1", "0.24.0"),
    ("vllm-dflash-swa-needs-v2", {"v2_env": "0"}, DRAFT, "0.26.0", "0.25.1"),
    ("vllm-dflash-swa-needs-v2", {"v2_env": "0"}, DRAFT, "0.33.0", "0.25.0"),
    ("vllm-dflash-prefix-caching", {"prefix_caching": {"value": None, "key": None}}, ALL_FULL,
     "0.33.0", "0.19.1"),
]


@pytest.mark.parametrize("rule,over,draft,inside,outside", CASES)
def test_each_version_rule_on_both_sides_of_its_range(tmp_path, rule, over, draft, inside, outside):
    req = request(tmp_path, draft=draft, **over)
    assert rule in ids(req, inside)
    assert rule not in ids(req, outside)
    found = [f for f in spec_check.evaluate(spec_facts.facts(req, inside)) if f["rule"] == rule][0]
    assert found["evidence"] == "version" and inside in found["message"]
    assert set(found) == {"rule", "severity", "message", "fix", "source", "evidence"}


def test_seed_case_on_0_20_1_reports_offset_swa_and_prefix_caching(tmp_path):
    # The Qwen3.6-27B + DFlash profile as first deployed on vLLM 0.20.1 (~1.1% acceptance): no
    # runner env, prefix caching on in the base profile.
    req = request(tmp_path, v2_env=None,
                  prefix_caching={"value": True, "key": "server.args.enable-prefix-caching"})
    found = {f["rule"]: f for f in spec_check.evaluate(spec_facts.facts(req, "0.20.1"))}
    assert sorted(found) == ["vllm-dflash-layer-offset", "vllm-dflash-prefix-caching",
                             "vllm-dflash-swa-ignored"]
    assert "[1, 16, 31, 46, 61]" in found["vllm-dflash-layer-offset"]["message"]
    assert "[2, 17, 32, 47, 62]" in found["vllm-dflash-layer-offset"]["message"]
    assert found["vllm-dflash-swa-ignored"]["severity"] == "FAIL"
    assert "4 sliding_attention" in found["vllm-dflash-swa-ignored"]["message"]
    assert "#40727" in found["vllm-dflash-layer-offset"]["source"]


def test_needs_v2_only_when_the_v1_runner_is_chosen(tmp_path):
    # 0.26 - 0.28 force V2 for mixed drafters when the env is unset; 0.29+ default to V2.
    for version in ("0.26.0", "0.28.0", "0.29.0", "0.33.0"):
        assert "vllm-dflash-swa-needs-v2" not in ids(request(tmp_path, v2_env=None), version)
        assert "vllm-dflash-swa-needs-v2" in ids(request(tmp_path, v2_env="0"), version)
    assert "vllm-dflash-swa-needs-v2" not in ids(request(tmp_path, v2_env="1"), "0.26.0")


def test_prefix_caching_off_is_quiet(tmp_path):
    assert "vllm-dflash-prefix-caching" not in ids(request(tmp_path), "0.33.0")
    on = request(tmp_path, prefix_caching={"value": True, "key": "server.args.enable-prefix-caching"})
    assert "vllm-dflash-prefix-caching" in ids(on, "0.33.0")


def _config_rule(tmp_path, rule, draft=DRAFT, target=TARGET, **over):
    good = ids(request(tmp_path / "good"), "0.33.0")
    assert good == [], good
    bad = request(tmp_path / "bad", draft=draft, target=target, **over)
    found = [f for f in spec_check.evaluate(spec_facts.facts(bad, "0.33.0")) if f["rule"] == rule]
    assert len(found) == 1, ids(bad, "0.33.0")
    assert found[0]["evidence"] == "config"
    return found[0]


def test_draft_length_both_sides(tmp_path):
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    f = _config_rule(tmp_path, "spec-draft-length",
                     k={"value": 16, "key": "server.args.speculative-config.num_speculative_tokens"})
    assert "num_speculative_tokens = 16 is more than 15" in f["message"]
    assert f["fix"] == "set server.args.speculative-config.num_speculative_tokens = 15"


def test_layer_out_of_range_both_sides(tmp_path):
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    draft = copy.deepcopy(DRAFT)
    draft["dflash_config"]["target_layer_ids"] = [1, 16, 31, 46, 64]
    f = _config_rule(tmp_path, "spec-layer-out-of-range", draft=draft)
    assert "[64] outside 0 .. 63" in f["message"] and f["severity"] == "FAIL"


def test_mask_token_both_sides(tmp_path):
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    draft = copy.deepcopy(DRAFT)
    draft["dflash_config"]["mask_token_id"] = 248320
    f = _config_rule(tmp_path, "spec-mask-token", draft=draft)
    assert "mask_token_id = 248320 is not below the target's text_config.vocab_size = 248320" in f["message"]


@pytest.mark.parametrize("config,words", [
    (None, "config.json is missing"), ("{not json", "is unreadable"),
    ({"architectures": ["DFlashDraftModel"], "block_size": 16}, "lacks dflash_config.mask_token_id, "
     "dflash_config.target_layer_ids"),
])
def test_drafter_config_both_sides(tmp_path, config, words):
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    f = _config_rule(tmp_path, "spec-drafter-config", draft=config)
    assert words in f["message"], f["message"]


def test_accepted_fail_becomes_warn(tmp_path):
    req = request(tmp_path, accept=["vllm-dflash-swa-ignored"])
    found = spec_check.evaluate(spec_facts.facts(req, "0.24.0"), req["accept"])
    swa = [f for f in found if f["rule"] == "vllm-dflash-swa-ignored"][0]
    assert swa["severity"] == "WARN" and swa["accepted"] is True
    check = spec_check.checks([swa])[0]
    assert check["status"] == "WARN" and "(accepted in the profile)" in check["message"]


def test_no_method_no_findings(tmp_path):
    assert spec_check.run(None) == ({}, [])
    assert spec_check.run({"engine": "vllm", "method": None}) == ({}, [])


@pytest.mark.parametrize("version,spec,inside", [
    ("0.20.1", ">=0.20.0,<0.22.0", True), ("0.22.0", ">=0.20.0,<0.22.0", False),
    ("0.21.1.dev12+gabc1234", ">=0.20.0,<0.22.0", True), ("0.20.1+cu129", "<0.20.1", False),
    ("0.22.0rc1", "<0.22.0", True), ("0.22.0.post1", ">0.22.0", True), ("0.20", ">=0.20.0", True),
    (None, "<0.20.0", False), (None, "", True), ("not a version", ">=0", False),
])
def test_version_ranges(version, spec, inside):
    assert versions.in_range(version, spec) is inside


def test_bad_range_is_an_error():
    with pytest.raises(ValueError):
        versions.in_range("0.20.0", "~0.20")


def test_every_rule_range_and_message_is_well_formed(tmp_path):
    facts = spec_facts.facts(request(tmp_path), "0.20.1")
    for rule in RULES + LOG_RULES:
        versions.in_range("0.20.0", rule.versions)
        assert rule.severity in ("FAIL", "WARN", "INFO") and rule.source and rule.fix
        spec_check.finding(rule, facts, "version")  # every template formats
    assert len({r.id for r in RULES}) == len(RULES)


# -- the start-up log ---------------------------------------------------------------------

V1_LINE = ("(EngineCore_DP0 pid=4242) INFO 05-02 10:11:12 [gpu_model_runner.py:4840] Using auxiliary "
           "layers from speculative config: %s")
V2_LINE = ("(EngineCore_DP0 pid=4242) INFO 05-02 10:11:12 [eagle3_utils.py:28] Using Eagle3 auxiliary "
           "layers from config: %s")


@pytest.mark.parametrize("line,rule", [
    (V1_LINE % "(1, 16, 31, 46, 61)", "vllm-dflash-layer-offset"),
    (V2_LINE % "(1, 16, 31, 46, 61)", "vllm-dflash-layer-offset"),
    (V1_LINE % "(2, 17, 32, 47, 62)", None),
    (V2_LINE % "(2, 17, 32, 47, 62)", None),
    (V1_LINE % "(3, 18, 33, 48, 63)", "vllm-dflash-aux-layers-mismatch"),
    (V2_LINE.replace("from config", "from model") % "(2, 32, 61)", "vllm-dflash-aux-layers-ignored"),
])
def test_log_evidence(tmp_path, line, rule):
    facts = spec_facts.facts(request(tmp_path), "0.33.0")
    ev = spec_evidence.evidence(facts, "INFO starting\n" + line + "\nINFO more\n")
    assert [f["rule"] for f in ev["findings"]] == ([rule] if rule else [])
    assert ev["runner"] == ("v1" if "gpu_model_runner" in line else "v2")
    assert ev["aux_line"].startswith("Using ")
    assert all(f["evidence"] == "log" for f in ev["findings"])
    if rule == "vllm-dflash-layer-offset":  # whatever the version says: here a "fixed" 0.33.0
        assert "vLLM 0.33.0" in ev["findings"][0]["message"]


def test_log_runner_lines():
    assert spec_evidence.parse("INFO [gpu_worker.py:272] Using V2 Model Runner\n")["runner"] == "v2"
    seen = spec_evidence.parse("WARNING [vllm.py:761] Model Runner V2 does not yet support custom logits "
                         "processors; using the V1 model runner instead.\n")
    assert seen["runner"] == "v1" and seen["v1_because"] == "custom logits processors"
    assert spec_evidence.parse("nothing here\n")["aux_layers"] is None


def test_log_mtp_warning_is_an_info_finding(tmp_path):
    req = dict(request(tmp_path), method="mtp")
    facts = spec_facts.facts(req, "0.33.0")
    line = ("WARNING 05-02 10:11:12 [speculative.py:1491] Enabling num_speculative_tokens > 1 will run "
            "multiple times of forward on same MTP layer,which may result in lower acceptance rate")
    ev = spec_evidence.evidence(facts, line + "\n")
    assert [(f["rule"], f["severity"], f["evidence"]) for f in ev["findings"]] == [
        ("vllm-mtp-layer-reused", "INFO", "log")]
    assert spec_evidence.evidence(facts, "INFO nothing\n")["findings"] == []


def test_a_fail_line_says_how_to_accept_it(tmp_path):
    req = request(tmp_path)
    found = spec_check.evaluate(spec_facts.facts(req, "0.24.0"))
    [line] = [c for c in spec_check.checks(found) if c["check"] == "vllm-dflash-swa-ignored"]
    assert line["status"] == "FAIL"
    assert '; or, knowing better, [check] accept = ["vllm-dflash-swa-ignored"] [' in line["message"]


def _release(tmp_path, kept=None):
    """An op_spec_evidence request for a release directory holding `kept` as its
    spec-facts.json (a dict, or text as written: damage), or none."""
    rdir = tmp_path / "deploy" / "releases" / "r1"
    rdir.mkdir(parents=True)
    if kept is not None:
        (rdir / spec_facts.FACTS_FILE).write_text(kept if isinstance(kept, str) else json.dumps(kept))
    return {"deploy_dir": str(tmp_path / "deploy"), "release": "r1", "scan": False}


def test_status_judges_the_facts_the_preflight_kept_with_the_release(tmp_path):
    """The preflight found vLLM 0.24.0 and a mixed sliding-window drafter: what the release runs.
    Status (asking with another version, the drafter's config.json changed since) judges those."""
    req = request(tmp_path)
    kept = spec_facts.facts(req, "0.24.0")
    (tmp_path / "draft" / "config.json").write_text(json.dumps(ALL_FULL))
    ans = spec_evidence.op_spec_evidence(**dict(_release(tmp_path, kept), doctor=dict(req, version="0.33.0")))
    assert ans["version"] == "0.24.0"
    assert "vllm-dflash-swa-ignored" in [f["rule"] for f in ans["findings"]]
    # the profile's [check] accept of now still applies to the kept facts
    accepted = dict(req, version="0.33.0", accept=["vllm-dflash-swa-ignored"])
    ans = spec_evidence.op_spec_evidence(**dict(_release(tmp_path / "b", kept), doctor=accepted))
    assert [f.get("accepted") for f in ans["findings"] if f["rule"] == "vllm-dflash-swa-ignored"] == [True]


@pytest.mark.parametrize("kept", [None, "{not json", "[1, 2]", ""])
def test_missing_or_damaged_kept_facts_are_computed_again(tmp_path, kept):
    req = dict(request(tmp_path), version="0.24.0")
    ans = spec_evidence.op_spec_evidence(**dict(_release(tmp_path, kept), doctor=req))
    assert ans["version"] == "0.24.0" and ans["layer_ids"] == [1, 16, 31, 46, 61]
    assert "vllm-dflash-swa-ignored" in [f["rule"] for f in ans["findings"]]
