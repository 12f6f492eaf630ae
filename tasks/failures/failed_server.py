"""A failed server, explained with the host's readings: what wait, status and rollback raise
and show.

`server_failed(...)` builds the `ServerFailed` error the wait raises (its message is
`server failed: <cause>` then `fix: <fix>`, its details the explaining log lines, its
`fatal` the JSON object `{rule, line, cause, fix}`). The explainer (tasks/failures/explain.py)
asks the host only when a rule needs it: who holds the GPU (the agent's `gpu_procs`,
the survey `fab kill-gpu-procs --dry-run` prints) and the kernel's OOM-killer line of a
SIGKILLed server (`kernel_oom`).
"""
from ..errors import OperationFailed

# The explainer and its rule tables (tasks/failures/explain.py, tasks/failures/rules/: ~40 compiled
# patterns) are imported when a server has failed, not by every task that may see one.


class ServerFailed(OperationFailed):
    """The server died or logged a fatal line; `explanation` says why and what to do."""

    def __init__(self, explanation, server=None):
        super().__init__(explanation.message(), details=explanation.lines)
        self.explanation = explanation
        self.fatal = explanation.as_json()
        self.server = server or {}
        self.json_extra = {"release": self.server.get("release"), "pid": self.server.get("pid"),
                           "fatal": self.fatal}


def launch_failed(error, release):
    """The ServerFailed of a launch the host refused (AgentError kind launch_failed: exec
    failed, launch.py died): the host recorded it in the release already (start-failed.json);
    this is the same cause and fix, said here as every failed start is."""
    from .explain import Explanation
    d = error.data or {}
    lines = [d["line"]] if d.get("line") and d["line"] != error.message else []
    ex = Explanation(d.get("rule") or "launcher-failed", d.get("line"), error.message,
                     d.get("fix") or "see the release's launch.py", lines)
    return ServerFailed(ex, {"release": release})


def wrong_port(server, port, serving_on, lines=()):
    """The ServerFailed of a server that answers on another port than `[server] port`
    (the host's watch saw its process tree serve /health there: tasks/steps/host/watch.py)."""
    from .explain import Explanation
    from .rules import WRONG_PORT
    values = {"port": port, "other": serving_on}
    ex = Explanation(WRONG_PORT.id, None, WRONG_PORT.cause.format(**values),
                     WRONG_PORT.fix.format(**values), list(lines))
    return ServerFailed(ex, server)


def raise_launch_failed(release):
    """A context manager: an AgentError of kind launch_failed inside becomes launch_failed()."""
    import contextlib
    from ..transport.agent import AgentError

    @contextlib.contextmanager
    def guard():
        try:
            yield
        except AgentError as e:
            if e.kind != "launch_failed":
                raise
            raise launch_failed(e, release) from None
    return guard()


def host_readings(host, profile, server, exit=None):
    from .explain import Readings

    def gpu_procs():
        return host.call("gpu_procs", nvidia_smi=profile.gpu.nvidia_smi, devices=None, timeout=30)

    def kernel_oom(pid):
        from ..transport.agent import AgentError
        try:
            return host.call("kernel_oom", pids=[pid], timeout=15).get("line")
        except AgentError:
            return None
    def packages(names):
        return host.call("packages", names=list(names), timeout=30)
    return Readings(profile=profile, server=server, exit=exit, gpu_procs=gpu_procs,
                    kernel_oom=kernel_oom, packages=packages)


def server_failed(scanner, host, profile, server, exit=None):
    """The ServerFailed error for what `scanner` read of this server's log."""
    from .explain import explain
    return ServerFailed(explain(scanner, host_readings(host, profile, server, exit)), server)


def explain_dead(host, profile, ddir, server, exit=None, lines=400):
    """Why a server that is not running ended (status), or None when nothing says it failed:
    it was stopped on purpose (`exit.stopped`: `fab stop`, a redeploy, a rollback; whatever it
    printed while shutting down, e.g. vLLM 0.32's `EngineDeadError` on SIGTERM), or no known
    line and an exit status a stop gives (0, SIGTERM, or SIGKILL without the OOM killer)."""
    if (exit or {}).get("stopped"):
        return None
    import base64
    from ..transport.agent import AgentError
    from .explain import explain
    from .logscan import LogScanner
    try:
        tail = host.call("log_tail", deploy_dir=ddir, release=server["release"], lines=lines)
    except AgentError:
        return None
    scanner = LogScanner()
    # the server is gone: a last line without its newline (`partial`) is its last word
    text = base64.b64decode(tail["data"]) + base64.b64decode(tail.get("partial") or "")
    scanner.feed(text.decode("utf-8", "replace"), final=True)
    ex = explain(scanner, host_readings(host, profile, server, exit))
    code = (exit or {}).get("returncode")
    if ex.rule == "exited" and (code in (None, 0, -15) or (code == -9 and "OOM killer" not in ex.cause)):
        return None
    return ex


def failed_record(name, error):
    """The --json host object of a deploy or rollback that failed: why, with `fatal` (null
    when no server failed: unreachable, a failed preflight with its findings, a lock held)."""
    from ..fleet.fanout import error_record
    rec = error_record(name, error)
    for key in ("release", "pid", "fatal"):
        rec.setdefault(key, None)
    return rec


def reporting_json(op, json_mode):
    """`op(host, reporter) -> HostResult` that, with --json, prints the host's object either
    way: `{host, ok: true, ...result data}`, or failed_record's (with `fatal`) before the
    error goes on to the fan-out's summary."""
    from ..errors import LlmfabError

    def wrapped(host, reporter):
        try:
            res = op(host, reporter)
        except LlmfabError as e:
            if json_mode:
                reporter.emit_json(failed_record(host.name, e))
            raise
        if json_mode:
            reporter.emit_json(dict({"host": host.name, "ok": True}, **res.data))
        return res
    return wrapped
