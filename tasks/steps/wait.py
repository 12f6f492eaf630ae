"""Wait until a launched server is ready, or say at once why it never will be.

Ready: the server process is alive, `/health` answers 200 and `/v1/models` lists
the served name. Failed: the process exited, or the log shows a fatal line. Each
tick is one agent `watch` request on the open channel (no new remote command): the
agent watches the process, the log, the port, /health and /v1/models on the host
every 50 ms and answers as soon as one of them changes (steps/host/watch.py), or after
`poll_interval` with progress, so the verdict comes one round trip after the event
whatever the interval. The fatal-line patterns travel with the request, so the agent
answers early on a line that may be fatal; this side's LogScanner still decides, from the
lines the agent read once and sent (it needs them anyway: the explanation, the tail, the
rule's figures). The start-up phase is the agent's answer (its reader feeds the phases'
parser on the host, tasks/base/host/startlog.py); nothing parses it again here. A
dropped connection is re-opened (bounded) and the wait goes on from the same log
offset; nothing is relaunched.
"""
import time

from tenacity import (RetryError, Retrying, retry_if_exception_type, stop_after_delay,
                      wait_exponential, wait_none)

from ..failures import logscan
from ..errors import HostUnreachable, OperationFailed
from ..failures.failed_server import server_failed, wrong_port
from ..failures.logscan import LogScanner
from ..transport.agent import AgentStartFailed, ConnectionLost
from .lock import PREEMPTING
from ..base.host.stopping import DEFAULT_GRACE_S
from ..output import fab_hint

FAILED_GRACE_S = 10.0  # a server that already failed gets less than fab stop's grace to exit
RECONNECT_BUDGET_S = 120
ANSWER_MARGIN_S = 30  # a watch answers within its wait_s; this much later the connection is dead
GPU_EVERY_S = 5.0     # nvidia-smi costs ~20 ms of CPU a run (H200, driver 580): not every second
AFTER_HINT_S = 0.25   # a hinted line the scanner did not call fatal yet: look again soon


def fatal_hints():
    """[(pattern, flags)] for the agent: the fatal-line patterns of logscan's rule table
    (tasks/failures/rules). Read from there, never copied, so a change of the table reaches the
    host; the scanner stays the judge (context rules, wrappers), the agent only answers
    early on a line that may count."""
    return [(p.regex, p.compiled.flags) for r in logscan.RULES for p in r.patterns]


class NotReadyYet(Exception):
    pass


class StoppedByOther(OperationFailed):
    """Another task (`fab stop`, `fab kill-gpu-procs`) stopped the server this one waited for:
    no failure of the server, nothing to clean up, nothing to put back."""


def stopped_by_other(server, task, record=None, holder=None):
    if holder is not None:
        who = (f"`fab {holder.get('task', '?')}` of {holder.get('user', '?')}@{holder.get('from', '?')}, "
               f"which holds the lock now")
    else:
        who = f"{(record or {}).get('by') or 'another task'} at {(record or {}).get('at', '?')}"
    return StoppedByOther(f"release {server['release']} (pid {server['pid']}) was stopped by {who}, "
                          f"while this {task} waited for it to be ready; it was not restarted "
                          "and nothing was put back")


class NotReadyInTime(OperationFailed):
    pass


def call_resilient(host, op, /, on_reconnect=None, budget=RECONNECT_BUDGET_S, **kw):
    """host.call(op) that re-opens the connection and agent when it drops."""
    for attempt in Retrying(retry=retry_if_exception_type(ConnectionLost), reraise=True,
                            stop=stop_after_delay(budget),
                            wait=wait_exponential(multiplier=0.2, max=3)):
        with attempt:
            if attempt.retry_state.attempt_number > 1:
                try:
                    host.reconnect()
                except (AgentStartFailed, HostUnreachable) as e:
                    # e.g. the network is still down: keep trying within the budget
                    raise ConnectionLost(str(e)) from e
                if on_reconnect:
                    on_reconnect()
            return host.call(op, **kw)


