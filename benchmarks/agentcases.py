"""Cases 7-8 of the benchmarks (issue 16): the host agent's start and its CPU while waiting.

7. Agent start, cold (no copy of the agent's code on the host) and warm, over SSH to
   one lab host: benchmarks/agentstart.py, per llmfab checkout (this one and
   --before-tree's, which sends and compiles its sources on every start).
8. Host CPU while `fab deploy` waits for a stand-in vLLM that loads for LOAD_S seconds
   (poll interval 1.0 s): the agent process's own CPU (utime + stime from /proc), the
   CPU of what it ran and waited for (nvidia-smi: cutime + cstime), and the SSH
   session's sshd (it encrypts every answer), sampled over the middle of the wait.
"""
import os
import subprocess
import time

from harness import HERE, HOST_PY, PY, LineClock, RunFailed, median
from hostlab import wait_for
from latency import fab_argv, standin_profile

LOAD_S = float(os.environ.get("LLMFAB_BENCH_LOAD_S", "60"))  # the bar: 60 s
CLK_TCK = os.sysconf("SC_CLK_TCK")


def agent_start_case(bench, reps, trees, log=print):
    """{label: {"cold": [[wall, host_cpu]], "warm": [...]}} for each (label, tree)."""
    import json
    lab, out = bench.lab, {}
    acct = str(bench.cpu.path("h1") / "cpuacct.usage") if bench.cpu.ok else "-"
    for label, tree in trees:
        r = subprocess.run([PY, HERE / "agentstart.py", tree, bench.cfg, "h1",
                            lab.home("h1"), acct, str(reps), HOST_PY],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RunFailed("agentstart.py (%s) exited %d: %s" % (label, r.returncode, r.stderr[-2000:]))
        out[label] = json.loads(r.stdout.strip().splitlines()[-1])
        log("  agent start %-7s cold %s warm %s" % (label, _med(out[label]["cold"]), _med(out[label]["warm"])))
    return out


def _med(rows):
    return "%.3f s" % median(r[0] for r in rows) if rows else "n/a"


def _ticks(pid, children=False):
    from hostlab import proc_stat
    fields = proc_stat(pid)[1]
    own = int(fields[11]) + int(fields[12])
    return (own, int(fields[13]) + int(fields[14])) if children else own


def _agent_pid(lab, host):
    """The agent: the process under the host's ssh sessions that runs the bootstrap."""
    from hostlab import _descendants, _proc_table
    table = _proc_table()
    for pid in _descendants(lab.sshd_pid(host), table):
        try:
            argv = open("/proc/%d/cmdline" % pid, "rb").read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 2 and argv[1] == b"-c" and b"llmfab_host" in argv[2]:
            return pid
    return None


def wait_cpu_case(bench, trees, load_s=LOAD_S, log=print):
    """{label: {"agent_pct", "children_pct", "sshd_pct", "window_s", "load_s"}} per tree."""
    lab, out = bench.lab, {}
    for label, tree in trees:
        prof = standin_profile(bench, "slow.toml", "ready", load_s, 1.0, timeout=int(load_s) + 120)
        clock = LineClock(fab_argv(bench, "deploy", "--profile", prof), cwd=tree)
        try:
            pid = wait_for(lambda: _agent_pid(lab, "h1"), 30, "the agent to start")
            deadline = time.monotonic() + 5  # past the launch: only the wait is measured
            wait_for(lambda: time.monotonic() >= deadline or clock.proc.poll() is not None, 10,
                     "the wait to begin")
            sshd = lab.session_sshd_pids("h1")
            a0, s0, t0 = _ticks(pid, True), sum(_ticks(p) for p in sshd), time.monotonic()
            end = t0 + load_s - 15
            wait_for(lambda: time.monotonic() >= end or clock.proc.poll() is not None, load_s,
                     "the middle of the wait")
            if clock.proc.poll() is not None:
                raise RunFailed("deploy ended before the server loaded:\n%s" %
                                "\n".join(l for _, l in clock.lines)[-2000:])
            a1, s1, t1 = _ticks(pid, True), sum(_ticks(p) for p in sshd), time.monotonic()
        finally:
            code, _ = clock.wait(timeout=load_s + 120)
            subprocess.run(fab_argv(bench, "stop", "--grace", "5", "--profile", prof),
                           cwd=str(tree), capture_output=True, timeout=120)
        window = t1 - t0
        pct = lambda ticks: round(100.0 * ticks / CLK_TCK / window, 2)  # noqa: E731
        out[label] = {"agent_pct": pct(a1[0] - a0[0]), "children_pct": pct(a1[1] - a0[1]),
                      "sshd_pct": pct(s1 - s0), "window_s": round(window, 1), "load_s": load_s,
                      "deploy_exit": code}
        log("  wait CPU %-7s %s" % (label, out[label]))
    return out
