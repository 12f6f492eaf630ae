"""Small typed readers for profile values; each failure is a ProfileError at the right file.

A `Checker` knows which file wrote each key (after `extends` merging), so an error
in a base profile points at the base profile, not at the file that extended it.
Key paths are tuples of str (table keys) and int (array indexes), shown as
`server.args.speculative-config` or `server.command[2]`.
"""
import datetime
import difflib
import json
import math
import re
from typing import NoReturn

from ..errors import ProfileError
from .toml_text import key as _toml_key

_NO_VALUE = object()
REQUIRED = _NO_VALUE  # pass as `default` to Checker.get for a key that must be present


def dotted(path):
    """`("server", "args", "a.b", 0)` -> `server.args."a.b"[0]`."""
    out = ""
    for p in path:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + _toml_key(p)
    return out


def describe(v):
    """What a value is, in the words of TOML, short enough for a one-line error."""
    if isinstance(v, bool):
        return f"boolean {'true' if v else 'false'}"
    if isinstance(v, int):
        return f"integer {v}"
    if isinstance(v, float):
        return f"float {v!r}"
    if isinstance(v, str):
        text = json.dumps(v, ensure_ascii=False)  # shows \u0000 and newlines visibly
        return "string " + (text if len(text) <= 60 else text[:57] + '..."')
    if isinstance(v, dict):
        return "a table"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return f"a date/time {v.isoformat()}"
    return type(v).__name__


class Checker:
    """Reads values out of the merged profile tree, raising ProfileError on anything off."""

    def __init__(self, top, origins, environ, need_secrets=True):
        self.top = top              # the file the user named: blamed when no better file is known
        self.origins = origins      # key path -> file that wrote it
        self.environ = environ
        self.need_secrets = need_secrets  # False: an unset secret is kept unread (load.py)

    def file_of(self, path):
        for n in range(len(path), 0, -1):
            found = self.origins.get(tuple(path[:n]))
            if found is not None:
                return found
        return self.top

    def fail(self, path, expected, got=_NO_VALUE, *, file=None) -> NoReturn:
        got = None if got is _NO_VALUE else describe(got)
        raise ProfileError(file or self.file_of(path), dotted(path), expected, got=got)

    def missing(self, path, expected) -> NoReturn:
        self.fail(path, f"required key is missing; expected {expected}", file=self.top)

    def table(self, value, path, known):
        """`value` must be a table whose keys are all in `known`."""
        if not isinstance(value, dict):
            self.fail(path, "a table", value)
        for k in value:
            if k not in known:
                near = difflib.get_close_matches(k, known, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                self.fail(path + (k,), f"unknown key{hint} (known keys here: {', '.join(known)})")
        return value

    def get(self, tbl, path, name, read, default=_NO_VALUE, expected="a value"):
        """`read(self, value, path)` on tbl[name]; absent -> default, or an error if required."""
        if name not in tbl:
            if default is _NO_VALUE:
                self.missing(path + (name,), expected)
            return default
        return read(self, tbl[name], path + (name,))

    def string(self, v, path, *, empty=False, what="a string"):
        if not isinstance(v, str):
            self.fail(path, what, v)
        if not v and not empty:
            self.fail(path, f"{what}, not empty")
        return v

    def integer(self, v, path, lo=None, hi=None):
        want = _range_text("an integer", lo, hi)
        # bool is an int subclass in Python, but `port = true` is a mistake, not 1.
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(path, want, v)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            self.fail(path, want, v)
        return v

    def positive(self, v, path):
        """A number of seconds > 0, returned as float."""
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            self.fail(path, "a number greater than 0", v)
        return float(v)

    def strings(self, v, path, *, nonempty=True, item=None):
        """An array of strings; `item(self, s, path)` checks each one further."""
        if not isinstance(v, list):
            self.fail(path, "an array of strings", v)
        if nonempty and not v:
            self.fail(path, "an array with at least one string")
        for i, s in enumerate(v):
            self.string(s, path + (i,), empty=True)  # callers refuse empty items where it matters
            if item:
                item(self, s, path + (i,))
        return tuple(v)

    def matches(self, v, path, pattern, what):
        self.string(v, path)
        if not re.fullmatch(pattern, v):
            self.fail(path, what, v)
        return v


def _range_text(what, lo, hi):
    if lo is not None and hi is not None:
        return f"{what} from {lo} to {hi}"
    if lo is not None:
        return f"{what} >= {lo}"
    return what


# Linux's execve(2) takes each argv or environment string up to MAX_ARG_STRLEN bytes, its
# terminating NUL included (32 pages of 4 KiB: include/uapi/linux/binfmts.h); a longer one
# fails the launch with E2BIG. A profile string becomes `--key=value` or `KEY=value` at most.
MAX_ARG_STRLEN = 131072


def no_nul_or_dates(ck, value, path=()):
    """NUL bytes cannot reach argv or environ, a string longer than execve takes cannot either,
    and TOML dates have no argv form: refuse all three, naming the key."""
    if isinstance(value, dict):
        for k, v in value.items():
            if "\0" in k:
                ck.fail(path + (k,), "a key without NUL bytes")
            no_nul_or_dates(ck, v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            no_nul_or_dates(ck, v, path + (i,))
    elif isinstance(value, str):
        if "\0" in value:
            ck.fail(path, "a string without NUL bytes", value)
        key = next((p for p in reversed(path) if isinstance(p, str)), "")
        size = len(value.encode("utf-8", "surrogatepass"))
        if len(key.encode("utf-8", "surrogatepass")) + size + 4 > MAX_ARG_STRLEN:
            ck.fail(path, f"a string that fits one command-line argument ({size} bytes here; "
                          f"Linux takes at most {MAX_ARG_STRLEN} per argument, key included)",
                    value)
    elif isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        ck.fail(path, "a string, number, boolean, array or table (TOML dates/times are not supported;"
                      " quote it as a string)", value)
