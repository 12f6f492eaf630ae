"""Output: every human line carries its host; JSON Lines go to stdout alone.

Human text goes to stdout, or to stderr when --json is given. A progress line
updates in place on a terminal when one host is involved, else it is printed as a
plain line whenever its phase changes (and at most every `PLAIN_EVERY_S`).

A finding (a doctor's rule, the live verdict's likely cause, why a server failed) is a
`Block`: a headline, then its fix and source on indented lines, every line wrapped to the
terminal's width (80 when the output is not a terminal), so no 400-character line runs off
the screen. textwrap does it: a table or progress library would add a dependency for this
one need, and `--json` carries the same fields unwrapped.

Text a server wrote (its log lines, its /v1/models ids, a flag its error named) reaches the
terminal only through here, and only as `terminal_text` makes it: control characters (ESC of
colours, window titles, OSC 52 clipboard writes and hyperlinks; CR, NUL, DEL, the C1 range,
bidirectional overrides) are written as `\\x1b`-style escapes, and a line longer than
`MAX_LINE_CHARS` is cut, saying how much was left out. `--json` escapes them as JSON does
(plus DEL and C1, which JSON leaves raw); `fab tail-log --raw` is the one way to get a
server's bytes as they are. Our own colours follow NO_COLOR (no-color.org: set and not
empty) and our cursor control (the progress line updated in place) TERM=dumb.
"""
import json
import os
import re
import sys
import textwrap
import threading
import time
from typing import NamedTuple, Tuple

from .interrupts import leave

PLAIN_EVERY_S = 15.0
NOT_A_TERMINAL_COLUMNS = 80
MIN_COLUMNS = 40  # narrower than this, wrapping helps no one: lines are cut at 40 anyway
MAX_LINE_CHARS = 4096  # a human line longer than this is cut (a 200,000-byte log line)

# Characters never written to a terminal as they are: C0 but tab and newline, DEL, C1 (U+0080..
# U+009F: a terminal may read U+009B as CSI), the line/paragraph separators, bidirectional
# overrides and isolates (text that displays in another order than it reads), and the lone
# surrogates a surrogateescape decode leaves.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029"
                     "\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029]")  # what json.dumps leaves raw


def _escape(m):
    c = m.group(0)
    o = ord(c)
    return "\\x%02x" % o if o < 0x100 else "\\u%04x" % o


def terminal_text(text, limit=MAX_LINE_CHARS):
    """`text` (one line) as a terminal may show it: control characters escaped, at most
    `limit` characters kept (None: all), the rest said in words."""
    text = _UNSAFE.sub(_escape, str(text))
    if limit is not None and len(text) > limit:
        text = f"{text[:limit]} [... {len(text) - limit} more characters cut; " \
               "`fab tail-log --raw` shows the line whole]"
    return text


def terminal_lines(text):
    """Several lines (a message holding newlines), each made safe by terminal_text."""
    return "\n".join(terminal_text(line) for line in _lines(str(text)))


def json_text(obj):
    """One JSON document on one line: JSON escapes C0 itself; DEL, C1 and the separators too."""
    return _JSON_UNSAFE.sub(lambda m: "\\u%04x" % ord(m.group(0)), json.dumps(obj, ensure_ascii=False))


def colors(stream):
    """Whether our own colours may be written to `stream`: a terminal, NO_COLOR unset or
    empty, TERM not dumb."""
    return (_isatty(stream) and not os.environ.get("NO_COLOR")
            and os.environ.get("TERM") != "dumb")


def cursor_control(stream):
    """Whether a line may be redrawn in place (CR, erase-line) on `stream`: a terminal whose
    TERM is not dumb."""
    return _isatty(stream) and os.environ.get("TERM") != "dumb"