def _gpu_text(gpus):
    if not gpus:
        return ""
    return " | GPU " + " ".join(f"{g['index']}:{(g['used_mib'] or 0) / 1024:.1f}G" for g in gpus)


def wait_ready(host, profile, deploy_dir, server, reporter, *, timeout=None, on_reconnect=None,
               gpu_probe=True, log_offset=0, progress=None, task="deploy"):
    """Block until ready (returns a dict of facts) or raise OperationFailed / NotReadyInTime.

    `log_offset`: where this run's lines start in server.log (a relaunched release appends).
    `progress`: a tasks.startup.estimate.Progress, for the start-up phase and the time left.
    """
    ready_cfg = profile.ready
    timeout = ready_cfg.timeout if timeout is None else timeout
    if progress is None:  # the phase the host reads from the engine's lines (tasks/startup/host/phases.py)
        from ..startup.estimate import Progress
        progress = Progress(profile.server.engine, None)
    served = profile.served_name
    scanner = LogScanner()
    state = {"offset": log_offset, "nvidia_smi": profile.gpu.nvidia_smi if gpu_probe else None,
             "seen": None, "soon": False}
    t0 = time.monotonic()
    req = dict(deploy_dir=deploy_dir, release=server["release"], pid=server["pid"],
               port=profile.server.port, host=profile.server.host,
               health_path=ready_cfg.health_path, models_path=ready_cfg.models_path,
               api_key=profile.api_key,
               devices=list(profile.gpu.devices) if profile.gpu.devices is not None else None,
               hints=fatal_hints(), gpu_every_s=max(GPU_EVERY_S, ready_cfg.poll_interval),
               start_offset=log_offset, engine=progress.engine, engine_version=progress.version,
               port_check=profile.server.engine == "command")

    def tick():
        wait_s = max(0.0, min(ready_cfg.poll_interval, timeout - (time.monotonic() - t0)))
        if state["soon"]:
            wait_s = min(wait_s, AFTER_HINT_S)
        r = call_resilient(host, "watch", on_reconnect=on_reconnect, log_offset=state["offset"],
                           nvidia_smi=state["nvidia_smi"], seen=state["seen"], wait_s=wait_s,
                           timeout=wait_s + ANSWER_MARGIN_S, **req)
        state["offset"], state["seen"] = r["log"]["offset"], r["state"]
        state["soon"] = r.get("why") == "hint"
        if state["nvidia_smi"] and r.get("gpus") is None:
            state["nvidia_smi"] = None  # no GPUs readable here: stop asking every tick
        if not r["alive"] and r.get("stopped"):  # stopped on purpose by another task
            raise stopped_by_other(server, task, r["stopped"])
        # The agent read the log after seeing the process gone: its last words are in.
        fatal = scanner.feed(r["log"]["text"], final=not r["alive"])
        if fatal is not None or not r["alive"]:  # why, and what to do (tasks/failures/failed_server.py)
            raise server_failed(scanner, host, profile, server, r.get("exit"))
        if r.get("why") == "wrong_port":  # ready, on a port nobody will probe
            raise wrong_port(server, profile.server.port, r["serving_on"], scanner.tail(20))
        elapsed = time.monotonic() - t0
        models = r.get("models")
        health = r.get("health")
        progress.feed(r.get("startup"), elapsed)
        if health == 200 and (not ready_cfg.models_path or served is None or
                              (models is not None and served in models)):
            return {"seconds": elapsed, "models": models, "gpus": r.get("gpus"), "at": r.get("at"),
                    "listening": r.get("listening")}
        phase = progress.phase
        if health == 200:
            phase = "starting api"
            if models is not None and served not in models:
                phase = f"serving {models}, waiting for {served!r}"
        left = progress.left(elapsed)
        left = "" if left is None else f", ~{left:.0f}s left"
        reporter.progress(host.name, phase,
                          f"{phase:<12} {elapsed:6.1f}s{left}{_gpu_text(r.get('gpus'))}")
        raise NotReadyYet(phase)

    try:
        # No wait between ticks: the agent holds each one until something changes.
        for attempt in Retrying(retry=retry_if_exception_type(NotReadyYet),
                                stop=stop_after_delay(timeout), wait=wait_none()):
            with attempt:
                return tick()
    except RetryError:
        what = f"server not ready after {timeout:.0f} s (last phase: {progress.phase})"
        err = NotReadyInTime(
            f"{what}; release {server['release']} (pid {server['pid']}) is still running. Watch "
            f"it with `{fab_hint(profile, 'tail-log --follow')}`, stop it with "
            f"`{fab_hint(profile, 'stop')}`",
            details=scanner.tail(20))
        err.what = what  # without the "still running" part, for callers that stop it
        raise err from None


