"""`fab deploy --rolling N` (or `[target] rolling = N`): a few hosts at a time, never all.

Hosts go in the order given (`-H`, else target.hosts), N at a time. Within a batch they
deploy in parallel exactly as `fab deploy` does; the next batch starts only when every
host of this one is ready (with `--smoke`: has also answered a 1-token completion,
tasks/steps/smoke.py). A host that fails is put back at once, while the rest of its batch goes on:

* a release ran there before the roll touched it: back to it as `fab rollback` does
  (tasks/releases.py rollback_host: stop, relaunch that release from its own files, wait);
  if the preflight failed, nothing was launched and that release simply keeps running;
* nothing ran there before: stopped (its log stays in the release).

Then the roll stops: later hosts are not touched (only read, to say what they run). Each
host's `rolled` is new | back | untouched | stopped, with the release it runs now and why;
the exit code is the worst host's (1 when a host failed).

Ctrl-C: the batch in flight finishes (its hosts end up ready, or back), then the roll stops,
exit 130: no host is left half-way. A second Ctrl-C leaves at once, as `fab deploy` does.
A [cluster] profile has one head whose Ray workers deploy with it: one unit, one batch.
"""
import os
import signal
import threading

from ..transport.agent import ConnectionLost
from ..errors import ExitCode, LlmfabError, UsageError
from ..interrupts import words
from .fanout import HostResult, run_all, worst
from ..output import report_error


def batch_size(flag, profile, no_wait):
    """N from --rolling (parsed by tasks/options.py), else [target] rolling; None: all at once.

    UsageError (nothing done) when the profile's rolling meets --no-wait."""
    if flag is not None:
        return flag
    size = profile.target.rolling
    if size is not None and no_wait:
        raise UsageError(f"{profile.path}: [target] rolling = {size} waits for each batch to be "
                         "ready before the next one; it cannot be combined with --no-wait "
                         "(nothing was done)")
    return size


def batches(hosts, size):
    """Consecutive groups of `size` hosts, in the order given."""
    return [list(hosts[i:i + size]) for i in range(0, len(hosts), size)]


def _outcome(res, rolled, release, why, fatal=None):
    res.data.update(rolled=rolled, release=release, why=why)
    if fatal is not None:  # why the new release's server failed (tasks/failures/failed_server.py)
        res.data["fatal"] = fatal
    return res


def _state(host, ddir):
    try:
        return host.call("state", deploy_dir=ddir)
    except ConnectionLost:  # the deploy's connection dropped: one fresh one for the clean-up
        host.reconnect()
        return host.call("state", deploy_dir=ddir)


def _running(state):
    return (state.get("server") or {}).get("release") if state.get("alive") else None


def host_step(host, *, ddir, deploy_one, rollback_one, stop_one, reporter):
    """Deploy one host; on failure put it back. Returns a HostResult with rolled/release/why."""
    name = host.name
    try:
        host.start()
        was = _running(host.call("state", deploy_dir=ddir))
    except LlmfabError as e:  # unreachable, or its Python cannot run: nothing was changed
        report_error(reporter, name, e)
        return _outcome(HostResult(name, int(e.code), "not reached"), "untouched", None,
                        f"not reached: {e.message.splitlines()[0]}")
    try:
        res = deploy_one(host, reporter)
        return _outcome(res, "new", res.data.get("release"), res.summary)
    except LlmfabError as e:
        report_error(reporter, name, e)
        failed, code, fatal = e.message.splitlines()[0], int(e.code), getattr(e, "fatal", None)
    try:
        now = _state(host, ddir)
        if was is None:
            reporter.line(name, "rolling: no release ran here before: stopping it")
            stop_one(host, reporter)
            return _outcome(HostResult(name, code, "stopped"), "stopped", None,
                            f"{failed}; no release ran here before: stopped", fatal)
        if _running(now) == was:  # e.g. the preflight failed: nothing was launched
            why = f"{failed}; nothing new was launched: release {was} kept running"
            return _outcome(HostResult(name, code, f"kept {was}"), "back", was, why, fatal)
        reporter.line(name, f"rolling: putting back release {was}, the one that ran before")
        back = rollback_one(host, reporter, was)
        return _outcome(HostResult(name, code, f"back on {was}", back.data), "back", was,
                        f"{failed}; {back.summary}", fatal)
    except LlmfabError as e:
        report_error(reporter, name, e)
        again = e.message.splitlines()[0]
        try:
            stop_one(host, reporter)
            left = "stopped"
        except LlmfabError as e2:
            left = f"could not stop it either: {e2.message.splitlines()[0]}"
        return _outcome(HostResult(name, code, "stopped"), "stopped", None,
                        f"{failed}; putting it back failed: {again}; {left}", fatal)


def _read_only(ddir, why):
    """For hosts the roll never reached: what they run now (one `state` read, no lock)."""
    def op(host):
        try:
            host.start()
            release = _running(host.call("state", deploy_dir=ddir))
            text = why
        except LlmfabError as e:
            release, text = None, f"{why} (could not read what it runs: {e.message.splitlines()[0]})"
        return _outcome(HostResult(host.name, ExitCode.OK, "not touched"), "untouched", release, text)
    return op


