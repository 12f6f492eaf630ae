"""Turn the launch suite's measurements (benchmarks/suite.py) into Markdown; write them into RESULTS.md."""
import statistics

from harness import fmt_spread, md_table, median, ratio

BEGIN = "<!-- results:begin (written by benchmarks/run.py suite; edit outside these markers) -->"
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
    return median(r[key] for r in runs) if runs else None


def _per_host(runs, key):
    """Median over runs of the mean over hosts of per_host[key]."""
    if not runs:
        return None
    return median(statistics.mean(h[key] for h in r["per_host"].values()) for r in runs)


def _total_cpu(runs):
    """Median over runs of client CPU + every host's CPU (None if not measured)."""
    try:
        return median(r["client_cpu"] + sum(h["host_cpu"] for h in r["per_host"].values())
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
            v = median(r[k] for r in runs)
            row("%s median <= poll interval + 0.3 s" % what, "%.2f s (limit %.1f s)" % (v, POLL_S + 0.3),
                v <= POLL_S + 0.3)
    st = data.get("startup")
    if st:
        v = median(st["fab --list"])
        row("`fab --list` < 0.5 s", "%.2f s" % v, v < 0.5)
    return md_table(["target (issue 8, hosts with ~/.bashrc)", "measured (medians)", ""], rows)


def tick_commands(trips):
    """Remote commands per poll tick: a waiting deploy's sshd commands beyond a no-wait one's."""
    wait = trips["wait"]
    ticks = _ticks(ops_count(wait["trace"]))
    base = median(r["per_host"]["h1"]["commands"] for r in trips["no_wait"])
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
    phase_rows.append(["**total (traced process)**", "%.3f" % median(r["trace"]["total"] for r in trips["no_wait"])])
    return table, md_table(["phase of a 1-host `fab deploy --no-wait`", "s (median)"], phase_rows)


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
           "Generated by `python benchmarks/run.py suite` on %s in %.0f s. Machine: %d cores (%s), "
           "Python %s, %s, Fabric %s, paramiko %s%s." % (
               data["when"], data["duration_s"], env["cpus"], env["cpu"], env["python"], env["ssh"],
               env["fabric"], env["paramiko"], "".join(", " + v for v in tv.values())),
           "Load average (1 / 5 / 15 min): %s." % loads,
           "Every figure is a whole process from spawn to exit, %d measured repetitions after one "
           "warm-up, the cases interleaved (tool order rotating), median (min-max)." % data["reps"], ""]
    out += ["### Targets", "", targets_issue16(data), "", targets(data), ""]
    if data.get("launch_nobashrc"):
        out += ["### 1-2. Launch a trivial server detached, hosts WITHOUT ~/.bashrc", "",
                launch_section(dict(data, launch=data["launch_nobashrc"], skipped_tools=[],
                                    launch_failed=data.get("launch_nobashrc_failed", {}))), ""]
    if "launch" in data:
        out += ["### 1-3. Launch a trivial server detached (2 KB launcher), hosts with ~/.bashrc", "",
                launch_section(data), ""]
    if data.get("verdict"):
        out += ["### 4. Verdict latency", "", verdict_section(data), ""]
    if data.get("trips"):
        table, phases = trips_section(data["trips"])
        out += ["### 5. Round trips", "", table, "", phases, ""]
    if data.get("startup"):
        out += ["### 6. Start-up", "", startup_section(data), ""]
    if data.get("agent"):
        out += ["### 7. Agent start, cold and warm", "", agent_section(data), ""]
    if data.get("waitcpu"):
        out += ["### 8. Host CPU while waiting", "", waitcpu_section(data), ""]
    return "\n".join(out).rstrip() + "\n"


BAR_S = 0.35  # issue 16: event -> verdict line, seconds
CPU_PCT = 2.0  # issue 16: the agent's CPU while waiting, % of a core


def _n(v):
    return "n/a" if v is None else "%.2f" % v


def _before(data):
    return "llmfab before (`%s`)" % data.get("before", "?")[:40]


