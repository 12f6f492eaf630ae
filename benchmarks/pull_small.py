"""`fab pull` of many small files against `scp -r` to one lab host (issue 38's bar: within 3x).

    python benchmarks/run.py pull-small [--files 5000] [--reps 3] [--out F.json]   (as root)

One lab host (tests/hostlab.py: a real sshd), a source of N files of a few bytes each (half
of them in a subdirectory, as a tokenizer's or a sharded checkpoint's many small files would
be), and, side by side in one run (harness.side_by_side: interleaved, the order rotating,
after one warm-up), with the host's model directory removed before each run:
  scp    `scp -r` of the directory (one SSH session, OpenSSH's own protocol)
  pull   `fab pull -H h1` (listing with the hashes cached, plan, batches, manifest)
The pull's time is the whole task, SSH login and agent start included, as a user sees it.
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import fmt_spread, md_table, paired_ratios, side_by_side, spread  # noqa: E402
from hostlab import HostLab  # noqa: E402

MODEL = "/root/models/small-files"


def make_source(root, n):
    (root / "sub").mkdir(parents=True)
    for i in range(n):
        (root / ("sub" if i % 2 else "") / f"f{i:05d}.txt").write_text(f"file {i}\n")
    return root


def main(argv=None):
    ap = argparse.ArgumentParser(prog="run.py pull-small", description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    with HostLab(1) as hl:
        source = make_source(Path(hl.root) / "source" / "small-files", args.files)
        prof = Path(hl.root) / "pull-small.toml"
        prof.write_text("\n".join([
            "[target]", 'hosts = ["h1"]', 'name = "pull-small"',
            "[server]", 'engine = "vllm"', 'python = "/usr/bin/python3"', f'model = "{MODEL}"',
            "[weights]", f'"{MODEL}" = "local:{source}"']) + "\n")
        hl.exec("h1", ["mkdir", "-p", "/root/models"], check=True)

        def run_one(_key, tool):
            hl.exec("h1", ["rm", "-rf", MODEL], check=True)
            t0 = time.monotonic()
            if tool == "scp":
                p = subprocess.run(["scp", "-q", "-r", "-F", str(hl.ssh_config), str(source),
                                    f"h1:{MODEL}"], capture_output=True, text=True)
            else:
                p = hl.fab("-H", "h1", "pull", profile=prof, timeout=3600)
            wall = time.monotonic() - t0
            if p.returncode:
                raise RuntimeError(f"{tool} exited {p.returncode}: {p.stderr[-2000:]}")
            got = hl.exec("h1", ["find", MODEL, "-type", "f", "-name", "f*.txt"], check=True,
                          capture_output=True, text=True).stdout.split()
            if len(got) != args.files:
                raise RuntimeError(f"{tool}: {len(got)} files on the host, not {args.files}")
            return {"wall": wall}

        results, failed = side_by_side([("small", ["scp", "pull"])], args.reps, run_one,
                                       errors=(RuntimeError,))
        walls = {t: [r["wall"] for r in results[("small", t)]] for t in ("scp", "pull")}
        ratios = paired_ratios(results, ("small", "pull"), ("small", "scp"))
        print(md_table(["run", "seconds, median (min-max)"],
                       [[t, fmt_spread(walls[t])] for t in ("scp", "pull")]))
        med = spread(ratios)
        print(f"\n{args.files} files: pull / scp -r {fmt_spread(ratios)} (goal <= 3)")
        if args.out:
            Path(args.out).write_text(json.dumps({
                "files": args.files, "walls": walls, "ratios": ratios,
                "ratio_median": med and med[0], "failed": failed}, indent=1) + "\n")
        return 0 if med and med[0] <= 3 else 1


if __name__ == "__main__":
    sys.exit(main())
