"""End to end: `fab tune` over real SSH against the stand-in vLLM on the lab's hosts.

The stand-in drafts with acceptance falling by position (STANDIN_ACCEPT_FALLS: position i
accepted in 0.65 ** (i + 1) of the steps) and each drafted token costs 0.12 of a target step
(STANDIN_DRAFT_COST), so tokens/s depends on k and k = 4 is fastest (1.71 tokens per step
unit against 1.67 for k = 2, 1.43 for k = 8, 1.47 for k = 1, 1 without speculation). The
sweep measures k = 1, 4, 8: the winner leads by 16% or more in the model. The stand-in's own
overhead per step (a few ms, tens under load) favours large k and small concurrency gaps; at 40
tokens/s a step takes 30-50 ms, so the lead stays beyond the noise of a loaded 2-core machine
(at 0.7 / 0.1 / 60 tokens/s, a lead of 11% in the model, k = 8 once measured faster under load).
"""
import json
import signal

import pytest

import helpers
from helpers import Background, deployment, server_record

pytestmark = pytest.mark.e2e

KEY = "server.args.speculative-config.num_speculative_tokens"


def base_profile(lab, name, port, *, tokens_per_s=150, extra_env=()):
    lines = ["[target]", 'hosts = ["h1"]', f'name = "{name}"',
             "[server]", 'engine = "vllm"', f'python = "{lab.ml_python}"',
             f'model = "{lab.model_dir("tune-target")}"', 'host = "127.0.0.1"', f"port = {port}",
             "[server.args]", 'served-model-name = "m"',
             'speculative-config = { method = "ngram", num_speculative_tokens = 2, '
             "prompt_lookup_max = 4 }",
             "[server.env]", 'STANDIN_ACCEPT_RATE = "0.65"', 'STANDIN_ACCEPT_FALLS = "1"',
             'STANDIN_DRAFT_COST = "0.12"', f'STANDIN_TOKENS_PER_S = "{tokens_per_s}"',
             'STANDIN_LOAD_SECONDS = "0.2"', *extra_env,
             "[ready]", "timeout = 60", "poll_interval = 0.2"]
    return helpers.write_profile(lab, name, lines)


def side_profile(lab, base, name, lines):
    """A --profiles variant: extends the base."""
    return helpers.write_profile(lab, name, [f'extends = "{base.name}"', *lines])


def records(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def alive_release(lab, host, name):
    path = deployment(lab, host, name) / "server.json"
    if not path.exists():
        return None
    server = server_record(lab, host, name)
    return server["release"] if helpers.host_pid_alive(lab, host, server["pid"]) else None


def test_a_sweep_over_two_hosts_skips_the_broken_variants_names_the_winner_and_puts_back(lab, tmp_path):
    name = "tune-sweep"
    # 40 tokens/s: a step takes 28-49 ms, so the stand-in's own overhead per step (~1 ms, more
    # on a loaded machine), which favours large k, stays small against the cost model
    base = base_profile(lab, name, 18810, tokens_per_s=40)
    drafter = lab.model_dir("tune-bad-drafter", architectures=["DFlashDraftModel"], block_size=16,
                            dflash_config={"target_layer_ids": [1, 2]})
    doctor_fail = side_profile(lab, base, "tune-doctor-fail", [
        "[server.args]", f'speculative-config = {{ method = "dflash", model = "{drafter}", '
                         "num_speculative_tokens = 4 }"])
    start_fail = side_profile(lab, base, "tune-start-fail", ["[server.env]", 'STANDIN_FAIL = "oom"'])
    helpers.fab(lab, "deploy", "-H", "h1", profile=base)  # h1 runs a release before; h2 nothing
    before = alive_release(lab, "h1", name)
    assert before and alive_release(lab, "h2", name) is None
    out = tmp_path / "sweep"
    r = helpers.fab(lab, "-H", "h1,h2", "tune", "--vary", f"{KEY}=1,4,8", "--baseline",
                    "--profiles", f"{doctor_fail},{start_fail}", "--concurrency", "1,4",
                    "--requests", "8", "--max-tokens", "64", "--repeat", "2", "--out", str(out),
                    profile=base, timeout=400)
    text = r.stdout + r.stderr
    recs = records(out)
    by = {(x["variant"], x["concurrency"]): x for x in recs}
    assert len(recs) == 6 * 2, text
    # the doctor's FAIL skips its variant, with its finding; the start failure has its fatal
    skipped = by[("tune-doctor-fail", 4)]
    assert skipped["status"] == "skipped" and skipped["finding"]["rule"] == "spec-drafter-config", skipped
    failed = by[("tune-start-fail", 4)]
    assert failed["status"] == "failed" and failed["fatal"]["rule"] in ("cuda-oom", "model-load-oom"), failed
    measured = [x for x in recs if x["status"] == "measured"]
    assert {x["variant"] for x in measured} == {"k=1", "k=4", "k=8", "baseline"}
    assert {x["host"] for x in recs} == {"h1", "h2"}, "the hosts share the variants"
    for x in measured:
        assert x["repeats"] == 2 and x["spread"]["output_tokens_per_s"]["min"] <= \
            x["output_tokens_per_s"] <= x["spread"]["output_tokens_per_s"]["max"]
        assert x["requests"] == 16 and x["errors"] == 0
    k4 = by[("k=4", 4)]["spec"]["per_position"]
    assert len(k4) == 4 and k4[0] > k4[1] > k4[2] > k4[3], k4  # acceptance falls by position
    assert by[("baseline", 4)]["spec"] is None
    # the winner: the best measured tokens/s at the largest concurrency. Whether it is beyond the
    # spread depends on the machine's load (k=1 came within 2.4% on a busy CI machine): either
    # way the line names the best, and says which it is.
    best = max((x for x in measured if x["concurrency"] == 4), key=lambda x: x["output_tokens_per_s"])
    assert best["variant"] == "k=4", [(x["variant"], x["output_tokens_per_s"]) for x in measured]
    assert r.returncode == 0 and ("\nwinner: k=4: " in text or "\nno clear winner: k=4: " in text), text
    assert "k=4 *" in text  # the table marks it
    assert "spec-drafter-config" in text and "failed to start" in text
    # put back: h1 runs the release it ran before (the same one), h2 runs nothing
    assert alive_release(lab, "h1", name) == before, text
    assert alive_release(lab, "h2", name) is None, text
    # the tuned profile extends the original and deploys the winner's setting
    tuned = out / f"{name}.tuned.toml"
    assert "extends = " in tuned.read_text() and "tune-sweep.toml" in tuned.read_text()
    dry = helpers.fab(lab, "deploy", "--dry-run", profile=tuned)
    assert '"num_speculative_tokens":4' in dry.stdout, dry.stdout
    assert (out / "report.html").read_text().count("<svg") == 2
    helpers.fab(lab, "stop", "-H", "h1", profile=base)

    # --resume measures only what results.jsonl lacks: keep k=1 and k=4, drop the rest
    kept = [x for x in recs if x["variant"] in ("k=1", "k=4")]
    (out / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in kept))
    rels = {h: len(helpers.releases(lab, h, name)) for h in ("h1", "h2")}
    r2 = helpers.fab(lab, "-H", "h1,h2", "tune", "--vary", f"{KEY}=1,4,8", "--baseline",
                     "--profiles", f"{doctor_fail},{start_fail}", "--concurrency", "1,4",
                     "--requests", "8", "--max-tokens", "64", "--repeat", "2", "--resume", str(out),
                     profile=base, timeout=400)
    assert "resuming: 2 of 6 variants already measured" in r2.stdout, r2.stdout + r2.stderr
    again = records(out)[len(kept):]
    assert {x["variant"] for x in again} == {"k=8", "baseline", "tune-doctor-fail",
                                             "tune-start-fail"}
    new = sum(len(helpers.releases(lab, h, name)) - rels[h] for h in ("h1", "h2"))
    assert new == 3, "k=8, baseline and the start failure: one new release each"


