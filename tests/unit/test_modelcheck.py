"""Model-aware preflight: fixture model directories (config.json only) read by the host-side checks,
and the profile -> `models` request derivation."""
import copy
import json
from pathlib import Path

import pytest

from tasks.steps.host import modelcheck
from tasks.doctor.host import spec_check, spec_facts
from tasks.profile.types import Gpu, JsonTable, Profile, Ready, Secret, Server, Target

from helpers import DRAFT, TARGET

REPO = Path(__file__).resolve().parents[2]

# Qwen3.6-27B: a multimodal checkpoint, so the language model's sizes sit under text_config.
def write_model(d, config):
    d.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return str(d)


def request(tmp_path, target=TARGET, draft=DRAFT, **over):
    """A `models` section as tasks/profile/models.py builds it for configs/qwen3.6-27b-dflash.toml."""
    req = dict(engine="vllm", method="dflash", v2_runner=False,
               target=write_model(tmp_path / "Qwen3.6-27B", target),
               draft=write_model(tmp_path / "Qwen3.6-27B-DFlash", draft),
               keys={"target": "server.model", "draft": "server.args.speculative-config.model",
                     "method": "server.args.speculative-config.method"},
               spec_tokens={"value": 15, "key": "server.args.speculative-config.num_speculative_tokens",
                            "over": 0},
               max_model_len={"value": 65536, "key": "server.args.max-model-len"},
               tp={"value": 2, "key": "server.args.tensor-parallel-size"})
    req.update(over)
    return req


def by_status(records, status):
    return [r for r in records if r["status"] == status]


def preflight(req):
    """The host preflight's model records: modelcheck's, then the doctor's rules that hold on
    any engine version (tasks/doctor/host/spec_check.py; version rules: test_doctor_rules.py)."""
    doctor = {"engine": req["engine"], "method": req["method"], "method_key": req["keys"].get("method"),
              "draft": req["draft"], "draft_key": req["keys"].get("draft"), "target": req["target"],
              "k": req.get("spec_tokens"), "v2_env": "1" if req.get("v2_runner") else None,
              "prefix_caching": {"value": False}}
    return modelcheck.run(req) + spec_check.checks(spec_check.evaluate(spec_facts.facts(doctor, None)))


def test_zlab_drafter_on_its_target_passes(tmp_path):
    # Sliding-window layers are judged by the doctor with the engine version (test_doctor_rules.py).
    records = preflight(request(tmp_path))
    assert [r["status"] for r in records] == ["OK"] * len(records), records
    checks = {r["check"] for r in records}
    assert checks == {"config", "spec", "dflash", "context", "tp"}
    assert "layer_types: 4 of 5 sliding_attention" in next(r for r in records if r["check"] == "dflash")["message"]


def test_zlab_drafter_with_v2_runner_set_is_all_ok(tmp_path):
    records = modelcheck.run(request(tmp_path, v2_runner=True))
    assert [r["status"] for r in records] == ["OK"] * len(records), records
    dflash = next(r for r in records if r["check"] == "dflash")
    for text in ("block_size 16", "dflash_config.mask_token_id 248070", "[1, 16, 31, 46, 61]",
                 "num_speculative_tokens 15 fits block_size 16"):
        assert text in dflash["message"]


def test_fields_nested_in_dflash_config_and_a_flat_target_are_read(tmp_path):
    draft = copy.deepcopy(DRAFT)
    draft["dflash_config"]["block_size"] = draft.pop("block_size")
    draft["layer_types"] = ["full_attention"] * 5
    target = dict(TARGET["text_config"], architectures=["Qwen3ForCausalLM"])
    records = modelcheck.run(request(tmp_path, target=target, draft=draft))
    assert [r["status"] for r in records] == ["OK"] * len(records), records
    assert "dflash_config.block_size 16" in next(r for r in records if r["check"] == "dflash")["message"]


def _drop(key):
    def f(d):
        d.pop(key, None)
        d["dflash_config"].pop(key, None)
    return f


def _set(path, value):
    def f(d):
        obj = d
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return f


