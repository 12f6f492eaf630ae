"""Reading a server log as it grows: the failure rule it shows, the lines that explain
it, the last exception. (The start-up phase is tasks/startup/host/phases.py's.)

Pure: fed text chunks (or lines, as a consumer of tasks/base/host/startlog.py), keeps a bounded
window of recent lines. Host code, so that one implementation decides for the client's verdict
(tasks/failures/logscan.py, the table's Rule records) and for the supervisor's restart record
(tasks/supervise/host/hangwatch.py, the same table as data). What counts as fatal
is the failure-rule table (tasks/failures/rules/) it is given; this module only decides WHICH
matching line explains the failure: the highest-priority root cause seen so far, never a wrapper
(`Engine core initialization failed`, `EngineDeadError`) while a known line explains it.
A wrapper whose cause follows it (`EngineCore encountered a fatal error`, then its
traceback) waits for that traceback's exception line, or one more chunk.
"""
import re
from collections import deque
from typing import NamedTuple, Optional

from .records import ABOVE, ROOT, Rule

ENGINE_PREFIX = re.compile(r"^\((?:EngineCore|Worker)[^)]*\)")
# What engines put before a message: vLLM's "(EngineCore_DP0 pid=7) ERROR 11-30 04:27:01
# [core.py:708] ", SGLang's "[2026-02-25 16:33:59 TP0] ", a docker-compose "name  | ".
LINE_PREFIX = re.compile(
    r"^(?:[\w.-]+\s+\| )?(?:\([\w:.\- ]+ pid=\d+\) ?)?(?:\[\d{4}-\d\d-\d\d [^\]]*\] )?"
    r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?)?")
PROCESS = re.compile(r"^(?:[\w.-]+\s+\| )?(\([\w:.\- ]+ pid=\d+\))")
EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Failure))"
                       r"(?::\s?(?P<message>.*))?$")


class Finding(NamedTuple):
    """The line that explains a failure. (line, reason) first, as callers index it."""
    line: str
    reason: str                   # the rule's title
    rule: Rule
    groups: dict                  # the pattern's named groups that matched
    fix: Optional[str] = None     # the matched wording's own fix template, if any
    inner: Optional[str] = None   # a wrapper's cause: the exception line it points at
    source: Optional[str] = None  # where the matched wording was read (engine, version, file)


class Exc(NamedTuple):
    type: str
    message: str
    number: int                   # its line number in the log (from 0)


def strip_prefix(line):
    return LINE_PREFIX.sub("", line, count=1)


