"""Output: every human line carries its host; JSON Lines go to stdout alone.

Human text goes to stdout, or to stderr when --json is given. A progress line
updates in place on a terminal when one host is involved, else it is printed as a
plain line whenever its phase changes (and at most every `PLAIN_EVERY_S`).

A finding (a doctor's rule, the live verdict's likely cause, why a server failed) is a
`Block`: a headline, then its fix and source on indented lines, every line wrapped to the
terminal's width (80 when the output is not a terminal), so no 400-character line runs off
the screen. textwrap does it: a table or progress library would add a dependency for this
one need, and `--json` carries the same fields unwrapped.
"""
import json
import os
import sys
import textwrap
import threading
import time
from typing import NamedTuple, Tuple

PLAIN_EVERY_S = 15.0
NOT_A_TERMINAL_COLUMNS = 80
MIN_COLUMNS = 40  # narrower than this, wrapping helps no one: lines are cut at 40 anyway


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
        os._exit(128 + 13)
    sys.excepthook = hook


class Reporter:
    def __init__(self, hosts=(), json_mode=False, stream=None):
        self.json_mode = json_mode
        self.stream = stream or (sys.stderr if json_mode else sys.stdout)
        self.width = max([len(h) for h in hosts] + [1])
        self.inplace = len(hosts) <= 1 and self.stream.isatty()
        self.columns = columns(self.stream)
        self._lock = threading.Lock()
        self._progress_shown = False
        self._last_plain = {}
        self._json_hosts = set()  # hosts whose --json object is out (tasks/fleet/fanout.py)

    def _write(self, stream, text):
        """Write and flush; once the reader has gone (a pipe into `head`), the rest of the
        output goes nowhere and the task goes on: a change in flight on a host is finished,
        not cut off by a closed pipe. The exit status stays the task's."""
        try:
            stream.write(text)
            stream.flush()
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())  # the interpreter's last flush finds it too
            os.close(devnull)

    def _prefix(self, host):
        return f"[{host}] " if host else ""

    def _clear_progress(self):
        if self._progress_shown:
            self._write(self.stream, "\r\x1b[2K")
            self._progress_shown = False

    def line(self, host, text=""):
        """One line (several if `text` holds newlines), or a Block wrapped to the terminal."""
        prefix = self._prefix(host)
        if isinstance(text, Block):
            parts = wrap_block(text, self.columns - len(prefix))
        else:
            parts = str(text).splitlines() or [""]
        with self._lock:
            self._clear_progress()
            self._write(self.stream, "".join(f"{prefix}{part}\n" for part in parts))

    def lines(self, host, lines):
        for text in lines:
            self.line(host, text)

    def progress(self, host, phase, text):
        with self._lock:
            if self.inplace:
                self._write(self.stream, f"\r\x1b[2K{self._prefix(host)}{text}")
                self._progress_shown = True
                return
            last = self._last_plain.get(host)
            now = time.monotonic()
            if last is None or last[0] != phase or now - last[1] >= PLAIN_EVERY_S:
                self._last_plain[host] = (phase, now)
                self._write(self.stream, f"{self._prefix(host)}{text}\n")

    def emitted(self, host):
        """Whether `host`'s --json object was printed."""
        return host in self._json_hosts

    def emit_json(self, obj):
        with self._lock:
            if isinstance(obj, dict) and "host" in obj:
                self._json_hosts.add(obj["host"])
            self._clear_progress()
            self._write(sys.stdout, json.dumps(obj, ensure_ascii=False) + "\n")

    def table(self, headers, rows):
        """A plain aligned table (no host prefix): the run's summary."""
        with self._lock:
            self._clear_progress()
            self._write(self.stream, "".join(line + "\n" for line in table_lines(headers, rows)))


def table_lines(headers, rows):
    """A plain aligned table as lines: a header, then a line per row, columns two spaces
    apart, no trailing blanks. Every table llmfab prints is drawn here."""
    lines = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]


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
