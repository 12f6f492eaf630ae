"""`fab tail-log`: the last lines of a release's server.log, or a stream of it.

    fab tail-log                      last 50 lines of the current release
    fab tail-log --lines 200 --grep 'ERROR|Traceback'
    fab tail-log --release 20250101T120000Z
    fab tail-log --follow             new lines until Ctrl-C (then exit 0)

Following asks the host agent, on the one open channel, for the bytes after a byte
offset; each request blocks up to ~1 s waiting for growth, so an idle log costs one
round trip a second. The offset only moves once an answer has arrived and been
printed, so when the connection drops llmfab reconnects (tenacity, bounded) and
asks again from the same offset: no line is lost or shown twice. Bytes are put into
lines here (tasks/log_lines.py): a partial line waits for its end, and only complete
lines are decoded, invalid UTF-8 becoming U+FFFD. Fatal lines (tasks/failures/logscan.py)
are shown in red, on a terminal only (not with NO_COLOR or TERM=dumb). With several hosts each
line carries its host.

A log holds what the server wrote, and a server may write anything: every line is shown with
its control characters escaped (`\x1b[31m` is printed as those 8 characters, so no colour,
window title, clipboard write or hyperlink reaches the terminal) and cut after 4,096
characters (tasks/output.py terminal_text), whether stdout is a terminal or a pipe: a pipe
often ends in a terminal (`| less -R`, `| tail`), and one rule is easier to trust. `--raw`
writes each line as the server wrote it (invalid UTF-8 still becomes U+FFFD), for a file or
a tool that wants the bytes.
Ctrl-C ends a follow with exit 0: stopping to watch is success, not an interruption; SIGTERM
or SIGHUP (a `kill`, a closed terminal) end it the same way with 143 or 129.
"""
import base64
import os
import sys
import threading

from tenacity import (Retrying, retry_if_exception_type, stop_after_delay, stop_when_event_set,
                      wait_exponential)

from .errors import ExitCode, HostUnreachable, Interrupted, OperationFailed, UsageError
from .fleet.fanout import HostResult
from .log_lines import LineAssembler, is_fatal
from .transport.agent import AgentError, ConnectionLost

FOLLOW_WAIT_S = 1.0            # how long one read blocks on the host waiting for growth
RECONNECT_BUDGET_S = 120       # give up following after this long without a connection
RED = "31"  # SGR code of fatal lines (tasks/output.py adds it where colours may be written)


class Printer:
    """Writes log lines: host prefix with several hosts, red fatal lines on a terminal.

    When the reader goes away (`fab tail-log -f | head`), following stops quietly.
    """

    def __init__(self, reporter, host, multi, stop, rx=None, raw=False):
        self.reporter, self.label, self.rx = reporter, host if multi else "", rx
        self.host, self.stop, self.raw = host, stop, raw
        self.count = 0

    def show(self, lines):
        for line in lines:
            if self.rx is not None and not self.rx.search(line):
                continue
            color = RED if not self.raw and is_fatal(line) else None
            try:
                self.reporter.line(self.label, line, raw=self.raw, color=color)
            except BrokenPipeError:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                self.stop.set()
                return
            self.count += 1

    def note(self, text):
        """Out-of-band notes go to stderr, so stdout carries only the log."""
        from .output import terminal_lines, write_text
        write_text(sys.stderr, terminal_lines(f"[{self.host}] {text}") + "\n")


def _no_release(e):
    avail = e.data.get("available") or []
    listed = ", ".join(avail) if avail else "none"
    return OperationFailed(f"{e}; releases there: {listed}")


def _reconnect(host, stop):
    for attempt in Retrying(retry=retry_if_exception_type((ConnectionLost, HostUnreachable)),
                            stop=stop_after_delay(RECONNECT_BUDGET_S) | stop_when_event_set(stop),
                            wait=wait_exponential(multiplier=0.2, max=3), reraise=True):
        with attempt:
            host.reconnect()


