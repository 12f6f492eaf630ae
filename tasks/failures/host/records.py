"""The record types of the failure-rule table (tasks/failures/rules/): plain data, no I/O.

A `Rule` says what one kind of start-up failure looks like in a server log (its
`patterns`, each with the engine version and file it was copied from), which rule
wins when several lines match (`priority`), what it means (`cause`) and what to do
(`fix`). `cause` and `fix` are templates: `{name}` is filled from the matched line's
named groups, then from derived values (tasks/failures/explain.py: profile, host and GPU
readings). Host code (standard library only, Python 3.9+): the failure-rule table's records on
the client, and what the supervisor makes of the table it gets as data (`from_data`).
"""
import re
from dataclasses import dataclass, field
from typing import Optional, Tuple

try:  # the parser `re` itself uses: re._parser from 3.11, sre_parse before
    from re import _parser as _sre
except ImportError:  # pragma: no cover - Python 3.9 and 3.10
    try:
        import sre_parse as _sre
    except ImportError:
        _sre = None  # then every pattern is simply always tried

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
        compiled = re.compile(self.regex)
        object.__setattr__(self, "compiled", compiled)
        object.__setattr__(self, "needle", required_literal(self.regex))

    def matches(self, line, before=()):
        """The match of this wording in `line`, or None. `before`: the lines just above it
        (or a function giving them), for a pattern that needs context (`after`)."""
        if self.needle is not None and self.needle not in line:
            return None
        m = self.compiled.search(line)
        if m is not None and self.after is not None:
            above = before() if callable(before) else before
            if not any(re.search(self.after, b) for b in above[-4:]):
                return None
        return m


# Flags under which the text of a regex is not the text it matches: IGNORECASE ((?i): any
# case matches, so a case-sensitive `in` test would skip real lines) and VERBOSE ((?x):
# the spaces written are not matched).
NO_LITERAL_FLAGS = re.IGNORECASE | re.VERBOSE


def required_literal(regex, flags=0):
    """The longest plain text every match of `regex` contains (4 characters or more), or
    None: then the regex is always tried. A cheap `in` test on it spares the regex on nearly
    every healthy line. The text is read from the regex as Python's own parser sees it, so
    escapes (`\\.`, `\\x41`), classes and flags mean what they mean to `re`: only a run of
    literal characters at the top level counts (not inside a capturing group, class, repeat
    or alternative), and none at all under NO_LITERAL_FLAGS (given, or inline as `(?i)`)."""
    if _sre is None:
        return None
    tree = _sre.parse(regex, flags)
    if tree.state.flags & NO_LITERAL_FLAGS:
        return None
    runs, run = [], ""
    for op, arg in tree:  # `a|b` parses to one BRANCH item (after any common prefix)
        if op is _sre.LITERAL:
            run += chr(arg)
        else:
            runs.append(run)
            run = ""
    best = max(runs + [run], key=len)
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
        """(pattern, match) of the first pattern found in `line`, or None (Pattern.matches)."""
        for p in self.patterns:
            m = p.matches(line, before)
            if m:
                return p, m
        return None


def from_data(table):
    """Rules from the table as data ([{id, priority, wrapper, patterns: [{regex, after}]}], the
    supervisor's supervise_rules.json, tasks/release/launcher.py), highest priority first. A
    pattern this Python cannot compile (syntax newer than the host's) is left out, not fatal."""
    out = []
    for r in table:
        pats = []
        for p in r.get("patterns", ()):
            try:
                if p.get("after"):
                    re.compile(p["after"])
                pats.append(Pattern(p["regex"], "", after=p.get("after")))
            except re.error:
                continue
        if pats:
            out.append(Rule(r["id"], r["id"], r.get("priority", 0), "", "", tuple(pats),
                            r.get("wrapper", ROOT)))
    return sorted(out, key=lambda r: -r.priority)
