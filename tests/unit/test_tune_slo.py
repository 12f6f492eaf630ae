"""`fab tune --slo`'s pure parts (tasks/tune/slo.py): bounds, the search, the conservative
score, the tie rule, the winner per load range, the Pareto front; the server-settings check."""
import pytest

from tasks.errors import UsageError
from tasks.tune import settings, slo


def test_parse_slo_reads_bounds_and_refuses_bad_ones():
    b = slo.parse_slo("ttft_p90<=800, tpot_p50<=40,e2e_p99.9<=5000")
    assert [(x.key, x.metric, x.q, x.limit_ms) for x in b] == [
        ("ttft_p90", "ttft", 90.0, 800.0), ("tpot_p50", "tpot", 50.0, 40.0), ("e2e_p99.9", "e2e", 99.9, 5000.0)]
    assert slo.slo_text(b) == "ttft_p90<=800,tpot_p50<=40,e2e_p99.9<=5000"
    for bad in ("ttft<=8", "ttft_p90<800", "foo_p90<=1", "ttft_p90<=0", "ttft_p90<=1,ttft_p90<=2", ""):
        with pytest.raises(UsageError, match="--slo"):
            slo.parse_slo(bad)


def sample(ttft, gaps, latency):
    return {"ok": True, "ttft_s": ttft, "itl_s": gaps, "output_tokens": len(gaps) + 1,
            "last_token_s": ttft + sum(gaps), "latency_s": latency}


def test_observe_computes_each_bound_from_the_samples():
    samples = [sample(0.1, [0.01] * 10, 0.3), sample(0.3, [0.03] * 10, 0.7), {"ok": False}]
    b = slo.parse_slo("ttft_p50<=1,tpot_p50<=1,itl_p90<=1,e2e_p50<=1")
    got = slo.observe(samples, b)
    assert got == {"ttft_p50": 200.0, "tpot_p50": 20.0, "itl_p90": 30.0, "e2e_p50": 500.0}
    assert slo.misses(got, slo.parse_slo("ttft_p50<=150,tpot_p50<=40")) == [("ttft_p50", 200.0, 150.0)]


def run_search(capacity, max_load):
    s = slo.Search(max_load)
    tried = []
    while (load := s.next()) is not None:
        tried.append(load)
        s.record(load, load <= capacity)
    return s, tried


@pytest.mark.parametrize("capacity", [0, 1, 2, 3, 5, 6, 13, 16, 33, 47, 63, 64, 100])
def test_the_search_brackets_then_bisects_within_eight_points(capacity):
    s, tried = run_search(capacity, 64)
    assert len(tried) <= slo.MAX_POINTS and len(set(tried)) == len(tried)
    found = s.passed()
    assert found <= min(capacity, 64)  # never above the truth
    assert min(capacity, 64) - found <= s.step(), (tried, found)
    assert s.step() <= 3, tried  # 8 points over 1..64 narrow it to 3 at worst


@pytest.mark.parametrize("capacity", range(0, 18))
def test_up_to_max_load_16_the_search_is_exact(capacity):
    s, tried = run_search(capacity, 16)
    assert s.passed() == min(capacity, 16) and s.step() == 0 or s.failed() == s.passed() + 1, tried
    assert s.passed() == min(capacity, 16), tried


def test_a_noisy_failure_below_a_pass_only_lowers_the_capacity():
    s = slo.Search(64)
    for load, ok in ((1, True), (4, True), (16, False), (10, False)):
        assert s.next() == load
        s.record(load, ok)
    assert s.next() == 7 and s.passed() == 4


def test_the_score_is_median_minus_1_4826_mad_and_noise_is_flagged():
    assert slo.score([100, 102, 98]) == (round(100 - 1.4826 * 2, 3), 100, 2)
    sc, med, mad = slo.score([100, 130, 70])
    assert not slo.noisy(100, 2) and slo.noisy(med, mad)


def point(load, score, meets=True):
    return {"load": load, "score": score, "meets": meets}


