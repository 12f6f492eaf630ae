"""Run a task's per-host operation on every host: the profile, the hosts, the summary.

Loads and validates the profile first (ProfileError, exit 2, with nothing done
anywhere), picks the hosts (`fab -H`, else the profile's `target.hosts`, else this
machine), runs the per-host operation on all of them in parallel, prints the summary,
and raises TaskFailed with the worst host's code. Errors become messages and exit
codes in one place only: the boundary in tasks/cli.py.
"""
import os
import sys

from ..errors import ExitCode, Interrupted, TaskFailed

INTERRUPT_NOTE = ("interrupted: nothing on the host(s) was stopped; servers already launched keep "
                  "running (see `fab status`, stop them with `fab stop`)")


def load(c, profile_arg):
    """The validated profile; ProfileError (exit 2) naming the file and key."""
    from ..profile import load_profile, resolve_profile_path
    cfg = c.config.get("llmfab") or {}
    path = resolve_profile_path(profile_arg, cfg.get("profile") if hasattr(cfg, "get") else None)
    return load_profile(path)


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
    return dict(config=c.config, python=python or profile.server.interpreter,
                connect_timeout=timeout,
                accept_new_host_keys=opts.accept_new_host_keys)


def run_hosts(c, profile, op, opts, reporter, *, hosts, python=None, on_interrupt=None):
    """Run op(host, reporter) -> HostResult on every host; [HostResult] in host order.

    Ctrl-C: `on_interrupt()` gives [(host, line)] printed before the general note (e.g. which
    release keeps running where), then Interrupted (exit 130)."""
    from .fanout import run_all
    try:
        return run_all(hosts, lambda h: op(h, reporter), parallel=opts.parallel,
                       reporter=reporter, host_kwargs=host_kwargs(c, profile, opts, python))
    except KeyboardInterrupt:
        for host, text in (on_interrupt() if on_interrupt else ()):
            reporter.line(host, text)
        reporter.line("", INTERRUPT_NOTE)
        if len(hosts) > 1:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(ExitCode.INTERRUPTED)  # worker threads cannot be interrupted; sockets close with us
        raise Interrupted() from None


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
