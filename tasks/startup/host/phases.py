"""Start-up phases from the engine's own log lines (host side), kept per release.

A start is cut into phases, each ending at a log line the engine prints (the table
PHASE_LINES below: phase, pattern, engine, versions, and where the wording was read).
llmfab's own times fill the ends: `process` runs from the launch to the engine's first
timestamped line, `ready` from the last line that ends a phase to the moment llmfab saw
the server ready. What no line accounts for is `unaccounted`. Each phase is
{phase, at, seconds}: `at` is when it ended, in seconds after the launch; the seconds of
all phases add up to the time to ready.

A line that states its own duration ("Loading weights took 0.01 seconds") gives the
phase's start; a phase whose line states none starts where the one before it ended. The
phases a container line already counts (kv_cache's "init engine (profile, create kv cache,
warmup model) took" holds the compile and the CUDA graphs) are taken out of it, so no
second is counted twice.

Times come from the lines themselves: vLLM writes "MM-DD HH:MM:SS" (local time, whole
seconds: +0.5 s is the best guess of the true moment), SGLang "[YYYY-MM-DD HH:MM:SS".
Lines without a time (uvicorn's "Application startup complete.") take the time of the
last line that had one. The launch time is the server process's start, read from /proc.

`compile_cache`: "warm" when the log shows the engine found compiled artifacts of an
earlier start (it loaded them, or tried and recompiled on top of the warm inductor
cache), "cold" when it compiled with nothing to start from, None when nothing compiled
(eager mode, a command server).

The readiness watch feeds a Parser the lines it reads (the one reader of the log,
tasks/base/host/startlog.py) and answers its live phase. The op `startup`, once ready, takes
that Parser from the agent's StartLog (reading only lines the watch has not), writes
startup.json beside the log and answers it with the last good start of the same profile and
engine version (`previous`), for the estimate and the slower-phase WARN
(tasks/startup/estimate.py). `startup_last` answers only that
previous start, before a launch. Standard library only; Python >= 3.9.
"""
import hashlib
import os
import re
import time

from ...base.host.layout import releases_sorted
from ...base.host import startlog
from ...base.host.statefiles import expand, read_json, write_json

STARTUP_FILE = "startup.json"
SCAN_BYTES = 32 << 20  # the phase lines come before "ready"