def test_a_tie_within_one_percent_goes_to_the_simpler_variant():
    vs = [{"name": "k=4", "k": 4, "capacity": 8, "goodput": 1005.0, "points": [point(1, 100), point(8, 1005)]},
          {"name": "k=2", "k": 2, "capacity": 8, "goodput": 1000.0, "points": [point(1, 99), point(8, 1000)]},
          {"name": "baseline", "k": None, "capacity": 8, "goodput": 996.0, "points": [point(1, 60), point(8, 996)]}]
    d = slo.decide(vs, "concurrency")
    assert d["winner"] == "baseline" and d["tie"], d  # within 1% of 1005: the simplest
    vs[2]["goodput"] = 990.0
    d = slo.decide(vs, "concurrency")
    assert d["winner"] == "k=2" and d["tie"] and "simpler" in d["why"], d
    vs[1]["goodput"] = 900.0
    d = slo.decide(vs, "concurrency")
    assert d["winner"] == "k=4" and not d["tie"] and "11.7% more than" not in d["why"], d


def test_a_sweep_where_nothing_started_does_not_say_no_variant_met_the_bounds():
    # Seen with two variants that both failed to start: "no variant meets the bounds at any
    # load measured", as if loads had been measured and missed.
    vs = [{"name": "a=1", "k": None, "capacity": None, "goodput": None, "points": []},
          {"name": "a=2", "k": None, "capacity": None, "goodput": None, "points": []}]
    d = slo.decide(vs, "concurrency")
    assert d["winner"] is None and d["why"].startswith("no variant was measured: each failed to start"), d
    vs[0]["points"] = [point(1, 0, False)]
    assert slo.decide(vs, "concurrency")["why"] == "no variant meets the bounds at any load measured"


def test_the_winner_per_load_range_reads_as_ranges():
    vs = [{"name": "k=4", "k": 4, "capacity": 8, "points": [point(1, 300), point(4, 700), point(8, 800), point(16, 0, False)]},
          {"name": "k=2", "k": 2, "capacity": 32, "points": [point(1, 250), point(4, 650), point(8, 900), point(32, 1500), point(64, 0, False)]},
          {"name": "baseline", "k": None, "capacity": 48, "points": [point(1, 100), point(4, 380), point(32, 1400), point(48, 1600), point(64, 0, False)]}]
    rngs = slo.ranges(vs, "concurrency")
    assert [(r["from"], r["to"], r["winner"]) for r in rngs] == [
        (1, 4, "k=4"), (8, 32, "k=2"), (48, 48, "baseline"), (64, 64, None)]
    assert slo.ranges_text(rngs, "concurrency", {"baseline": "no speculation"}) == \
        "k=4 up to concurrency 4, k=2 to 32, no speculation to 48, none meets the bounds from 64 on"


def test_one_variant_with_one_point_still_decides():
    d = slo.decide([{"name": "k=2", "k": 2, "capacity": 1, "goodput": 50.0, "points": [point(1, 50)]}], "rate")
    assert d["winner"] == "k=2" and "only variant" in d["why"] and d["ranges_text"] == "k=2 up to req/s 1"
    d = slo.decide([{"name": "k=2", "k": 2, "capacity": 0, "goodput": None, "points": [point(1, 50, False)]}], "rate")
    assert d["winner"] is None and "no variant meets" in d["why"]


def test_the_pareto_front():
    pts = [(10, 100), (20, 80), (15, 60), (5, 100), (30, 10), (None, 5)]
    assert slo.pareto(pts) == [0, 1, 4]


HELP = {"max-num-seqs": None, "gpu-memory-utilization": None, "dtype": ["auto", "half"],
        "max-num-batched-tokens": None}


def test_server_settings_are_checked_against_the_engines_help():
    ok = [("server.args.max-num-seqs", (8, 16)), ("server.args.speculative-config.num_speculative_tokens", (1, 2)),
          ("server.args.gpu_memory_utilization", (0.5, 0.9)), ("server.args.dtype", ("half",))]
    settings.check(ok, "h1", HELP, "vllm 0.32.0")
    for vary, says in [
        ([("server.args.max-num-seq", (8,))], "the engine on h1 (vllm 0.32.0) has no --max-num-seq"),
        ([("server.args.max-num-seqs", (0,))], "max-num-seqs=0: expected a whole number >= 1"),
        ([("server.args.gpu-memory-utilization", (1.5,))], "expected a fraction in (0, 1]"),
        ([("server.args.dtype", ("fp8",))], "accepts auto, half"),
    ]:
        with pytest.raises(UsageError, match=None) as e:
            settings.check(vary, "h1", HELP, "vllm 0.32.0")
        assert says in e.value.message, e.value.message


