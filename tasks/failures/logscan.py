"""The client's log scanner: tasks/failures/host/logscan.py's LogScanner over the failure-rule
table (tasks/failures/rules/), and the fatal-line test `fab tail-log` highlights with.

The deploy's wait feeds it the lines the host agent read once and sent (tasks/steps/wait.py);
the supervisor runs the same scanner on the host over the same table as data. Client-side
scanning stays because the verdict needs what only this side has: the explanation's lines,
the rule's cause and fix templates filled from the profile and GPU readings
(tasks/failures/explain.py).
"""
from .host.logscan import Exc, Finding, LogScanner as _HostScanner, strip_prefix
from .rules import RULES

__all__ = ["Exc", "Finding", "LogScanner", "RULES", "is_fatal_line", "strip_prefix"]


class LogScanner(_HostScanner):
    def __init__(self, window=400):
        super().__init__(RULES, window)


def is_fatal_line(line):
    """Whether a line matches any failure rule (for highlighting; no context checks)."""
    return any(r.match(line) for r in RULES if r.patterns)