class DeferredCtrlC:
    """First Ctrl-C: note it (the batch in flight goes on); second: KeyboardInterrupt now.

    The note goes straight to the stream's file descriptor: the handler may run while the
    main thread holds the reporter's lock."""

    NOTE = ("\n{what}: the roll stops when the batch in flight is done (each of its hosts "
            "ends ready or back); Ctrl-C again to leave now (servers launched keep running)\n")

    def __init__(self, stream):
        self.stream, self.pressed, self._previous = stream, False, None

    def _handler(self, signum, frame):
        if self.pressed:
            signal.signal(signal.SIGINT, self._previous or signal.default_int_handler)
            raise KeyboardInterrupt
        self.pressed = True
        try:
            os.write(self.stream.fileno(), self.NOTE.format(what=words()).encode())
        except (OSError, ValueError, AttributeError):
            pass

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def roll(hosts, size, step, *, ddir, reporter, host_kwargs, parallel, json_mode=False, label=None):
    """Run `step(host, reporter)` (host_step with its callables) batch by batch.

    Returns (results in host order, interrupted). KeyboardInterrupt (a second Ctrl-C)
    propagates to the caller, which says what keeps running."""
    groups = batches(hosts, size)
    done, stopped_by = [], None
    with DeferredCtrlC(reporter.stream) as ctrl_c:
        for i, group in enumerate(groups, 1):
            reporter.line("", f"rolling: batch {i} of {len(groups)}: {label or ', '.join(group)}")
            out = run_all(group, lambda h: step(h, reporter), parallel=parallel, reporter=reporter,
                          host_kwargs=host_kwargs)
            done += out
            _emit(reporter, out, json_mode)
            bad = [r.host for r in out if r.code]
            if bad:
                stopped_by = f"the roll stopped at {', '.join(bad)} (batch {i} of {len(groups)})"
                break
            if ctrl_c.pressed and i < len(groups):
                stopped_by = f"the roll was interrupted ({words()}) after batch {i} of {len(groups)}"
                break
        interrupted = ctrl_c.pressed and stopped_by is not None and not any(r.code for r in done)
    rest = hosts[len(done):]
    if rest:
        reporter.line("", f"rolling: {stopped_by}; not touched: {', '.join(rest)}")
        left = run_all(rest, _read_only(ddir, f"not reached: {stopped_by}"), parallel=parallel,
                       reporter=reporter, host_kwargs=host_kwargs)
        _emit(reporter, left, json_mode)
        done += left
    _summary(reporter, done)
    return done, interrupted


def _emit(reporter, results, json_mode):
    if not json_mode:
        return
    for r in results:
        rec = {"host": r.host, "ok": r.code == 0, "release": r.data.get("release"),
               "rolled": r.data.get("rolled"), "why": r.data.get("why")}
        rec.update((k, v) for k, v in r.data.items() if k not in rec)
        reporter.emit_json(rec)


def _summary(reporter, results):
    reporter.table(["host", "result", "release", "rolled", "why"], [
        [r.host, "ok" if r.code == 0 else f"exit {r.code}", r.data.get("release") or "-",
         r.data.get("rolled"), r.data.get("why") or r.summary] for r in results])


def deploy_rolling(c, profile, opts, size, *, deploy_one, rollback_one, on_interrupt):
    """The body of `fab deploy` once it knows the batch size (tasks/deploy.py hands over).

    deploy_one(host, reporter) and rollback_one(host, reporter, release) -> HostResult, as
    `fab deploy` and `fab rollback` do one host; on_interrupt() -> [(host, line)] said on a
    second Ctrl-C."""
    from ..steps.preflight import deploy_dir
    from ..errors import Interrupted, TaskFailed
    from ..output import Reporter
    from .runner import host_kwargs, hosts_for, interrupt_note
    from ..interrupts import leave
    from ..steps.shutdown import stop_deployment
    hosts, ddir = hosts_for(c, profile), deploy_dir(profile)
    label = None
    if profile.cluster is not None:  # one head (tasks/fleet/ray_cluster.py check_hosts): one batch
        size = len(hosts)
        label = (f"{', '.join(hosts)} with its Ray workers {', '.join(profile.cluster.workers)} "
                 "(a cluster rolls as one unit)")
    reporter = Reporter(hosts, json_mode=opts.json)

    def step(host, rep):
        return host_step(host, ddir=ddir, deploy_one=deploy_one, rollback_one=rollback_one,
                         stop_one=lambda h, r: stop_deployment(h, ddir, r, by=None),  # a failed release: its failure stays
                         reporter=rep)
    try:
        results, interrupted = roll(hosts, size, step, ddir=ddir, reporter=reporter,
                                    host_kwargs=host_kwargs(c, profile, opts),
                                    parallel=min(opts.parallel, size), json_mode=opts.json,
                                    label=label)
    except KeyboardInterrupt:  # the second Ctrl-C: leave now, as `fab deploy` does
        reporter.line("", interrupt_note())
        for host, text in on_interrupt():  # the last lines: where each host is
            reporter.line(host, text)
        leave()  # worker threads cannot be interrupted; sockets close with us
    if interrupted:
        raise Interrupted()
    code = worst(r.code for r in results)
    if code:
        raise TaskFailed(int(code))
    return results
