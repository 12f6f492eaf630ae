"""`fab bench`'s client against `vllm bench serve`'s, on a streaming server that is never short
of CPU (issue 23, item 6: what is left of a difference when the engine is taken out).

    python benchmarks/run.py bench-clients [--rounds 3]

Starts a uvicorn/Starlette server under the real vLLM's interpreter (the HTTP stack vLLM's API
server uses) that answers /v1/completions the way vLLM 0.32.0 streams: the first token chunk
after 15 ms, then one chunk every 3 ms (4 in 5 with text "", as the tiny model's held-back
bytes), the usage chunk, [DONE]. Then, alternating, each round: fab's host-side bench op (the
agent's own code, in its own process: 64 requests, 4 at a time, 128 tokens each) and
`vllm bench serve` (the same shape; run as in benchmarks/vllm_bench_compare.py). Prints each
tool's output tok/s, TTFT/TPOT/ITL p50, and the client's CPU seconds over its window
(fab: its whole process, warm-up included; vLLM: from its "Starting main benchmark run"
line to its result, read from /proc). No real engine runs: no lock needed.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from harness import REPO, median
import realengine
from vllm_bench_compare import BENCH_SERVE

SERVER = '''
import asyncio, json, sys
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

async def completions(request):
    n = int((await request.json()).get("max_tokens", 16))
    async def gen():
        await asyncio.sleep(0.015)
        for i in range(n):
            if i:
                await asyncio.sleep(0.003)
            choice = {"index": 0, "text": "ab" if i % 5 == 0 else "", "logprobs": None,
                      "finish_reason": "length" if i == n - 1 else None}
            yield "data: " + json.dumps({"id": "c", "object": "text_completion", "model": "tiny",
                                         "choices": [choice]}) + "\\n\\n"
        usage = {"prompt_tokens": 128, "completion_tokens": n, "total_tokens": n + 128}
        yield "data: " + json.dumps({"id": "c", "choices": [], "usage": usage}) + "\\n\\n"
        yield "data: [DONE]\\n\\n"
    return StreamingResponse(gen(), media_type="text/event-stream")

async def models(request):
    return JSONResponse({"data": [{"id": "tiny"}]})

async def metrics(request):
    return PlainTextResponse("")

app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                        Route("/v1/models", models), Route("/metrics", metrics)])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
'''
FAB = '''
import json, sys
sys.path.insert(0, %r)
from tasks.measure.host import loadgen as bench
from tasks.measure import bench_stats as benchstats
raw = bench.op_bench(**{"port": %d, "host": "127.0.0.1", "engine": "vllm", "model": "tiny",
                         "requests": 64, "concurrency": 4, "max_tokens": 128, "prompts": [{"prompt": "hi"}]})
print(json.dumps(benchstats.record("local", raw, None)))
'''


def cpu_s(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_fab(port):
    import resource
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([sys.executable, "-c", FAB % (str(REPO), port)], capture_output=True,
                       text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rec = json.loads(r.stdout)
    return {"tok/s": rec["output_tokens_per_s"], "TTFT": rec["ttft_ms"]["p50"],
            "TPOT": rec["tpot_ms"]["p50"], "ITL": rec["itl_ms"]["p50"],
            "CPU s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime}


def run_vllm(port, tmp, n):
    result = Path(tmp) / f"v{n}.json"
    argv = [str(realengine.VLLM_PYTHON), "-c", BENCH_SERVE, "--backend", "openai",
            "--base-url", f"http://127.0.0.1:{port}", "--model", "tiny",
            "--tokenizer", str(realengine.tiny_model("target")), "--dataset-name", "random",
            "--random-input-len", "128", "--random-output-len", "128", "--num-prompts", "64",
            "--max-concurrency", "4", "--ignore-eos", "--seed", "0", "--disable-tqdm",
            "--save-result", "--result-dir", str(tmp), "--result-filename", result.name]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    start = cpu = None
    for line in p.stdout:
        if "Starting main benchmark run" in line:
            start = cpu_s(p.pid)
        elif "Serving Benchmark Result" in line and start is not None:
            cpu = cpu_s(p.pid) - start
    if p.wait() != 0:
        raise SystemExit(f"vllm bench serve exited {p.returncode}")
    v = json.loads(result.read_text())
    return {"tok/s": v["output_throughput"], "TTFT": v["median_ttft_ms"], "TPOT": v["median_tpot_ms"],
            "ITL": v["median_itl_ms"], "CPU s": cpu}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="run.py bench-clients", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=18174)
    a = ap.parse_args(argv)
    realengine.require_real_engine()
    server = subprocess.Popen([str(realengine.VLLM_PYTHON), "-c", SERVER, str(a.port)])
    runs = {"fab": [], "vllm": []}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{a.port}/v1/models", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the streaming server did not start")
                time.sleep(0.2)  # polling a process we started, no event to wait on
        with tempfile.TemporaryDirectory() as tmp:
            for n in range(a.rounds):
                order = ("fab", "vllm") if n % 2 == 0 else ("vllm", "fab")
                for tool in order:
                    runs[tool].append(run_fab(a.port) if tool == "fab" else run_vllm(a.port, tmp, n))
                print(f"round {n + 1}: " + "; ".join(
                    f"{t} " + ", ".join(f"{k} {v:.2f}" for k, v in runs[t][-1].items()) for t in order),
                    flush=True)
    finally:
        server.terminate()
        server.wait(30)
    print("\n| figure | fab bench's client | vllm bench serve's client | fab / vllm |\n| --- | --- | --- | --- |")
    for k in runs["fab"][0]:
        f = median(r[k] for r in runs["fab"])
        v = median(r[k] for r in runs["vllm"])
        print(f"| {k} | {f:.2f} | {v:.2f} | {f / v:.3f} |")
