"""The live verdict (docs/findings.md thresholds), likely-cause order, and bench --repeat / --compare."""
import pytest

from tasks.measure import metrics, repeats
from tasks.doctor import findings, verdict


def spec(rate, k, drafts=1000, pos0=None):
    """A spec window as metrics.spec_window gives it, for a drafter accepting `rate` of k."""
    length = 1 + rate * k
    return {"acceptance_rate": rate, "mean_acceptance_length": length, "drafts": drafts,
            "per_position": [min(1.0, rate * k) if pos0 is None else pos0] + [0.0] * (k - 1)}


@pytest.mark.parametrize("s,method,k,want", [
    (spec(0.011, 15), "dflash", 15, "broken"),        # Qwen3.6-27B + DFlash on vLLM 0.20.1: tau 1.17
    (spec(0.62, 15), "dflash", 15, "healthy"),        # tau 10.3
    (spec(0.08, 15, pos0=0.9), "dflash", 15, "low"),  # tau 2.2 < 60% of 4.1, not broken
    (spec(0.2, 15, pos0=0.29), "dflash", 15, "broken"),
    (spec(0.09, 3, pos0=0.5), "mtp", 3, "broken"),    # tau 1.27 < 1.3 with k >= 3
    (spec(0.09, 3, pos0=0.5), "ngram", 3, "healthy"),  # ngram: never broken, no reference
    (spec(0.011, 15, drafts=99), "dflash", 15, None),  # not enough drafts yet
    (spec(0.8, 1), "mtp", 1, "healthy"),
    (spec(0.3, 1, pos0=0.31), "mtp", 1, "healthy"),   # tau 1.3 > 60% of 1.8
])
def test_verdicts(s, method, k, want):
    v = verdict.verdict(s, method, k)
    assert v["verdict"] == want, v
    assert v["evidence"]["drafts"] == s["drafts"] and v["evidence"]["min_drafts"] == 100


def test_reference_per_k():
    assert verdict.reference("dflash", 15)[0] == 4.1
    assert verdict.reference("dflash", 7)[0] == 4.1      # nearest listed k
    assert verdict.reference("dflash", 2)[0] == 3.0      # capped at 1 + k
    assert verdict.reference("mtp", 2)[0] == 1.8
    assert verdict.reference("mtp", 4)[0] == 3.3
    assert verdict.reference("suffix", 4) == (None, None)


def test_causes_most_likely_first_each_with_its_fix_and_source():
    found = [{"rule": r, "severity": s, "fix": f"fix {r}", "message": "m", "evidence": "version",
              "source": f"source of {r}"}
             for r, s in (("vllm-dflash-prefix-caching", "WARN"), ("vllm-dflash-layer-offset", "WARN"),
                          ("vllm-dflash-swa-ignored", "FAIL"))]
    v = verdict.verdict(spec(0.011, 15), "dflash", 15, found)
    assert [f["rule"] for f in v["findings"]] == ["vllm-dflash-swa-ignored", "vllm-dflash-layer-offset",
                                                   "vllm-dflash-prefix-caching"]
    text = verdict.verdict_text(v)
    assert text.startswith("verdict: broken (position-0 acceptance") and text.endswith(")")
    causes = verdict.cause_lines(v)
    assert [c.headline for c in causes] == [
        "likely cause 1: FAIL vllm-dflash-swa-ignored (version): m",
        "likely cause 2: WARN vllm-dflash-layer-offset (version): m",
        "likely cause 3: WARN vllm-dflash-prefix-caching (version): m"]
    assert causes[0].notes == (("fix", "fix vllm-dflash-swa-ignored"),
                               ("source", "source of vllm-dflash-swa-ignored"))
    ok = verdict.verdict(spec(0.62, 15), "dflash", 15, found)
    assert "fix" not in verdict.verdict_text(ok) and verdict.cause_lines(ok) == []


def test_prefix_hit_rate_over_a_window():
    def snap(q, h):
        return metrics.parse("vllm:prefix_cache_queries_total %d\nvllm:prefix_cache_hits_total %d\n" % (q, h))
    assert findings.prefix_hit_rate(snap(1000, 400), snap(200, 0)) == 0.5
    assert findings.prefix_hit_rate(snap(1000, 400)) == 0.4
    assert findings.prefix_hit_rate(metrics.parse("vllm:generation_tokens_total 3\n")) is None


def _rec(tok_s, rate):
    return {"host": "h1", "requests": 8, "errors": 0, "duration_s": 1.0, "requests_per_s": 8.0,
            "output_tokens_per_s": tok_s, "ttft_ms": {"p50": 10.0, "p90": 12.0},
            "itl_ms": {"p50": 1.0, "p90": 2.0},
            "spec": {"acceptance_rate": rate, "mean_acceptance_length": 1 + 15 * rate, "per_position": []}}


def test_repeat_medians_and_spread():
    out = repeats.summarize([_rec(100.0, 0.5), _rec(130.0, 0.6), _rec(110.0, 0.55)])
    assert out["output_tokens_per_s"] == 110.0 and out["spec"]["acceptance_rate"] == 0.55
    assert out["repeat"]["spread"]["output tok/s"] == {"min": 100.0, "median": 110.0, "max": 130.0}
    assert out["requests"] == 24 and out["repeat"]["n"] == 3
    assert "output tok/s" in "\n".join(repeats.repeat_lines(out))


def test_compare_verdict_line_beyond_or_within_the_spread():
    a = repeats.summarize([_rec(100.0, 0.30), _rec(104.0, 0.32)])
    b = repeats.summarize([_rec(150.0, 0.60), _rec(155.0, 0.61)])
    line = repeats.verdict_line("on", a, "off", b)
    assert line.startswith("verdict: output tok/s: off better by 49.5% (beyond the spread)"), line
    assert "acceptance: off better by" in line and line.endswith("(beyond the spread)")
    c = repeats.summarize([_rec(98.0, 0.31), _rec(106.0, 0.33)])
    assert "within the spread: not decided" in repeats.verdict_line("a", a, "c", c)