# kind: "took" - the line ends the phase and states its duration (group `s`);
#       "end"  - the line ends the phase (its time); "begin" - the line starts the phase
#                (a later "end" line of the same phase closes it).
# cache: "warm" / "cold" - the line is evidence of the compile cache's state.
# source: where the wording was read (the installed 0.32.0 wheel; SGLang's GitHub tree).
PHASE_LINES = [
    # -- vLLM: the order a start prints them ---------------------------------------------
    {"phase": "engine_start", "kind": "end", "engine": "vllm", "versions": ">=0.8.0",
     "pattern": r"Initializing a V1 LLM engine \(v[^)]*\) with config",
     "source": "vllm/v1/engine/core.py:133 (seen in 0.32.0, CPU build)"},
    {"phase": "worker_start", "kind": "end", "engine": "vllm", "versions": ">=0.8.0",
     "pattern": r"Starting to load model ",
     "source": "vllm/v1/worker/cpu_model_runner.py:68, gpu_model_runner.py (seen in 0.32.0)"},
    {"phase": "weights", "kind": "took", "engine": "vllm", "versions": ">=0.6.0",
     "pattern": r"Loading weights took (?P<s>\d+(?:\.\d+)?) seconds",
     "source": "vllm/model_executor/model_loader/default_loader.py:501 (seen in 0.32.0)"},
    {"phase": "weights", "kind": "took", "engine": "vllm", "versions": ">=0.6.0",
     "pattern": r"Model loading took \S+ GiB (?:memory )?and (?P<s>\d+(?:\.\d+)?) seconds",
     "source": "vllm/v1/worker/gpu_model_runner.py:5150 (0.32.0; GPU runner only, the CPU "
               "runner never prints it); 0.26.0 on an H200: 'Model loading took 0.0 GiB and "
               "1.601510 seconds' (V2 runner, vllm/v1/worker/gpu/model_runner.py:305), "
               "'... GiB memory and ...' (V1 runner)"},
    {"phase": "compile", "kind": "begin", "engine": "vllm", "versions": ">=0.10.0",
     "pattern": r"Warming up model for the compilation\.\.\.",
     "source": "vllm/v1/worker/cpu_model_runner.py:87 (seen in 0.32.0, CPU build)"},
    {"phase": "compile", "kind": "end", "engine": "vllm", "versions": ">=0.10.0",
     "pattern": r"Warming up done\.",
     "source": "vllm/v1/worker/cpu_model_runner.py:91 (seen in 0.32.0, CPU build)"},
    {"phase": "compile", "kind": "begin", "engine": "vllm", "versions": ">=0.12.0",
     "pattern": r"Starting torch\.compile$",
     "source": "vllm/compilation/monitor.py:40 (0.32.0; VLLM_COMPILE mode, GPU)"},
    {"phase": "compile", "kind": "took", "engine": "vllm", "versions": ">=0.10.0",
     "pattern": r"torch\.compile (?:and initial profiling/warmup run together )?took "
                r"(?P<s>\d+(?:\.\d+)?) s in total",
     "source": "vllm/compilation/monitor.py:20, decorators.py:708 (0.32.0; older releases: "
               "'torch.compile takes X s in total')"},
    {"phase": "compile", "kind": "took", "engine": "vllm", "versions": "<0.12.0",
     "pattern": r"torch\.compile takes (?P<s>\d+(?:\.\d+)?) s in total",
     "source": "vllm/compilation/monitor.py (0.8-0.11 wording)"},
    {"phase": "cuda_graphs", "kind": "begin", "engine": "vllm", "versions": ">=0.6.0",
     "pattern": r"Capturing (?:\w+ )?CUDA graphs",
     "source": "vllm/v1/worker/gpu_model_runner.py:6657 (0.32.0: the capture's progress bar)"},
    {"phase": "cuda_graphs", "kind": "took", "engine": "vllm", "versions": ">=0.6.0",
     "pattern": r"Graph capturing finished in (?P<s>\d+(?:\.\d+)?) secs?",
     "source": "vllm/v1/worker/gpu_model_runner.py:6582 (0.32.0; GPU only)"},
    # The V2 model runner's kernel warm-up (warmup_kernels: execute_model + sample_tokens to
    # JIT the Triton kernels): no line of its own, 16 s cold on an H200, between these two
    {"phase": "kernel_warmup", "kind": "begin", "engine": "vllm", "versions": ">=0.26.0",
     "pattern": r"Free memory on device \(",
     "source": "vllm/v1/worker/gpu_worker.py:857 (seen in 0.26.0 on an H200: 'Free memory on "
               "device (139.29/139.8 GiB) on startup')"},
    {"phase": "kernel_warmup", "kind": "end", "engine": "vllm", "versions": ">=0.26.0",
     "pattern": r"Kernel JIT monitor activated",
     "source": "vLLM jit_monitor.py:79, as its log line names it (seen in 0.26.0 on an H200: 'Kernel JIT monitor "
               "activated; monitored JIT compilations during inference will use mode=warn.')"},
    {"phase": "kv_cache", "kind": "took", "engine": "vllm", "versions": ">=0.8.0",
     "pattern": r"init engine \(profile, create kv cache, warmup model\) took "
                r"(?P<s>\d+(?:\.\d+)?) s(?:econds)?",
     "contains": ["compile", "cuda_graphs", "kernel_warmup"],
     "source": "vllm/v1/engine/core.py:386-403 (seen in 0.32.0: 'took 1.48 s')"},
    {"phase": "api_server", "kind": "end", "engine": "vllm", "versions": ">=0.8.0",
     "pattern": r"Starting vLLM (?:API )?server (?:\d+ )?on ",
     "source": "vllm/entrypoints/launchers/api_server/entry.py:140 (0.32.0: 'Starting vLLM "
               "server on'; older: 'Starting vLLM API server 0 on')"},
    {"phase": "api_server", "kind": "end", "engine": "vllm", "versions": "",
     "pattern": r"Application startup complete\.",
     "source": "uvicorn (no time of its own; seen in 0.32.0)"},
    # evidence of the compile cache (vllm/compilation/decorators.py, backends.py in 0.32.0)
    {"phase": None, "cache": "warm", "engine": "vllm", "versions": ">=0.10.0",
     "pattern": r"Compiling model again due to a load failure from |Directly load AOT "
                r"compilation from path|Directly load the compiled graph",
     "source": "vllm/compilation/decorators.py:334 (seen in 0.32.0: the AOT reload fails, "
               "the inductor cache is warm), backends.py:296"},
    {"phase": None, "cache": "cold", "engine": "vllm", "versions": ">=0.10.0",
     "pattern": r"saved AOT compiled function to |Compiling a graph for compile range",
     "source": "vllm/compilation/decorators.py:743 (seen in 0.32.0), backends.py:399"},
    # -- SGLang (python/sglang/srt/...) ---------------------------------------------------
    {"phase": "weights", "kind": "begin", "engine": "sglang", "versions": "",
     "pattern": r"Load weight begin\.",
     "source": "sglang srt/model_executor/model_runner.py (load_model)"},
    {"phase": "weights", "kind": "took", "engine": "sglang", "versions": "",
     "pattern": r"Load weight end\. elapsed=(?P<s>\d+(?:\.\d+)?) s",
     "source": "sglang srt/model_executor/model_runner.py (load_model, newer wording)"},
    {"phase": "weights", "kind": "end", "engine": "sglang", "versions": "",
     "pattern": r"Load weight end\. type=",
     "source": "sglang srt/model_executor/model_runner.py (load_model, older wording)"},
    {"phase": "kv_cache", "kind": "end", "engine": "sglang", "versions": "",
     "pattern": r"KV Cache is allocated\. #tokens|Memory pool end\.",
     "source": "sglang srt/mem_cache/memory_pool.py, model_runner.py (init_memory_pool)"},
    {"phase": "cuda_graphs", "kind": "took", "engine": "sglang", "versions": "",
     "pattern": r"Capture (?:cuda|target decode CUDA) graph end\. (?:Time elapsed: |elapsed=)"
                r"(?P<s>\d+(?:\.\d+)?) ?s",
     "source": "sglang srt/model_executor/model_runner.py (init_device_graphs; renamed in "
               "nightlies after v0.5.10)"},
    {"phase": "api_server", "kind": "end", "engine": "sglang", "versions": "",
     "pattern": r"Application startup complete\.|Uvicorn running on ",
     "source": "uvicorn, under sglang srt/entrypoints/http_server.py"},
    {"phase": "warmup", "kind": "end", "engine": "sglang", "versions": "",
     "pattern": r"The server is fired up and ready to roll!",
     "source": "sglang srt/entrypoints/http_server.py (_wait_and_warmup)"},
]
ORDER = ["process", "engine_start", "worker_start", "weights", "compile", "cuda_graphs",
         "kernel_warmup", "kv_cache", "api_server", "warmup", "ready"]