# (id, change to the drafter, change to the target, request overrides, status, check,
#  file blamed ("draft" | "target" | None), texts the message must contain)
BROKEN = [
    ("no-block-size", _drop("block_size"), None, {}, "FAIL", "spec-drafter-config", "draft",
     ["config.json lacks dflash_config.block_size, which dflash drafters need"]),
    ("no-mask-token", _drop("mask_token_id"), None, {}, "FAIL", "spec-drafter-config", "draft",
     ["lacks dflash_config.mask_token_id"]),
    ("no-layer-ids", _drop("target_layer_ids"), None, {}, "FAIL", "spec-drafter-config", "draft",
     ["lacks dflash_config.target_layer_ids"]),
    ("layer-ids-not-a-list", _set(("dflash_config", "target_layer_ids"), "1,16"), None, {}, "FAIL",
     "dflash", "draft", ['dflash_config.target_layer_ids = "1,16" is not a non-empty list']),
    ("layer-id-past-target", _set(("dflash_config", "target_layer_ids"), [1, 16, 31, 46, 64]), None, {},
     "FAIL", "spec-layer-out-of-range", "draft",
     ["dflash_config.target_layer_ids = [1, 16, 31, 46, 64] has [64] outside 0 .. 63",
      "the target has 64 layers"]),
    ("target-too-shallow", None, _set(("text_config", "num_hidden_layers"), 48), {}, "FAIL",
     "spec-layer-out-of-range", "draft", ["has [61] outside 0 .. 47", "the target has 48 layers"]),
    ("mask-token-past-vocab", _set(("dflash_config", "mask_token_id"), 248320), None, {}, "FAIL",
     "spec-mask-token", "draft", ["dflash_config.mask_token_id = 248320 is not below the target's "
                         "text_config.vocab_size = 248320"]),
    ("top-level-mask-token", lambda d: d.update(mask_token_id=248400) or d["dflash_config"].pop(
        "mask_token_id"), None, {}, "FAIL", "spec-mask-token", "draft",
     ["config.json: mask_token_id = 248400 is not below the target's text_config.vocab_size"]),
    ("hidden-size", _set(("hidden_size",), 4096), None, {}, "FAIL", "dflash", "draft",
     ["hidden_size = 4096 differs from the target's text_config.hidden_size = 5120"]),
    ("target-hidden-size", _set(("target_hidden_size",), 4096), None, {}, "FAIL", "dflash", "draft",
     ["target_hidden_size = 4096 differs"]),
    ("too-many-spec-tokens", None, None,
     {"spec_tokens": {"value": 16, "key": "server.args.speculative-config.num_speculative_tokens",
                      "over": 0}}, "WARN", "spec-draft-length", "draft",
     ["server.args.speculative-config.num_speculative_tokens = 16 is more than 15, the most the "
      "drafter's block_size = 16 allows", "fix: set server.args.speculative-config.num_speculative_tokens = 15"]),
    ("draft-no-config", lambda d: None, None, {"draft_missing": True}, "FAIL", "spec-drafter-config",
     "draft", ["config.json is missing", "(server.args.speculative-config.model)"]),
    ("target-bad-json", None, None, {"target_text": '{"architectures": ['}, "FAIL", "config", "target",
     ["not valid JSON"]),
    ("target-not-object", None, None, {"target_text": "[1, 2]"}, "FAIL", "config", "target",
     ["not a JSON object"]),
    ("max-model-len", None, None, {"max_model_len": {"value": 300000, "key": "server.args.max-model-len"}},
     "WARN", "context", "target",
     ["server.args.max-model-len = 300000 is above text_config.max_position_embeddings = 262144"]),
    ("tp-heads", None, None, {"tp": {"value": 5, "key": "server.args.tensor-parallel-size"}}, "WARN", "tp",
     "target", ["server.args.tensor-parallel-size = 5 does not divide text_config.num_attention_heads = 24"]),
    ("eagle3-head-as-eagle", _set(("architectures",), ["LlamaForCausalLMEagle3"]), None,
     {"method": "eagle"}, "FAIL", "spec", "draft",
     ['architectures = ["LlamaForCausalLMEagle3"] name an EAGLE3 draft model, but '
      "server.args.speculative-config.method is 'eagle': set it to 'eagle3'"]),
    ("eagle-head-as-eagle3", _set(("architectures",), ["EagleLlamaForCausalLM"]), None,
     {"method": "eagle3"}, "FAIL", "spec", "draft", ["name an EAGLE draft model", "set it to 'eagle'"]),
    ("dflash-as-eagle3", None, None, {"method": "eagle3"}, "FAIL", "spec", "draft",
     ['["DFlashDraftModel"] name a DFlash draft model']),
    ("sglang-eagle3-head-as-EAGLE", _set(("architectures",), ["Eagle3LlamaForCausalLM"]), None,
     {"engine": "sglang", "method": "eagle",
      "keys": {"draft": "server.args.speculative-draft-model-path",
               "method": "server.args.speculative-algorithm"}},
     "FAIL", "spec", "draft", ["server.args.speculative-algorithm is 'EAGLE': set it to 'EAGLE3'"]),
]


@pytest.mark.parametrize("case", BROKEN, ids=[c[0] for c in BROKEN])
def test_broken_variant_is_reported_naming_file_and_key(tmp_path, case):
    _, change_draft, change_target, over, status, check, blamed, texts = case
    draft, target = copy.deepcopy(DRAFT), copy.deepcopy(TARGET)
    change_draft and change_draft(draft)
    change_target and change_target(target)
    over = dict(over)
    if over.pop("draft_missing", False):
        draft = None
    if "target_text" in over:
        target = over.pop("target_text")
    keys = over.pop("keys", None)
    req = request(tmp_path, target=target, draft=draft, v2_runner=True, **over)
    if keys:
        req["keys"] = keys
    records = preflight(req)
    bad = [r for r in records if r["status"] != "OK"]
    assert len(bad) == 1, records
    [rec] = bad
    assert (rec["status"], rec["check"]) == (status, check), rec
    files = {"draft": tmp_path / "Qwen3.6-27B-DFlash" / "config.json",
             "target": tmp_path / "Qwen3.6-27B" / "config.json"}
    assert rec["message"].startswith(str(files[blamed])) or str(files[blamed]) in rec["message"]
    for text in texts:
        assert text in rec["message"], rec["message"]


