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

    def __post_init__(self):
        object.__setattr__(self, "compiled", re.compile(self.regex))


@dataclass(frozen=True)
class Rule:
    id: str                         # stable, lowercase-dashed; never renamed once released
    title: str                      # a few words, for the README table
    priority: int                   # the highest matching rule explains the failure
    cause: str                      # template, plain words
    fix: str                        # template, an action with the numbers filled in
    patterns: Tuple[Pattern, ...] = ()
    wrapper: str = ROOT             # ROOT, ABOVE or BELOW (see above)

    def match(self, line, before=()):
        """(pattern, match) of the first pattern found in `line`, or None.

        `before`: the lines just above it, for patterns that need context."""
        for p in self.patterns:
            m = p.compiled.search(line)
            if m and (p.after is None or any(re.search(p.after, b) for b in before[-4:])):
                return p, m
        return None
