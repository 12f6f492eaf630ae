"""Turn benchmarks/run.py's measurements into Markdown; write them into RESULTS.md."""
import statistics

from measure import fmt_spread, md_table, ratio

BEGIN = "<!-- results:begin (written by benchmarks/run.py; edit outside these markers) -->"
END = "<!-- results:end -->"
POLL_S = 1.0

LABELS = {
    "ssh": "plain ssh one-liner (x.py pre-placed)",
    "ssh-kex": "plain ssh one-liner, `-o KexAlgorithms=curve25519-sha256`",
    "fabric": "minimal Fabric script",
    "llmfab": "**llmfab** `fab deploy --no-wait`",
    "ansible": "Ansible playbook (copy + shell)",
    "pyinfra": "pyinfra (files.put + server.shell)",
}


def _label(tool, n, before=None):
    if tool == "llmfab-before":
        return "llmfab before: `%s`" % (before or "?")
    if tool == "fabric" and n > 1:
        return "minimal Fabric ThreadingGroup"
    if tool == "ssh" and n > 1:
        return "plain ssh one-liner, one ssh per host in parallel"
    return LABELS[tool]


def _med(runs, key="wall"):
    return statistics.median(r[key] for r in runs) if runs else None


def _per_host(runs, key):
    """Median over runs of the mean over hosts of per_host[key]."""
    if not runs:
        return None
    return statistics.median(statistics.mean(h[key] for h in r["per_host"].values()) for r in runs)


def _total_cpu(runs):
    """Median over runs of client CPU + every host's CPU (None if not measured)."""
    try:
        return statistics.median(r["client_cpu"] + sum(h["host_cpu"] for h in r["per_host"].values())
                                 for r in runs)
    except (TypeError, statistics.StatisticsError):
        return None


def _num(v, digits=2):
    if v is None:
        return "n/a"
    return str(int(v)) if float(v).is_integer() else "%.*f" % (digits, v)


def launch_section(data):
    res, failed = data["launch"], data.get("launch_failed", {})
    rows, notes = [], []
    for (n, tool), runs in res.items():
        mine = _med(res.get((n, "llmfab"), []))
        if (n, tool) in failed and not runs:
            rows.append([n, _label(tool, n, data.get("before")), "failed: " + failed[(n, tool)][0].splitlines()[0][:80],
                         "", "", "", "", "", "", ""])
            continue
        if (n, tool) in failed:
            notes.append("%s on %d host(s) failed %d time(s) of %d; first error: %s" % (
                tool, n, len(failed[(n, tool)]), len(failed[(n, tool)]) + len(runs),
                " / ".join(l.strip() for l in failed[(n, tool)][0].splitlines() if "error" in l.lower())[:300]))
        rows.append([n, _label(tool, n, data.get("before")), fmt_spread([r["wall"] for r in runs]),
                     ratio(_med(runs), mine) if tool != "llmfab" else "1x",
                     _num(_per_host(runs, "connections")), _num(_per_host(runs, "commands")),
                     _num(_per_host(runs, "host_cpu")), _num(_med(runs, "client_cpu")),
                     _num(_total_cpu(runs)), _num(_total_cpu(runs) / data["env"]["cpus"])
                     if _total_cpu(runs) is not None else "n/a"])
    for tool in data.get("skipped_tools", []):
        rows.append(["1, 8", tool, "skipped: " + (data.get("tools_note") or "not installed"), "", "", "", "", "", "", ""])
    table = md_table(["hosts", "tool", "wall s: median (min-max)", "÷ llmfab", "SSH conns / host",
                      "remote cmds / host", "host CPU s / host", "client CPU s", "CPU s, all",
                      "CPU floor s (all / cores)"], rows)
    return table + "".join("\n\nFailure: " + n for n in notes)


