"""`fab tune --slots auto` on a host with 8 fake GPUs against `--slots 1` (issue 31).

    python benchmarks/run.py tune-slots [--rounds 1] [--out F.json]

Builds a lab of one namespace host (tests/hostlab.py: real sshd) with 8 fake GPUs, running the
stand-in vLLM (0.5 s of "loading"), and times the whole `fab tune --slo` command, wall clock,
for the same sweep of 8 one-GPU variants (`server.args.max-num-seqs=1..8`, a bound every load
meets, --max-load 4: load points 1 and 4, 3 runs each) with `--slots 1` (one variant at a
time) and `--slots auto` (8 at once, each its own GPU and port), side by side in one run, the
order alternating by round. Prints a table, the time ratio and the load points per variant.
"""
import argparse
import json
import time
from pathlib import Path

import harness  # noqa: F401  (puts tests/ on sys.path)

from hostlab import HostLab


def profile(lab, name, port):
    lines = ["[target]", 'hosts = ["h1"]', f'name = "{name}"',
             "[server]", 'engine = "vllm"', f'python = "{lab.ml_python}"',
             f'model = "{lab.model_dir("bench-target")}"', 'host = "127.0.0.1"', f"port = {port}",
             "[server.args]", 'served-model-name = "m"',
             "[server.env]", 'STANDIN_TOKENS_PER_S = "400"', 'STANDIN_LOAD_SECONDS = "0.5"',
             "[ready]", "timeout = 60", "poll_interval = 0.2"]
    path = Path(lab.root) / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def sweep(lab, prof, slots, out):
    t0 = time.monotonic()
    r = lab.fab("tune", "--vary", "server.args.max-num-seqs=1,2,3,4,5,6,7,8", "--slots", slots,
                "--slo", "tpot_p50<=1000", "--max-load", "4", "--requests", "4",
                "--max-tokens", "16", "--out", str(out), profile=prof, timeout=1200)
    seconds = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"fab tune --slots {slots} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return {"slots": slots, "seconds": round(seconds, 2), "variants": len(recs),
            "points_per_variant": sorted({len(x["points"]) for x in recs}),
            "capacities": sorted({x["capacity"] for x in recs})}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="run.py tune-slots", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = []
    with HostLab(1) as lab:
        lab.set_gpus("h1", count=8)
        prof = profile(lab, "tune-slots-bench", 18950)
        for rnd in range(args.rounds):
            for slots in (["1", "auto"] if rnd % 2 == 0 else ["auto", "1"]):
                res = sweep(lab, prof, slots, Path(lab.root) / f"slots-{rnd}-{slots}")
                res["round"] = rnd + 1
                rows.append(res)
                print(f"round {rnd + 1}: --slots {slots}: {res['seconds']:.1f} s, "
                      f"{res['variants']} variants, load points per variant "
                      f"{res['points_per_variant']}, capacities {res['capacities']}", flush=True)
    one = [r["seconds"] for r in rows if r["slots"] == "1"]
    auto = [r["seconds"] for r in rows if r["slots"] == "auto"]
    ratio = (sum(auto) / len(auto)) / (sum(one) / len(one))
    print(f"\n8 one-GPU variants on 8 fake GPUs: --slots 1 {sum(one) / len(one):.1f} s, "
          f"--slots auto {sum(auto) / len(auto):.1f} s: {ratio:.2f} of the time")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "ratio": round(ratio, 3)}, indent=1) + "\n")
