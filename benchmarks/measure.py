"""Pure helpers of benchmarks/run.py: sshd log counting, statistics, Markdown tables.

Kept apart from the script (which needs root and the SSH lab) so they can be unit
tested quickly: tests/unit/test_benchmarks_measure.py.
"""
import statistics

# sshd at LogLevel VERBOSE (the lab's) logs one "Accepted publickey" per authenticated
# connection and one "Starting session:" per channel that runs something: "command"
# (exec: everything is run through the user's shell, which sources ~/.bashrc), "subsystem
# 'sftp'" (also started through the shell) or "shell" (an interactive login).
ACCEPTED = "Accepted publickey for "
STARTING = "Starting session: "


def count_sshd(text):
    """{"connections", "commands", "exec", "subsystem", "shell"} counted in sshd log text.

    "commands" is every session that made sshd start a program through the user's shell:
    exec requests, subsystems (sftp) and shells.
    """
    counts = {"connections": 0, "exec": 0, "subsystem": 0, "shell": 0}
    for line in text.splitlines():
        if line.startswith(ACCEPTED):
            counts["connections"] += 1
            continue
        at = line.find(STARTING)
        if at < 0:
            continue
        kind = line[at + len(STARTING):].split(" ", 1)[0]
        if kind == "command":
            counts["exec"] += 1
        elif kind in ("subsystem", "shell"):
            counts[kind] += 1
    counts["commands"] = counts["exec"] + counts["subsystem"] + counts["shell"]
    return counts


def spread(samples):
    """(median, min, max) of a non-empty list of numbers."""
    return statistics.median(samples), min(samples), max(samples)


def fmt_s(value):
    return "%.2f" % value if value is not None else "n/a"


def fmt_spread(samples):
    """'median (min-max)' in seconds, or 'n/a' for no samples."""
    if not samples:
        return "n/a"
    med, lo, hi = spread(samples)
    return "%.2f (%.2f-%.2f)" % (med, lo, hi)


def ratio(a, b):
    """a / b as '1.23x', or 'n/a' when either is missing."""
    if a is None or b is None or b == 0:
        return "n/a"
    return "%.2fx" % (a / b)


def md_table(headers, rows):
    """A GitHub Markdown table; cells are str()-ed and '|' escaped."""
    def cell(v):
        return str(v).replace("|", "\\|")
    out = ["| " + " | ".join(cell(h) for h in headers) + " |",
           "| " + " | ".join("---" for _ in headers) + " |"]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(out)