def targets(data):
    rows = []
    res = data.get("launch", {})
    m = {k: _med(v) for k, v in res.items()}
    one = m.get((1, "llmfab"))

    def row(name, value, ok):
        rows.append([name, value, "n/a" if ok is None else ("**met**" if ok else "**missed**")])

    if one is not None:
        fab1 = m.get((1, "fabric"))
        row("1 host: llmfab <= 1.5x minimal Fabric", "%s vs %s s = %s" % (_num(one), _num(fab1), ratio(one, fab1)),
            None if fab1 is None else one <= 1.5 * fab1)
        for tool, factor in (("ansible", 4.0), ("pyinfra", 1.7)):
            other = m.get((1, tool))
            row("1 host: %s >= %.1fx llmfab" % (tool, factor),
                "%s vs %s s = %s" % (_num(other), _num(one), ratio(other, one)),
                None if other is None else other >= factor * one)
        for n, factor in ((8, 1.5), (16, 2.5)):
            mn = m.get((n, "llmfab"))
            ssh = (m.get((n, "ssh")), m.get((1, "ssh")))
            cpu = _total_cpu(res.get((n, "llmfab"), []))
            floor = " (plain ssh: %s; CPU floor of the %d lab hosts + client on %d cores: %s s)" % (
                ratio(*ssh), n, data["env"]["cpus"], _num(cpu / data["env"]["cpus"]) if cpu else "n/a")
            row("%d hosts: llmfab <= %.1fx its 1-host time" % (n, factor),
                "%s vs %s s = %s%s" % (_num(mn), _num(one), ratio(mn, one), floor),
                None if mn is None else mn <= factor * one)
        conns = [_per_host(v, "connections") for (n, t), v in res.items() if t == "llmfab" and v]
        row("one SSH connection per host per task", "llmfab: %s per host (1/8/16 hosts)" % " / ".join(map(_num, conns)),
            all(c == 1 for c in conns) if conns else None)
    trips = data.get("trips")
    if trips:
        per_tick = tick_commands(trips)
        row("at most one remote command per poll tick", "%s commands per tick" % _num(per_tick), per_tick <= 1)
    for key, what in (("ready", "ready -> verdict"), ("fatal", "fatal line -> exit")):
        runs = data.get(key)
        if runs:
            k = "verdict_s" if key == "ready" else "exit_s"
            v = statistics.median(r[k] for r in runs)
            row("%s median <= poll interval + 0.3 s" % what, "%.2f s (limit %.1f s)" % (v, POLL_S + 0.3),
                v <= POLL_S + 0.3)
    st = data.get("startup")
    if st:
        v = statistics.median(st["fab --list"])
        row("`fab --list` < 0.5 s", "%.2f s" % v, v < 0.5)
    return md_table(["target (issue 8, hosts with ~/.bashrc)", "measured (medians)", ""], rows)


def tick_commands(trips):
    """Remote commands per poll tick: a waiting deploy's sshd commands beyond a no-wait one's."""
    wait = trips["wait"]
    ticks = _ticks(ops_count(wait["trace"]))
    base = statistics.median(r["per_host"]["h1"]["commands"] for r in trips["no_wait"])
    return (wait["per_host"]["h1"]["commands"] - base) / max(ticks, 1)


def _ticks(ops):
    return ops.get("watch", 0) + ops.get("poll", 0)  # watch: event-driven (issue 16); poll: before


def ops_count(trace):
    out = {}
    for _, _, kind, name, _, _ in trace["events"]:
        if kind == "call":
            out[name] = out.get(name, 0) + 1
    return out


def trips_section(trips):
    from latency import median_phases
    rows = []
    for label, runs in (("deploy --no-wait", trips["no_wait"]), ("deploy (waits until ready)", [trips["wait"]])):
        r = runs[0]
        h = r["per_host"]["h1"]
        ops = ops_count(r["trace"])
        rows.append([label, h["connections"], "%d (%d exec + %d sftp)" % (h["commands"], h["exec"], h["subsystem"]),
                     sum(ops.values()), ", ".join("%s x%d" % (k, v) if v > 1 else k for k, v in ops.items())])
    ticks = _ticks(ops_count(trips["wait"]["trace"]))
    rows.append(["per wait tick (%d ticks above)" % ticks, 0, _num(tick_commands(trips)), 1, "watch"])
    table = md_table(["llmfab task (1 host)", "SSH connections", "remote commands (sshd)",
                      "agent requests", "requests by op"], rows)
    phase_rows = [[name, "%.3f" % s] for name, s in median_phases(trips["no_wait"])]
    phase_rows.append(["**total (traced process)**", "%.3f" % statistics.median(r["trace"]["total"] for r in trips["no_wait"])])
    return table, md_table(["phase of a 1-host `fab deploy --no-wait`", "s (median)"], phase_rows)


