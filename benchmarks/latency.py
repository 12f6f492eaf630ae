"""Cases 4-6 of issue 8: verdict latency, round trips, start-up time (benchmarks/suite.py).

4. The stand-in vLLM (tests/standins) stamps time.time() into STANDIN_READY_FILE when
   its port opens, or into STANDIN_FATAL_FILE when it prints its fatal line. `fab deploy`
   runs at the default poll interval (1.0 s); its output lines are time-stamped as they
   arrive. verdict = the "ready in" / "error: server failed" line; exit = process exit.
   STANDIN_LOAD_SECONDS is drawn at random per run, so the event falls anywhere within a
   poll interval.
5. benchmarks/fab_traced.py counts llmfab's transport in-process (connections, remote
   commands, agent requests by op), and sshd's log counts what reached the host.
6. Whole-process wall time of `fab --list` and `fab deploy --dry-run`, beside the floor:
   the interpreter alone and `import fabric` (which `fab` itself does before anything).
"""
import json
import os
import subprocess
import time

from harness import HERE, PY, READY_PORT, REPO, LineClock, RunFailed, median

FATAL_NEEDLE = "error: server failed"
READY_NEEDLE = " ready in "


def standin_profile(bench, name, mode, load_seconds, poll_interval=1.0, timeout=60):
    lab = bench.lab
    env = ['STANDIN_LOAD_SECONDS = "%s"' % load_seconds, 'STANDIN_GPU_MIB = "256"']
    if mode == "fatal":
        env += ['STANDIN_FAIL = "oom"', 'STANDIN_FATAL_FILE = "/tmp/llmfab-bench-stamp"']
    else:
        env += ['STANDIN_READY_FILE = "/tmp/llmfab-bench-stamp"']
    return bench._write_profile(name, [
        "[target]", 'name = "%s"' % name.split(".")[0],
        "[server]", 'engine = "vllm"', 'python = "%s"' % lab.ml_python,
        'model = "%s"' % lab.model_dir("m"), "port = %d" % READY_PORT,
        "[server.args]", 'served-model-name = "m"', "[server.env]", *env,
        "[ready]", "timeout = %d" % timeout, "poll_interval = %s" % poll_interval])


def fab_argv(bench, *args):
    return [PY, "-m", "fabric", "-S", bench.cfg, "-H", "h1", *args]


def verdict_case(bench, mode, reps, warmup=1, log=print, poll_interval=1.0, tree=None):
    """[{"load_s", "verdict_s", "exit_s"}] for mode "ready" or "fatal" on h1.

    tree: another llmfab checkout to run `fab` from (the before/after comparison)."""
    lab, out = bench.lab, []
    stamp = lab.tmp("h1") / "llmfab-bench-stamp"
    for rep in range(-warmup, reps):
        # The event falls anywhere within a poll period (and one more second of loading).
        span = max(poll_interval, 1.0)
        load = round(bench.rng.uniform(1.0, 1.0 + span) if mode == "ready" else
                     bench.rng.uniform(1.5, 1.5 + span), 3)
        prof = standin_profile(bench, "%s.toml" % mode, mode, load, poll_interval)
        stamp.unlink(missing_ok=True)
        clock = LineClock(fab_argv(bench, "deploy", "--profile", prof), cwd=tree)
        code, exited = clock.wait()
        want = 0 if mode == "ready" else 1
        verdict = clock.first(READY_NEEDLE if mode == "ready" else FATAL_NEEDLE)
        if code != want or verdict is None or not stamp.exists():
            raise RunFailed("%s deploy: exit %s (wanted %d), verdict line %s, stamp %s:\n%s" % (
                mode, code, want, verdict, stamp.exists(), "\n".join(l for _, l in clock.lines)[-2000:]))
        t = float(stamp.read_text())
        rec = {"load_s": load, "verdict_s": verdict - t, "exit_s": exited - t}
        if mode == "ready":
            subprocess.run(fab_argv(bench, "stop", "--grace", "5", "--profile", prof), cwd=str(tree or REPO),
                           capture_output=True, timeout=120)
        if rep >= 0:
            out.append(rec)
        log("  rep %2d  %-5s poll %.1f %s load %.2f s: verdict +%.3f s, exit +%.3f s%s" % (
            rep, mode, poll_interval, "before" if tree else "now", load, rec["verdict_s"], rec["exit_s"], "  (warm-up)" if rep < 0 else ""))
    return out