def _isatty(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def write_text(stream, text):
    """Write our own text (a note, a document we made) to `stream` and flush; a reader gone
    (`| head`) ends the output quietly. Lines a server wrote go through Reporter.line."""
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


class Block(NamedTuple):
    """A headline, then each (label, text) of `notes` on its own line (`label: text`), all
    `hang` columns in from the headline; lines start `indent` columns in."""
    headline: str
    notes: Tuple[Tuple[str, str], ...] = ()
    indent: int = 0
    hang: int = 2


def indented(line, n):
    """A line (str or Block) `n` columns further in."""
    if isinstance(line, Block):
        return line._replace(indent=line.indent + n)
    return " " * n + line


def wrap_block(block, width):
    """The lines of `block`, each at most `width` columns unless one word is longer (paths,
    URLs and flags are never split: a reader copies them). A headline's further lines and the
    notes sit `hang` columns in; a note's further lines sit under its text."""
    def wrap(text, first, rest):
        return textwrap.wrap(text, max(width, MIN_COLUMNS), initial_indent=first,
                             subsequent_indent=rest, break_long_words=False,
                             break_on_hyphens=False) or [first.rstrip()]
    lead, inner = " " * block.indent, " " * (block.indent + block.hang)
    out = wrap(block.headline, lead, inner)
    for label, text in block.notes:
        if text:
            first = f"{inner}{label}: "
            out += wrap(str(text), first, " " * len(first))
    return out


def columns(stream):
    """The width to wrap to: $COLUMNS if set, else the terminal's, else 80 (not a terminal).
    shutil.get_terminal_size does the same for stdout only; human text may go to stderr."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        pass
    return NOT_A_TERMINAL_COLUMNS


def processes(n):
    """'1 process', '3 processes': a count in words, never a parenthesised plural."""
    return f"{n} process" if n == 1 else f"{n} processes"


def quiet_on_closed_pipe():
    """A closed stdout (`fab --list | head -1`) ends the program quietly: Invoke's own printing
    (--list, --help) raises BrokenPipeError outside any task, and this hook ends the process
    without a traceback, with the status a Unix tool killed by SIGPIPE has (128 + 13)."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        if not issubclass(kind, BrokenPipeError):
            return previous(kind, value, tb)
        leave(128 + 13)
    sys.excepthook = hook


class Reporter:
    def __init__(self, hosts=(), json_mode=False, stream=None):
        self.json_mode = json_mode
        self.stream = stream or (sys.stderr if json_mode else sys.stdout)
        self.width = max([len(h) for h in hosts] + [1])
        self.inplace = len(hosts) <= 1 and cursor_control(self.stream)
        self.color = colors(self.stream)
        self.columns = columns(self.stream)
        self._lock = threading.Lock()
        self._progress_shown = False
        self._last_plain = {}
        self._json_hosts = set()  # hosts whose --json object is out (tasks/fleet/fanout.py)

    def _write(self, stream, text):
        """Write and flush; once the reader has gone (a pipe into `head`), the rest of the
        output goes nowhere and the task goes on: a change in flight on a host is finished,
        not cut off by a closed pipe. The exit status stays the task's."""
        write_text(stream, text)  # the interpreter's last flush finds the devnull too

    def _prefix(self, host):
        return f"[{host}] " if host else ""

    def _clear_progress(self):
        if self._progress_shown:
            self._write(self.stream, "\r\x1b[2K")
            self._progress_shown = False

    def line(self, host, text="", *, raw=False, color=None):
        """One line (several if `text` holds newlines), or a Block wrapped to the terminal.
        Every part is made safe for a terminal (terminal_text) unless `raw`; `color` (an SGR
        code such as "31") is added around it where colours may be written."""
        prefix = self._prefix(host)
        if isinstance(text, Block):
            text = text._replace(headline=terminal_text(text.headline),
                                 notes=tuple((label, terminal_text(t) if t else t)
                                             for label, t in text.notes))
            parts = wrap_block(text, self.columns - len(prefix))
        else:
            parts = str(text).split("\n") if raw else \
                [terminal_text(p) for p in (_lines(str(text)) or [""])]
        if color and self.color:
            parts = [f"\x1b[{color}m{p}\x1b[0m" for p in parts]
        with self._lock:
            self._clear_progress()
            self._write(self.stream, "".join(f"{prefix}{part}\n" for part in parts))

    def lines(self, host, lines):
        for text in lines:
            self.line(host, text)

    def progress(self, host, phase, text):
        with self._lock:
            if self.inplace:
                self._write(self.stream, f"\r\x1b[2K{self._prefix(host)}{terminal_text(text, None)[:self.columns]}")
                self._progress_shown = True
                return
            last = self._last_plain.get(host)
            now = time.monotonic()
            if last is None or last[0] != phase or now - last[1] >= PLAIN_EVERY_S:
                self._last_plain[host] = (phase, now)
                self._write(self.stream, f"{self._prefix(host)}{terminal_text(text)}\n")

    def emitted(self, host):
        """Whether `host`'s --json object was printed."""
        return host in self._json_hosts

    def emit_json(self, obj):
        with self._lock:
            if isinstance(obj, dict) and "host" in obj:
                self._json_hosts.add(obj["host"])
            self._clear_progress()
            self._write(sys.stdout, json_text(obj) + "\n")

    def table(self, headers, rows):
        """A plain aligned table (no host prefix): the run's summary."""
        with self._lock:
            self._clear_progress()
            self._write(self.stream, "".join(line + "\n" for line in table_lines(headers, rows)))


def table_lines(headers, rows):
    """A plain aligned table as lines: a header, then a line per row, columns two spaces
    apart, no trailing blanks. Every table llmfab prints is drawn here."""
    lines = [[terminal_text(c) for c in headers]] + [[terminal_text(c) for c in r] for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]


def _lines(text):
    """`text` split at newlines only: str.splitlines would also split at CR, VT, FF and the
    separators, hiding the CR that rewrites a line, which terminal_text shows instead."""
    parts = text.split("\n")
    return parts[:-1] if parts and parts[-1] == "" else parts


def fab_hint(profile, task):
    """The exact `fab TASK` for this profile (a bare `fab stop` would use the default one)."""
    import shlex
    return f"fab {task} --profile {shlex.quote(str(profile.path))}"


def report_error(reporter, name, error):
    """Print an error once, with its detail lines (a task may report early, then clean up).
    A failed server's error is its cause, then the fix and the rule's source on indented
    lines wrapped to the terminal (Block above), then the log lines verbatim."""
    if getattr(error, "reported", False):
        return
    ex = getattr(error, "explanation", None)
    if ex is not None:
        reporter.line(name, Block(f"error: server failed: {ex.cause}",
                                  (("fix", ex.fix), ("source", ex.source_text()))))
    else:
        reporter.line(name, f"error: {error.message}")
    reporter.lines(name, [indented(d, 2) for d in error.details])
    error.reported = True
