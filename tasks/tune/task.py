"""Body of `fab tune`: validate everything, survey the hosts, sweep, decide, write, put back.

Order matters for the exit codes: flags, the profile and every variant are checked first
(exit 2, no host touched); then each host is read once (3 if one cannot be reached, 2 if
they are not alike); only then does anything change on a host. The sweep's files go to
DIR as they come (results.jsonl appended per variant, so Ctrl-C loses nothing measured);
report.html and `<stem>.tuned.toml` are written at the end. Exit 0 with a winner or a tie,
1 when no variant could be measured, 3 when hosts were lost with variants left.
"""
import datetime
import json
import os
import sys
import threading
import time
from pathlib import Path

from ..errors import ExitCode, HostUnreachable, Interrupted, LlmfabError, TaskFailed, UsageError
from . import results
from .slo import slo_text
from ..base.host.safefile import open_append, replace as write_atomically

PLAN = "plan.json"
RESULTS = "results.jsonl"
LOG = "sweep.log"
# What must be the same to resume a sweep: the variants and the workload.
PLAN_KEYS = ("profile", "vary", "profiles", "baseline", "concurrency", "requests", "input_len",
             "max_tokens", "repeat", "seed", "slo", "load", "max_load")


def _plan(opts, base):
    return {"profile": str(base.path), "vary": [[k, list(v)] for k, v in opts.vary],
            "profiles": [str(Path(p).resolve()) for p in opts.profiles],
            "baseline": opts.baseline, "concurrency": list(opts.concurrency),
            "requests": opts.requests, "input_len": opts.input_len,
            "max_tokens": opts.max_tokens, "repeat": opts.repeat, "seed": opts.seed,
            "slo": slo_text(opts.slo) if opts.slo else None,
            "load": opts.load if opts.slo else None, "max_load": opts.max_load if opts.slo else None,
            # what each measured profile says, its extends chain merged in: the same flags over
            # an edited file are another sweep
            "profile_digest": {str(base.path): base.digest,
                               **{str(Path(p).resolve()): _digest(p) for p in opts.profiles}}}


def _digest(path):
    from ..profile import load_profile
    try:
        return load_profile(path, need_secrets=False).digest
    except LlmfabError:
        return None  # said in words when its variant is built


def default_out_root(environ=None):
    """Where sweeps go without --out: `$XDG_STATE_HOME/llmfab/tune/` (default
    ~/.local/state/llmfab/tune/), whatever the current directory is. The current directory
    was the default once, and a sweep run from the checkout (as the README runs every task)
    left an untracked directory in it; the user's state directory is the same place from any
    directory, and each run prints where its results are."""
    environ = os.environ if environ is None else environ
    state = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "llmfab" / "tune"


def _out_dir(opts, base):
    if opts.resume:
        out = Path(opts.resume)
        if not (out / PLAN).is_file():
            raise UsageError(f"--resume {out}: no {PLAN} there (is it a `fab tune` result "
                             "directory?)")
        return out, False
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(opts.out) if opts.out else default_out_root() / f"{base.target.name}-{stamp}"
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out} exists and is not empty: choose another directory, or "
                         f"continue that sweep with --resume {out}")
    return out, True


def _check_resume(out, plan):
    saved = json.loads((out / PLAN).read_text())
    diff = [k for k in PLAN_KEYS if saved.get(k) != plan.get(k)]
    if diff:
        raise UsageError(f"--resume {out}: that sweep was made with other settings ("
                         + ", ".join(f"{k}: {saved.get(k)!r} there, {plan.get(k)!r} now"
                                     for k in diff)
                         + "); give the same flags, or start a new sweep with --out")
    was = saved.get("profile_digest") or {}  # (a sweep begun before it was recorded: not checked)
    changed = [p for p, d in was.items() if plan["profile_digest"].get(p, d) != d]
    if changed:
        raise UsageError(f"--resume {out}: {', '.join(changed)} changed since that sweep began (its "
                         "content, with what it extends): resuming would mix measurements of two "
                         "profiles; put it back as it was, or start a new sweep with --out")


def tune(c, opts):
    """Body of `fab tune` (opts: tasks.tune.sweep_options.TuneOptions)."""
    from ..fleet.runner import load
    from .variants import build
    base = load(c, opts.profile, launching=True)
    if base.cluster is not None:
        raise UsageError(f"{base.path}: fab tune does not sweep [cluster] profiles (nothing was done)")
    concurrency = opts.concurrency
    objective = results.parse_objective(opts.objective) if opts.objective \
        else ("tokens_per_s", max(concurrency))
    if opts.slo:
        objective = ("goodput", None)
    elif objective[1] not in concurrency:
        raise UsageError(f"--objective {opts.objective}: concurrency {objective[1]} is not "
                         f"measured (--concurrency {','.join(map(str, concurrency))})")
    out, fresh = _out_dir(opts, base)
    plan = _plan(opts, base)
    if not fresh:
        _check_resume(out, plan)
    made = fresh and not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        variants = build(base, vary=opts.vary, profiles=opts.profiles, baseline=opts.baseline,
                         out=out)
    except LlmfabError:
        if made:
            import shutil
            shutil.rmtree(out, ignore_errors=True)
        raise
    write_atomically(str(out / PLAN), json.dumps(plan, indent=1) + "\n")
    Sweeper(c, opts, base, variants, out, objective).run()


