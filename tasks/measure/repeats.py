"""`fab bench --repeat N` and the verdict line of `--compare`: A/B that decides. Pure.

With --repeat the host's result record keeps the fields of `fab bench --json`, each figure the median
of the N runs, plus `repeat: {n, runs: [...records], spread: {figure: {min, median, max}}}`.
A difference between two saved results is "beyond the spread" when the two [min, max]
ranges of that figure do not overlap; with single runs there is no spread to judge by,
and the line says so (run each side with --repeat 3 or more).
"""
import statistics

# (name in the verdict line, how to read it from a record, larger is better)
FIGURES = (
    ("output tok/s", lambda r: r.get("output_tokens_per_s"), True),
    ("acceptance", lambda r: (r.get("spec") or {}).get("acceptance_rate"), True),
    ("mean accept len", lambda r: (r.get("spec") or {}).get("mean_acceptance_length"), True),
    ("TTFT p50 ms", lambda r: (r.get("ttft_ms") or {}).get("p50"), False),
    ("TTFT p90 ms", lambda r: (r.get("ttft_ms") or {}).get("p90"), False),
)
MEDIAN_FIELDS = ("duration_s", "requests_per_s", "output_tokens_per_s")


def median(values, digits=3):
    """The median of the values that are not None, rounded (None when there are none): the
    one median of repeated runs (fab bench --repeat, fab tune)."""
    xs = [v for v in values if v is not None]
    return round(statistics.median(xs), digits) if xs else None


def summarize(records):
    """One record for N runs of one host: medians in the usual fields, the runs and spread.
    `fab bench --repeat` and `fab tune` (each variant at each load) both summarize with it."""
    first = records[-1]
    out = dict(first)
    out["requests"] = sum(r["requests"] for r in records)
    out["errors"] = sum(r["errors"] for r in records)
    for key in MEDIAN_FIELDS:
        out[key] = median([r[key] for r in records])
    for key in ("ttft_ms", "itl_ms", "tpot_ms"):
        if any(key in r for r in records):
            out[key] = {q: median([(r.get(key) or {}).get(q) for r in records]) for q in ("p50", "p90")}
    servers = [r["server_ms"] for r in records if r.get("server_ms")]
    if servers:
        out["server_ms"] = {k: median([s.get(k) for s in servers]) for k in ("ttft_mean", "tpot_mean")}
    specs = [r["spec"] for r in records if r.get("spec")]
    if specs:
        spec = dict(specs[-1])  # the last window's verdict and findings stand for the set
        spec["acceptance_rate"] = median([s.get("acceptance_rate") for s in specs], 6)
        spec["mean_acceptance_length"] = median([s.get("mean_acceptance_length") for s in specs], 6)
        width = max(len(s.get("per_position") or []) for s in specs)
        if width:
            spec["per_position"] = [median([(s.get("per_position") or [])[i]
                                             if i < len(s.get("per_position") or []) else None
                                             for s in specs], 6) for i in range(width)]
        out["spec"] = spec
    spread = {}
    for name, get, _ in FIGURES:
        xs = [get(r) for r in records if get(r) is not None]
        if xs:
            spread[name] = {"min": min(xs), "median": round(statistics.median(xs), 6), "max": max(xs)}
    out["repeat"] = {"n": len(records), "runs": records, "spread": spread}
    return out


def repeat_lines(rec):
    """Human lines: each figure's median and spread over the runs."""
    rep = rec.get("repeat") or {}
    lines = [f"over {rep.get('n')} runs (median, min .. max):"]
    for name, s in (rep.get("spread") or {}).items():
        lines.append(f"  {name:<16} {s['median']:g} ({s['min']:g} .. {s['max']:g})")
    return lines


def _range(rec, name):
    s = ((rec.get("repeat") or {}).get("spread") or {}).get(name)
    return (s["min"], s["max"]) if s else None


def lead_pct(a, b):
    """How much b differs from a, in percent of a (the base of every comparison here)."""
    return abs(b - a) / abs(a) * 100.0 if a else float("inf")


def beyond_spread(ra, rb):
    """Whether two [min, max] ranges do not overlap (None when either is unknown)."""
    if ra is None or rb is None:
        return None
    return ra[1] < rb[0] or rb[1] < ra[0]


def verdict_line(a_label, a, b_label, b):
    """Which side is better on output tok/s and on acceptance, by how much, and whether the
    difference is beyond the spread."""
    parts = []
    for name, get, bigger_better in FIGURES[:2]:
        va, vb = get(a), get(b)
        if va is None or vb is None:
            parts.append(f"{name}: not in both")
            continue
        if va == vb:
            parts.append(f"{name}: equal")
            continue
        better = (b_label, vb, va) if (vb > va) == bigger_better else (a_label, va, vb)
        pct = lead_pct(va, vb)
        apart = beyond_spread(_range(a, name), _range(b, name))
        if apart is None:
            beyond = "no spread known (run each side with --repeat 3 or more)"
        elif apart:
            beyond = "beyond the spread"
        else:
            beyond = "within the spread: not decided"
        parts.append(f"{name}: {better[0]} better by {pct:.1f}% ({beyond})")
    return "verdict: " + "; ".join(parts)
