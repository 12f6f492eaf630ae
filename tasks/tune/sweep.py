"""Running a sweep: the hosts share the variants, one variant at a time on each host.

Each host takes the next variant from one queue and, on its own connection (which holds
the deployment's lock all along), measures it:

1. deploy it exactly as `fab deploy` does (tasks/deploy.py deploy_host: lock, preflight and
   the doctor's rules, a new release, launch, wait until ready). A preflight FAIL skips the
   variant with its finding; a server that fails to start is recorded with its `fatal`
   explanation (the wait already stopped it); the sweep goes on either way.
2. bench it exactly as `fab bench` does (tasks/bench.py measure_once: one warm-up request,
   the measured window, /metrics before and after, the doctor's verdict over the window),
   at each concurrency, `repeat` times, the same seeded prompts every time;
3. stop it (tasks/steps/shutdown.py, GPU memory back to its baseline).

So H alike hosts take about 1/H of the time. Ctrl-C sets `cancel`: every host call made
after it raises Cancelled (a BaseException, so no clean-up path in between runs: the task
body restores what ran before on fresh connections, ending these agents).
"""
import os
import threading
import time

from ..transport.agent import ConnectionLost, Host
from ..errors import HostUnreachable, LlmfabError, OperationFailed, PreflightFailed
from . import results


class Cancelled(BaseException):
    """Ctrl-C: this host's worker must do nothing more."""


class SweepHost(Host):
    """A Host whose every request first checks the sweep's cancel event."""

    def __init__(self, name, cancel, **kw):
        super().__init__(name, **kw)
        self.cancel = cancel

    def _check(self):
        if self.cancel.is_set():
            raise Cancelled()

    def start(self):
        self._check()
        return super().start()

    def call(self, op, timeout=None, **kw):
        self._check()
        return super().call(op, timeout=timeout, **kw)

    def put(self, data, path, mode=0o644):
        self._check()
        return super().put(data, path, mode)


class Workload:
    """What every variant is measured with: concurrencies, requests, max_tokens, repeat, and
    the seeded prompts (tasks/measure/workload.py), sent greedy (temperature 0) so each variant
    generates the same text and acceptance compares like with like. vLLM and SGLang are also
    asked to ignore end-of-sequence (`ignore_eos`, both servers' own request field, as
    `vllm bench serve --ignore-eos` does): every request yields max_tokens, so each variant
    generates as much and its drafts are enough for the doctor's verdict."""

    def __init__(self, concurrency, requests, max_tokens, repeat, prompts, engine="vllm",
                 slo=None):
        self.concurrency, self.requests, self.max_tokens = concurrency, requests, max_tokens
        self.repeat, self.prompts = repeat, prompts
        self.slo = slo  # a capacity.SloPlan under --slo: each variant's capacity is searched
        self.sampling = {"temperature": 0.0}
        if engine in ("vllm", "sglang"):
            self.sampling["ignore_eos"] = True

    def request(self, c):
        return {"requests": self.requests, "concurrency": c, "max_tokens": self.max_tokens,
                "sampling": dict(self.sampling)}