_VLLM_TIME = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)"
                        r"(?:\.(\d+))? \[")
_SGLANG_TIME = re.compile(r"^\[(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?[\] ]")
_COMPILED = {}


def rules(engine, version=None):
    """The table's rows for `engine` at `version` (None: not known, every row of the engine),
    patterns compiled (once per process)."""
    key = (engine, version)
    if key not in _COMPILED:
        from ...doctor.host import versions
        _COMPILED[key] = [dict(r, rx=re.compile(r["pattern"])) for r in PHASE_LINES
                          if r["engine"] == engine and (version is None or versions.parse(version) is None
                                                        or versions.in_range(version, r["versions"]))]
    return _COMPILED[key]


def line_time(line, year):
    """Epoch seconds of the time the line carries (local time), or None."""
    m = _SGLANG_TIME.match(line)
    if m:
        y, mo, d, h, mi, s, frac = m.groups()
        y = int(y)
    else:
        m = _VLLM_TIME.search(line)
        if m is None:
            return None
        mo, d, h, mi, s, frac = m.groups()
        y = year
    try:
        t = time.mktime((int(y), int(mo), int(d), int(h), int(mi), int(s), 0, 0, -1))
    except (OverflowError, ValueError):
        return None
    return t + (float("0." + frac) if frac else 0.5)


