"""`fab tune`'s pure parts: the shipped prompts, --vary, variant files, the winner, alike hosts,
and the stand-in drafter whose acceptance falls by position."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tasks.measure import workload
from tasks.errors import UsageError
from tasks.tune.sweep_options import TuneOptions
from tasks.profile import load_profile
from tasks.tune import results, variants
from tasks.tune.hosts import check_alike

REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_prompt_set_loads_and_is_seeded():
    texts = workload.shipped()
    assert len(texts) >= 20 and all(len(t.split()) >= 10 for t in texts)
    a, b = workload.prompts(seed=0, count=40), workload.prompts(seed=0, count=40)
    assert a == b and len(a) == 40 and all(set(p) == {"prompt"} for p in a)
    assert workload.prompts(seed=1, count=40) != a
    assert {p["prompt"] for p in a} == set(texts)  # every prompt used, none invented
    long = workload.prompts(seed=0, count=3, input_len=300)
    assert all(len(p["prompt"].split()) == 300 for p in long)


def test_the_prompt_file_ships_in_the_package():
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    assert "workload.jsonl" in cfg["options.package_data"]["llmfab.measure"]


def test_parse_vary_types_values_and_refuses_bad_input():
    assert variants.parse_vary(["a.b=1,2.5,true,ngram"]) == [("a.b", (1, 2.5, True, "ngram"))]
    for bad in ("a.b", "=1", "a..b=1", "a=1,,2", "a=1,1"):
        with pytest.raises(UsageError):
            variants.parse_vary([bad])
    with pytest.raises(UsageError, match="given twice"):
        variants.parse_vary(["a=1", "a=2"])


def base_profile(tmp_path, spec='speculative-config = { method = "ngram", num_speculative_tokens = 2 }'):
    p = tmp_path / "base.toml"
    p.write_text("\n".join(["[target]", 'name = "m"', "keep_releases = 3", "[server]",
                            'engine = "vllm"', 'model = "/m"', "[server.args]", spec,
                            'max-num-seqs = 8', ""]))
    return load_profile(p)


@pytest.mark.parametrize("spec", [
    'speculative-config = { method = "ngram", num_speculative_tokens = 2 }',
    """speculative-config = '{"method": "ngram", "num_speculative_tokens": 2}'""",
    'speculative_config = { method = "ngram", num_speculative_tokens = 2 }',
])
def test_vary_writes_the_whole_flag_into_a_file_that_extends_the_original(tmp_path, spec):
    base = base_profile(tmp_path, spec)
    vs = variants.build(base, vary=[("server.args.speculative-config.num_speculative_tokens", (1, 4))],
                        profiles=(), baseline=True, out=tmp_path / "out")
    assert [v.name for v in vs] == ["k=1", "k=4", "baseline"]
    k4 = vs[1].profile
    assert json.loads(dict(k4.server.args)[next(k for k, _ in k4.server.args if "spec" in k)].text) \
        == {"method": "ngram", "num_speculative_tokens": 4}
    assert k4.target.name == "m" and k4.target.keep_releases == 5  # same deployment, keeps enough
    assert "extends = " in vs[1].path.read_text()
    assert not any("spec" in k for k, _ in vs[2].profile.server.args)  # the baseline
    assert dict(vs[2].profile.server.args)["max-num-seqs"] == 8
    tuned = tmp_path / "out" / "base.tuned.toml"
    tuned.write_text(variants.tuned_text(base, vs[1], "k=4 wins", tuned.parent))
    again = load_profile(tuned)
    assert again.server.args == k4.server.args and again.target.keep_releases == 3
    assert again.target.name == "m"


@pytest.mark.parametrize("spec", [
    "num-speculative-tokens = 2",                 # vLLM before --speculative-config
    "num_speculative_tokens = 2",
    'spec-method = "ngram"\nspec-tokens = 2',     # vLLM 0.32's shortcut flags
    'sc = { method = "ngram", num_speculative_tokens = 2 }',  # the -sc alias
    '"speculative-config.method" = "ngram"\n"speculative-config.num_speculative_tokens" = 2',
    'speculative-algorithm = "EAGLE"\nspeculative-num-steps = 3',  # SGLang
    "ngram-prompt-lookup-max = 4",
])
def test_the_baseline_keeps_no_speculative_flag_in_any_spelling(tmp_path, spec):
    base = base_profile(tmp_path, spec)
    baseline = variants.build(base, vary=[], profiles=(), baseline=True, out=tmp_path / "o")[-1]
    assert [k for k, _ in baseline.profile.server.args] == ["max-num-seqs"]


def test_vary_keys_that_cannot_be_set_name_the_variant_and_key(tmp_path):
    base = base_profile(tmp_path)

    def build(key):
        return variants.build(base, vary=[(key, (1,))], profiles=(), baseline=False,
                              out=tmp_path / "o")
    with pytest.raises(UsageError, match=r"variant 1 \(num_speculativ_tokens=1\).*speculative-config"
                                         r"\.num_speculativ_tokens is not in the profile"):
        build("server.args.speculative-config.num_speculativ_tokens")
    with pytest.raises(UsageError, match=r"variant 1 .*server\.args\.max-num-seqs\.x"):
        build("server.args.max-num-seqs.x")
    with pytest.raises(UsageError, match=r"variant 1 \(bogus=1\).*server\.bogus"):
        build("server.bogus")
    with pytest.raises(UsageError, match="is a table"):
        build("server.args.speculative-config")
    assert dict(build("server.args.max-model-len")[0].profile.server.args)["max-model-len"] == 1  # a new flag


def test_more_than_32_variants_is_bad_input(tmp_path):
    base = base_profile(tmp_path)
    with pytest.raises(UsageError, match="33 variants: at most 32"):
        variants.build(base, vary=[("server.args.max-num-seqs", tuple(range(1, 33)))], profiles=(),
                       baseline=True, out=tmp_path / "o")
    with pytest.raises(UsageError, match="nothing to tune"):
        variants.build(base, vary=[], profiles=(), baseline=False, out=tmp_path / "o")


def test_options():
    o = TuneOptions.from_flags(vary=["a.b=1,2"], concurrency="1,8", keep="winner")
    assert o.vary == (("a.b", (1, 2)),) and o.concurrency == (1, 8) and o.repeat == 3
    for bad in ({"concurrency": "1,1"}, {"concurrency": "0"}, {"objective": "fast@8"},
                {"keep": "both"}, {"out": "a", "resume": "b"}, {"repeat": "0"}):
        with pytest.raises(UsageError):
            TuneOptions.from_flags(**bad)


def rec(variant, tps, spread=None, verdict="healthy", c=8, repeats=2, status="measured"):
    lo, hi = spread or (tps, tps)
    return {"variant": variant, "concurrency": c, "status": status, "requests": 8, "errors": 0,
            "output_tokens_per_s": tps, "ttft_ms": {"p50": 1, "p90": 2}, "repeats": repeats,
            "spec": {"verdict": verdict, "evidence": {"why": "position-0 acceptance 0.00 < 0.3"}},
            "spread": {"output_tokens_per_s": {"min": lo, "median": tps, "max": hi}}}


def test_the_winner_leads_beyond_the_spread_else_no_clear_winner():
    d = results.decide([rec("a", 100, (98, 102)), rec("b", 120, (118, 121)),
                        rec("r", 500, verdict="broken")], ("tokens_per_s", 8))
    assert (d["winner"], d["second"], d["tie"], d["excluded"]) == ("b", "a", False, ["r"])
    assert "beyond the spread" in d["why"] and "r excluded: verdict broken" in d["why"]
    d = results.decide([rec("a", 100, (95, 110)), rec("b", 104, (101, 106))], ("tokens_per_s", 8))
    assert d["tie"] and d["winner"] == "b" and d["why"].startswith("no clear winner")
    d = results.decide([rec("a", 100, repeats=1), rec("b", 104, repeats=1)], ("tokens_per_s", 8))
    assert d["winner"] == "b" and not d["tie"] and "--repeat 1" in d["why"]
    d = results.decide([rec("a", 100, status="failed"), rec("r", 9, verdict="broken")], ("tokens_per_s", 8))
    assert d["winner"] is None and "broken" in d["why"]
    # a resumed sweep appends: the last record of a variant counts
    d = results.decide([rec("a", 100), rec("b", 90), rec("a", 80)], ("tokens_per_s", 8))
    assert d["winner"] == "b"


def test_ttft_objective_takes_the_lowest():
    a, b = rec("a", 100), rec("b", 120)
    a["ttft_ms"]["p90"], b["ttft_ms"]["p90"] = 30.0, 45.0
    assert results.decide([a, b], ("ttft_p90", 8))["winner"] == "a"


def test_unlike_hosts_are_named():
    same = {"engine": "vllm 0.11.0", "gpus": ["NVIDIA H100"] * 8}
    check_alike({"a": same, "b": dict(same)})
    with pytest.raises(UsageError, match=r"b: vllm 0\.10\.2, 8 x NVIDIA H100"):
        check_alike({"a": same, "b": dict(same, engine="vllm 0.10.2")})
    with pytest.raises(UsageError, match=r"c: vllm 0\.11\.0, 4 x NVIDIA H100"):
        check_alike({"a": same, "c": dict(same, gpus=["NVIDIA H100"] * 4)})


def test_the_stand_in_drafters_acceptance_falls_by_position():
    spec = importlib.util.spec_from_file_location("demo_server_t", REPO / "configs" / "demo_server.py")
    demo = importlib.util.module_from_spec(spec)
    sys.modules["demo_server_t"] = demo
    spec.loader.exec_module(demo)
    sim = demo.SpecDecodeSim(4, 0.7, geometric=True)
    for _ in range(1000):
        sim.step()
    snap = sim.snapshot()
    assert [round(n / 1000, 2) for n in snap["per_pos"]] == [0.7, 0.49, 0.34, 0.24]
    flat = demo.SpecDecodeSim(4, 0.5)
    for _ in range(100):
        flat.step()
    assert flat.snapshot()["accepted"] == 200  # the default model is unchanged


def test_without_out_a_sweep_writes_into_the_state_directory_not_the_current_one(tmp_path, monkeypatch):
    from types import SimpleNamespace
    from tasks.tune.task import _out_dir
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    base = SimpleNamespace(target=SimpleNamespace(name="qwen"))
    out, fresh = _out_dir(SimpleNamespace(resume=None, out=None), base)
    assert fresh and out.parent == tmp_path / "state" / "llmfab" / "tune", out
    assert out.name.startswith("qwen-")
    monkeypatch.delenv("XDG_STATE_HOME")
    out, _ = _out_dir(SimpleNamespace(resume=None, out=None), base)
    assert out.parent == Path.home() / ".local" / "state" / "llmfab" / "tune"
