"""Write plain data back out as TOML text: the subset a profile can hold.

The standard library reads TOML (tomllib) but cannot write it, and a whole
writer library would be a dependency for ~80 lines. Supported values: str,
int, float (inf and nan too), bool, lists and dicts of those. Dates are not:
the profile loader refuses them before anything is written.

The output is deterministic (keys in insertion order) because its sha256 is the
profile digest, and `tomllib.loads(dumps(d)) == d` holds for every supported `d`.
"""
import math
import re

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def dumps(data):
    """Serialise a dict as a TOML document: scalars first, then one `[header]` per sub-table."""
    lines: list = []
    _table(data, (), lines)
    return "\n".join(lines).strip("\n") + "\n"


def quote_string(s):
    """A TOML basic string. Control characters (and DEL) must be escaped to be valid TOML."""
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch < " " or ch == "\x7f":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def key(k):
    """A key, bare when TOML allows it, else quoted."""
    return k if _BARE_KEY.match(k) else quote_string(k)


def value(v):
    """One value in inline form (tables inside arrays become inline tables)."""
    if isinstance(v, bool):  # before int: bool is an int subclass
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)  # repr round-trips exactly and is always a valid TOML float
    if isinstance(v, str):
        return quote_string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, dict):
        if not v:
            return "{}"
        return "{ " + ", ".join(f"{key(k)} = {value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def _table(data, path, lines):
    items = list(data.items())
    # `[header]` tables can only come after a table's plain values, which would reorder keys
    # (and key order is argv order for [server.args]): a table followed by a plain value is
    # therefore written inline, in place.
    last_plain = max((i for i, (_, v) in enumerate(items) if not isinstance(v, dict)), default=-1)
    scalars = items[:last_plain + 1]
    subtables = items[last_plain + 1:]
    # A header is needed for a table with its own values, or an empty one (else it would vanish).
    if path and (scalars or not subtables):
        lines.append("")
        lines.append("[" + ".".join(key(p) for p in path) + "]")
    for k, v in scalars:
        lines.append(f"{key(k)} = {value(v)}")
    for k, v in subtables:
        _table(v, path + (k,), lines)
