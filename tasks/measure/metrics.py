"""What a server's /metrics (and SGLang's /server_info) say: acceptance, throughput, load.

Pure functions over recorded text, parsed with prometheus_client's own parser. vLLM's
speculative-decoding counters (vllm/v1/spec_decode/metrics.py):

    acceptance rate         = accepted tokens / draft tokens
    mean acceptance length  = 1 + accepted tokens / drafts   (tokens per verification step)
    per position i          = accepted tokens at position i / drafts

Given two snapshots the numbers are over the window between them (counter deltas), so
traffic from before the window does not leak in. Counters absent = the server runs
without speculative decoding: spec is None, and the text says so instead of showing zeros.
SGLang exposes no such counters; its `avg_spec_accept_length` (server_info) is reported
as SGLang computes it.
"""
from dataclasses import dataclass, field

from ..supervise.host.hangwatch import GENERATED, RUNNING, WAITING  # noqa: F401  (one list, host and client)

NO_SPEC = "no speculative decoding"

DRAFTS = ("vllm:spec_decode_num_drafts_total",)
DRAFT_TOKENS = ("vllm:spec_decode_num_draft_tokens_total",)
ACCEPTED = ("vllm:spec_decode_num_accepted_tokens_total",)
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc; SGLang calls it token_usage.
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
SGLANG_RATE = ("sglang:spec_accept_rate",)


# The server's own latency histograms (vLLM 0.32 vllm/v1/metrics/loggers.py): the change of
# their sum and count over a window is its mean TTFT and TPOT there, measured where no client's
# scheduling touches them.
SERVER_TTFT = "vllm:time_to_first_token_seconds"
SERVER_TPOT = "vllm:request_time_per_output_token_seconds"


@dataclass
class Snapshot:
    """Samples summed over label sets (engines, models); per-position counts by position."""

    values: dict = field(default_factory=dict)
    maxima: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)     # label sets per name (to average gauges)
    per_pos: dict = field(default_factory=dict)

    def get(self, names, default=None):
        for name in names:
            if name in self.values:
                return self.values[name]
        return default


def parse(text):
    """Snapshot of a Prometheus text exposition; ValueError if it is not one."""
    from prometheus_client.parser import text_string_to_metric_families
    snap = Snapshot()
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                if s.name == PER_POS and "position" in s.labels:
                    pos = int(s.labels["position"])
                    snap.per_pos[pos] = snap.per_pos.get(pos, 0.0) + s.value
                    continue
                snap.values[s.name] = snap.values.get(s.name, 0.0) + s.value
                snap.maxima[s.name] = max(snap.maxima.get(s.name, s.value), s.value)
                snap.counts[s.name] = snap.counts.get(s.name, 0) + 1
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"not Prometheus text: {e}") from None
    return snap


def _delta(after, before):
    """Counter increase; a counter that went down means the server restarted in between."""
    if before is None or after < before:
        return after
    return after - before


def server_means(after, before=None):
    """{"ttft_mean", "tpot_mean"} in ms from the server's own histograms over the window
    between two snapshots; None when it has neither (SGLang, an older vLLM); a figure is None
    when no request finished in the window."""
    out = {}
    for key, name in (("ttft_mean", SERVER_TTFT), ("tpot_mean", SERVER_TPOT)):
        total, count = after.get((name + "_sum",)), after.get((name + "_count",))
        if total is not None and count is not None and before is not None:
            total0, count0 = before.get((name + "_sum",), 0.0), before.get((name + "_count",), 0.0)
            if count >= count0:  # else the server restarted in between: all of it is the window's
                total, count = total - total0, count - count0
        out[key] = round(1000.0 * total / count, 3) if count else None
    return out if any(k in after.values for k in (SERVER_TTFT + "_count", SERVER_TPOT + "_count")) else None


def spec_window(after, before=None):
    """{acceptance_rate, mean_acceptance_length, per_position} over the window, or None.

    `before` None: totals since the server started. Rates are None while no draft was made.
    """
    if after is None or after.get(DRAFTS) is None or after.get(DRAFT_TOKENS) is None:
        return None
    b = before if before is not None and before.get(DRAFTS) is not None else Snapshot()
    restarted = after.get(DRAFTS) < b.get(DRAFTS, 0.0)
    if restarted:
        b = Snapshot()
    drafts = _delta(after.get(DRAFTS), b.get(DRAFTS))
    draft_tokens = _delta(after.get(DRAFT_TOKENS), b.get(DRAFT_TOKENS))
    accepted = _delta(after.get(ACCEPTED, 0.0), b.get(ACCEPTED))
    per_pos = [_delta(after.per_pos[p], b.per_pos.get(p)) for p in sorted(after.per_pos)]
    return {
        "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts else None,
        "per_position": [n / drafts for n in per_pos] if drafts else [],
        "drafts": drafts,  # for the doctor's verdict (tasks/doctor/verdict.py); not output as is
    }


