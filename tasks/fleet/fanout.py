"""Run one operation on every host in parallel (bounded), then one summary.

Each host gets one `Host` (one SSH connection, one agent) for the whole task. A
host that fails does so alone; the exit code is the worst of them all
(3 unreachable > 1 failed > 0), and 130 when interrupted.

Every worker thread a task runs on hosts starts here: `run_all` (one operation per host),
`each` (a step of a task on several hosts: a bounded pool, results in order) and `flow`
(work started as a schedule allows and handed back as it ends: `fab pull`'s copies, whose
next sender depends on which copy ended).
"""
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional

from ..errors import ExitCode, LlmfabError
from ..transport.agent import Host
from ..output import report_error


@dataclass
class HostResult:
    host: str
    code: int = ExitCode.OK
    summary: str = "ok"
    data: dict = field(default_factory=dict)
    json: Optional[dict] = None   # the host's --json object when its operation raised


def error_record(name, error):
    """The --json object of a host whose operation failed: `{host, ok: false, error, code}`,
    then what the error adds (its `json_extra`: a failed preflight's checks and findings, a
    failed server's fatal). An unreachable host gets one too: one object per host, always."""
    lines = (getattr(error, "message", None) or str(error)).splitlines()
    rec = {"host": name, "ok": False, "error": lines[0] if lines else "",
           "code": int(getattr(error, "code", ExitCode.FAILED))}
    rec.update(getattr(error, "json_extra", None) or {})
    return rec


def _rank(code):
    # Worst first: unreachable, failed, bad input, ok. Interrupted trumps all.
    return {ExitCode.INTERRUPTED: 5, ExitCode.UNREACHABLE: 4, ExitCode.FAILED: 3,
            ExitCode.BAD_INPUT: 2}.get(code, 0 if code == 0 else 3)


def worst(codes):
    codes = list(codes)
    return max(codes, key=_rank) if codes else ExitCode.OK


def run_all(hosts, op, *, parallel, reporter, host_kwargs=None, opened=None):
    """Call op(host: Host) -> HostResult for each host name; returns [HostResult] in host order.
    A host's error is its result (reported, with its --json object). `opened`: {name: Host}
    the caller holds across several steps (and closes); the others are made from
    `host_kwargs` and closed after their op."""
    def one(name):
        host = opened[name] if opened else Host(name, **host_kwargs)
        try:
            return op(host)
        except LlmfabError as e:
            return failed(reporter, name, e)
        except Exception as e:  # a bug: report it per host, keep the others going
            reporter.line(name, f"internal error: {type(e).__name__}: {e}")
            return HostResult(name, ExitCode.FAILED, f"internal error: {type(e).__name__}",
                              json={"host": name, "ok": False, "code": int(ExitCode.FAILED),
                                    "error": f"internal error: {type(e).__name__}: {e}"})
        finally:
            if not opened:
                host.close()

    return each(hosts, one, parallel=parallel)


def failed(reporter, name, error):
    """The HostResult of a host whose step raised `error` (an LlmfabError), said on its line."""
    report_error(reporter, name, error)
    return HostResult(name, int(error.code), _short(error.message), json=error_record(name, error))


def each(items, fn, *, parallel):
    """[fn(item) for item in items], at most `parallel` at once in worker threads; one item
    runs here, in this thread, where Ctrl-C reaches it. A Ctrl-C while they run waits for
    those in flight (each host's step ends as it would)."""
    items = list(items)
    if len(items) <= 1:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(items)))) as pool:
        futures = [pool.submit(fn, i) for i in items]
        return [f.result() for f in futures]


def flow(ready, run, ended, *, poll=0.5):
    """Run work as a schedule allows: `ready()` -> the items to start now, each run as
    `run(item)` in a worker thread of its own; `ended(item, outcome)` here, in this thread,
    as each ends (it may make more items ready; an exception `run` raised is its outcome).
    Returns once none runs and none is ready. This thread waits in slices of `poll` s, so a
    Ctrl-C reaches it at once; work in flight is never waited for (a copy of a large file
    would hold Ctrl-C for minutes): the task's exit (tasks/interrupts.py `leave`) ends it."""
    done = queue.Queue()

    def worker(item):
        try:
            outcome = run(item)
        except Exception as e:  # noqa: BLE001 - handed to `ended`, which decides
            outcome = e
        done.put((item, outcome))

    running = 0
    while True:
        for item in ready():
            running += 1
            threading.Thread(target=worker, args=(item,), daemon=True).start()
        if not running:
            return
        while True:
            try:
                item, outcome = done.get(timeout=poll)
                break
            except queue.Empty:
                continue
        running -= 1
        ended(item, outcome)


def _short(message, limit=100):
    first = message.splitlines()[0] if message else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"


def emit_missing(reporter, results):
    """--json: the object of every host that printed none (an unreachable host, an error
    before its task printed its own): exactly one object per host, whatever happened."""
    for r in results:
        if not reporter.emitted(r.host):
            reporter.emit_json(r.json or dict({"host": r.host, "ok": r.code == 0}, **r.data))


def summarize(reporter, results, title):
    if len(results) > 1 or any(r.code for r in results):
        reporter.table(["host", "result", title], [
            [r.host, "ok" if r.code == 0 else f"exit {r.code}", r.summary] for r in results])
