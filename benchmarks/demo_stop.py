"""How long `fab stop` of the demo takes: N times `fab deploy && fab stop` on `local`.

    python3 benchmarks/demo_stop.py [--runs 20] [--port 18731] [--before-tree DIR]

The profile extends configs/demo.toml with its own port and workdir (other people run the
demo's default ones on this machine). Each stop's wall time (the whole `fab stop`
process) and the host's own "stopped ... in X s" figure are printed, with how many
stops ended in SIGKILL. `--before-tree DIR` runs another checkout (e.g. main before the
fix) side by side, alternating runs. Exits 1 if any stop of this tree took 2 s or more.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STOPPED = re.compile(r"stopped release \S+: (\d+) process\(es\) ended on SIGTERM(?:, (\d+) killed by SIGKILL)? in ([\d.]+) s")


def write_profile(tree, workdir, port):
    path = Path(workdir) / "demo-stop.toml"
    path.write_text("\n".join([
        f'extends = "{Path(tree) / "configs" / "demo.toml"}"',
        "[target]", 'hosts = ["local"]', 'name = "demo-stop"', f'workdir = "{workdir}"',
        "[server]", f"port = {port}", "[server.args]", f"port = {port}", "load-seconds = 0.5", ""]))
    return path


def fab(tree, *args):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "fabric", *args], cwd=tree, capture_output=True,
                       text=True, timeout=120)
    return r, time.monotonic() - t0


def one(tree, prof):
    r, _ = fab(tree, "deploy", "--profile", str(prof))
    if r.returncode != 0:
        raise SystemExit(f"deploy failed in {tree}:\n{r.stdout}\n{r.stderr}")
    r, wall = fab(tree, "stop", "--profile", str(prof))
    if r.returncode != 0:
        raise SystemExit(f"stop failed in {tree}:\n{r.stdout}\n{r.stderr}")
    m = STOPPED.search(r.stdout + r.stderr)
    return {"wall": wall, "host_s": float(m.group(3)) if m else None,
            "killed": int(m.group(2) or 0) if m else None}


def summary(label, rows):
    walls = [r["wall"] for r in rows]
    host = [r["host_s"] for r in rows if r["host_s"] is not None]
    killed = sum(1 for r in rows if r["killed"])
    under = sum(1 for r in rows if r["wall"] < 2.0)
    return (f"{label}: {len(rows)} stops, {under}/{len(rows)} under 2 s; wall median "
            f"{statistics.median(walls):.2f} s, max {max(walls):.2f} s; host-side median "
            f"{statistics.median(host):.2f} s, max {max(host):.2f} s; {killed} ended in SIGKILL")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--port", type=int, default=18731)
    ap.add_argument("--before-tree", default=None)
    opts = ap.parse_args()
    trees = [("this tree", str(REPO))] + ([("before", opts.before_tree)] if opts.before_tree else [])
    rows = {label: [] for label, _ in trees}
    with tempfile.TemporaryDirectory(prefix="llmfab-demo-stop-") as work:
        profiles = {}
        for i, (label, tree) in enumerate(trees):
            d = os.path.join(work, str(i))
            os.mkdir(d)
            profiles[label] = write_profile(tree, d, opts.port + i)
        for n in range(opts.runs):
            for label, tree in trees:
                row = one(tree, profiles[label])
                rows[label].append(row)
                print(f"{label} run {n + 1:2d}: stop {row['wall']:.2f} s wall, host {row['host_s']} s, "
                      f"SIGKILLed {row['killed']}", flush=True)
    for label, _ in trees:
        print(summary(label, rows[label]))
    return 0 if all(r["wall"] < 2.0 for r in rows["this tree"]) else 1


if __name__ == "__main__":
    sys.exit(main())