def verdict_section(data):
    rows = []
    for key, what in (("ready", "server ready (port open) -> `ready in` line"),
                      ("fatal", "fatal log line (CUDA OOM) -> `error: server failed` line")):
        runs = data.get(key) or []
        if runs:
            rows.append([what, len(runs), fmt_spread([r["verdict_s"] for r in runs]),
                         fmt_spread([r["exit_s"] for r in runs]), "<= %.1f" % (POLL_S + 0.3)])
    return md_table(["event (stand-in vLLM, poll interval 1.0 s)", "runs", "-> verdict line, s",
                     "-> process exit, s", "target (median), s"], rows)


def startup_section(data):
    rows = []
    own = data.get("own_imports", {})
    for label, samples in data["startup"].items():
        o = own.get(label)
        rows.append([label, fmt_spread(samples), "%.0f of %.0f" % o if o else ""])
    return md_table(["command", "wall s: median (min-max)", "import ms: llmfab's own (tasks.*) of all"], rows)


def render(data):
    env = data["env"]
    tv = data.get("tool_versions", {})
    loads = "; ".join("%s %.2f / %.2f / %.2f" % ((name,) + tuple(l)) for name, l in data["loads"])
    out = ["## Results", "",
           "Generated by `python benchmarks/run.py` on %s in %.0f s. Machine: %d cores (%s), "
           "Python %s, %s, Fabric %s, paramiko %s%s." % (
               data["when"], data["duration_s"], env["cpus"], env["cpu"], env["python"], env["ssh"],
               env["fabric"], env["paramiko"], "".join(", " + v for v in tv.values())),
           "Load average (1 / 5 / 15 min): %s." % loads,
           "Every figure is a whole process from spawn to exit, %d measured repetitions after one "
           "warm-up, the cases interleaved (tool order rotating), median (min-max)." % data["reps"], ""]
    import report16
    out += ["### Targets", "", report16.targets(data), "", targets(data), ""]
    if data.get("launch_nobashrc"):
        out += ["### 1-2. Launch a trivial server detached, hosts WITHOUT ~/.bashrc", "",
                launch_section(dict(data, launch=data["launch_nobashrc"], skipped_tools=[],
                                    launch_failed=data.get("launch_nobashrc_failed", {}))), ""]
    if "launch" in data:
        out += ["### 1-3. Launch a trivial server detached (2 KB launcher), hosts with ~/.bashrc", "",
                launch_section(data), ""]
    if data.get("verdict"):
        out += ["### 4. Verdict latency", "", report16.verdict_section(data), ""]
    if data.get("trips"):
        table, phases = trips_section(data["trips"])
        out += ["### 5. Round trips", "", table, "", phases, ""]
    if data.get("startup"):
        out += ["### 6. Start-up", "", startup_section(data), ""]
    if data.get("agent"):
        out += ["### 7. Agent start, cold and warm", "", report16.agent_section(data), ""]
    if data.get("waitcpu"):
        out += ["### 8. Host CPU while waiting", "", report16.waitcpu_section(data), ""]
    return "\n".join(out).rstrip() + "\n"


def write_into(path, text):
    """Replace what lies between the markers in `path` (create it with them if missing)."""
    block = BEGIN + "\n\n" + text + "\n" + END
    if path.exists() and BEGIN in path.read_text() and END in path.read_text():
        old = path.read_text()
        head, rest = old.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        path.write_text(head + block + tail)
    else:
        path.write_text("# llmfab benchmarks\n\nRun: `python benchmarks/run.py` (root; see its docstring).\n\n"
                        + block + "\n")
