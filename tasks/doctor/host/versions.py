"""Engine versions and version ranges, as the doctor's rule table writes them.

A version is what package metadata says (`importlib.metadata.version("vllm")`): "0.20.1",
"0.22.0rc1", "0.21.1.dev12+gabc1234" (a nightly), "0.20.1+cu129" (a local build). Ordering
follows PEP 440 closely enough for the ranges used here: a dev or rc build of X sorts before
X, a post release after it, and a local tag (+...) is ignored. A nightly of 0.21.1 is thus
inside ">=0.21.0,<0.22.0": rules judge it like its release line, and the start-up log (see
spec_evidence.py) settles what the build really does.

A range is comma-separated clauses, all of which must hold: ">=0.20.0,<0.22.0". The empty
range matches every version, and an unknown version (None) matches only the empty range.
Standard library only; Python >= 3.9.
"""
import re

_VERSION = re.compile(r"^\s*v?(\d+(?:\.\d+)*)(?:[-_.]?(a|b|rc|c|alpha|beta|pre|preview)[-_.]?(\d*))?"
                      r"(?:[-_.]?(post|rev|r)[-_.]?(\d*))?(?:[-_.]?(dev)[-_.]?(\d*))?(?:\+.*)?\s*$",
                      re.IGNORECASE)
_PRE = {"a": 1, "alpha": 1, "b": 2, "beta": 2, "rc": 3, "c": 3, "pre": 3, "preview": 3}
_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(\S+)\s*$")


def parse(text):
    """A sortable key for a version string, or None when it is not a version."""
    if not isinstance(text, str):
        return None
    m = _VERSION.match(text)
    if m is None:
        return None
    release, pre, pre_n, post, post_n, dev, dev_n = m.groups()
    nums = [int(x) for x in release.split(".")]
    while len(nums) > 1 and nums[-1] == 0:  # 0.20 == 0.20.0
        nums.pop()
    # (stage, n): dev-only builds come before any pre-release, which come before the release.
    if pre:
        stage = (_PRE[pre.lower()], int(pre_n or 0))
    elif dev and not post:
        stage = (0, 0)
    else:
        stage = (4, 0)
    post_key = int(post_n or 0) + 1 if post else 0
    dev_key = int(dev_n or 0) if dev else float("inf")
    return (tuple(nums), stage, post_key, dev_key)


def _clauses(spec):
    out = []
    for part in (p for p in spec.split(",") if p.strip()):
        m = _CLAUSE.match(part)
        key = parse(m.group(2)) if m else None
        if key is None:
            raise ValueError("bad version range clause %r in %r (expected e.g. '>=0.20.0')" % (part, spec))
        out.append((m.group(1), key))
    return out


_OPS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, "==": lambda a, b: a == b,
        "!=": lambda a, b: a != b, ">": lambda a, b: a > b, "<": lambda a, b: a < b}


def in_range(version, spec):
    """Whether `version` (a string, or None when unknown) is inside the range `spec`."""
    clauses = _clauses(spec or "")
    if not clauses:
        return True
    key = parse(version)
    if key is None:
        return False
    return all(_OPS[op](key, bound) for op, bound in clauses)


def describe(spec):
    """The range in words for the docs and messages: ">=0.20.0,<0.22.0" -> "0.20.0 - <0.22.0"."""
    clauses = [p.strip() for p in (spec or "").split(",") if p.strip()]
    if not clauses:
        return "any version"
    lo = [c[2:] for c in clauses if c.startswith(">=")]
    hi = [c for c in clauses if c.startswith("<") and not c.startswith("<=")]
    if len(clauses) == 2 and lo and hi:
        return "%s to %s" % (lo[0], hi[0])
    return ", ".join(clauses)
