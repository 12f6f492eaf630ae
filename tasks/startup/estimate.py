"""Start-up profile, client side: the engine's cache directory, the time-left estimate,
the slower-phase WARN, and the words for a start's phases.

The phases themselves are read on the host from the engine's log lines
(tasks/startup/host/phases.py, whose table says which line ends which phase); a release
keeps them as startup.json. Here: what deploy does with them.
"""
import re

# Where each engine keeps what it compiles, as an environment variable naming a
# directory. vLLM hashes its own VLLM_* variables (vllm/envs.py compile_factors) into the
# key of that cache, VLLM_CACHE_ROOT itself excepted; nothing llmfab sets per release
# (LLMFAB_RELEASE) is one of them. SGLang compiles into torch's default inductor
# directory (/tmp/torchinductor_<user>), already shared by every start on the host.
CACHE_ENV = {
    "vllm": {"var": "VLLM_CACHE_ROOT", "source": "vllm/envs.py (VLLM_CACHE_ROOT; ignored by "
                                                  "compile_factors in 0.32.0)"},
}
# The environment vLLM 0.32.0 hashes into its compile cache's key (vllm/envs.py
# compile_factors(): every variable it knows, less an ignore list that holds VLLM_CACHE_ROOT):
# its own VLLM_* ones (a superset: it ignores ~70 of them, e.g. VLLM_CPU_KVCACHE_SPACE,
# VLLM_PORT) and these. Read by running compile_factors() under the real engine; a
# variable llmfab sets per release must be none of them, or every release would compile anew.
VLLM_COMPILE_ENV = {"prefixes": ("VLLM_", "RAY_EXPERIMENTAL_NOSET_", "MOONCAKE_"),
                    "names": ("CMAKE_BUILD_TYPE", "CUDA_HOME", "NVCC_THREADS", "VERBOSE"),
                    "except": ("VLLM_CACHE_ROOT",),
                    "source": "vllm/envs.py compile_factors (0.32.0, 249 factors)"}


def in_vllm_compile_key(name):
    """Whether vLLM keys its compile cache on environment variable `name`."""
    e = VLLM_COMPILE_ENV
    return name not in e["except"] and (name.startswith(e["prefixes"]) or name in e["names"])


_SAFE = re.compile(r"[^A-Za-z0-9._+-]")

# Rules as data: what makes a start's phase worth a WARN.
RULES = [
    {"id": "startup-phase-slower", "severity": "WARN", "ratio": 1.25, "min_s": 5.0,
     "message": "start-up phase {phase} took {now:.1f} s, {prev:.1f} s at the last good start "
                "of this profile and engine version (release {prev_release})",
     "fix": "see what changed on the host (load, disk, model files) with `fab tail-log`; a "
            "compile phase is slower when the engine's compile cache ({cache}) was emptied or "
            "its key changed (engine version, VLLM_* environment)",
     "source": "llmfab: more than 25% and 5 s slower than the previous start"},
]


def cache_env(profile, engine_version):
    """{VAR: path relative to the deployment directory} for launch.py, or {} when the engine
    keeps no compile cache or the profile sets the variable itself."""
    spec = CACHE_ENV.get(profile.server.engine)
    if spec is None:
        return {}
    own = {k for k, _ in profile.server.env} | set(profile.secrets)
    if spec["var"] in own:
        return {}
    version = _SAFE.sub("_", engine_version) if engine_version else "unknown"
    return {spec["var"]: f"cache/{profile.server.engine}-{version}"}


def engine_version(checks):
    """The engine version preflight found on the host (its `engine` check), or None."""
    for c in checks or ():
        if c.get("check") == "engine" and isinstance(c.get("engine"), dict):
            return c["engine"].get("version")
    return None


MIN_RATE_BASE_S = 5.0  # below this much of the previous start, no speed ratio is trusted


