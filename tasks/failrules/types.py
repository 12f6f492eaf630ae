"""The record types of the failure-rule table (tasks/failrules/): plain data, no I/O.

A `Rule` says what one kind of start-up failure looks like in a server log (its
`patterns`, each with the engine version and file it was copied from), which rule
wins when several lines match (`priority`), what it means (`cause`) and what to do
(`fix`). `cause` and `fix` are templates: `{name}` is filled from the matched line's
named groups, then from derived values (tasks/explain.py: profile, host and GPU
readings). Standard library only, Python 3.9+: the host side may read it too.
"""
import re
from dataclasses import dataclass, field
from typing import Optional, Tuple

# Where the cause of a wrapper line is: "" (none: the line is a root cause),
# "above" (logged before it, e.g. `Engine core initialization failed`), or
# "below" (the traceback that follows it, e.g. `EngineCore encountered a fatal error`).
ROOT, ABOVE, BELOW = "", "above", "below"


@dataclass(frozen=True)
class Pattern:
    regex: str                      # searched in each log line (engine prefixes stay on)
    source: str                     # engine + version(s) + file the wording was read in
    fix: Optional[str] = None       # this wording's own fix (e.g. SGLang's flag names)
    after: Optional[str] = None     # regex one of the 4 lines above must match (context)
    compiled: "re.Pattern" = field(init=False, repr=False, compare=False)
    needle: Optional[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "compiled", re.compile(self.regex))
        object.__setattr__(self, "needle", required_literal(self.regex))


def required_literal(regex):
    """The longest plain text every match of `regex` contains, or None (then the regex is
    always tried). A cheap `in` test on it spares the regex on nearly every healthy line.
    Only text outside groups and classes counts; a top-level `|` means no such text."""
    runs, run, depth, i = [], "", 0, 0
    while i < len(regex):
        c = regex[i]
        if c == "\\" and i + 1 < len(regex):
            nxt = regex[i + 1]
            i += 2
            if depth == 0 and not nxt.isalnum():
                run += nxt
                continue
            runs.append(run)
            run = ""
            continue
        i += 1
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif depth == 0 and c == "|":
            return None
        elif depth == 0 and c in "?*{":
            run = run[:-1]  # the char before is optional (or repeated: {m,n})
            if c == "{":
                i = regex.find("}", i) + 1 or len(regex)
        elif depth == 0 and c not in "+.^$":
            run += c
            continue
        runs.append(run)
        run = ""
    runs.append(run)
    best = max(runs, key=len)
    return best if len(best) >= 4 else None


@dataclass(frozen=True)
class Rule:
    id: str                         # stable, lowercase-dashed; never renamed once released
    title: str                      # a few words, for the reference table (docs/reference/failure-rules.md)
    priority: int                   # the highest matching rule explains the failure
    cause: str                      # template, plain words
    fix: str                        # template, an action with the numbers filled in
    patterns: Tuple[Pattern, ...] = ()
    wrapper: str = ROOT             # ROOT, ABOVE or BELOW (see above)

    def match(self, line, before=()):
        """(pattern, match) of the first pattern found in `line`, or None.

        `before`: the lines just above it (or a function giving them), for patterns that
        need context."""
        for p in self.patterns:
            if p.needle is not None and p.needle not in line:
                continue
            m = p.compiled.search(line)
            if m and p.after is not None:
                above = before() if callable(before) else before
                if not any(re.search(p.after, b) for b in above[-4:]):
                    continue
            if m:
                return p, m
        return None