class Parser:
    """Fed lines in log order, collects the events that end (or begin) phases."""

    def __init__(self, engine, launched_at, version=None):
        self.engine, self.launched_at = engine, launched_at
        self.year = time.localtime(launched_at).tm_year
        self.rules = rules(engine, version)
        self.events = []      # (phase, kind, t, seconds, rule)
        self.first = None     # time of the first timestamped line
        self.last_t = None
        self.cache = None
        self.current = "process"
        self.left = set()     # phases the live line has shown and left: it never goes back
        # the live phase after a line: the next one of the engine's that is nobody's part
        # (compile and CUDA graphs happen inside kv_cache: their own lines announce them)
        inner = {p for r in self.rules for p in r.get("contains") or ()}
        self.order = [p for p in ORDER if p in ("process", "ready")
                      or any(r["phase"] == p for r in self.rules) and p not in inner]

    def feed(self, text):
        return self.feed_lines(text.splitlines())

    def feed_lines(self, lines, final=False):
        """Lines in log order (a StartLog consumer, tasks/base/host/startlog.py); returns the
        live phase."""
        if not self.rules:  # a command server: no lines of its are known
            return self.current
        for line in lines:
            t = line_time(line, self.year)
            if t is not None:
                if t < self.launched_at - 86400 * 180:  # a log written across New Year
                    t = line_time(line, self.year + 1)
                if self.first is None:
                    self.first = t
                    self.move(self.order[1])
                self.last_t = t if self.last_t is None else max(self.last_t, t)
            for r in self.rules:
                m = r["rx"].search(line)
                if m is None:
                    continue
                if r.get("cache"):
                    # a load attempt is the stronger evidence: once warm, stays warm
                    if self.cache != "warm":
                        self.cache = r["cache"]
                    continue
                when = self.last_t if self.last_t is not None else self.launched_at
                secs = float(m.group("s")) if "s" in m.groupdict() and m.group("s") else None
                self.events.append((r["phase"], r["kind"], when, secs, r))
                self.move(self.next_phase(r["phase"], r["kind"]))
                break
        return self.current

    def ended(self):
        """The phases whose lines ended them so far, one per such line, in log order: what the
        watch answers, for the client's time-left estimate."""
        return [e[0] for e in self.events if e[1] != "begin"]

    def move(self, phase):
        """The live phase goes on to `phase`, never back to one it has left (the end of a phase
        inside kv_cache, or a drafter's second "Starting to load model", keeps it where it is)."""
        if phase != self.current and phase not in self.left:
            self.left.add(self.current)
            self.current = phase

    def next_phase(self, phase, kind):
        """The phase a start is in after a line of `kind` about `phase`."""
        if kind == "begin":
            return phase
        if phase not in self.order:  # a phase inside another: that one goes on
            return next((r["phase"] for r in self.rules if phase in (r.get("contains") or ())),
                        phase)
        i = self.order.index(phase)
        return self.order[i + 1] if i + 1 < len(self.order) else phase


