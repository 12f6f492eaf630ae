"""The launch suite (issues 8, 16): `python benchmarks/run.py suite` (as root: it starts the SSH lab).

Stands up tests/hostlab.py namespace hosts (real sshd each), then runs every case side
by side, interleaved, several repetitions after a warm-up:

1-2. launch a trivial server (benchmarks/tiny_server.py) detached on 1, 8 and 16 hosts:
     llmfab's `fab deploy --no-wait` vs the plain ssh one-liner (baseline_ssh.sh) vs a
     minimal Fabric script / ThreadingGroup (baseline_fabric.py), on hosts without a
     ~/.bashrc first, then with root's (whose `pyenv init` every remote command pays);
3.   the same with Ansible (ansible-core) and pyinfra on 1 and 8 hosts, from a throwaway
     venv (--tools-venv; created if missing; a row says so if it cannot be installed);
4.   readiness latency (ready -> verdict) and failure latency (fatal line -> exit), at
     poll_interval 1.0 and 5.0;
5.   round trips per deploy and per poll tick (sshd's log and fab_traced.py);
6.   `fab --list` and `fab deploy --dry-run` start-up time;
7.   the host agent's start over SSH, cold (no cached code on the host) and warm;
8.   the host's CPU while deploy waits for a server that loads for 60 s.
--before-tree DIR runs cases 1-2, 4, 7 and 8 with that checkout's llmfab too.

Prints the tables (Markdown) and writes them into benchmarks/RESULTS.md between the
`results:begin`/`results:end` markers; text outside the markers is kept.

Options: --reps N (default 7), --quick (3 repetitions, at most 8 hosts),
--cases launch,verdict,trips,startup,agent,waitcpu (default all), --no-tools (skip Ansible and
pyinfra), --out PATH, --no-write.
"""
import argparse
import os
import platform
import subprocess
import time
from pathlib import Path

import agentcases
import harness
import latency
import launch
import report
import thirdparty
from harness import HERE, log
from hostlab import HostLab

DEFAULT_TOOLS_VENV = "/var/tmp/llmfab-bench-tools"
ALL_CASES = ("launch", "verdict", "trips", "startup", "agent", "waitcpu")
POLLS = (1.0, 5.0)


def parse(argv):
    p = argparse.ArgumentParser(prog="run.py suite", description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=7, help="measured repetitions per case (default 7)")
    p.add_argument("--quick", action="store_true", help="3 repetitions, at most 8 hosts")
    p.add_argument("--cases", default=",".join(ALL_CASES), help="comma-separated subset of %s" % (ALL_CASES,))
    p.add_argument("--no-tools", action="store_true", help="skip Ansible and pyinfra")
    p.add_argument("--tools-venv", default=DEFAULT_TOOLS_VENV,
                   help="throwaway venv for ansible-core and pyinfra (default %s)" % DEFAULT_TOOLS_VENV)
    p.add_argument("--before-tree", metavar="DIR",
                   help="also run llmfab from this checkout (e.g. `git worktree add DIR COMMIT`), "
                        "side by side with this one, on 1 and 8 hosts")
    p.add_argument("--out", default=str(HERE / "RESULTS.md"))
    p.add_argument("--no-write", action="store_true", help="print only")
    args = p.parse_args(argv)
    args.cases = [c for c in args.cases.split(",") if c]
    unknown = set(args.cases) - set(ALL_CASES)
    if unknown:
        p.error("unknown case(s) %s" % ", ".join(sorted(unknown)))
    if args.quick:
        args.reps = min(args.reps, 3)
    return args


def environment():
    ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    import fabric
    import paramiko
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(), "ssh": ssh,
            "fabric": fabric.__version__, "paramiko": paramiko.__version__}


