"""`fab bench` without SSH: the real agent (host `local`) against a real demo server.

The demo server (configs/demo_server.py, also the stand-ins' HTTP side) runs in this
process on a free port; its simulated drafter accepts round(rate * k) of k drafted
tokens per step, so any window's acceptance is `rate` within 2 / draft tokens.
Also: flag validation, prompt files, percentiles and --compare, from the real CLI.
"""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tasks import bench
from tasks.measure import bench_stats, metrics
from tasks.errors import UsageError
from tasks.transport.agent import Host

ROOT = Path(__file__).resolve().parents[2]


def _demo_module():
    spec = importlib.util.spec_from_file_location("demo_server", ROOT / "configs" / "demo_server.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def start_demo(k, rate=0.62, tokens_per_s=4000.0):
    demo = _demo_module()
    sim = demo.SpecDecodeSim(k, rate) if k else None
    m = demo.Metrics("demo-model", spec=sim)
    state = demo.ServerState(demo.Engine(m, tokens_per_s=tokens_per_s, spec=sim), ["demo-model"],
                             access_log=False)
    server = demo.start_http(state, demo.bind_socket("127.0.0.1", 0))
    return server, server.socket.getsockname()[1]


@pytest.fixture
def agent():
    host = Host("local", python=sys.executable)
    host.start()
    yield host
    host.close()


def run_bench(host, port, n=12, conc=3, max_tokens=64, prompts=None):
    return host.call("bench", port=port, host="127.0.0.1", engine="vllm", model="demo-model",
                     models_path="/v1/models", api_key=None, requests=n, concurrency=conc,
                     max_tokens=max_tokens, prompts=prompts or [{"prompt": "hello there"}])


def test_bench_window_acceptance_excludes_earlier_traffic(agent):
    server, port = start_demo(15, 0.62)
    try:
        # Earlier traffic: the counters are non-zero when the measured window starts.
        run_bench(agent, port, n=4, conc=2, max_tokens=200)
        raw = run_bench(agent, port, n=12, conc=3, max_tokens=64,
                        prompts=[{"prompt": "a b c"}, {"messages": [{"role": "user", "content": "hi"}]}])
    finally:
        server.shutdown()
    before = metrics.parse(raw["before"]["text"])
    after = metrics.parse(raw["after"]["text"])
    assert before.get(metrics.DRAFTS) > 0, "counters were non-zero before the window"
    window_drafts = after.get(metrics.DRAFTS) - before.get(metrics.DRAFTS)
    rec = bench_stats.record("local", raw, bench_stats.window_spec(raw, "vllm"))
    assert list(rec) == list(bench_stats.FIELDS + bench_stats.EXTRA_FIELDS)
    assert rec["requests"] == 12 and rec["errors"] == 0
    assert rec["spec"]["acceptance_rate"] == pytest.approx(0.62, abs=0.01)
    # 15 drafted per step, 62 % of them accepted: 1 + 0.62 * 15 tokens per step.
    assert rec["spec"]["mean_acceptance_length"] == pytest.approx(1 + 15 * 0.62, abs=0.15)
    accepted = after.get(metrics.ACCEPTED) - before.get(metrics.ACCEPTED)
    assert rec["spec"]["mean_acceptance_length"] == pytest.approx(1 + accepted / window_drafts,
                                                                  abs=1e-5)
    assert len(rec["spec"]["per_position"]) == 15
    assert all(s["usage"] and s["output_tokens"] == 64 for s in raw["samples"])
    assert rec["output_tokens_per_s"] == pytest.approx(12 * 64 / rec["duration_s"], rel=0.01)
    assert rec["ttft_ms"]["p50"] > 0 and rec["itl_ms"]["p90"] >= rec["itl_ms"]["p50"] > 0


def test_no_speculative_decoding_and_status_metrics(agent):
    server, port = start_demo(0)
    try:
        raw = run_bench(agent, port, n=3, conc=3, max_tokens=8)
        status = metrics.status_metrics(agent, _Profile, {"port": port}, interval=0.2)
    finally:
        server.shutdown()
    assert bench_stats.window_spec(raw, "vllm") is None
    assert bench_stats.human_lines(bench_stats.record("local", raw, None), "vllm")[-1] \
        == "no speculative decoding"
    assert status["spec"] is None and status["lines"][0] == "no speculative decoding"
    assert status["generation_tokens_per_s"] == 0.0


def test_status_metrics_with_spec_and_without_a_server(agent):
    server, port = start_demo(4, 0.5)
    try:
        run_bench(agent, port, n=2, conc=2, max_tokens=40)
        status = metrics.status_metrics(agent, _Profile, {"port": port}, interval=0.2)
    finally:
        server.shutdown()
        server.server_close()
    assert status["spec"]["acceptance_rate"] == pytest.approx(0.5, abs=0.02)
    assert status["lines"][0].startswith("speculative decoding: acceptance 5")
    assert status["lines"][2].startswith("requests: 0 running, 0 waiting; KV cache")
    gone = metrics.status_metrics(agent, _Profile, {"port": port}, interval=0.2)
    assert gone["spec"] is None and gone["lines"][0].startswith("metrics: not available (")


def test_failed_requests_are_counted_not_fatal(agent):
    server, port = start_demo(0)
    try:
        with pytest.raises(Exception, match="warm-up request failed: HTTP 404"):
            agent.call("bench", port=port, host="127.0.0.1", engine="vllm", model="nope",
                       requests=1, concurrency=1, max_tokens=4, prompts=[{"prompt": "x"}])
    finally:
        server.shutdown()


class _Profile:
    class server:
        engine, host, port = "vllm", "127.0.0.1", 8000


def test_percentile_interpolates_like_numpy():
    assert bench_stats.percentile([], 50) is None
    assert bench_stats.percentile([3.0], 90) == 3.0
    assert bench_stats.percentile([1, 2, 3, 4], 50) == 2.5
    assert bench_stats.percentile(list(range(11)), 90) == pytest.approx(9.0)
    assert bench_stats.percentile([10, 0, 5], 90) == pytest.approx(9.0)


def test_prompt_files(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "a"}\n\n{"messages": [{"role": "user", "content": "b"}]}\n')
    assert bench.read_prompts(str(good)) == [
        {"prompt": "a"}, {"messages": [{"role": "user", "content": "b"}]}]
    for text, msg in (('{"prompt": "a"}\nnot json\n', r"p.jsonl:2: not JSON"),
                      ('{"text": "a"}\n', r"p.jsonl:1: expected"),
                      ('{"messages": []}\n', r"p.jsonl:1: expected"),
                      ("\n", "holds no prompt")):
        good.write_text(text)
        with pytest.raises(UsageError, match=msg):
            bench.read_prompts(str(good))
    with pytest.raises(UsageError, match="cannot read"):
        bench.read_prompts(str(tmp_path / "missing.jsonl"))


def fab(*args, cwd=ROOT):
    return subprocess.run(["fab", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args, needle", [
    (["--requests", "0"], "--requests expects a positive integer"),
    (["--concurrency", "-2"], "--concurrency expects a positive integer"),
    (["--requests", "abc"], "--requests expects a positive integer (got 'abc')"),
    (["--max-tokens", "0"], "--max-tokens expects a positive integer"),
    (["--prompts", "/nonexistent/p.jsonl"], "--prompts: cannot read /nonexistent/p.jsonl"),
    (["--compare", "only-one.json"], "--compare expects two files"),
    (["--random-input-len", "0"], "--random-input-len expects a positive integer"),
    (["--random-input-len", "8", "--prompts", "p.jsonl"], "--random-input-len and --prompts exclude"),
])
def test_bad_flags_exit_2_before_any_host(args, needle):
    # -H names a host that cannot resolve: had it been contacted, the exit would be 3.
    r = fab("-H", "nowhere.invalid", "bench", *args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr


def _result(host, tps, spec):
    return {"host": host, "requests": 32, "errors": 0, "duration_s": 4.0, "requests_per_s": 8.0,
            "output_tokens_per_s": tps, "ttft_ms": {"p50": 12.0, "p90": 20.0},
            "itl_ms": {"p50": 5.0, "p90": 6.0}, "spec": spec}


def test_compare_prints_two_runs_side_by_side(tmp_path):
    mtp, dflash = tmp_path / "mtp.json", tmp_path / "dflash.json"
    mtp.write_text(json.dumps(_result("h1", 400.0, None)) + "\n")
    dflash.write_text(json.dumps(_result("h1", 1000.0, {"acceptance_rate": 0.62,
                      "mean_acceptance_length": 10.3, "per_position": [0.9]})) + "\n")
    r = fab("bench", "--compare", f"{mtp},{dflash}")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["metric", "mtp", "dflash", "B/A"]
    assert "output tok/s     400.0    1000.0  2.50x" in r.stdout
    assert lines[-3].split() == ["acceptance", "no", "spec", "0.620", "-"]
    # The A/B verdict line (tasks/measure/repeats.py): single runs have no spread to judge by.
    assert lines[-1] == ("verdict: output tok/s: dflash better by 150.0% (no spread known (run each "
                         "side with --repeat 3 or more)); acceptance: not in both")
    bad = tmp_path / "bad.json"
    bad.write_text('{"host": "h1"}\n')
    r = fab("bench", "--compare", f"{mtp},{bad}")
    assert r.returncode == 2 and "bad.json:1: not a `fab bench --json` result" in r.stderr


def test_compare_warns_naming_each_setting_in_which_two_runs_differ(tmp_path):
    """`fab bench --json` records what the run was asked (tasks/bench.py SETTINGS); comparing a
    run at concurrency 1 and temperature 0 with one at 4 and the server's default says so."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    common = {"max_tokens": 128, "ignore_eos": False, "random_input_len": None, "seed": 0,
              "prompts": None}
    a.write_text(json.dumps(dict(_result("h1", 400.0, None), concurrency=1, temperature=0,
                                 release="r1", **common)) + "\n")
    b.write_text(json.dumps(dict(_result("h1", 900.0, None), concurrency=4, temperature=None,
                                 release="r2", **common)) + "\n")
    r = fab("bench", "--compare", f"{a},{b}")
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first == ("warning: these runs were not made alike: concurrency 1 (a) vs 4 (b); "
                     "temperature 0 (a) vs None (b)"), first
    assert "max_tokens" not in first and "release" not in first  # alike, or not a setting of the load
    a.write_text(json.dumps(_result("h1", 400.0, None)) + "\n")  # saved before settings were kept
    first = fab("bench", "--compare", f"{a},{b}").stdout.splitlines()[0]
    assert first.startswith("warning: these runs were not made alike: concurrency not recorded (a) vs 4 (b)")


def test_random_prompts_are_token_ids_of_the_model_vocabulary(tmp_path):
    """--random-input-len: N ids each, seeded, none of them a special token, read from the
    model's tokenizer.json on the host (here a small one in the layout of the tiny model's)."""
    import tasks.measure.host.loadgen
    from tasks.base.host.hosterrors import HostError
    tok = {"model": {"type": "BPE", "vocab": {f"t{i}": i for i in range(40)}},
           "added_tokens": [{"id": 0, "content": "<unk>", "special": True},
                            {"id": 2, "content": "</s>", "special": True},
                            {"id": 39, "content": "word", "special": False}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok))
    prompts = tasks.measure.host.loadgen.random_prompts(str(tmp_path), 5, 300, seed=0)
    assert len(prompts) == 5 and all(len(p["prompt"]) == 300 for p in prompts)
    ids = {i for p in prompts for i in p["prompt"]}
    assert ids <= set(range(40)) - {0, 2} and 39 in ids and len(ids) > 30
    assert prompts == tasks.measure.host.loadgen.random_prompts(str(tmp_path), 5, 300, seed=0)
    assert prompts != tasks.measure.host.loadgen.random_prompts(str(tmp_path), 5, 300, seed=1)
    with pytest.raises(HostError, match="needs the model's tokenizer.json on the host"):
        tasks.measure.host.loadgen.random_prompts(str(tmp_path / "nope"), 1, 8, seed=0)


def test_ignore_eos_and_token_id_prompts_reach_the_request_body():
    import tasks.measure.host.loadgen
    path, body = tasks.measure.host.loadgen._request_for({"prompt": [5, 6, 7]}, "m", 16, {"ignore_eos": True})
    assert path == "/v1/completions" and body["prompt"] == [5, 6, 7] and body["ignore_eos"] is True


# Streams as vLLM 0.32.0 writes them (vllm/entrypoints/openai/completion/serving.py and
# chat_completion/serving.py): one chunk per engine output with new tokens, its text "" while
# the byte-level detokenizer holds back a partial UTF-8 character; a chat stream opens with a
# role-only chunk; then the usage chunk (no choices) and [DONE].
COMPLETION_STREAM = [
    {"choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": None}]},
    {"choices": [{"index": 0, "text": "\u00e9a", "logprobs": None, "finish_reason": None}]},
    {"choices": [{"index": 0, "text": "b", "logprobs": None, "finish_reason": None}]},
    {"choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}]},
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}},
]
CHAT_STREAM = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"content": "\u00e9a"}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"content": "b"}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}},
]


def _serve_stream(chunks=None, body=None):
    """A real HTTP server answering every POST with this stream: `chunks` as SSE, or a
    recorded response `body` as it was received."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            if body is not None:
                self.wfile.write(body)
                return
            for c in chunks:
                self.wfile.write(("data: " + json.dumps(c) + "\n\n").encode())
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *a):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("chunks", [COMPLETION_STREAM, CHAT_STREAM], ids=["completions", "chat"])
def test_ttft_itl_and_tpot_count_the_chunks_that_carry_tokens_as_vllm_bench_serve_does(chunks, monkeypatch):
    """TTFT stops at the first chunk carrying a token even when its text is "" (held back), not
    at the first text; the request's generation ends at the last token chunk, not at the usage
    chunk and [DONE]. The clock ticks 1 s per reading, so the times are the chunks' order."""
    sample = _request_with_ticking_clock(monkeypatch, _serve_stream(chunks))
    chat = "delta" in chunks[0]["choices"][0]
    # start 0; role chunk (chat) 1; token chunks next, one tick each; usage chunk; end
    first = 2.0 if chat else 1.0
    assert sample["ok"] and sample["output_tokens"] == 4 and sample["usage"]
    assert sample["ttft_s"] == first
    assert sample["itl_s"] == [1.0, 1.0, 1.0]
    assert sample["last_token_s"] == first + 3
    assert sample["latency_s"] == first + 5
    assert bench_stats.tpot_s(sample) == 1.0


