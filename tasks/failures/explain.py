"""Why a server failed and what to do: a failure rule's cause and fix, filled in.

`explain(scanner, readings)` turns what the log scanner found (tasks/failures/logscan.py) into
an `Explanation` {rule, line, cause, fix, lines}. The rule's templates (tasks/failures/rules/)
are filled from the matched line first, then from the values below, computed from the
profile and host readings (tasks/failures/template_values.py): e.g. the largest tensor-parallel size
that divides the heads, or the processes that hold the GPU, found as
`fab kill-gpu-procs --dry-run` finds them. A server that ended without a known line is
rule `exited`: the last exception of its traceback, else its exit status or signal.
"""
import signal
from dataclasses import dataclass, field
from typing import Callable, Optional

from .template_values import VALUES
from ..base.host.hosterrors import exit_words, signal_name
from .rules import BY_ID, EXITED


@dataclass
class Readings:
    """What is known besides the log; each reading is optional.

    `gpu_procs()`, `kernel_oom(pid)` and `packages(names)` are host calls, made only for the
    rules that need them (gpu-memory-taken; a SIGKILLed server; torch-package-mismatch)."""
    profile: object = None
    server: Optional[dict] = None                  # server.json: pid, pgid, release, port
    exit: Optional[dict] = None                    # exit.json: returncode, ended_at
    gpu_procs: Optional[Callable[[], dict]] = None
    kernel_oom: Optional[Callable[[int], Optional[str]]] = None
    packages: Optional[Callable[[list], dict]] = None  # names -> {name: {version, torch}}
    cache: dict = field(default_factory=dict)


@dataclass
class Explanation:
    rule: str
    line: Optional[str]
    cause: str
    fix: str
    lines: list = field(default_factory=list)      # the log lines that explain it
    source: Optional[str] = None                   # where the matched wording was read

    def as_json(self):
        return {"rule": self.rule, "line": self.line, "cause": self.cause, "fix": self.fix}

    def message(self):
        """`server failed: <cause>` then `fix: <fix>` (the reporter prefixes `error: `)."""
        return f"server failed: {self.cause}\nfix: {self.fix}"

    def source_text(self):
        """The rule that explained it and where its wording was read, for people."""
        return f"failure rule {self.rule}" + (f", worded as in {self.source}" if self.source else "")


class _Values(dict):
    """The matched groups; a missing name is computed once by VALUES, else '?'."""

    def __init__(self, groups, finding, readings):
        super().__init__(groups)
        self.finding, self.readings = finding, readings

    def __missing__(self, key):
        fn = VALUES.get(key)
        value = fn(self, self.readings) if fn else None
        value = "?" if value is None else value
        self[key] = value
        return value


def fill(template, values):
    try:
        return template.format_map(values)
    except (ValueError, IndexError, AttributeError) as e:  # a bad template must not hide the failure
        return f"{template} [{type(e).__name__}: {e}]"


def explain(scanner, readings=None):
    """The Explanation of a failed server from its scanned log and the readings."""
    readings = readings or Readings()
    finding = scanner.fatal
    if finding is None:
        values = _Values({}, None, readings)
        values["exception"] = scanner.last_exception()
        cause, fix = exit_cause(values, readings)
        return Explanation(EXITED.id, None, cause, fix, scanner.tail(20))
    rule = finding.rule
    values = _Values(dict(scanner.groups_for(rule), **finding.groups), finding, readings)
    values["inner"] = finding.inner or "no exception line came with it (see the lines below)"
    return Explanation(rule.id, finding.line.strip(), fill(rule.cause, values),
                       fill(finding.fix or rule.fix, values), scanner.explanation(), finding.source)


def exit_cause(values, readings):
    """(cause, fix) of a server that ended with no known line."""
    tail = values["fab_tail"]
    if values["exception"]:
        return values["exception"], f"read its traceback below; `{tail}` shows the whole log"
    code = (readings.exit or {}).get("returncode")
    if code is None:
        return ("the server is gone and left no exit status",
                f"read its last lines below; `{tail}` shows the whole log")
    if code < 0:
        name = _signal_name(-code)
        pid = (readings.server or {}).get("pid")
        oom = readings.kernel_oom(pid) if code == -signal.SIGKILL and readings.kernel_oom and pid else None
        if oom:
            return (f"killed by {name} from the kernel's OOM killer (the host ran out of RAM): {oom}",
                    "give the host more RAM or swap, or make the server hold less host memory "
                    "(e.g. a smaller `swap-space` / `cpu-offload-gb`, fewer API server processes)")
        return (f"{exit_words(code)} (no error line; not by llmfab)",
                "find who sent it: another user or tool, a cgroup/container memory limit, or the "
                "kernel's OOM killer (`dmesg` on the host); relaunch with `fab deploy`")
    if code == 0:
        return ("exited with status 0 before it was ready (an engine crash can exit 0)",
                f"read its last lines below; `{tail}` shows the whole log")
    return (f"{exit_words(code)} and no error line",
            f"read its last lines below; `{tail}` shows the whole log")


def _signal_name(num):
    return signal_name(num)


def rule_ids():
    return sorted(BY_ID)
