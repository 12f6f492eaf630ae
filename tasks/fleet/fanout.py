"""Run one operation on every host in parallel (bounded), then one summary.

Each host gets one `Host` (one SSH connection, one agent) for the whole task. A
host that fails does so alone; the exit code is the worst of them all
(3 unreachable > 1 failed > 0), and 130 when interrupted.
"""
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


def run_all(hosts, op, *, parallel, reporter, host_kwargs):
    """Call op(host: Host) -> HostResult for each host name; returns [HostResult] in host order."""
    results = {}

    def one(name):
        host = Host(name, **host_kwargs)
        try:
            res = op(host)
        except LlmfabError as e:
            report_error(reporter, name, e)
            res = HostResult(name, int(e.code), _short(e.message), json=error_record(name, e))
        except Exception as e:  # a bug: report it per host, keep the others going
            reporter.line(name, f"internal error: {type(e).__name__}: {e}")
            res = HostResult(name, ExitCode.FAILED, f"internal error: {type(e).__name__}",
                             json={"host": name, "ok": False, "code": int(ExitCode.FAILED),
                                   "error": f"internal error: {type(e).__name__}: {e}"})
        finally:
            host.close()
        results[name] = res
        return res

    if len(hosts) == 1:
        one(hosts[0])
    else:
        with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(hosts)))) as pool:
            futures = [pool.submit(one, h) for h in hosts]
            for f in futures:
                f.result()
    return [results[h] for h in hosts]


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