def _request_with_ticking_clock(monkeypatch, server):
    """One streamed request through the host side's one_request, its clock ticking 1 s per
    reading (start, each data chunk, end): the times it records are the chunks' order."""
    import tasks.measure.host.loadgen
    ticks = iter(range(1000))

    class Clock:
        @staticmethod
        def perf_counter():
            return float(next(ticks))
    monkeypatch.setattr(tasks.measure.host.loadgen, "time", Clock)
    try:
        url = "http://127.0.0.1:%d/v1/completions" % server.server_address[1]
        return tasks.measure.host.loadgen.one_request(url, {"prompt": "x"}, {"Content-Type": "application/json"}, 10)
    finally:
        server.shutdown()
        server.server_close()


REAL_STREAMS = ROOT / "tests" / "fixtures" / "real-vllm-cpu"


@pytest.mark.parametrize("name, tokens, first", [("completion-stream.sse", 64, 1),
                                                  ("chat-stream.sse", 16, 2)])
def test_every_token_chunk_of_a_real_vllm_stream_counts(name, tokens, first, monkeypatch):
    """Streams recorded from vLLM 0.32.0 (tests/fixtures/real-vllm-cpu/SOURCES.md): without
    speculative decoding each chunk with choices carries one token, so the chunks fab counts
    equal the usage's completion_tokens, although most of them have text "" (the tiny model's
    byte-level tokens held back by the detokenizer); the chat role chunk is not one."""
    body = (REAL_STREAMS / name).read_bytes()
    empty = body.count(b'"text":""') + body.count(b'"delta":{"content":""}')
    assert empty > tokens // 2  # what made "first chunk with text" the wrong clock
    sample = _request_with_ticking_clock(monkeypatch, _serve_stream(body=body))
    assert sample["ok"] and sample["usage"] and sample["output_tokens"] == tokens
    assert sample["ttft_s"] == first
    assert len(sample["itl_s"]) == tokens - 1 and set(sample["itl_s"]) == {1.0}
    assert sample["last_token_s"] == first + tokens - 1
    assert bench_stats.tpot_s(sample) == 1.0