def main(argv=None):
    args = parse(argv)
    started = time.time()
    harness.compile_trees([harness.REPO] + ([args.before_tree] if args.before_tree else []))
    loads = [("start", os.getloadavg())]
    bins, tools_note = {}, None
    if "launch" in args.cases and not args.no_tools:
        log("tools: ansible-core and pyinfra in %s" % args.tools_venv)
        bins, tools_note = thirdparty.ensure_venv(args.tools_venv)
        if tools_note:
            log("  " + tools_note)
    tools = [t for t in ("ansible", "pyinfra") if bins.get(t)]
    counts = (1, 8) if args.quick else (1, 8, 16)
    data = {"env": environment(), "reps": args.reps, "tools_note": tools_note,
            "tool_versions": thirdparty.versions(bins) if bins else {},
            "skipped_tools": [] if args.no_tools else [t for t in ("ansible", "pyinfra") if t not in tools]}
    t0 = time.monotonic()
    with HostLab(max(counts)) as lab:
        log("lab: %d hosts in %.1f s (slot %d)" % (len(lab.hosts), time.monotonic() - t0, lab.slot))
        bench = harness.Bench(lab, lab.root / "bench")
        ws = thirdparty.Workspace(lab.root / "tools", lab.ssh_config, lab.known_hosts, lab.hosts)
        before, trees = [], [("now", harness.REPO)]
        if args.before_tree:
            bench.before_tree = Path(args.before_tree).resolve()
            before, trees = ["llmfab-before"], trees + [("before", bench.before_tree)]
            data["before"] = subprocess.run(["git", "-C", str(bench.before_tree), "log", "-1", "--format=%h %s"],
                                            capture_output=True, text=True).stdout.strip()[:90] \
                or bench.before_tree.name
        if "launch" in args.cases:
            log("case 1-2: launch on hosts WITHOUT ~/.bashrc (%d reps after a warm-up)" % args.reps)
            bench.bashrc(False)
            try:
                plan = [(n, ["ssh", "fabric", "llmfab"] + (before if n < 16 else [])) for n in counts]
                data["launch_nobashrc"], data["launch_nobashrc_failed"] = launch.launch_case(
                    bench, plan, args.reps, log=log)
            finally:
                bench.bashrc(True)
            plan = [(1, ["ssh", "ssh-kex", "fabric", "llmfab"] + before + tools),
                    (8, ["ssh", "fabric", "llmfab"] + before + tools)]
            if 16 in counts:
                plan.append((16, ["ssh", "fabric", "llmfab"]))
            log("case 1-3: launch (%d reps after a warm-up)" % args.reps)
            data["launch"], data["launch_failed"] = launch.launch_case(
                bench, plan, args.reps, tools_ws=ws, bins=bins, log=log)
            loads.append(("after launch", os.getloadavg()))
        if "verdict" in args.cases:
            log("case 4: ready -> verdict, fatal -> exit, poll_interval %s" % (POLLS,))
            data["polls"], data["verdict"] = POLLS, {}
            for poll in POLLS:
                for label, tree in trees:
                    for mode in ("ready", "fatal"):
                        data["verdict"][(label, poll, mode)] = latency.verdict_case(
                            bench, mode, args.reps, log=log, poll_interval=poll,
                            tree=tree if label == "before" else None)
            data["ready"], data["fatal"] = data["verdict"][("now", 1.0, "ready")], data["verdict"][("now", 1.0, "fatal")]
            loads.append(("after verdict", os.getloadavg()))
        if "agent" in args.cases:
            log("case 7: agent start, cold and warm")
            data["agent"] = agentcases.agent_start_case(bench, args.reps, trees, log=log)
        if "waitcpu" in args.cases:
            log("case 8: host CPU while waiting for a %.0f s load" % agentcases.LOAD_S)
            data["waitcpu"] = agentcases.wait_cpu_case(bench, trees, log=log)
        if "trips" in args.cases:
            log("case 5: round trips")
            data["trips"] = latency.round_trips(bench, reps=min(args.reps, 5), log=log)
    bench.cpu.remove_all()  # the lab's processes are gone: its groups are empty now
    if "startup" in args.cases:
        log("case 6: start-up")
        data["startup"] = latency.startup(reps=max(args.reps, 10))
        data["own_imports"] = {label: latency.own_import_ms(argv) for label, argv in latency.STARTUP[2:]}
    loads.append(("end", os.getloadavg()))
    data["loads"] = loads
    data["duration_s"] = time.time() - started
    data["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))
    text = report.render(data)
    print(text)
    if not args.no_write:
        report.write_into(Path(args.out), text)
        log("wrote %s" % args.out)
    return 0