def phases(parser, ready_at):
    """[{phase, at, seconds}] from launch to ready_at (epoch seconds, the host's clock)."""
    t0 = parser.launched_at
    out = []

    def add(phase, end, seconds):
        seconds = max(0.0, seconds)
        if out and out[-1]["phase"] == phase:
            out[-1]["at"] = end - t0
            out[-1]["seconds"] += seconds
        elif seconds > 0 or phase != "unaccounted":  # a phase seen stays, even at 0 s
            out.append({"phase": phase, "at": end - t0, "seconds": seconds})

    cursor = t0
    if parser.first is not None:
        cursor = min(max(parser.first, t0), ready_at)
        add("process", cursor, cursor - t0)
    begins, nested, last = {}, [], None
    for phase, kind, t, secs, rule in parser.events:
        if kind == "begin":
            begins.setdefault(phase, t)
            continue
        if last and last[0] == phase and out and out[-1]["phase"] == phase and secs is not None:
            # a second line about the same phase covers the first ("Model loading took" holds
            # "Loading weights took"): measure both from where the first one started
            out.pop()
            cursor = last[1]
            secs = max(secs, t - cursor)
        start_hint = begins.pop(phase, None)
        if secs is None and start_hint is not None:
            secs = t - start_hint
        if any(phase in (r["contains"] or ()) for r in _containers(parser)):
            nested.append((phase, t, secs))
            continue
        inner = []
        if rule.get("contains"):
            inner, nested = nested, []
        else:
            for n in nested:  # no container line came: they count on their own
                cursor = _span(add, cursor, n[0], n[1], n[2], [], ready_at)
            nested = []
        cursor = _span(add, cursor, phase, t, secs, inner, ready_at)
        last = (phase, cursor - out[-1]["seconds"]) if out and out[-1]["phase"] == phase else None
    for n in nested:
        cursor = _span(add, cursor, n[0], n[1], n[2], [], ready_at)
    add("ready", ready_at, ready_at - cursor)
    return _once(out)


def _once(spans):
    """Each phase once, in the place it first took: a phase that comes back (a drafter's
    weights after the target's, a gap no line accounts for on both sides of one) adds its
    seconds there (its `at` stays where that first span ended, so the line keeps its order).
    The total stays the time to ready."""
    out = {}
    for p in spans:
        if p["phase"] in out:
            out[p["phase"]]["seconds"] += p["seconds"]
        else:
            out[p["phase"]] = dict(p)
    for p in out.values():
        p["at"], p["seconds"] = round(p["at"], 2), round(p["seconds"], 2)
    return list(out.values())


def _containers(parser):
    return [r for r in parser.rules if r.get("contains")]


def _span(add, cursor, phase, end, secs, inner, ready_at):
    """Add `phase` ending at `end` (its own `secs`, or from the cursor), after any gap as
    unaccounted, with the `inner` phases it holds taken out of it. Returns the new cursor."""
    end = min(max(end, cursor), ready_at)
    start = cursor if secs is None else min(max(end - secs, cursor), end)
    add("unaccounted", start, start - cursor)
    span = end - start
    inner_total = sum(s or 0.0 for _, _, s in inner)
    scale = min(1.0, span / inner_total) if inner_total > 0 else 1.0
    for name, t, s in inner:
        add(name, min(max(t, start), end), (s or 0.0) * scale)
    add(phase, end, span - inner_total * scale)
    return end


# -- the host's facts ------------------------------------------------------------------
def process_started(pid):
    """Epoch seconds at which process `pid` started (from /proc), or None."""
    try:
        with open("/proc/%d/stat" % int(pid)) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, TypeError):
        return None
    return time.time() - uptime + int(fields[19]) / ticks


