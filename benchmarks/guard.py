"""The speed guard: `fab deploy --no-wait` against a minimal Fabric script, side by side in one run.

    python benchmarks/run.py guard [--reps 7] [--before-tree DIR]     # as root: it starts the lab

On 8 lab hosts (tests/hostlab.py: a namespace and a real sshd each) without ~/.bashrc, so that
each tool's own cost shows rather than the `pyenv init` every remote command pays here, every
repetition launches the 2 KB tiny server (benchmarks/tiny_server.py) on 1 host and then on 8,
with `fab deploy --no-wait` and with benchmarks/baseline_fabric.py (a Connection on 1 host, a
ThreadingGroup on 8), interleaved, the order rotating, after one warm-up. The bar is on the
ratio of the two medians; each repetition's own ratio (the two runs beside each other, so a
load swing between repetitions cancels) gives its spread. --before-tree DIR runs `fab deploy
--no-wait` from that checkout too, in the same rotation (e.g. main before a change).

It also prints the agent's code as it travels (files, bytes, the bootstrap's length) and its
start over SSH to one host, cold (no cached copy on the host) and warm. Prints Markdown;
exits 0 when every bar holds, 1 when one is missed.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import agentcases
import harness
import launch
from harness import fmt_spread, md_table, paired_ratios, spread

BARS = {1: 2.0, 8: 2.5}  # llmfab's median / Fabric's median, by number of hosts (issue 32)


def parse(argv):
    p = argparse.ArgumentParser(prog="run.py guard", description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=7, help="measured repetitions (default 7)")
    p.add_argument("--before-tree", metavar="DIR", help="also `fab deploy --no-wait` from this checkout")
    return p.parse_args(argv)


def shipped(tree):
    """What the agent's code weighs in `tree`: {"files", "bytes", "bootstrap_bytes"}."""
    code = ("import json\nfrom tasks.transport import agent_code as c\np = c.payload()\n"
            "print(json.dumps({'files': len(p.files), 'bytes': sum(len(d) for _, d in p.files),"
            " 'bootstrap_bytes': len(c.bootstrap())}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=str(tree), capture_output=True, text=True)
    return json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr.strip()[-300:]}


def commit(tree):
    """The last commit of the tree's tasks/ (what runs), '+' if tasks/ has uncommitted edits."""
    git = ["git", "-C", str(tree)]
    last = subprocess.run(git + ["log", "-1", "--format=%h", "--", "tasks"], capture_output=True, text=True)
    dirty = subprocess.run(git + ["status", "--porcelain", "--", "tasks"], capture_output=True, text=True)
    return (last.stdout.strip() + ("+" if dirty.stdout.strip() else "")) if last.returncode == 0 \
        else os.path.basename(os.path.abspath(tree))


def walls(runs):
    return [r["wall"] for r in runs]


def judge(results):
    """{n: (Fabric's spread, llmfab's spread, ratio of the medians or None, met)}."""
    out = {}
    for n, bar in BARS.items():
        fab, llm = spread(walls(results[(n, "fabric")])), spread(walls(results[(n, "llmfab")]))
        r = llm[0] / fab[0] if fab and llm else None
        out[n] = (fab, llm, r, r is not None and r <= bar)
    return out


def render(data):
    res = data["results"]
    out = ["Speed guard, %s: llmfab's tasks/ at `%s`; %d measured repetitions after a warm-up, hosts without "
           "~/.bashrc; load average (1 min) %.2f at the start, %.2f at the end; %.0f s in all." % (
               data["when"], data["commit"], data["reps"], data["load"][0], data["load"][1],
               data["duration_s"]), ""]
    rows = []
    for n, (fab, llm, r, met) in judge(res).items():
        rows.append([n, fmt_spread(walls(res[(n, "fabric")])), fmt_spread(walls(res[(n, "llmfab")])),
                     "%.2fx" % r if r else "n/a",
                     fmt_spread(paired_ratios(res, (n, "llmfab"), (n, "fabric")), unit="x"),
                     "<= %.1fx" % BARS[n], "**met**" if met else "**missed**"])
        if data.get("before"):
            old = spread(walls(res[(n, "llmfab-before")]))
            rows.append([n, "", "before, `%s`: %s" % (data["before"][:24], fmt_spread(walls(res[(n, "llmfab-before")]))),
                         "%.2fx" % (old[0] / fab[0]) if old and fab else "n/a",
                         fmt_spread(paired_ratios(res, (n, "llmfab-before"), (n, "fabric")), unit="x"), "", ""])
    out.append(md_table(["hosts", "Fabric s: median (min-max)", "llmfab s: median (min-max)",
                         "llmfab / Fabric (medians)", "per repetition: median (min-max)", "bar", ""], rows))
    cpu = [h["host_cpu"] for r in res[(1, "llmfab")] for h in r["per_host"].values()]
    failed = ", ".join("%s on %d host(s): %d" % (t, n, len(e)) for (n, t), e in data["failed"].items())
    out += ["", "llmfab's host CPU per 1-host deploy (cgroup): %s s. Failed runs: %s." % (
        fmt_spread(cpu, 3), failed or "none")]
    for label, info in data["shipped"].items():
        agent = data["agent"].get(label, {})
        out.append("Agent code (%s): %s files, %.1f KB, bootstrap %s bytes; agent start over SSH, "
                   "cold %s s, warm %s s." % (
                       label, info.get("files", "?"), info.get("bytes", 0) / 1024, info.get("bootstrap_bytes", "?"),
                       fmt_spread([x[0] for x in agent.get("cold", [])], 3),
                       fmt_spread([x[0] for x in agent.get("warm", [])], 3)))
    return "\n".join(out)


def main(argv=None):
    args = parse(argv)
    started, load0 = time.time(), os.getloadavg()[0]
    trees = [("now", harness.REPO)]
    if args.before_tree:
        trees.append(("before", os.path.abspath(args.before_tree)))
    harness.compile_trees([t for _, t in trees])
    tools = ["fabric", "llmfab"] + (["llmfab-before"] if args.before_tree else [])
    from hostlab import HostLab
    with HostLab(max(BARS)) as lab:
        bench = harness.Bench(lab, lab.root / "bench")
        bench.before_tree = trees[-1][1] if args.before_tree else None
        bench.bashrc(False)
        try:
            results, failed = launch.launch_case(bench, [(n, tools) for n in sorted(BARS)], args.reps,
                                                 log=harness.log)
        finally:
            bench.bashrc(True)
        agent = agentcases.agent_start_case(bench, min(args.reps, 5), trees, log=harness.log)
    bench.cpu.remove_all()
    data = {"reps": args.reps, "results": results, "failed": failed, "agent": agent,
            "shipped": {label: shipped(tree) for label, tree in trees},
            "commit": commit(harness.REPO), "before": commit(args.before_tree) if args.before_tree else None,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
            "load": (load0, os.getloadavg()[0]), "duration_s": time.time() - started}
    print(render(data))
    return 0 if all(met for *_, met in judge(results).values()) else 1
