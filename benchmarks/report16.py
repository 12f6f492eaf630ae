"""Markdown for issue 16's cases (benchmarks/run.py): its bar, verdict latency at two poll
intervals, launch on hosts without ~/.bashrc, agent start cold/warm, CPU while waiting."""
import statistics

from measure import fmt_spread, md_table, ratio

BAR_S = 0.35
CPU_PCT = 2.0


def _med(runs, key="wall"):
    return statistics.median(r[key] for r in runs) if runs else None


def _n(v):
    return "n/a" if v is None else "%.2f" % v


def _before(data):
    return "llmfab before (`%s`)" % data.get("before", "?")[:40]


def targets(data):
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
                         "%.3f" % statistics.median(r[1] for r in runs)])
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