class LogScanner:
    def __init__(self, rules, window=400):
        """`rules`: the failure-rule table's Rules, highest priority first."""
        self.rules = rules
        self.recent = deque(maxlen=window)
        self.fatal = None            # the Finding, once decided (it never changes after)
        self.lines_seen = 0
        self.matches = []            # (line number, rule, pattern, match), in log order
        self.exceptions = deque(maxlen=64)   # exception lines that ended a traceback
        self._in_tb = {}             # process prefix -> inside a traceback
        self._open = 0               # how many of them are (lines outside any skip the tracking)
        self._want_message = None    # an exception line whose message is on the next line
        self._pending = 0            # chunks seen since a BELOW wrapper with no exception yet

    # -- feeding -------------------------------------------------------------------------
    def feed(self, text, final=False):
        """Add complete lines; returns the Finding once one explains the failure, else None.

        `final`: the server is gone, no more lines will come: decide with what there is."""
        return self.feed_lines(text.splitlines(), final)

    def feed_lines(self, lines, final=False):
        for line in lines:
            n = self.lines_seen
            self.lines_seen += 1
            self.recent.append((n, line))
            if self._open or self._want_message or "Traceback" in line:
                self._track_exception(n, line)
            for rule in self.rules:  # highest priority first; needles spare most regexes
                hit = rule.match(line, self._before)
                if hit:
                    self.matches.append((n, rule, hit[0], hit[1]))
                    break
        if self.fatal is None:
            self.fatal = self._decide(final)
        return self.fatal

    def _before(self):
        """The lines above the newest one (for patterns that need context)."""
        k = len(self.recent) - 1
        return [self.recent[i][1] for i in range(max(0, k - 4), k)]

    def _track_exception(self, n, line):
        proc = PROCESS.match(line)
        key = proc.group(1) if proc else ""
        body = strip_prefix(line)
        if self._want_message is not None:
            if body.strip():
                typ, _, at = self._want_message
                self.exceptions.append(Exc(typ, body.strip(), at))
                self._want_message = None
            return
        if body.startswith("Traceback (most recent call last):"):
            self._open += not self._in_tb.get(key)
            self._in_tb[key] = True
            return
        if not self._in_tb.get(key) or body[:1].isspace() or not body:
            return
        self._in_tb[key] = False
        self._open -= 1
        m = EXCEPTION.match(body)
        if m:
            if (m.group("message") or "").strip():
                self.exceptions.append(Exc(m.group("type"), m.group("message").strip(), n))
            else:  # e.g. CPython's spawn RuntimeError: the text starts on the next line
                self._want_message = (m.group("type"), None, n)

    # -- deciding ------------------------------------------------------------------------
    def _finding(self, n, rule, pattern, m, inner=None):
        line = m.string  # the whole line the pattern was searched in
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        return Finding(line, rule.title, rule, groups, pattern.fix, inner, pattern.source)

    def _decide(self, final):
        if not self.matches:
            return None
        roots = [x for x in self.matches if x[1].wrapper == ROOT]
        if roots:
            best = max(roots, key=lambda x: (x[1].priority, -x[0]))
            return self._finding(*best)
        above = [x for x in self.matches if x[1].wrapper == ABOVE]
        if above:
            n = above[0][0]
            inner = [e for e in self.exceptions if e.number < n]
            return self._finding(*above[0], inner=_exc_text(inner[-1]) if inner else None)
        n = self.matches[0][0]  # a BELOW wrapper: its cause is the traceback after it
        after = [e for e in self.exceptions if e.number > n and "EngineDeadError" not in e.type]
        if not (self._open or self._want_message):
            self._pending += 1  # chunks with no traceback still open after the wrapper
        if after or final or self._pending >= 2:
            return self._finding(*self.matches[0], inner=_exc_text(after[0]) if after else None)
        return None

    # -- reading -------------------------------------------------------------------------
    def groups_for(self, rule):
        """The named groups of every line that matched `rule`, the first line's first:
        a failure's figures may be spread over several lines (huggingface_hub's URL,
        transformers' repo id)."""
        out = {}
        for _, r, _, m in self.matches:
            if r is rule:
                for k, v in m.groupdict().items():
                    if v is not None:
                        out.setdefault(k, v)
        return out

    def last_exception(self):
        """'Type: message' of the last exception that ended a traceback, or None."""
        return _exc_text(self.exceptions[-1]) if self.exceptions else None

    def explanation(self, context=12):
        """The lines that explain the failure, in log order: the traceback around the
        chosen line (from its `Traceback` header), the engine's error lines, and the tail."""
        recent = list(self.recent)
        if self.fatal is None:
            return [l for _, l in recent[-context:]]
        at = next((k for k, (_, l) in enumerate(recent) if l is self.fatal.line or l == self.fatal.line), None)
        keep = set(range(max(0, len(recent) - context), len(recent)))
        if at is not None:
            start = max(0, at - 8)
            for k in range(at, max(-1, at - 40), -1):
                if "Traceback (most recent call last)" in recent[k][1]:
                    start = k
                    break
            keep |= set(range(start, min(len(recent), at + 7)))
        engine = [k for k, (_, l) in enumerate(recent) if ENGINE_PREFIX.match(l) and
                  re.search(r"ERROR|Error|error|Traceback|raise|File \"", l)]
        keep |= set(engine[-20:])
        return [recent[k][1] for k in sorted(keep)]

    def tail(self, n=20):
        return [l for _, l in self.recent][-n:]


def _exc_text(exc):
    return f"{exc.type}: {exc.message}"