def test_the_engine_help_parser_reads_flags_and_choices():
    from tasks.tune.host.enginehelp import parse_flags
    text = ("usage: api_server.py [-h] [--max-num-seqs MAX_NUM_SEQS]\n  [--dtype {auto,half}]\n"
            "  --gpu-memory-utilization GPU_MEMORY_UTILIZATION\n      see --help=all.\n")
    got = parse_flags(text)
    assert got["max-num-seqs"] is None and got["dtype"] == ["auto", "half"]
    assert "gpu-memory-utilization" in got


def tick_labels(svg):
    """[(x, text)] of the x-axis tick labels of one chart (the row of labels under the axis)."""
    import re
    from tasks.tune.svg import H, PAD_B
    row = H - PAD_B + 16
    return [(float(x), t) for x, y, t in re.findall(
        r'<text x="([\d.]+)" y="([\d.]+)" text-anchor="middle" font-size="11">([^<]*)</text>', svg)
        if float(y) == row]


@pytest.mark.parametrize("tpots", [
    [11, 13, 45, 38, 42, 20, 21, 36, 70, 41],   # the browser test's sweep: 22.2, 23.8, 24.4 ...
    [40.0 + i / 10 for i in range(30)],          # thirty points within 3 ms
    [20], [20, 20.1]])
def test_no_two_x_tick_labels_of_a_chart_overlap(tpots):
    from types import SimpleNamespace
    from tasks.tune import loadcharts
    pts = [{"load": i + 1, "score": 100.0 + i, "meets": True, "tpot_ms": {"p50": t},
            "runs_slo_ms": [{"tpot_p50": t}] * 3} for i, t in enumerate(tpots)]
    series = [(0, SimpleNamespace(name="k=2", profile=None), {"points": pts, "capacity": 1})]
    for svg in (loadcharts.pareto_chart(series), loadcharts.goodput_chart(series, "concurrency"),
                loadcharts.bound_chart(series, slo.parse_slo("tpot_p50<=40")[0], "concurrency")):
        labels = sorted(tick_labels(svg))
        assert labels, svg
        for (xa, a), (xb, b) in zip(labels, labels[1:]):
            assert xb - xa >= 6.5 * (len(a) + len(b)) / 2, labels  # at 11 px a character is < 6.5 px


def test_tunes_record_of_repeated_runs_is_measures_one_summary():
    """tune keeps what `fab bench --repeat` keeps (tasks/measure/repeats.py summarize), tpot
    and server_ms too, and its spread is that summary's, renamed."""
    from tasks.measure.repeats import summarize
    from tasks.tune import results

    def run(tps, tpot):
        return {"host": "h1", "requests": 8, "errors": 0, "duration_s": 1.0, "requests_per_s": 8.0,
                "output_tokens_per_s": tps, "ttft_ms": {"p50": 20, "p90": tps / 10},
                "itl_ms": {"p50": 5.0, "p90": 6.0}, "tpot_ms": {"p50": tpot, "p90": tpot * 1.5},
                "server_ms": {"ttft_mean": 9.0, "tpot_mean": tpot}, "spec": None}
    runs = [run(100.0, 10.0), run(130.0, 12.5), run(90.0, 11.0), run(120.0, 14.0)]
    want = summarize([dict(r) for r in runs])
    rec = results.measured("k=2", {}, "h1", "r1", 4, runs)
    for key in ("output_tokens_per_s", "ttft_ms", "itl_ms", "tpot_ms", "server_ms", "requests_per_s"):
        assert rec[key] == want[key], key
    assert rec["output_tokens_per_s"] == 110.0 and rec["tpot_ms"]["p50"] == 11.75
    assert rec["repeats"] == 4
    assert rec["spread"]["output_tokens_per_s"] == want["repeat"]["spread"]["output tok/s"]
