"""`fab tune` over 1 host against the same sweep over 3 alike hosts (issue 24).

    python benchmarks/run.py tune-hosts [--variants 6] [--rounds 1] [--out F.json]

Builds a lab of 3 namespace hosts (tests/hostlab.py: real sshd each) running the stand-in vLLM
(acceptance falling by draft position, a cost per drafted token, 0.5 s of "loading"), and
times the whole `fab tune` command, wall clock, for the same sweep (k = 1..N, concurrency
1 and 4, 8 requests of 64 tokens, repeat 2) with `-H h1` and with `-H h1,h2,h3`, side by
side in one run, alternating which goes first each round. Each host deploys, benches and
stops one variant at a time, so 3 hosts should take about 1/3 of the time plus the fixed
parts (the survey, the put-back, the report). Prints a table and writes JSON to --out.
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
             'speculative-config = { method = "ngram", num_speculative_tokens = 2 }',
             "[server.env]", 'STANDIN_ACCEPT_RATE = "0.7"', 'STANDIN_ACCEPT_FALLS = "1"',
             'STANDIN_DRAFT_COST = "0.1"', 'STANDIN_TOKENS_PER_S = "150"',
             'STANDIN_LOAD_SECONDS = "0.5"', "[ready]", "timeout = 60", "poll_interval = 0.2"]
    path = Path(lab.root) / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def sweep(lab, prof, hosts, variants, out):
    ks = ",".join(str(k) for k in range(1, variants + 1))
    t0 = time.monotonic()
    r = lab.fab("-H", hosts, "tune", "--vary",
                f"server.args.speculative-config.num_speculative_tokens={ks}",
                "--concurrency", "1,4", "--requests", "8", "--max-tokens", "64", "--repeat", "2",
                "--out", str(out), profile=prof, timeout=1200)
    seconds = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"fab tune -H {hosts} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    winner = next((line for line in r.stdout.splitlines() if "winner" in line), "")
    return {"hosts": hosts, "seconds": round(seconds, 2), "records": len(recs),
            "by_host": {h: sum(1 for x in recs if x["host"] == h) // 2 for h in hosts.split(",")},
            "winner": winner}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="run.py tune-hosts", description=__doc__.splitlines()[0])
    ap.add_argument("--variants", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = []
    with HostLab(3) as lab:
        prof = profile(lab, "tune-bench", 18900)
        for rnd in range(args.rounds):
            order = ["h1", "h1,h2,h3"] if rnd % 2 == 0 else ["h1,h2,h3", "h1"]
            for hosts in order:
                out = Path(lab.root) / f"tune-{rnd}-{hosts.count(',') + 1}"
                res = sweep(lab, prof, hosts, args.variants, out)
                res["round"] = rnd + 1
                rows.append(res)
                print(f"round {rnd + 1}: {len(hosts.split(','))} host(s): {res['seconds']:.1f} s, "
                      f"variants per host {res['by_host']}; {res['winner']}", flush=True)
    one = [r["seconds"] for r in rows if r["hosts"] == "h1"]
    three = [r["seconds"] for r in rows if r["hosts"] != "h1"]
    ratio = (sum(three) / len(three)) / (sum(one) / len(one))
    print(f"\n{args.variants} variants: 1 host {sum(one) / len(one):.1f} s, 3 hosts "
          f"{sum(three) / len(three):.1f} s: 3 hosts take {ratio:.2f} of the time of 1")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "ratio": round(ratio, 3)}, indent=1) + "\n")
