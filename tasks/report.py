"""Output: every human line carries its host; JSON Lines go to stdout alone.

Human text goes to stdout, or to stderr when --json is given. A progress line
updates in place on a terminal when one host is involved, else it is printed as a
plain line whenever its phase changes (and at most every `PLAIN_EVERY_S`).
"""
import json
import sys
import threading
import time

PLAIN_EVERY_S = 15.0


class Reporter:
    def __init__(self, hosts=(), json_mode=False, stream=None):
        self.json_mode = json_mode
        self.stream = stream or (sys.stderr if json_mode else sys.stdout)
        self.width = max([len(h) for h in hosts] + [1])
        self.inplace = len(hosts) <= 1 and self.stream.isatty()
        self._lock = threading.Lock()
        self._progress_shown = False
        self._last_plain = {}

    def _prefix(self, host):
        return f"[{host}] " if host else ""

    def _clear_progress(self):
        if self._progress_shown:
            self.stream.write("\r\x1b[2K")
            self._progress_shown = False

    def line(self, host, text=""):
        with self._lock:
            self._clear_progress()
            for part in str(text).splitlines() or [""]:
                self.stream.write(f"{self._prefix(host)}{part}\n")
            self.stream.flush()

    def lines(self, host, lines):
        for text in lines:
            self.line(host, text)

    def progress(self, host, phase, text):
        with self._lock:
            if self.inplace:
                self.stream.write(f"\r\x1b[2K{self._prefix(host)}{text}")
                self.stream.flush()
                self._progress_shown = True
                return
            last = self._last_plain.get(host)
            now = time.monotonic()
            if last is None or last[0] != phase or now - last[1] >= PLAIN_EVERY_S:
                self._last_plain[host] = (phase, now)
                self.stream.write(f"{self._prefix(host)}{text}\n")
                self.stream.flush()

    def emit_json(self, obj):
        with self._lock:
            self._clear_progress()
            sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
            sys.stdout.flush()

    def table(self, headers, rows):
        """A plain aligned table (no host prefix): the run's summary."""
        with self._lock:
            self._clear_progress()
            self.stream.write("".join(line + "\n" for line in table_lines(headers, rows)))
            self.stream.flush()


def table_lines(headers, rows):
    """A plain aligned table as lines: a header, then a line per row, columns two spaces
    apart, no trailing blanks. Every table llmfab prints is drawn here."""
    lines = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
