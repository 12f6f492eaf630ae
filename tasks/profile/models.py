"""The models a profile names, as the model-aware preflight checks them. Pure; no I/O.

`models_request(server)` returns the `models` section of the preflight request; the
host (tasks/steps/host/modelcheck.py) reads each model directory's config.json and runs
the checks, and the doctor's request (tasks/doctor/host_request.py) starts from it. It is
built once, with the Server (tasks/profile/types.py), as `profile.server.models`: every
reader asks that. Every value carries the profile key it came from, so a host-side message
can say which line of the profile to change.

Only absolute paths are model directories here (the same rule as the path checks in
ServerArgs.model_paths); a Hugging Face id such as "Qwen/Qwen3.6-27B" is fetched by
the engine itself and cannot be read beforehand. The flags come from `server.flags`
(tasks/profile/serverargs.py), where [server.args] is read once. This module imports
nothing from the package: tasks/profile/types.py builds on it.
"""
# SGLang's --speculative-algorithm (checked case-insensitively by SGLang) -> vLLM's method names.
SGLANG_ALGORITHMS = {"eagle": "eagle", "eagle3": "eagle3", "nextn": "mtp", "dflash": "dflash",
                     "standalone": "draft_model"}
TP_FLAGS = {"vllm": ("tensor-parallel-size", "tp"), "sglang": ("tp-size", "tp", "tensor-parallel-size")}
CONTEXT_FLAGS = {"vllm": ("max-model-len",), "sglang": ("context-length",)}


def _int(value):
    """An int from an int or a decimal string (vLLM's parser accepts "15"); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _length(value):
    """max-model-len as vLLM reads it: 65536, "64k" (x1000), "64K" (x1024), "1m", "1M"."""
    if isinstance(value, str) and value[-1:] in ("k", "K", "m", "M") and value[:-1].isdigit():
        scale = {"k": 1000, "K": 1024, "m": 1000 ** 2, "M": 1024 ** 2}[value[-1]]
        return int(value[:-1]) * scale
    return _int(value)


def _absolute(path):
    return path if isinstance(path, str) and path.startswith("/") else None


def models_request(server):
    """The `models` section of the preflight request for a Server (tasks/profile/types.py;
    its `flags` and `environ` already read), or None when there is nothing to read.

    Keys: engine, target, draft (absolute dirs or None), method (lower case, vLLM's names),
    spec_tokens {value, key, over}: tokens drafted per step and how far past
    `block_size - 1` the key may go (SGLang's speculative-num-draft-tokens counts the
    anchor too), max_model_len {value, key}, tp {value, key}, v2_runner (bool), keys {...}
    naming where target/draft/method came from.
    """
    s = server
    if s.engine not in ("vllm", "sglang"):
        return None
    args = s.flags
    keys = {"target": "server.model"}
    draft = method = None
    spec_tokens = None
    if s.engine == "vllm":
        spec = args.speculative
        if spec is not None:
            draft = _absolute(spec.model)
            keys["draft"] = spec.key_of("model")
            keys["method"] = spec.key_of("method")
            method = spec.method.lower() if spec.method is not None else None
            if method is None and spec.model is not None:
                # vLLM's own detection when no method is given (vllm/config/speculative.py).
                low = spec.model.lower()
                method = ("eagle" if "eagle-" in low else "eagle3" if "eagle3" in low
                          else "dflash" if "dflash" in low else None)
            n = spec.tokens
            if n is not None:
                spec_tokens = {"value": n, "key": spec.key_of("num_speculative_tokens"), "over": 0}
    else:
        draft = _absolute(args.value("speculative-draft-model-path"))
        if args.has("speculative-draft-model-path"):
            keys["draft"] = args.key("speculative-draft-model-path")
        algo = args.value("speculative-algorithm")
        if isinstance(algo, str):
            method = SGLANG_ALGORITHMS.get(algo.lower(), algo.lower())
            keys["method"] = args.key("speculative-algorithm")
        n = _int(args.value("speculative-num-draft-tokens"))
        if n is not None:
            spec_tokens = {"value": n, "key": args.key("speculative-num-draft-tokens"), "over": 1}
    target = _absolute(s.model)
    if target is None and draft is None:
        return None
    ctx, tp = args.value(*CONTEXT_FLAGS[s.engine]), args.value(*TP_FLAGS[s.engine])
    cname, tname = args.key(*CONTEXT_FLAGS[s.engine]), args.key(*TP_FLAGS[s.engine])
    return dict(
        engine=s.engine, target=target, draft=draft, method=method, keys=keys,
        spec_tokens=spec_tokens,
        max_model_len={"value": _length(ctx), "key": cname} if _length(ctx) else None,
        tp={"value": _int(tp), "key": tname} if _int(tp) else None,
        v2_runner=s.engine == "vllm" and bool(s.environ.v2_runner),
    )