class Sweeper:
    def __init__(self, c, opts, base, variants, out, objective):
        from ..output import Reporter
        from ..fleet.runner import host_kwargs, hosts_for
        self.c, self.opts, self.base, self.variants = c, opts, base, variants
        self.out, self.objective = out, objective
        self.hosts = hosts_for(c, base)
        self.kw = host_kwargs(c, base, opts)
        self.term = Reporter(self.hosts, json_mode=opts.json)
        self._logf = os.fdopen(open_append(str(out / LOG)), "a", encoding="utf-8")
        self.log = Reporter(self.hosts, stream=self._logf)

    # -- phases ----------------------------------------------------------------------------
    def survey(self):
        """{host: release running now or None}; exit 3 / 2 before anything changes."""
        from ..fleet.fanout import run_all
        from ..steps.preflight import deploy_dir
        from .hosts import check_alike, survey_op
        res = run_all(self.hosts, survey_op(self.base, deploy_dir(self.base)),
                      parallel=self.opts.parallel, reporter=self.term, host_kwargs=self.kw)
        bad = [r for r in res if r.code]
        if bad:
            if self.opts.json:  # each host that refused the sweep: {host, ok: false, error, code}
                from ..fleet.fanout import emit_missing
                emit_missing(self.term, bad)
            code = max(int(r.code) for r in bad)
            if code == ExitCode.UNREACHABLE:
                raise HostUnreachable(f"cannot reach {', '.join(r.host for r in bad)}; nothing "
                                      "was done on any host")
            raise TaskFailed(code)
        check_alike({r.host: r.data["facts"] for r in res})
        from .hosts import describe
        from .slots import plan as slot_plan
        facts = res[0].data["facts"]
        self.slots = {r.host: slot_plan(self.opts.slots, self.base, self.variants,
                                        len(r.data["facts"].get("gpus") or ())) for r in res}
        self.check_settings(res[0].host, facts)
        per = len(self.slots[res[0].host]) or 1
        self.term.line("", f"tune: {len(self.variants)} variants on {len(self.hosts)} host(s) "
                           f"({describe(facts)})" + (f", {per} at once on each" if per > 1 else "")
                           + f"; results in {self.out}/")
        return {r.host: r.data["running"] for r in res}

    def check_settings(self, host_name, facts):
        """--vary server.args.X: each flag and value against the engine's --help (exit 2)."""
        from .settings import check, varied_flags
        if not varied_flags(self.opts.vary) or self.base.server.engine not in ("vllm", "sglang"):
            return
        from ..transport.agent import Host
        host = Host(host_name, **self.kw)
        try:
            host.start()
            got = host.call("engine_flags", engine=self.base.server.engine,
                            python=self.base.server.interpreter, timeout=240)
        finally:
            host.close()
        if got["flags"] is None:
            raise UsageError(f"--vary server.args...: cannot read the flags of the engine on "
                             f"{host_name} ({' '.join(got['argv'] or [])}: {got['error']}); "
                             "nothing was launched")
        check(self.opts.vary, host_name, got["flags"], facts.get("engine"))

    def run(self):
        from ..measure import workload
        from .sweep import Sweep, Workload
        o = self.opts
        before = self.survey()
        path = self.out / RESULTS
        old = results.read(path)
        points = (None,) if o.slo else o.concurrency
        todo = results.missing(self.variants, points, old)
        if old:
            self.term.line("", f"tune: resuming: {len(self.variants) - len(todo)} of "
                               f"{len(self.variants)} variants already measured")
        plan = None
        if o.slo:
            from .capacity import SloPlan
            plan = SloPlan(o.slo, o.load, o.max_load, o.repeat, o.requests)
        count = max(o.requests, 2 * o.max_load if o.slo else 0) + 1
        wl = Workload(o.concurrency, o.requests, o.max_tokens, o.repeat,
                      workload.prompts(seed=o.seed, count=count, input_len=o.input_len),
                      engine=self.base.server.engine, slo=plan)
        cancel = threading.Event()
        sweep = Sweep(todo, len(self.variants), wl, results_path=path, log=self.log,
                      progress=self.term.progress, cancel=cancel, host_kwargs=self.kw,
                      base=self.base, slots=self.slots)
        t0 = time.monotonic()
        threads = [threading.Thread(target=sweep.run_host, args=(h, k),
                                    daemon=True, name=f"tune-{h}-{k}") for h, k in sweep.workers(self.hosts)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP (tasks/interrupts.py)
            from ..interrupts import words
            cancel.set()
            self.term.line("", f"{words()}: the sweep stops here; putting back what ran before")
            self.put_back(before, keep="previous", stale=sweep.agents, slots=sweep.slot_agents)
            measured = f"what was measured is in {path}" if path.is_file() else \
                "nothing was measured yet (no results.jsonl)"
            self.term.line("", f"interrupted: {measured} (continue with --resume {self.out})")
            raise Interrupted() from None
        records = old + sweep.records
        self.finish(records, before, sweep, time.monotonic() - t0)

    def finish(self, records, before, sweep, seconds):
        from ..profile import load_profile
        from .variants import tuned_text
        o = self.opts
        if o.slo:
            from .slo import decide
            from .tables import slo_table, slo_inputs
            decision = decide(slo_inputs(records, self.variants), o.load)
            headers, rows = slo_table(records, self.variants, decision, o.load)
        else:
            decision = results.decide(records, self.objective)
            headers, rows = results.table(records, self.variants, o.concurrency, self.objective,
                                          decision)
        tuned = None
        if decision["winner"]:
            winner = next(v for v in self.variants if v.name == decision["winner"])
            tpath = self.out / f"{self.base.path.stem}.tuned.toml"
            write_atomically(str(tpath), tuned_text(self.base, winner, decision["why"], self.out))
            tuned = load_profile(tpath)
        self.write_report(records, decision, headers, rows)
        self.term.line("")
        self.term.table(headers, rows)
        self.term.line("")
        self.term.line("", ("" if decision["tie"] and not o.slo else "winner: " if decision["winner"]
                            else "no winner: ") + decision["why"])
        if o.slo and decision.get("ranges_text"):
            self.term.line("", f"winner per load range ({slo_text(o.slo)}): {decision['ranges_text']}")
        if tuned is not None:
            self.term.line("", f"tuned profile: {tuned.path} (fab deploy --profile {tuned.path})")
        self.term.line("", f"report: {self.out / 'report.html'}; results: "
                           f"{self.out / RESULTS}; sweep took {seconds:.0f} s")
        self.put_back(before, keep=o.keep if tuned is not None else "previous", tuned=tuned)
        if o.json:
            for r in results.latest(records):
                self.term.emit_json(r)
            self.term.emit_json({"winner": decision["winner"], "tie": decision["tie"],
                                 "second": decision["second"], "objective": decision["objective"],
                                 **({"slo": slo_text(o.slo), "load": o.load,
                                     "ranges": decision["ranges"],
                                     "ranges_text": decision["ranges_text"]} if o.slo else {}),
                                 "why": decision["why"], "excluded": decision["excluded"],
                                 "tuned_profile": str(tuned.path) if tuned else None,
                                 "report": str(self.out / "report.html")})
        self._logf.close()
        left = results.missing(self.variants, (None,) if o.slo else o.concurrency, records)
        if sweep.lost and left:
            raise HostUnreachable("host(s) lost during the sweep ("
                                  + "; ".join(f"{h}: {w}" for h, w in sweep.lost.items())
                                  + f"); {len(left)} variant(s) not measured: continue with "
                                    f"--resume {self.out}")
        if not decision["winner"]:
            raise TaskFailed(ExitCode.FAILED)

    def write_report(self, records, decision, headers, rows):
        from .htmlreport import render
        o = self.opts
        load = [("slo", slo_text(o.slo)), ("load", o.load), ("max load", o.max_load)] if o.slo \
            else [("concurrency", ",".join(map(str, o.concurrency)))]
        meta = [("profile", self.base.path.name), ("hosts", ", ".join(self.hosts)),
                *load, ("slots", o.slots), ("requests", o.requests),
                ("max tokens", o.max_tokens), ("repeat", o.repeat), ("seed", o.seed),
                ("written", datetime.datetime.now(datetime.timezone.utc).strftime(
                    "%Y-%m-%d %H:%M UTC"))]
        html = render(title=f"fab tune: {self.base.target.name}", records=records,
                      variants=self.variants, concurrencies=o.concurrency,
                      objective=self.objective, decision=decision, headers=headers, rows=rows,
                      meta=meta, slo=o.slo, load=o.load)
        write_atomically(str(self.out / "report.html"), html)

    def put_back(self, before, *, keep, tuned=None, stale=None, slots=None):
        """Every host back to what ran before (or the winner), in parallel, fresh connections;
        after Ctrl-C also every slot's own deployment (`<name>-s<K>`) stopped."""
        from ..transport.agent import Host
        from ..output import report_error
        from .hosts import put_back, stop_slot

        def one(name):
            host = Host(name, **self.kw)
            try:
                what = put_back(host, self.base, before.get(name), self.log, keep=keep,
                                tuned=tuned, stale_agent=(stale or {}).get(name))
                for (h, k), pid in sorted((slots or {}).items()):
                    if h == name:
                        stop_slot(host, self.base, k, pid, self.log)
                self.term.line(name, f"tune: {what}")
            except LlmfabError as e:
                report_error(self.term, name, e)
                self.term.line(name, "tune: could not put back what ran before; see "
                                     f"{self.out / LOG} and `fab status`")
            finally:
                host.close()
        threads = [threading.Thread(target=one, args=(h,), daemon=True) for h in self.hosts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sys.stdout.flush()