def follow(host, ddir, release, offset, stop, printer, asm):
    """Print new lines from `offset` until `stop` is set; survives dropped connections."""
    current_noted = False
    while not stop.is_set():
        try:
            r = host.call("log_read", deploy_dir=ddir, release=release, offset=offset,
                          wait=FOLLOW_WAIT_S, timeout=FOLLOW_WAIT_S + 30)
        except ConnectionLost as e:
            if stop.is_set():
                break
            printer.note(f"connection lost ({e}); reconnecting")
            try:
                _reconnect(host, stop)
            except (ConnectionLost, HostUnreachable) as e2:
                if stop.is_set():
                    break
                raise OperationFailed(f"lost the connection and could not reconnect within "
                                      f"{RECONNECT_BUDGET_S} s: {e2}") from None
            printer.note(f"reconnected; resuming at byte {offset}")
            continue
        if r["truncated"]:
            printer.note(f"{release}/server.log was truncated; reading it from the start")
            asm.flush()
        offset = r["offset"]
        if r["data"]:
            printer.show(asm.feed(base64.b64decode(r["data"])))
        if not current_noted and r.get("current") and r["current"] != release:
            current_noted = True
            printer.note(f"release {r['current']} is now current; still following {release} "
                         f"(run `fab tail-log --follow` again to follow the new one)")
    return offset


def tail_host(host, reporter, ddir, opts, stop, multi):
    lines, rx, release = opts.lines, opts.regex, opts.release
    host.start()
    printer = Printer(reporter, host.name, multi, stop, raw=opts.raw)
    try:
        r = host.call("log_tail", deploy_dir=ddir, release=release, lines=lines,
                      grep=opts.grep, timeout=120)
    except AgentError as e:
        if e.kind == "no_release":
            raise _no_release(e) from None
        if e.kind == "bad_grep":
            raise UsageError(f"--grep: the host's Python rejects it: {e}") from None
        raise
    release = r["release"]
    if not r["exists"]:
        printer.note(f"release {release} has no server.log yet (never started)")
    if r["clipped"]:
        printer.note("(older lines cut: the selection exceeds 4 MiB)")
    asm = LineAssembler()
    printer.show(asm.feed(base64.b64decode(r["data"])))
    if not opts.follow or stop.is_set():
        partial = base64.b64decode(r["partial"])
        if partial:  # a line still being written: shown as it is so far
            printer.show(LineAssembler().feed(partial + b"\n"))
        return HostResult(host.name, 0, f"{printer.count} line(s) of {release}")
    printer.rx = rx  # the host filtered the tail; new lines are filtered here
    end = follow(host, ddir, release, r["end"], stop, printer, asm)
    return HostResult(host.name, 0, f"followed {release} to byte {end}")


def tail_log(c, opts):
    """Body of `fab tail-log` (opts: tasks.options.TailLogOptions)."""
    from .fleet.runner import hosts_for, load, run_task
    from .steps.preflight import deploy_dir
    profile = load(c, opts.profile)
    try:
        sys.stdout.reconfigure(errors="replace")  # a non-UTF-8 terminal must not crash us
    except (AttributeError, ValueError):
        pass
    ddir = deploy_dir(profile)
    stop = threading.Event()
    multi = len(hosts_for(c, profile)) > 1

    def op(host, reporter):
        return tail_host(host, reporter, ddir, opts, stop, multi)

    if not opts.follow:
        run_task(c, profile, op, opts, title="tail-log")
        return
    # Followers run in a worker thread so that Ctrl-C reaches this (main) thread
    # whatever the number of hosts; it asks them to stop, and they do within a read.
    box, done = {}, threading.Event()

    def runner():
        try:
            run_task(c, profile, op, opts, title="tail-log")
        except BaseException as e:  # handed to the main thread below
            box["error"] = e
        finally:
            done.set()
    threading.Thread(target=runner, name="tail-log-follow", daemon=True).start()
    try:
        while not done.wait(0.25):  # (an interrupted Thread.join can misreport is_alive)
            pass
    except KeyboardInterrupt:  # Ctrl-C: exit 0; SIGTERM, SIGHUP: 128 + n (tasks/interrupts.py)
        import signal
        from .interrupts import cause, exit_status, leave
        stop.set()
        finished = done.wait(FOLLOW_WAIT_S + 2)
        code = ExitCode.OK if cause() == signal.SIGINT else exit_status()
        if not finished:  # stuck reconnecting: nothing on the host needs us
            leave(code)
        if code:
            raise Interrupted()
        return
    if "error" in box:
        raise box["error"]