class Sweep:
    """The queue, the progress, and the records as they come (appended to results.jsonl)."""

    def __init__(self, todo, total, workload, *, results_path, log, progress, cancel, host_kwargs,
                 base=None, slots=None):
        self.todo = list(todo)           # [(variant, [concurrency, ...])]
        self.total = total               # variants in the whole sweep (the "of N")
        self.workload = workload
        self.results_path = results_path
        self.log = log                   # Reporter into the sweep's log file: every detail
        self.progress = progress         # callable(host, phase, text) for the terminal
        self.cancel = cancel
        self.host_kwargs = host_kwargs
        self.records = []
        self.hosts = {}                  # name -> SweepHost
        self.agents = {}                 # name -> the agent pid of its worker's connection
        self.lost = {}                   # name -> why the host was given up
        self.durations = []              # seconds per variant done
        self.started = time.monotonic()
        self.base = base                 # the sweep's profile (slot deployments are named from it)
        self.slots = slots or {}         # host -> [[gpu indices] per slot]; none: one slot as the profile says
        self.slot_agents = {}            # (host, slot) -> agent pid, slots 1.. (slot 0 is `agents`)
        self._lock = threading.Lock()
        self._done_count = total - len(self.todo)

    # -- the queue -------------------------------------------------------------------------
    def _next(self):
        with self._lock:
            return self.todo.pop(0) if self.todo else None

    def _record(self, recs):
        import json
        with self._lock:
            self.records += recs
            from ..base.host.safefile import open_append
            with os.fdopen(open_append(str(self.results_path)), "a", encoding="utf-8") as f:
                for r in recs:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")

    def time_left(self):
        """Seconds left, from the mean time per variant so far and the hosts at work."""
        with self._lock:
            if not self.durations:
                return None
            left = len(self.todo) + sum(1 for _ in self.hosts) - len(self.lost)
            per = sum(self.durations) / len(self.durations)
            workers = max(1, len(self.hosts) - len(self.lost))
        return max(0.0, per * left / workers)

    def say(self, host, variant, phase):
        elapsed = time.monotonic() - self.started
        left = self.time_left()
        text = (f"variant {variant.index} of {self.total} ({variant.name}): {phase}, "
                f"elapsed {clock(elapsed)}" + (f", about {clock(left)} left" if left is not None
                                               else ""))
        self.log.line(host, text)
        self.progress(host, f"{variant.index}:{phase.split(' ')[0]}", text)

    # -- one host --------------------------------------------------------------------------
    def workers(self, hosts):
        """[(host, slot)]: one worker per host, or per slot of a host under --slots."""
        return [(h, k) for h in hosts for k in (range(len(self.slots[h])) if self.slots.get(h) else [None])]

    def run_host(self, name, slot=None):
        host = SweepHost(name, self.cancel, **self.host_kwargs)
        key = name if not slot else f"{name}#{slot}"
        self.hosts[key] = host
        try:
            hello = host.start()
            if slot:
                self.slot_agents[(name, slot)] = hello.get("pid")
            else:
                self.agents[name] = hello.get("pid")
            while True:
                item = self._next()
                if item is None:
                    return
                t0 = time.monotonic()
                try:
                    self.measure(host, *item, slot=slot)
                except (HostUnreachable, ConnectionLost) as e:
                    with self._lock:
                        self.todo.insert(0, item)  # another host takes it
                    raise e
                with self._lock:
                    self.durations.append(time.monotonic() - t0)
        except Cancelled:
            return
        except LlmfabError as e:
            self.log.line(name, f"error: {e.message}")
            if self.cancel.is_set():  # Ctrl-C: what ended the call is the interrupt, said once
                return
            self.lost[name] = e.message.splitlines()[0]
            self.progress(name, "lost", f"host given up: {self.lost[name]}")
        finally:
            if not self.cancel.is_set():  # Ctrl-C: the put-back ends this agent itself
                host.close()

    def measure(self, host, variant, concurrencies, slot=None):
        """Measure one variant on one host (in one of its slots); its records
        (tasks/tune/results.py) are written before the stop, so a stop that fails loses
        nothing measured."""
        from ..bench import measure_once
        from ..deploy import deploy_host
        from ..options import DeployOptions
        from ..steps.preflight import deploy_dir
        from ..steps.shutdown import stop_deployment
        profile, name, log = variant.profile, host.name, self.log
        if slot is not None:
            from .slots import slot_profile
            profile = slot_profile(variant, slot, self.slots[name][slot], self.base)
        ddir = deploy_dir(profile)
        say = self.say if slot is None else (
            lambda h, v, phase: self.say(h, v, f"{phase} (slot {slot}, GPUs "
                                               f"{','.join(map(str, self.slots[name][slot]))})"))

        def skipped(status, why, release=None):
            return [results.not_measured(variant.name, variant.settings, name, release, c,
                                         status, why) for c in concurrencies]
        say(name, variant, "deploy")
        opts = DeployOptions(stop_on_timeout=True)
        try:
            res = deploy_host(host, profile, opts, log, restore=False)  # a failed variant is recorded
        except (HostUnreachable, ConnectionLost):
            raise
        except PreflightFailed as e:
            fails = [c for c in getattr(e, "checks", []) if c["status"] == "FAIL"]
            first = fails[0] if fails else {"check": "preflight", "message": e.message}
            finding = first.get("finding") or {"rule": first["check"], "message": first["message"]}
            say(name, variant, f"skipped: preflight FAIL: {finding.get('rule')}")
            return self._record(skipped("skipped", {"finding": finding}))
        except OperationFailed as e:
            fatal = getattr(e, "fatal", None)
            release = (getattr(e, "server", None) or {}).get("release")
            say(name, variant, "failed to start" + (f": {fatal['rule']}" if fatal else ""))
            why = {"fatal": fatal} if fatal else {"error": e.message.splitlines()[0]}
            return self._record(skipped("failed", why, release))
        release = res.data["release"]
        out = []
        try:
            state = host.call("state", deploy_dir=ddir)
            server = state.get("server") or {}
            port = server.get("port") or profile.server.port
            if self.workload.slo is not None:
                out.append(self.capacity(host, variant, profile, log, port, server, ddir, release,
                                         lambda phase: say(name, variant, phase)))
            for c in (concurrencies if self.workload.slo is None else ()):
                runs = []
                for n in range(self.workload.repeat):
                    say(name, variant, f"bench concurrency {c}, run {n + 1} of "
                                            f"{self.workload.repeat}")
                    rec, _raw = measure_once(host, profile, log, port, self.workload.prompts,
                                             self.workload.request(c), server, ddir)
                    rec.pop("_verdict_lines", None)
                    runs.append(rec)
                out.append(results.measured(variant.name, variant.settings, name, release, c, runs))
        except (HostUnreachable, ConnectionLost):
            raise
        except OperationFailed as e:
            say(name, variant, "bench failed")
            done = {r["concurrency"] for r in out}
            out += [r for r in skipped("failed", {"error": e.message.splitlines()[0]}, release)
                    if r["concurrency"] not in done]
        self._record(out)
        say(name, variant, "stop")
        stop_deployment(host, ddir, log)


    def capacity(self, host, variant, profile, log, port, server, ddir, release, say):
        """The variant's capacity record under --slo (tasks/tune/capacity.py)."""
        from ..bench import measure_once
        from . import capacity
        plan = self.workload.slo

        def bench(req):
            return measure_once(host, profile, log, port, self.workload.prompts,
                                req, server, ddir)

        def summarize(load, runs):
            rec = results.measured(variant.name, variant.settings, host.name, release,
                                   load if plan.kind == "concurrency" else None, runs)
            if plan.kind == "rate":
                rec["request_rate"] = load
            return rec
        points, cap, step = capacity.search(bench, plan, self.workload, say, summarize)
        base = {"variant": variant.name, "settings": variant.settings, "host": host.name,
                "release": release, "concurrency": None, "status": "measured"}
        rec = capacity.variant_record(base, plan, points, cap, step, variant_k(variant))
        say(f"capacity {cap:g} ({plan.kind}), goodput "
            + (f"{rec['goodput']:.1f} tok/s" if rec["goodput"] is not None else "-"))
        return rec


def variant_k(variant):
    """The variant's number of draft tokens (None: no speculation), for the tie rule."""
    spec = variant.profile.server.flags.speculative
    if spec is None:
        return None
    k = spec.num_speculative_tokens
    try:
        return int(k)
    except (TypeError, ValueError):
        return 0


def clock(seconds):
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