def test_the_servers_own_ttft_and_tpot_over_the_window_and_the_burst_note():
    """From /metrics recorded on vLLM 0.32.0 (3 requests between the two snapshots): the change
    of its TTFT and TPOT histograms; a client whose ITL p50 is a small share of the server's
    TPOT got its tokens in bursts, and the human lines say so (seen on this 2-core machine
    under load: ITL p50 0.01-0.03 ms against the server's 3-5 ms, benchmarks/RESULTS.md)."""
    fixtures = ROOT / "tests" / "fixtures" / "metrics"
    raw = {"before": {"text": (fixtures / "vllm_cpu_0.32.0_draft_model_start.txt").read_text()},
           "after": {"text": (fixtures / "vllm_cpu_0.32.0_draft_model_after.txt").read_text()},
           "samples": [], "duration_s": 1.0}
    srv = bench_stats.window_server(raw)
    assert srv == {"ttft_mean": round(1000 * 0.19354009628295898 / 3, 3),
                   "tpot_mean": round(1000 * 0.00960647657447022 / 3, 3)}
    assert bench_stats.window_server(dict(raw, after={"text": (fixtures / "sglang_metrics.txt").read_text()})) is None
    assert bench_stats.window_server(dict(raw, after={"text": None})) is None
    rec = bench_stats.record("h1", raw, None)
    assert rec["server_ms"] == srv and list(rec)[-1] == "server_ms"

    def lines(itl_p50):
        r = dict(rec, itl_ms={"p50": itl_p50, "p90": itl_p50}, tpot_ms={"p50": 1.0, "p90": 2.0})
        return [str(getattr(l, "headline", l)) for l in bench_stats.human_lines(r, "vllm")]
    clear = lines(3.0)
    assert "server's own    TTFT mean 64.5 ms, TPOT mean 3.20 ms (its /metrics over the window)" in clear
    assert not any(l.startswith("note: the tokens reached") for l in clear)
    burst = lines(0.02)
    assert any(l.startswith("note: the tokens reached this client in bursts (ITL p50 0.02 ms, the "
                            "server's 3.20 ms a token)") for l in burst), burst
    # a server without the TPOT histogram (the demo's stand-in): no "TPOT mean - ms", no note
    rec = dict(rec, server_ms={"ttft_mean": 64.5, "tpot_mean": None})
    alone = lines(0.02)
    assert "server's own    TTFT mean 64.5 ms (its /metrics over the window)" in alone, alone
    assert not any(l.startswith("note: the tokens reached") for l in alone)