@pytest.mark.parametrize("sig, code, port", [(signal.SIGINT, 130, 18820),
                                             (signal.SIGTERM, 143, 18821),
                                             (signal.SIGHUP, 129, 18822)])
def test_ctrl_c_or_a_kill_mid_sweep_restores_the_previous_release_and_exits_128_n(lab, tmp_path,
                                                                                  sig, code, port):
    # SIGTERM (a `kill`, a CI timeout) and SIGHUP (a closed terminal) put back as Ctrl-C does
    name = f"tune-sig{int(sig)}"
    base = base_profile(lab, name, port, tokens_per_s=60)
    helpers.fab(lab, "deploy", "-H", "h3", profile=base)
    before = alive_release(lab, "h3", name)
    out = tmp_path / "ctrlc"
    bg = Background(lab, "-H", "h3", "tune", "--vary", f"{KEY}=1,2,4", "--concurrency", "2",
                    "--requests", "6", "--max-tokens", "64", "--repeat", "2", "--out", str(out),
                    profile=base)
    try:
        bg.wait_line("variant 2 of 3 (k=2): bench", timeout=120)
        running = alive_release(lab, "h3", name)
        assert running and running != before  # variant 2 runs now
        bg.proc.send_signal(sig)
        assert bg.finish(120) == code, bg.text
    finally:
        bg.close()
    assert "putting back what ran before" in bg.text
    assert alive_release(lab, "h3", name) == before, bg.text
    assert [x["variant"] for x in records(out)] == ["k=1"], "variant 1 measured, nothing after"
    assert not (out / "report.html").exists()
    helpers.fab(lab, "stop", "-H", "h3", profile=base)


def test_unlike_hosts_are_refused_before_anything_is_done(lab, tmp_path):
    name = "tune-unlike"
    base = base_profile(lab, name, 18830)
    lab.set_gpus("h2", count=1)
    try:
        r = helpers.fab(lab, "-H", "h1,h2", "tune", "--vary", f"{KEY}=1,2", "--out",
                        str(tmp_path / "o"), profile=base, code=2)
    finally:
        lab.set_gpus("h2", count=2)
    assert "not alike" in r.stderr and "h2: vllm" in r.stderr and "1 x" in r.stderr, r.stderr
    for h in ("h1", "h2"):
        assert not (deployment(lab, h, name) / "releases").exists()


@pytest.mark.parametrize("args, says", [
    (["--vary", f"{KEY}=1,2,3,4,5,6", "--vary", "server.args.speculative-config.prompt_lookup_max=1,2,3,4,5,6"],
     "36 variants: at most 32"),
    (["--vary", "server.args.speculative-config.num_speculativ_tokens=1,2"],
     "variant 1 (num_speculativ_tokens=1): --vary server.args.speculative-config.num_speculativ_tokens: "
     "server.args.speculative-config.num_speculativ_tokens is not in the profile"),
    (["--vary", "server.bogus=1,2"], "variant 1 (bogus=1)"),
])
def test_bad_variants_are_exit_2_with_nothing_done(lab, tmp_path, args, says):
    name = "tune-bad"
    base = base_profile(lab, name, 18840)
    out = tmp_path / "o"
    r = helpers.fab(lab, "tune", *args, "--out", str(out), profile=base, code=2)
    assert says in r.stderr, r.stderr
    assert not out.exists()
    assert not deployment(lab, "h1", name).exists()