def test_method_from_architecture_mtp_and_unnamed_archs_pass(tmp_path):
    draft = dict(DRAFT, architectures=["Qwen3NextMTP"])
    assert not by_status(modelcheck.run(request(tmp_path, draft=draft, method="mtp")), "FAIL")
    plain = dict(DRAFT, architectures=["LlamaForCausalLM"])
    records = modelcheck.run(request(tmp_path, draft=plain, method="eagle3"))
    assert not by_status(records, "FAIL")
    assert "do not name a method" in next(r for r in records if r["check"] == "spec")["message"]


def test_nothing_local_to_read(tmp_path):
    assert modelcheck.run(None) == []
    gguf = tmp_path / "draft.gguf"
    gguf.write_bytes(b"GGUF")
    req = request(tmp_path, draft=DRAFT, v2_runner=True)
    req["draft"], req["target"] = str(gguf), str(tmp_path / "absent")  # path checks report these
    assert modelcheck.run(req) == []


# --- profile -> models request (local, pure) ---

def profile(engine="vllm", model="/root/models/Qwen3.6-27B", args=(), env=()):
    return Profile(path=Path("/p.toml"), target=Target(hosts=(), name="t", workdir="~/llmfab"),
                   server=Server(engine=engine, python=None, model=model, args=tuple(args),
                                 env=tuple(env)),
                   ready=Ready(), gpu=Gpu(), cluster=None, resolved_toml="", digest="0" * 64)


SPEC = JsonTable('{"method":"dflash","model":"/root/models/Qwen3.6-27B-DFlash","num_speculative_tokens":15}')


def test_vllm_request_names_every_key():
    m = profile(args=[("tensor-parallel-size", 2), ("max-model-len", "64k"), ("speculative-config", SPEC)],
                env=[("VLLM_USE_V2_MODEL_RUNNER", "1")]).server.models  # built with the Server
    assert m == dict(engine="vllm", target="/root/models/Qwen3.6-27B",
                     draft="/root/models/Qwen3.6-27B-DFlash", method="dflash",
                     keys={"target": "server.model", "draft": "server.args.speculative-config.model",
                           "method": "server.args.speculative-config.method"},
                     spec_tokens={"value": 15, "key": "server.args.speculative-config.num_speculative_tokens",
                                  "over": 0},
                     max_model_len={"value": 64000, "key": "server.args.max-model-len"},
                     tp={"value": 2, "key": "server.args.tensor-parallel-size"}, v2_runner=True)


def test_vllm_request_variants():
    m = profile(args=[("tp", 4), ("speculative_config.model", "/d/Qwen-DFlash"),
                      ("speculative_config.num_speculative_tokens", 7)],
                env=[("VLLM_USE_V2_MODEL_RUNNER", Secret("X", "0"))]).server.models
    assert (m["draft"], m["method"], m["spec_tokens"]["value"], m["tp"], m["v2_runner"]) == (
        "/d/Qwen-DFlash", "dflash", 7, {"value": 4, "key": "server.args.tp"}, False)
    mtp = profile(args=[("speculative-config", JsonTable('{"method":"mtp"}'))]).server.models
    assert (mtp["draft"], mtp["method"], mtp["max_model_len"], mtp["tp"]) == (None, "mtp", None, None)
    assert profile(model="Qwen/Qwen3.6-27B").server.models is None
    assert profile(engine="command", model="/m").server.models is None


def test_sglang_request():
    m = profile(engine="sglang", args=[
        ("tp-size", 2), ("context-length", 32768), ("speculative-algorithm", "EAGLE3"),
        ("speculative-draft-model-path", "/root/models/Qwen3.6-27B-EAGLE3"),
        ("speculative-num-draft-tokens", 4)]).server.models
    assert m["method"] == "eagle3" and m["draft"] == "/root/models/Qwen3.6-27B-EAGLE3"
    assert m["keys"]["method"] == "server.args.speculative-algorithm"
    assert m["spec_tokens"] == {"value": 4, "key": "server.args.speculative-num-draft-tokens", "over": 1}
    assert m["tp"]["key"] == "server.args.tp-size" and m["max_model_len"]["value"] == 32768


def test_shipped_dflash_profile():
    from tasks.profile import load_profile
    m = load_profile(REPO / "configs" / "qwen3.6-27b-dflash.toml", environ={}).server.models
    assert (m["target"], m["draft"], m["method"], m["v2_runner"]) == (
        "/root/models/Qwen3.6-27B", "/root/models/Qwen3.6-27B-DFlash", "dflash", True)
    assert (m["spec_tokens"]["value"], m["tp"]["value"], m["max_model_len"]["value"]) == (15, 2, 65536)