def wait_or_clean_up(host, profile, ddir, server, reporter, *, task, timeout=None,
                     stop_on_timeout=False, log_offset=0, stale_agent=None, progress=None):
    """The step after a launch, for deploy and rollback alike: wait until ready, else free.

    A dropped connection is re-opened and the lock re-taken; if the host has not noticed
    the old connection died (half-open), the task's own old agent (`stale_agent`, its pid)
    still holds the lock and is ended. A server that failed is stopped (its log stays in
    the release) after its verdict is printed; one not ready in time is left running
    unless `stop_on_timeout`. A raised error has `stopped` True when the server was stopped.
    """
    from ..output import report_error
    from .lock import take_lock
    name = host.name
    agent = {"pid": stale_agent}

    def relock():
        from ..errors import LockHeld
        reporter.line(name, "connection re-opened; still waiting")
        try:
            took = take_lock(host, ddir, task, stale_agent=agent["pid"], phase="waiting")
        except LockHeld as e:  # `fab stop` ended this task's agent to stop the server
            if (e.holder or {}).get("task") in PREEMPTING:
                raise stopped_by_other(server, task, holder=e.holder) from None
            raise
        if took.get("ended_stale_agent"):
            reporter.line(name, f"ended agent pid {took['ended_stale_agent']} of the lost connection "
                                "(it still held the lock)")
        agent["pid"] = host.hello.get("pid")

    try:
        return wait_ready(host, profile, ddir, server, reporter, timeout=timeout,
                          log_offset=log_offset, on_reconnect=relock, progress=progress, task=task)
    except StoppedByOther:
        raise
    except NotReadyInTime as e:
        if not stop_on_timeout:
            raise
        reporter.line(name, "--stop-on-timeout: stopping the server")
        # Stopped on purpose (not ready in time): what it prints while stopping is no failure.
        call_resilient(host, "stop", deploy_dir=ddir, grace=DEFAULT_GRACE_S, timeout=DEFAULT_GRACE_S + 60,
                       by=f"fab {task} --stop-on-timeout (not ready in time)")
        err = NotReadyInTime(f"{e.what}; stopped it (--stop-on-timeout); its log stays in "
                             f"release {server['release']}", details=e.details)
        err.stopped = True
        raise err from None
    except OperationFailed as e:
        report_error(reporter, name, e)  # the verdict first; the clean-up below may take seconds
        try:
            # by=None: stopped because it failed, which stays its explanation
            call_resilient(host, "stop", deploy_dir=ddir, grace=FAILED_GRACE_S, by=None, timeout=60, budget=10)
        except Exception:
            pass
        fatal = getattr(e, "fatal", None)
        if fatal is not None:  # the server itself failed: `fab rollback` must not pick this release
            try:
                host.call("mark_failed", deploy_dir=ddir, release=server["release"],
                          rule=fatal.get("rule"), cause=fatal.get("cause"), fix=fatal.get("fix"),
                          line=fatal.get("line"), timeout=30)
            except Exception:
                pass
        e.stopped = True
        raise
