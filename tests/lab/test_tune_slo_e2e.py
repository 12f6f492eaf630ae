"""End to end: `fab tune --slo` over real SSH against the stand-in vLLM, whose latency grows
with the load by a known curve (STANDIN_BATCH_COST), so each variant's capacity is known in
advance; and `--slots` on a host with 8 fake GPUs.

The cost model (configs/demo_server.py Engine): a step takes (1 + d k + b (c - 1)(1 + k)) / T
seconds with c requests running and yields L_k tokens (1 + 0.65 + 0.65^2 + ... , k terms), so
TPOT at concurrency c is that over L_k. With T = 200 tok/s, d = 0.12, b = 0.5: no speculation
20 ms at c = 7, 22.5 at 8; k = 2 21.1 ms at c = 6, 24.7 at 7. Under tpot_p50 <= 22 the
capacities are 7 and 6.
"""
import json
import time

import pytest

import helpers
from helpers import deployment

pytestmark = pytest.mark.e2e

KEY = "server.args.speculative-config.num_speculative_tokens"
T, D, B, RATE, BOUND = 200.0, 0.12, 0.5, 0.65, 22.0


def expected_capacity(k, bound=BOUND, max_load=12):
    tokens = 1 + sum(RATE ** (i + 1) for i in range(k))
    c = 0
    while c < max_load and 1000.0 * (1 + D * k + B * c * (1 + k)) / T / tokens <= bound:
        c += 1
    return c


def profile(lab, name, port, *, host, env=()):
    lines = ["[target]", f'hosts = ["{host}"]', f'name = "{name}"',
             "[server]", 'engine = "vllm"', f'python = "{lab.ml_python}"',
             f'model = "{lab.model_dir("tune-target")}"', 'host = "127.0.0.1"', f"port = {port}",
             "[server.args]", 'served-model-name = "m"',
             'speculative-config = { method = "ngram", num_speculative_tokens = 2, prompt_lookup_max = 4 }',
             "[server.env]", f'STANDIN_ACCEPT_RATE = "{RATE}"', 'STANDIN_ACCEPT_FALLS = "1"',
             'STANDIN_LOAD_SECONDS = "0.2"', *env,
             "[ready]", "timeout = 60", "poll_interval = 0.2"]
    return helpers.write_profile(lab, name, lines)


def records(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_the_search_finds_each_variants_known_capacity_and_says_who_wins_where(lab, tmp_path):
    assert (expected_capacity(0), expected_capacity(2)) == (7, 6)
    base = profile(lab, "tune-slo", 18860, host="h1", env=[
        f'STANDIN_TOKENS_PER_S = "{T:g}"', f'STANDIN_DRAFT_COST = "{D}"', f'STANDIN_BATCH_COST = "{B}"'])
    out = tmp_path / "slo"
    t0 = time.monotonic()
    r = helpers.fab(lab, "-H", "h1,h2", "tune", "--vary", f"{KEY}=2", "--baseline",
                    "--slo", f"tpot_p50<={BOUND:g}", "--max-load", "12", "--requests", "4",
                    "--max-tokens", "16", "--out", str(out), "--json", profile=base, timeout=400)
    took = time.monotonic() - t0
    text = r.stdout + r.stderr
    by = {x["variant"]: x for x in records(out)}
    assert set(by) == {"k=2", "baseline"}, text
    for name, k in (("baseline", 0), ("k=2", 2)):
        rec = by[name]
        loads = [p["load"] for p in rec["points"]]
        assert len(loads) <= 8 and loads[:3] == [1, 4, 12], loads  # bracket by x4, then bisect
        assert all(len(p["runs_slo_ms"]) >= 3 for p in rec["points"])
        assert abs(rec["capacity"] - expected_capacity(k)) <= 1, (name, rec["capacity"], [
            (p["load"], p["runs_slo_ms"]) for p in rec["points"]])
        at = next(p for p in rec["points"] if p["load"] == rec["capacity"])
        assert rec["goodput"] == at["score"] <= at["output_tokens_per_s"] and rec["slo"] == {"tpot_p50": BOUND}
        assert at["tpot_ms"]["p50"] <= BOUND and "server_ms" in at  # the bench summary, whole
    # goodput at capacity: c / TPOT; no speculation serves more at its capacity (7 x 1000/20 =
    # 350 tok/s against 6 x 1000/21.1 = 284), k = 2 more at every load both meet
    decision = json.loads(r.stdout.splitlines()[-1])
    assert decision["winner"] == "baseline", decision
    assert decision["ranges"][0]["winner"] == "k=2" and decision["ranges"][0]["from"] == 1, decision
    assert "winner per load range (tpot_p50<=22): k=2 up to concurrency" in text, text
    html = (out / "report.html").read_text()
    assert "Winner per load range" in html and "bound 22 ms" in html and "Pareto front" in html
    print(r.stdout)
    print(f"\nSLO sweep of 2 variants on 2 hosts took {took:.1f} s")


def test_slots_run_eight_variants_at_once_on_eight_fake_gpus(lab, tmp_path):
    name = "tune-slots"
    events = "tune-slots-events.jsonl"
    base = profile(lab, name, 18870, host="h3", env=['STANDIN_TOKENS_PER_S = "400"',
                                                     f'STANDIN_EVENTS_FILE = "/tmp/{events}"'])
    lab.set_gpus("h3", count=8)
    try:
        # a flag the host's engine lacks: exit 2 naming it, before any launch
        bad = helpers.fab(lab, "tune", "--vary", "server.args.max-num-seq=1,2", "--slo",
                          "tpot_p50<=1000", "--out", str(tmp_path / "bad"), profile=base, code=2)
        assert "has no --max-num-seq" in bad.stderr and "nothing was launched" in bad.stderr, bad.stderr
        assert not (deployment(lab, "h3", name) / "releases").exists()
        out = tmp_path / "slots"
        r = helpers.fab(lab, "tune", "--vary", "server.args.max-num-seqs=1,2,3,4,5,6,7,8", "--slots",
                        "auto", "--slo", "tpot_p50<=1000", "--max-load", "1", "--requests", "2",
                        "--max-tokens", "8", "--out", str(out), profile=base, timeout=400)
    finally:
        lab.set_gpus("h3", count=2)
    text = r.stdout + r.stderr
    assert "8 at once on each" in text, text
    recs = records(out)
    assert len(recs) == 8 and all(x["status"] == "measured" and x["capacity"] == 1 for x in recs), text
    # each slot its own deployment, port and GPU: what each stand-in was started with
    seen = set()
    home = deployment(lab, "h3", name).parent
    for d in [home / name] + [home / f"{name}-s{k}" for k in range(1, 8)]:
        for rel in (d / "releases").iterdir():
            got = json.loads((rel / "standin-received.json").read_text())
            seen.add((got["env"]["CUDA_VISIBLE_DEVICES"], got["args"]["port"]))
    assert {g for g, _ in seen} == {str(i) for i in range(8)} and len({p for _, p in seen}) == 8, seen
    # they ran at once: the most servers ready together, from the stand-ins' own records
    alive, most = set(), 0
    for e in sorted((json.loads(line) for line in (lab.tmp("h3") / events).read_text()
                     .splitlines()), key=lambda e: e["t"]):
        if e["event"] == "ready":
            alive.add(e["pid"])
        elif e["event"] in ("stop", "exit"):
            alive.discard(e["pid"])
        most = max(most, len(alive))
    assert most >= 4, most
