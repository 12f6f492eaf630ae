"""The endpoint's GPU memory plan, made before any member starts (pure: facts in, plan out).

Per device, what each member needs awake (weights from the safetensors headers + its KV
budget + drafter + the engine's own overhead, or its fraction of the device), what it keeps
parked, and the peak while the members start in order. A plan that does not fit is refused
with these numbers (exit 1) and nothing starts.
"""
from dataclasses import dataclass, field
from typing import List, Optional

MIB = 1024 * 1024

# Facts the plan uses, with where each comes from (rendered into docs/endpoint.md).
FACTS = {
    "asleep_mib": (937, "GPU memory a level-1 sleeping vLLM 0.26.0 server kept on an H200 (tiny "
                        "Llama: CUDA context and graphs; 43593 -> 937 MiB), seen 2026-12-04"),
    "overhead_mib": (2048, "beyond weights and KV budget, what a vLLM server takes awake (CUDA context, "
                           "graphs, activations): an estimate covering the 937 MiB a sleeping one keeps; "
                           "benchmarks/h200_endpoint.sh measures it"),
    "gpu_memory_utilization": (0.9, "vLLM's default --gpu-memory-utilization: that share of the device's "
                                    "total memory, and vLLM refuses to start with less free"),
    "mem_fraction_static": (0.88, "SGLang's default --mem-fraction-static on a large GPU"),
}


def fact(name):
    return FACTS[name][0]


def parse_bytes(v):
    """--kv-cache-memory-bytes as vLLM reads it: an int, or a number with k/m/g/t (1000s) or
    K/M/G/T (1024s) as human_readable_int does; None when it is not one."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if not isinstance(v, str) or not v:
        return None
    units = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12,
             "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
    try:
        if v[-1] in units:
            return int(float(v[:-1]) * units[v[-1]])
        return int(v)
    except ValueError:
        return None


@dataclass
class Need:
    member: str
    devices: List[int]
    awake_mib: Optional[float]   # per device; None: not known (engine = "command")
    asleep_mib: float
    parked: bool
    how: str                     # how awake_mib was worked out, in words

    @property
    def held_mib(self):
        """What it holds once started: parked -> what a sleeping server keeps."""
        return self.asleep_mib if self.parked else (self.awake_mib or 0)


@dataclass
class DevicePlan:
    index: int
    name: str
    total_mib: int
    free_mib: int
    rows: list = field(default_factory=list)   # [(member, held, how)]
    peak_mib: float = 0
    peak_at: str = ""

    @property
    def fits(self):
        return self.peak_mib <= self.free_mib


def member_need(m, total_mib, weights_bytes, drafter_bytes):
    """Need for one endpoint member (profile.EndpointMember) on a device of `total_mib`."""
    prof = m.profile
    args = dict(prof.server.args)
    tp = args.get("tensor-parallel-size", 1)
    tp = tp if isinstance(tp, int) and tp > 0 else 1
    devices = prof.devices or list(range(tp))
    asleep = fact("asleep_mib") if m.parked or m.idle_s else 0
    if prof.server.engine == "vllm":
        kv = parse_bytes(args.get("kv-cache-memory-bytes"))
        if kv is not None:
            w = (weights_bytes or 0) / MIB / tp
            d = (drafter_bytes or 0) / MIB / tp
            awake = w + kv / MIB + d + fact("overhead_mib")
            how = (f"weights {w:.0f}" + ("" if weights_bytes is not None else " (unknown: not read)")
                   + f" + KV {kv / MIB:.0f}" + (f" + drafter {d:.0f}" if d else "")
                   + f" + overhead {fact('overhead_mib')} MiB")
        else:
            util = args.get("gpu-memory-utilization", fact("gpu_memory_utilization"))
            awake = float(util) * total_mib
            how = f"gpu-memory-utilization {util} x {total_mib} MiB"
    elif prof.server.engine == "sglang":
        frac = args.get("mem-fraction-static", fact("mem_fraction_static"))
        awake = float(frac) * total_mib
        how = f"mem-fraction-static {frac} x {total_mib} MiB"
    else:
        awake, how = None, 'not known (engine = "command"): counted as 0'
    return Need(m.name, devices, awake, asleep, m.parked, how)


def model_paths(members):
    """The model directories whose weights the plan reads: each member's model and drafter."""
    paths = []
    for m in members:
        paths.append(m.profile.server.model)
        spec = dict(m.profile.server.args).get("speculative-config")
        if isinstance(spec, dict) and isinstance(spec.get("model"), str):
            paths.append(spec["model"])
    return [p for p in paths if p]


def make_plan(ep, gpus, weights):
    """`gpus`: [{index, name, total_mib, used_mib}] from the host; `weights`:
    {model path: bytes or None}. Returns [DevicePlan] (only devices some member uses)."""
    by_index = {g["index"]: g for g in gpus}
    plans = {}
    held = {}
    for m in ep.members:
        prof = m.profile
        total = next(iter(by_index.values()))["total_mib"] if by_index else 0
        spec = dict(prof.server.args).get("speculative-config")
        draft_model = spec.get("model") if isinstance(spec, dict) else None
        need = member_need(m, total, weights.get(prof.server.model),
                           weights.get(draft_model) if draft_model else None)
        for i in need.devices:
            g = by_index.get(i)
            if g is None:
                continue
            p = plans.setdefault(i, DevicePlan(i, g.get("name", "?"), g["total_mib"],
                                               g["total_mib"] - g["used_mib"]))
            if need.awake_mib is not None and not prof.devices:
                need = member_need(m, g["total_mib"], weights.get(prof.server.model),
                                   weights.get(draft_model) if draft_model else None)
            peak = held.get(i, 0) + (need.awake_mib or 0)
            if peak > p.peak_mib:
                p.peak_mib, p.peak_at = peak, m.name
            held[i] = held.get(i, 0) + need.held_mib
            p.rows.append((m.name, need.awake_mib, need.held_mib, need.parked, need.how))
    return [plans[i] for i in sorted(plans)]


def plan_lines(plans):
    out = []
    for p in plans:
        out.append(f"GPU {p.index} ({p.name}, {p.total_mib} MiB, {p.free_mib} free):")
        for name, awake, held, parked, how in p.rows:
            tail = f", parked: keeps {held:.0f}" if parked else ""
            out.append(f"  {name}: {awake or 0:.0f} MiB awake ({how}){tail}")
        verdict = "fits" if p.fits else "DOES NOT FIT"
        out.append(f"  peak {p.peak_mib:.0f} MiB (while {p.peak_at} starts) of {p.free_mib} free: {verdict}"
                   + ("" if p.fits else f", {p.peak_mib - p.free_mib:.0f} MiB short"))
    return out


def plan_json(plans):
    return [{"gpu": p.index, "name": p.name, "total_mib": p.total_mib, "free_mib": p.free_mib,
             "peak_mib": round(p.peak_mib), "peak_at": p.peak_at, "fits": p.fits,
             "members": [{"member": n, "awake_mib": None if a is None else round(a), "held_mib": round(h),
                          "parked": pk, "how": how} for n, a, h, pk, how in p.rows]} for p in plans]