def _sha256(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def compile_cache(from_log, before):
    """warm | cold | None: the log's evidence (a load, or a compile from nothing), warm also
    when the cache directory held compiled artifacts before the launch (the engine compiled
    again on top of them: vLLM 0.32.0's inductor cache, its AOT artifact removed); None when
    nothing compiled."""
    if from_log == "cold" and before == "warm":
        return "warm"
    return from_log


def cache_state(path):
    """"warm" when `path` (the engine's cache directory) holds compiled artifacts, else
    "cold", None without a path."""
    if not path:
        return None
    root = os.path.join(path, "torch_compile_cache")
    try:
        for _dir, _dirs, files in os.walk(root):
            if files:
                return "warm"
    except OSError:
        pass
    return "cold"


ANY = "any"


def previous(ddir, release, profile_sha, engine_version, prefer=ANY):
    """The newest earlier start (startup.json) of the same profile and engine version that
    got ready; with `prefer` (a compile_cache state), the newest in that state if any."""
    found = []
    for name in reversed(releases_sorted(ddir)):
        if name == release:
            continue
        rec = read_json(os.path.join(ddir, "releases", name, STARTUP_FILE))
        if not rec or not rec.get("phases") or rec.get("profile_sha256") != profile_sha \
                or rec.get("engine_version") != engine_version:
            continue
        found.append(rec)
    for rec in found:
        if prefer == ANY or rec.get("compile_cache") == prefer:
            return rec
    return found[0] if found else None


def _release_dir(deploy_dir, release):
    ddir = expand(deploy_dir)
    return ddir, os.path.join(ddir, "releases", release)


def op_startup_last(deploy_dir, release, engine_version=None, cache_dir=None):
    """Before a launch: the previous start of this profile and engine version (or None),
    and whether the engine's cache directory (`cache_dir`, relative to the deployment) is
    warm now. Never fails (it runs in the deploy's batch before the launch, which a failure
    would stop): unreadable is None."""
    try:
        return _startup_last(deploy_dir, release, engine_version, cache_dir)
    except Exception as e:  # noqa: BLE001 - an estimate is not worth a failed deploy
        return {"previous": None, "expect_cache": None, "error": str(e)}


def _startup_last(deploy_dir, release, engine_version, cache_dir):
    ddir, rdir = _release_dir(deploy_dir, release)
    expect = cache_state(cache_dir and os.path.join(ddir, cache_dir))
    sha = _sha256(os.path.join(rdir, "profile.toml"))
    return {"previous": previous(ddir, release, sha, engine_version, prefer=expect), "expect_cache": expect}


def version_of(rdir, version):
    """`version`, else (a relaunch, rollback: the client does not know it) the one the
    release's first start recorded."""
    if version is None:
        version = (read_json(os.path.join(rdir, STARTUP_FILE)) or {}).get("engine_version")
    return version


def parser_of(log, engine, version, launched_at):
    """The Parser of `log` (a StartLog) for this engine and version, made with `launched_at`
    (epoch s, a callable) if the log has none yet."""
    return log.consumer(("phases", engine, version), lambda: Parser(engine, launched_at(), version))


def op_startup(deploy_dir, release, pid, engine="command", engine_version=None, ready_at=None,
               ready_s=None, launched_at=None, log_offset=None, cache_before=None):
    """Once ready: the release's start-up phases from its server.log (from log_offset; what the
    watch read of it already parsed), kept as startup.json; with the previous start of the same
    profile and engine version. `launched_at` (else the process's start, else ready_at -
    ready_s) begins the first phase."""
    ddir, rdir = _release_dir(deploy_dir, release)
    ready_at = float(ready_at or time.time())
    engine = engine or "command"
    version = version_of(rdir, engine_version)
    given = launched_at

    def started():
        at = given or process_started(pid)
        return ready_at - float(ready_s or 0.0) if at is None else at

    if engine == "command":
        parser = Parser(engine, started(), version)
    else:
        log = startlog.of(os.path.join(rdir, "server.log"), log_offset)
        parser = parser_of(log, engine, version, started)
        log.read_to(None, limit=max(0, SCAN_BYTES - (log.offset - log.start)))
    launched = parser.launched_at
    rec = {"release": release, "engine": engine, "engine_version": version,
           "profile_sha256": _sha256(os.path.join(rdir, "profile.toml")),
           "launched_at": round(launched, 3), "ready_at": round(ready_at, 3),
           "ready_s": round(ready_at - launched, 2),
           "phases": phases(parser, ready_at) if engine != "command" else [],
           "compile_cache": compile_cache(parser.cache, cache_before)}
    write_json(os.path.join(rdir, STARTUP_FILE), rec)
    prev = previous(ddir, release, rec["profile_sha256"], rec["engine_version"])
    return {"startup": rec, "previous": prev}
