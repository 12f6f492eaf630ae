"""Log bytes -> display lines, for `fab tail-log`. Pure: no I/O.

Fatal lines are highlighted here, on the client, from the text alone: tail-log streams any
release's log (an old one, one no watch read), so the text is all it has; the rule table's
test is tasks/failures/logscan.py's, the one the deploy's verdict uses.

Chunks arrive cut anywhere (mid-line, mid-character). Only complete lines are
decoded, so a multi-byte character split across two chunks is never mangled;
invalid UTF-8 becomes U+FFFD and never raises.
"""
from .failures.logscan import is_fatal_line

MAX_PARTIAL = 1 << 20  # a "line" this long without a newline is shown in pieces


class LineAssembler:
    """Bytes in (any chunking), complete decoded lines out. Pure.

    A line is shown once its b"\\n" has arrived; a trailing b"\\r" is dropped. A
    partial line longer than `max_partial` is released in pieces cut at a UTF-8
    character boundary, so a multi-byte character is never split into two U+FFFD.
    """

    def __init__(self, max_partial=MAX_PARTIAL):
        self.buf = b""
        self.max_partial = max_partial

    def feed(self, data):
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        out = [_decode(line) for line in lines]
        while len(self.buf) > self.max_partial:
            cut = utf8_boundary(self.buf, self.max_partial)
            out.append(_decode(self.buf[:cut]))
            self.buf = self.buf[cut:]
        return out

    def flush(self):
        """The held partial line, decoded (None if there is none); the buffer empties."""
        rest, self.buf = self.buf, b""
        return _decode(rest) if rest else None


def _decode(line):
    if line.endswith(b"\r"):
        line = line[:-1]
    return line.decode("utf-8", "replace")


def utf8_boundary(data, limit):
    """The largest cut <= limit (> 0) that does not split a UTF-8 sequence in data."""
    cut = limit
    for back in range(1, 4):  # a sequence is at most 4 bytes: look at most 3 back
        i = limit - back
        if i <= 0:
            break
        b = data[i]
        if b & 0xC0 == 0x80:        # continuation byte: keep looking for the lead
            continue
        if b >= 0xC0:               # lead byte: does its sequence fit before limit?
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            if i + need > limit:
                cut = i
        break
    return cut


def is_fatal(line):
    return is_fatal_line(line)