def targets_issue16(data):
    rows = []

    def row(name, value, ok):
        rows.append([name, value, "n/a" if ok is None else ("**met**" if ok else "**missed**")])

    verdict = data.get("verdict", {})
    for mode, key, what in (("fatal", "exit_s", "fatal line -> deploy exit"),
                            ("ready", "verdict_s", "ready -> verdict")):
        for poll in data.get("polls", ()):
            v = _med(verdict.get(("now", poll, mode)), key)
            row("%s median <= %.2f s, poll_interval %.1f" % (what, BAR_S, poll), "%s s" % _n(v),
                None if v is None else v <= BAR_S)
    for variant, label in (("launch_nobashrc", "hosts without ~/.bashrc"),
                           ("launch", "hosts with root's ~/.bashrc")):
        res = data.get(variant)
        if not res:
            continue
        for n, bar in ((1, 1.3), (8, 1.5), (16, None)):
            mine, fab = _med(res.get((n, "llmfab"))), _med(res.get((n, "fabric")))
            if mine is None:
                continue
            what = "1 host: `deploy --no-wait` vs minimal Fabric" if n == 1 else \
                "%d hosts: `deploy --no-wait` vs Fabric ThreadingGroup" % n
            ok = None if fab is None or bar is None or variant == "launch" and n == 1 else mine <= bar * fab
            row("%s (%s)%s" % (what, label, " <= %.1fx" % bar if ok is not None else ""),
                "%s vs %s s = %s" % (_n(mine), _n(fab), ratio(mine, fab)), ok)
    cpu = data.get("waitcpu", {}).get("now")
    if cpu:
        total = cpu["agent_pct"] + cpu["children_pct"]
        row("agent CPU while a server loads for %.0f s <= %.0f%% of a core" % (cpu["load_s"], CPU_PCT),
            "%.2f%% (agent %.2f%% + nvidia-smi %.2f%%; the session's sshd %.2f%% more)"
            % (total, cpu["agent_pct"], cpu["children_pct"], cpu["sshd_pct"]), total <= CPU_PCT)
    conns = [(v, n) for v in ("launch_nobashrc", "launch") for (n, t), runs in data.get(v, {}).items()
             if t == "llmfab" and runs]
    if conns:
        per = [(r["per_host"][h]["connections"], r["per_host"][h]["commands"])
               for v, n in conns for r in data[v][(n, "llmfab")] for h in r["per_host"]]
        row("one SSH connection and one remote command per task and host",
            "%d of %d host-runs had exactly 1 + 1" % (sum(p == (1, 1) for p in per), len(per)),
            all(p == (1, 1) for p in per))
    return md_table(["target (issue 16)", "measured (medians)", ""], rows)


def verdict_section(data):
    rows = []
    for (label, poll, mode), runs in sorted(data.get("verdict", {}).items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0] != "now")):
        what = "server ready (port open) -> `ready in` line" if mode == "ready" else \
            "fatal log line (CUDA OOM) -> `error: server failed` line"
        who = "**llmfab**" if label == "now" else _before(data)
        rows.append([what, "%.1f" % poll, who, len(runs), fmt_spread([r["verdict_s"] for r in runs]),
                     fmt_spread([r["exit_s"] for r in runs])])
    return md_table(["event (stand-in vLLM)", "poll_interval s", "llmfab", "runs", "-> verdict line, s",
                     "-> process exit, s"], rows)


def agent_section(data):
    rows = []
    for label, res in data["agent"].items():
        who = "**llmfab**" if label == "now" else _before(data)
        for kind in ("cold", "warm"):  # before: the sources are sent and compiled every time
            runs = res[kind]
            rows.append([who, kind, len(runs), fmt_spread([r[0] for r in runs]),
                         "%.3f" % median(r[1] for r in runs)])
    return md_table(["agent start over SSH (Host.start: remote shell, Python, code, hello)", "agent code on the host",
                     "runs", "wall s: median (min-max)", "host CPU s (median)"], rows)


def waitcpu_section(data):
    rows = []
    for label, r in data["waitcpu"].items():
        who = "**llmfab**" if label == "now" else _before(data)
        rows.append([who, "%.0f" % r["load_s"], "%.0f" % r["window_s"], "%.2f" % r["agent_pct"],
                     "%.2f" % r["children_pct"], "%.2f" % r["sshd_pct"],
                     "%.2f" % (r["agent_pct"] + r["children_pct"] + r["sshd_pct"])])
    return md_table(["deploy waiting (poll_interval 1.0 s)", "load s", "measured over s",
                     "agent % of a core", "its children (nvidia-smi) %", "sshd session %", "all %"], rows)


def write_into(path, text):
    """Replace what lies between the markers in `path` (create it with them if missing)."""
    block = BEGIN + "\n\n" + text + "\n" + END
    if path.exists() and BEGIN in path.read_text() and END in path.read_text():
        old = path.read_text()
        head, rest = old.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        path.write_text(head + block + tail)
    else:
        path.write_text("# llmfab benchmarks\n\nRun: `python benchmarks/run.py suite` (root; see benchmarks/suite.py).\n\n"
                        + block + "\n")