class Progress:
    """The phase a start is in and, given the previous start of the same profile and engine
    version, the time left: what that start took from the end of the phase just finished
    to ready, less what has passed since this one finished it, scaled by how fast this start
    has been so far against that one (a busier host is slower in every phase alike).

    The phases come from the host, which parses the log where it lands (the watch's answer
    `startup`: the live phase and the phases ended so far); nothing is parsed here."""

    def __init__(self, engine, previous, version=None):
        """`engine`, `version`: what the host's parser reads the log as (its table's rows for
        them), sent with each watch request."""
        self.engine, self.version = engine or "command", version
        self.previous = previous
        self.current = "process"
        self.ended = 0             # how many phase ends of the host's answer were taken in
        self.done_at = {}          # phase -> elapsed (this side's clock) when its line came
        self.last_done = None

    def feed(self, startup, elapsed):
        """Take in the watch's `startup` answer ({phase, ended}, or None: nothing known yet)."""
        if not startup:
            return self.current
        for p in startup["ended"][self.ended:]:
            self.done_at.setdefault(p, elapsed)
            self.last_done = p
        self.ended = len(startup["ended"])
        self.current = startup["phase"]
        return self.current

    @property
    def phase(self):
        return self.current

    def left(self, elapsed):
        """Seconds left by the previous start, or None without one."""
        prev = self.previous
        if not prev or not prev.get("phases"):
            return None
        total = prev.get("ready_s") or sum(p["seconds"] for p in prev["phases"])
        ends = {}
        for p in prev["phases"]:
            ends[p["phase"]] = p["at"]
        if self.last_done in ends:
            done, before = self.done_at[self.last_done], ends[self.last_done]
            rate = done / before if before >= MIN_RATE_BASE_S and done > 0 else 1.0
            return max(0.0, (total - before) * rate - (elapsed - done))
        return max(0.0, total - elapsed)


def by_phase(phases):
    """{phase: seconds}, an `unaccounted` that appears several times added up."""
    out = {}
    for p in phases or ():
        out[p["phase"]] = out.get(p["phase"], 0.0) + p["seconds"]
    return out


def slower_findings(rec, previous, rules=RULES, cache_dir=None):
    """WARN findings for phases slower than at the previous good start."""
    if not rec or not previous:
        return []
    now, before = by_phase(rec.get("phases")), by_phase(previous.get("phases"))
    out = []
    for rule in rules:
        for phase, secs in now.items():
            prev = before.get(phase)
            if phase == "unaccounted" or prev is None:
                continue
            if secs > prev * rule["ratio"] and secs - prev > rule["min_s"]:
                words = {"phase": phase, "now": secs, "prev": prev,
                         "prev_release": previous.get("release"), "cache": cache_dir or "none"}
                out.append({"rule": rule["id"], "severity": rule["severity"],
                            "message": rule["message"].format(**words),
                            "fix": rule["fix"].format(**words), "source": rule["source"],
                            "evidence": "startup", "phase": phase,
                            "seconds": round(secs, 2), "previous_seconds": round(prev, 2)})
    return out


def summary(rec):
    """One line: each phase and its seconds, and the compile cache. `rec`: a startup.json,
    or a status record (`startup` holds the phases there)."""
    phases = (rec or {}).get("phases") or (rec or {}).get("startup")
    if not phases:
        return None
    parts = [f"{p['phase']} {p['seconds']:.1f}s" for p in phases]
    cache = f"; compile cache {rec['compile_cache']}" if rec.get("compile_cache") else ""
    return f"start-up: {', '.join(parts)}{cache}"


def record(host, profile, ddir, server, facts, engine_version, reporter, log_offset=0,
           cache_before=None):
    """Once ready: the host reads the start's phases from server.log and keeps them in the
    release (startup.json); prints them, and a WARN per phase slower than at the previous
    good start of this profile. Returns (the record, the WARN findings)."""
    ans = host.call("startup", deploy_dir=ddir, release=server["release"], pid=server["pid"],
                    engine=profile.server.engine, engine_version=engine_version,
                    ready_at=facts.get("at"), ready_s=facts.get("seconds"), log_offset=log_offset,
                    cache_before=cache_before)
    rec = ans["startup"]
    line = summary(rec)
    if line:
        reporter.line(host.name, line)
    cache = next(iter(cache_env(profile, engine_version).values()), None)
    found = slower_findings(rec, ans.get("previous"), cache_dir=cache)
    for f in found:
        reporter.line(host.name, f"{f['severity']:<4} {f['rule']} {f['message']}; fix: {f['fix']}")
    return rec, found