def traced(bench, args, hosts, expect_launch=True):
    """One fab_traced.py run: bench.timed()'s record plus "trace" (the in-process events)."""
    path = bench.work / "trace.json"
    path.unlink(missing_ok=True)
    env = dict(os.environ, LLMFAB_BENCH_TRACE=str(path))
    run = bench.timed([PY, HERE / "fab_traced.py", "-S", bench.cfg, "-H", ",".join(hosts), *args],
                      hosts, env=env, expect_launch=expect_launch)
    run["trace"] = json.loads(path.read_text())
    return run


def round_trips(bench, reps=5, log=print):
    """Traced no-wait deploys (reps, for a phase breakdown) and one deploy that waits."""
    no_wait = []
    for rep in range(-1, reps):
        run = traced(bench, ["deploy", "--no-wait", "--profile", bench.launch_profile], ["h1"])
        if rep >= 0:
            no_wait.append(run)
        log("  traced deploy --no-wait: %.2f s" % run["wall"])
    prof = standin_profile(bench, "ticks.toml", "ready", 3.0)
    wait = traced(bench, ["deploy", "--profile", prof], ["h1"], expect_launch=False)
    subprocess.run(fab_argv(bench, "stop", "--grace", "5", "--profile", prof), cwd=str(REPO),
                   capture_output=True, timeout=120)
    log("  traced deploy (waits for ready): %.2f s" % wait["wall"])
    return {"no_wait": no_wait, "wait": wait}


def phases(trace):
    """[(phase, seconds)] of one traced 1-host --no-wait deploy, in order."""
    ev = trace["events"]
    first = lambda kind, pred: next(e for e in ev if e[2] == kind and pred(e[3]))  # noqa: E731
    connect, start = first("connect", lambda n: True), first("start", lambda n: True)
    hello_end = start[0] + start[1]  # start() returns with the agent's hello record
    preflight = first("call", lambda n: n == "preflight")
    release = first("call", lambda n: n == "new_release")
    launch = first("call", lambda n: "launch" in n.replace("(", "+").replace(")", "+").split("+"))
    end = lambda e: e[0] + e[1]  # noqa: E731
    return [
        ("python start-up, imports, profile, fan-out (client)", connect[0]),
        ("SSH connection (paramiko: TCP, kex, auth)", connect[1]),
        ("agent start: exec through the remote shell, python, agent code (hello)",
         hello_end - end(connect)),
        ("lock + state (one request), preflight (agent ops)", end(preflight) - hello_end),
        ("new release holding its files (one request)", end(release) - end(preflight)),
        ("gpu_baseline + launch (one request)", end(launch) - end(release)),
        ("summary, close, exit", trace["total"] - end(launch)),
    ]


def median_phases(runs):
    rows = [phases(r["trace"]) for r in runs]
    return [(rows[0][i][0], median(r[i][1] for r in rows)) for i in range(len(rows[0]))]


# -- case 6 ------------------------------------------------------------------------------
STARTUP = [
    ("python -c pass (the interpreter alone)", [PY, "-c", "pass"]),
    ("python -c 'import fabric' (what `fab` imports first)", [PY, "-c", "import fabric"]),
    ("fab --list", [PY, "-m", "fabric", "--list"]),
    ("fab deploy --dry-run (configs/demo.toml)",
     [PY, "-m", "fabric", "deploy", "--dry-run", "--profile", "configs/demo.toml"]),
]


def startup(reps=10, warmup=1):
    """{label: [wall s]} interleaved."""
    out = {label: [] for label, _ in STARTUP}
    for rep in range(-warmup, reps):
        for label, argv in STARTUP:
            t0 = time.perf_counter()
            subprocess.run([str(a) for a in argv], cwd=str(REPO), capture_output=True, check=True)
            if rep >= 0:
                out[label].append(time.perf_counter() - t0)
    return out


def own_import_ms(argv):
    """(ms in llmfab's own modules `tasks.*`, ms of all imports) from one -X importtime run."""
    r = subprocess.run([PY, "-X", "importtime"] + [str(a) for a in argv[1:]], cwd=str(REPO),
                       capture_output=True, text=True)
    own = total = 0
    for line in r.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _, name = line[len("import time:"):].split("|")
        total += int(self_us)
        if name.strip() == "tasks" or name.strip().startswith("tasks."):
            own += int(self_us)
    return own / 1000, total / 1000
