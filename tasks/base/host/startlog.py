"""One reader of a release's server.log on the host: each byte is read once, each line fed once
to every consumer that wants it.

A start's log is wanted by several readers: the readiness watch (new lines and the fatal-line
hints, tasks/steps/host/watch.py), the start-up phases (tasks/startup/host/phases.py Parser),
the speculative-decoding evidence (tasks/doctor/host/spec_evidence.py Head) and the
supervisor's fatal line (tasks/failures/host/logscan.py LogScanner). A `StartLog` reads the new
bytes after its offset, splits them into complete lines and hands the lines to each of its
consumers (objects with `feed_lines(lines, final)`), keeping what they made of them.

The agent keeps one StartLog per (log, start offset) for as long as it runs (`of`), so the
ops that come after the watch at ready (`startup`, `spec_evidence`) read only what the watch
has not read yet. A consumer asked for after reading began (`consumer`) has missed the lines so
far and is fed them from the file once: a second read of those bytes, only then (an agent
started after a dropped connection, an op for an older start). Standard library only; Python
>= 3.9.
"""
import os

CHUNK = 256 * 1024  # bytes one read takes at most (a watch answer's text stays small)

_OPEN = {}  # (path, start) -> StartLog: what this agent has read of each start's log


def read_log(path, offset, limit=CHUNK, final=False):
    """New complete lines after byte offset: {offset (new), text, size}. Partial lines wait,
    unless `final` (the server is gone: its last line, without a newline, is all it wrote)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return {"offset": offset, "text": "", "size": None}
    if size < offset:  # truncated by someone else: start over rather than miss lines
        offset = 0
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(limit)
    end = data.rfind(b"\n")
    if final and len(data) < limit:
        end = len(data) - 1
    if end < 0:
        if len(data) < limit:
            return {"offset": offset, "text": "", "size": size}
        end = len(data) - 1  # a huge line: hand it over in pieces
    data = data[:end + 1]
    return {"offset": offset + len(data), "text": data.decode("utf-8", "replace"), "size": size}


class StartLog:
    """The part of `path` from byte `start` on, read as it grows."""

    def __init__(self, path, start=0, consumers=None):
        self.path, self.start, self.offset = path, int(start or 0), int(start or 0)
        self.consumers = dict(consumers or {})
        self.size = -1  # the file's size at the last read (-1: never read)

    def consumer(self, name, make):
        """The consumer `name`; one not fed yet is made by make() and fed what was read so far."""
        if name not in self.consumers:
            made = make()
            if self.offset > self.start:
                StartLog(self.path, self.start, {name: made}).read_to(self.offset)
            self.consumers[name] = made
        return self.consumers[name]

    def read(self, limit=CHUNK, final=False):
        """The new complete lines since the last read (a stat only when the file has not grown),
        fed to every consumer; returns their text ("" if none). `final`: the writer is gone, so a
        last line without its newline counts too."""
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return ""
        if size == self.size and not (final and size > self.offset):
            return ""
        r = read_log(self.path, self.offset, limit, final)
        self.size, self.offset = size, r["offset"]
        if r["text"]:
            lines = r["text"].splitlines()
            for c in self.consumers.values():
                c.feed_lines(lines, final)
        return r["text"]

    def read_to(self, end, limit=None):
        """Read on until `end` (a byte offset; None: the end of the file), at most `limit` bytes
        from where this started reading now."""
        begin = self.offset
        while end is None or self.offset < end:
            want = CHUNK if end is None else min(CHUNK, end - self.offset)
            if limit is not None:
                want = min(want, begin + limit - self.offset)
            if want <= 0 or not self.read(want):
                break
            self.size = -1  # more may be there: the next read must not stop at the stat
        return self


def of(path, start=0):
    """This agent's StartLog of `path` from `start` (a new one, reading from there, if none)."""
    key = (path, int(start or 0))
    if key not in _OPEN:
        _OPEN[key] = StartLog(path, start)
    return _OPEN[key]


def forget(path, start=0):
    _OPEN.pop((path, int(start or 0)), None)