def rounded(spec, digits=6):
    """The spec record with its numbers rounded for output (None stays None)."""
    if spec is None:
        return None
    out = {k: (None if spec[k] is None else round(spec[k], digits))
           for k in ("acceptance_rate", "mean_acceptance_length")}
    out["per_position"] = [round(p, digits) for p in spec["per_position"]]
    return out


def sglang_spec(server_info, snap=None):
    """SGLang's own numbers (not windowed): avg_spec_accept_length, spec_accept_rate gauge."""
    states = (server_info or {}).get("internal_states") or [server_info or {}]
    lengths = [s.get("avg_spec_accept_length") for s in states if isinstance(s, dict)]
    lengths = [float(x) for x in lengths if isinstance(x, (int, float))]
    if not lengths:
        return None
    rate = None
    if snap is not None and snap.get(SGLANG_RATE) is not None:
        rate = snap.get(SGLANG_RATE) / snap.counts[SGLANG_RATE[0]]  # mean over DP ranks
    return {"acceptance_rate": rate, "mean_acceptance_length": sum(lengths) / len(lengths),
            "per_position": []}


def generation_rate(before, after, seconds):
    """Generated tokens per second between two snapshots, or None."""
    a, b = after.get(GENERATED), before.get(GENERATED)
    if a is None or b is None or seconds <= 0:
        return None
    return _delta(a, b) / seconds


def load(snap):
    """{running, waiting, kv_cache_usage (0..1, the fullest engine)}; None where absent."""
    kv = next((snap.maxima[n] for n in KV_USAGE if n in snap.maxima), None)
    return {"running": snap.get(RUNNING), "waiting": snap.get(WAITING), "kv_cache_usage": kv}


def spec_text(spec, since=""):
    """One human line about speculative decoding."""
    if spec is None:
        return NO_SPEC
    if spec["acceptance_rate"] is None and spec["mean_acceptance_length"] is None:
        return "speculative decoding on, no drafts yet" + since
    parts = []
    if spec["acceptance_rate"] is not None:
        parts.append(f"acceptance {spec['acceptance_rate'] * 100:.1f}%")
    if spec["mean_acceptance_length"] is not None:
        parts.append(f"mean acceptance length {spec['mean_acceptance_length']:.2f}")
    text = "speculative decoding: " + ", ".join(parts) + since
    if spec["per_position"]:
        text += "; per position " + " ".join(f"{p:.2f}" for p in spec["per_position"])
    return text


def summarize_sample(sample, engine):
    """(Snapshot or None, spec or None) from one host snapshot (see measure/host/loadgen.py)."""
    snap = parse(sample["text"]) if sample.get("text") else None
    if engine == "sglang":
        return snap, sglang_spec(sample.get("server_info"), snap)
    return snap, spec_window(snap)


def status_metrics(host, profile, server, interval=1.0):
    """For `fab status`: {spec, generation_tokens_per_s, lines} of a running server.

    Two /metrics samples `interval` seconds apart inside one agent request give the
    current generation rate; acceptance is since the server started.
    """
    out = {"spec": None, "generation_tokens_per_s": None, "lines": []}
    res = host.call("metrics", port=server.get("port") or profile.server.port,
                    host=profile.server.host, engine=profile.server.engine, interval=interval)
    first, last = res["samples"][0], res["samples"][-1]
    if first.get("text") is None and first.get("server_info") is None:
        out["lines"].append(f"metrics: not available ({first.get('error')})")
        return out
    try:
        snap0, _ = summarize_sample(first, profile.server.engine)
        snap1, spec = summarize_sample(last, profile.server.engine)
    except ValueError as e:
        out["lines"].append(f"metrics: unreadable /metrics ({e})")
        return out
    out["spec"] = rounded(spec)
    out["spec_raw"], out["snapshot"] = spec, snap1  # for the doctor's verdict (tasks/doctor/findings.py)
    since = " (as SGLang reports it)" if profile.server.engine == "sglang" else " (since start)"
    out["lines"].append(spec_text(spec, since))
    if snap0 is not None and snap1 is not None and len(res["samples"]) > 1:
        rate = generation_rate(snap0, snap1, last["t"] - first["t"])
        if rate is not None:
            out["generation_tokens_per_s"] = round(rate, 2)
            out["lines"].append(f"generation: {rate:.1f} tokens/s (last {last['t'] - first['t']:.1f} s)")
    if snap1 is not None:
        ld = load(snap1)
        out["load"] = {"requests_running": None if ld["running"] is None else int(ld["running"]),
                       "requests_waiting": None if ld["waiting"] is None else int(ld["waiting"]),
                       "kv_cache_usage": ld["kv_cache_usage"]}
        if ld["running"] is not None or ld["kv_cache_usage"] is not None:
            kv = "?" if ld["kv_cache_usage"] is None else f"{ld['kv_cache_usage'] * 100:.1f}%"
            out["lines"].append(f"requests: {_int(ld['running'])} running, {_int(ld['waiting'])} "
                                f"waiting; KV cache {kv}")
    return out


def _int(x):
    return "?" if x is None else str(int(x))
