"""What explaining a failure costs (issue 14): `python3 benchmarks/explain_cost.py [--lab]`.

1. Scanning, every poll: a healthy 20,000-line vLLM start-up log fed in 400-line chunks
   through today's scanner (the failure-rule table) and, side by side in the same run,
   through the scanner before issue 14 (tasks/failures/logscan.py at --before, read with `git show`).
2. Explaining, once per failure: explain() of every recorded fixture (no host call).
3. --lab: fatal line -> verdict of a real `fab deploy` (tests/hostlab.py host, poll_interval
   1.0 s) for rules that need no host reading (cuda-oom, as benchmarks/run.py times it;
   kv-cache-too-small) and one that asks the host who holds the GPU (gpu-memory-taken:
   one more agent request), interleaved, the fatal line at a random point of a poll.
   The stand-in stamps the time it prints the fatal line (STANDIN_FATAL_FILE).
"""
import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from tasks.failures.explain import Readings, explain  # noqa: E402
from tasks.failures.logscan import LogScanner  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "failures"
HEALTHY = [
    "(EngineCore_DP0 pid=4242) INFO 12-01 08:00:00 [gpu_model_runner.py:2602] Starting to load model m...",
    "(APIServer pid=4200) INFO 12-01 08:00:01 [loggers.py:127] Engine 000: Avg prompt throughput: 1.5 "
    "tokens/s, Avg generation throughput: 10.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs",
    "(APIServer pid=4200) INFO:     127.0.0.1:51234 - \"POST /v1/chat/completions HTTP/1.1\" 200 OK",
    "(EngineCore_DP0 pid=4242) INFO 12-01 08:00:02 [monitor.py:34] torch.compile takes 20.12 s in total",
]


def old_scanner(before):
    """The LogScanner of tasks/failures/logscan.py at commit `before` (its own module)."""
    text = subprocess.run(["git", "show", f"{before}:tasks/failures/logscan.py"], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "logscan_before.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("logscan_before", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.LogScanner


def scan_cost(scanner_cls, chunks, reps):
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        s = scanner_cls()
        for c in chunks:
            s.feed(c)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def offline(before, reps=7):
    lines = [HEALTHY[i % len(HEALTHY)] for i in range(20000)]
    chunks = ["\n".join(lines[i:i + 400]) + "\n" for i in range(0, len(lines), 400)]
    new = scan_cost(LogScanner, chunks, reps)
    old = scan_cost(old_scanner(before), chunks, reps)
    cases = json.loads((FIXTURES / "cases.json").read_text())
    costs = []
    for case in cases:
        text = (FIXTURES / case["file"]).read_text()
        t0 = time.perf_counter()
        for _ in range(50):
            s = LogScanner()
            s.feed(text, final=True)
            explain(s, Readings(exit=case["exit"]))
        costs.append((time.perf_counter() - t0) / 50)
    print("| what | before issue 14 | now |\n| --- | --- | --- |")
    print(f"| scan 20,000 healthy log lines (50 polls of 400) | {old * 1000:.1f} ms "
          f"({old / 20000 * 1e6:.2f} us/line) | {new * 1000:.1f} ms ({new / 20000 * 1e6:.2f} us/line) |")
    print(f"| scan + explain one recorded failure ({len(cases)} fixtures) | - | median "
          f"{statistics.median(costs) * 1000:.2f} ms, max {max(costs) * 1000:.2f} ms |")


def lab_case(reps):
    from helpers import TARGET
    from hostlab import HostLab
    import random
    rng = random.Random(14)
    out = {"cuda-oom": [], "kv-cache-too-small": [], "gpu-memory-taken": []}
    with HostLab(1) as lab:
        model = lab.model_dir("bench-qwen", architectures=TARGET["architectures"],
                              text_config=TARGET["text_config"])
        stamp = lab.tmp("h1") / "llmfab-explain-stamp"
        for rep in range(-1, reps):
            for rule in out:
                # A random load time: the fatal line falls anywhere within a poll interval.
                env = ['STANDIN_FATAL_FILE = "/tmp/llmfab-explain-stamp"',
                       'STANDIN_LOAD_SECONDS = "%.3f"' % rng.uniform(1.5, 3.5)]
                args = ["max-model-len = 65536"]
                if rule == "cuda-oom":  # the case benchmarks/run.py times (no host reading)
                    env.append('STANDIN_FAIL = "oom"')
                elif rule == "kv-cache-too-small":
                    env.append('STANDIN_KV_CACHE_GIB = "4"')
                else:  # more than 1 - 0.9 of the GPU is taken by a "baseline" the stand-in sees
                    lab.set_gpus("h1", 2, baseline_mib=20000)
                prof = lab.root / f"{rule}.toml"
                prof.write_text("\n".join([
                    "[target]", 'hosts = ["h1"]', f'name = "{rule}"', "[server]", 'engine = "vllm"',
                    f'python = "{lab.ml_python}"', f'model = "{model}"', "port = 31499",
                    "[server.args]", *args, "[server.env]", *env, "[ready]", "timeout = 60", ""]))
                stamp.unlink(missing_ok=True)
                seen = None
                proc = subprocess.Popen([sys.executable, "-m", "fabric", "-S", str(lab.ssh_config), "deploy",
                                         "--profile", str(prof)], cwd=REPO, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
                for line in proc.stdout:
                    if seen is None and "error: server failed" in line:
                        seen = time.time()
                proc.stdout.close()
                code = proc.wait(120)
                lab.set_gpus("h1", 2)
                if code != 1 or seen is None or not stamp.exists():
                    raise SystemExit(f"{rule}: exit {code}, verdict {seen}, stamp {stamp.exists()}")
                if rep >= 0:
                    out[rule].append(seen - float(stamp.read_text()))
    print("| rule (poll_interval 1.0 s) | fatal line -> verdict, median | max | runs |\n| --- | --- | --- | --- |")
    for rule, v in out.items():
        print(f"| `{rule}` | {statistics.median(v):.3f} s | {max(v):.3f} s | {len(v)} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="7e36195", help="commit of the scanner to compare with")
    ap.add_argument("--lab", action="store_true", help="also time real deploys on a lab host (root)")
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    offline(a.before, a.reps)
    if a.lab:
        lab_case(a.reps)


if __name__ == "__main__":
    main()
