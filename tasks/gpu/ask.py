"""What an engine will ask of each GPU at start-up, known before the launch (`fab check`, deploy
and tune's preflight FAIL when a device has less free).

Each engine checks free memory against a fraction of the WHOLE device as it starts, and dies
on it 30-90 s later; the preflight makes the same comparison at once, with both numbers and
the largest fraction that fits. The table holds each engine's flag, its default, and where the
engine checks it. `[gpu] min_free_mib` is the same check in MiB for any engine.
"""
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class MemoryAsk:
    engine: str
    flag: str                  # the [server.args] key
    default: Optional[float]   # the engine's own default; None: it sizes itself (no check)
    source: str


ASKS = (
    MemoryAsk("vllm", "gpu-memory-utilization", 0.9,
              "vLLM's worker compares free memory at start-up with gpu-memory-utilization x the device's "
              "total and stops with \"Free memory on device cuda:N (F/T GiB) on startup is less than "
              "desired GPU memory utilization (U, X GiB)\" (vllm/v1/worker/utils.py, seen in vLLM 0.26.0 "
              "on an H200; default 0.9, vllm/config/cache.py)"),
    MemoryAsk("sglang", "mem-fraction-static", None,
              "SGLang reserves mem-fraction-static x the device's total for weights and KV cache "
              "(python/sglang/srt/server_args.py; its default is computed from the GPU's size, so "
              "only a value set in [server.args] is checked)"),
)
BY_ENGINE = {a.engine: a for a in ASKS}


def memory_ask(profile):
    """{"flag", "fraction", "source"} the preflight checks, or None (no fraction known)."""
    ask = BY_ENGINE.get(profile.server.engine)
    if ask is None:
        return None
    value = profile.server.flags.value(ask.flag)
    try:
        fraction = float(value) if value is not None else ask.default
    except (TypeError, ValueError):
        return None
    if fraction is None:
        return None
    return {"flag": ask.flag, "fraction": fraction, "default": value is None, "source": ask.source}
