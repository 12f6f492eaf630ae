"""Run a task's per-host operation on every host: the profile, the hosts, the summary.

Loads and validates the profile first (ProfileError, exit 2, with nothing done
anywhere), picks the hosts (`fab -H`, else the profile's `target.hosts`, else this
machine), runs the per-host operation on all of them in parallel, prints the summary,
and raises TaskFailed with the worst host's code. Errors become messages and exit
codes in one place only: the boundary in tasks/cli.py. A task whose work is not one
operation per host (`fab pull`: plans, then copies between hosts, then manifests) runs its
steps through tasks/fleet/fanout.py under `run_fleet`, which gives it the same Ctrl-C.
"""
from ..errors import Interrupted, TaskFailed
from ..runtime import host_python


def interrupt_note():
    from ..interrupts import words
    return f"interrupted ({words()}): nothing more was done on any host"


def load(c, profile_arg, *, launching=False):
    """The validated profile; ProfileError (exit 2) naming the file and key. Secrets
    (`from_env`) are read only for a task `launching` a new release (deploy, tune): every
    other task works without them (stop, status, releases, rollback: the release has its
    own secrets.json)."""
    from ..profile import load_profile, resolve_profile_path
    cfg = c.config.get("llmfab") or {}
    path = resolve_profile_path(profile_arg, cfg.get("profile") if hasattr(cfg, "get") else None)
    return load_profile(path, need_secrets=launching)


def hosts_for(c, profile):
    hosts = list(c.config.get("llmfab_hosts") or []) or list(profile.target.hosts) or ["local"]
    seen = []
    for h in hosts:
        if h not in seen:
            seen.append(h)
    return seen


def host_kwargs(c, profile, opts, python=None):
    timeout = None
    try:
        timeout = c.config.timeouts.connect
    except AttributeError:
        pass
    return dict(config=c.config, python=python or host_python(profile),
                connect_timeout=timeout,
                accept_new_host_keys=opts.accept_new_host_keys)


def run_hosts(c, profile, op, opts, reporter, *, hosts, python=None, on_interrupt=None):
    """Run op(host, reporter) -> HostResult on every host; [HostResult] in host order,
    under `run_fleet`'s Ctrl-C (one host runs in this thread: Interrupted unwinds it)."""
    from .fanout import run_all
    kw = host_kwargs(c, profile, opts, python)
    return run_fleet(lambda: run_all(hosts, lambda h: op(h, reporter), parallel=opts.parallel,
                                     reporter=reporter, host_kwargs=kw),
                     reporter, on_interrupt=on_interrupt, threads=len(hosts) > 1)


def run_fleet(body, reporter, *, on_interrupt=None, note=interrupt_note, threads=True):
    """body() on the hosts of a task, with the Ctrl-C every many-host task shares.

    Ctrl-C (tasks/interrupts.py): a host being changed (a stop, a launch) finishes that step
    first; then `note()` (the general line: nothing more was done), then `on_interrupt()`'s
    [(host, line)] (where each host was left, and how to restore it; it may still act, as
    `fab pull` removes its key) as the last lines; then the process ends at once when
    `threads` (worker threads run body's steps: they cannot be interrupted), else
    Interrupted (exit 130) unwinds."""
    import signal
    import threading
    from ..interrupts import CTRL_C, leave
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, CTRL_C.handler) if main else None
    try:
        return body()
    except KeyboardInterrupt:
        CTRL_C.settle(_wait_until)
        reporter.line("", note())
        for host, text in (on_interrupt() if on_interrupt else ()):
            reporter.line(host, text)
        if threads:
            leave()  # worker threads cannot be interrupted; sockets close with us
        raise Interrupted() from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _wait_until(done, timeout=120.0):
    """Poll `done()` every 50 ms for at most `timeout` s (a host's step in flight: a stop's
    grace, a launch)."""
    import time
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)


def run_task(c, profile, op, opts, *, title, hosts=None, json_mode=False, python=None,
             on_interrupt=None):
    """run_hosts, then the summary table; exit with the worst host's code."""
    from .fanout import emit_missing, summarize, worst
    from ..output import Reporter

    hosts = hosts or hosts_for(c, profile)
    reporter = Reporter(hosts, json_mode=json_mode)
    results = run_hosts(c, profile, op, opts, reporter, hosts=hosts, python=python,
                        on_interrupt=on_interrupt)
    if json_mode:
        emit_missing(reporter, results)
    summarize(reporter, results, title)
    code = worst(r.code for r in results)
    if code:
        raise TaskFailed(int(code))
    return results
