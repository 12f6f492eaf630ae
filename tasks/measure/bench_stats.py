"""Pure arithmetic of `fab bench`: raw samples from the host -> the result record; compare.

The record has exactly the fields of `fab bench --json` (docs/reference/cli.md) (JSON Lines, one per host):
host, requests, errors, duration_s, requests_per_s, output_tokens_per_s,
ttft_ms {p50, p90}, itl_ms {p50, p90}, spec {acceptance_rate, mean_acceptance_length,
per_position} or null, and tpot_ms {p50, p90} and server_ms {ttft_mean, tpot_mean} (the
server's own histograms over the window, or null) besides. `requests` counts measured requests
(the warm-up is excluded); requests_per_s and output_tokens_per_s count successful requests
over the window. TTFT, ITL and TPOT are `vllm bench serve`'s (tasks/measure/host/loadgen.py says
which streamed chunks count): TPOT, time per output token after the first, is per request
(last token - first token) / (output tokens - 1), over requests with more than one token; it
compares across speculative settings where ITL does not (one streamed chunk carries several
tokens under speculative decoding).
"""
import json
import math
from pathlib import Path

from . import metrics
from ..errors import UsageError
from ..output import Block

FIELDS = ("host", "requests", "errors", "duration_s", "requests_per_s", "output_tokens_per_s",
          "ttft_ms", "itl_ms", "spec")
# Added after the first release's fields (a saved result without them still reads for --compare).
EXTRA_FIELDS = ("tpot_ms", "server_ms")
# ITL p50 below this share of the server's own TPOT: the tokens reached the client in bursts.
BURST_SHARE = 0.1


def percentile(values, q):
    """Linear-interpolated percentile (q in 0..100), like numpy's default; None if empty."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _ms(values):
    def r(x):
        return None if x is None else round(x * 1000.0, 3)
    return {"p50": r(percentile(values, 50)), "p90": r(percentile(values, 90))}


def window_spec(raw, engine):
    """Spec numbers over the bench window (counter deltas), None without spec decoding."""
    before, after = raw["before"], raw["after"]
    if engine == "sglang":
        snap = metrics.parse(after["text"]) if after.get("text") else None
        return metrics.sglang_spec(after.get("server_info"), snap)
    if not after.get("text"):
        return None
    b = metrics.parse(before["text"]) if before.get("text") else None
    return metrics.spec_window(metrics.parse(after["text"]), b)


def tpot_s(sample):
    """(last token - first token) / (output tokens - 1) of one sample, both times as the
    streamed chunks carrying them arrived (vLLM's benchmark: (latency - TTFT) / (n - 1), its
    latency ending at the last token chunk, not at the usage chunk and [DONE] after it);
    None with one token or fewer."""
    end = sample.get("last_token_s")
    if sample["ttft_s"] is None or end is None or sample["output_tokens"] < 2:
        return None
    return (end - sample["ttft_s"]) / (sample["output_tokens"] - 1)


def window_server(raw):
    """The server's own TTFT/TPOT means over the bench window (metrics.server_means), or None."""
    after, before = raw["after"].get("text"), raw["before"].get("text")
    if not after:
        return None
    try:
        return metrics.server_means(metrics.parse(after), metrics.parse(before) if before else None)
    except ValueError:
        return None


def bursts(rec):
    """Whether the tokens reached the client in bursts: its ITL p50 a small share of the
    server's own time per token. Then its TTFT and TPOT percentiles show when the client got
    to read (a loaded host's scheduling), not the server; the server's own means do not."""
    itl = (rec.get("itl_ms") or {}).get("p50")
    tpot = (rec.get("server_ms") or {}).get("tpot_mean")
    return itl is not None and bool(tpot) and itl < BURST_SHARE * tpot


def record(host, raw, spec):
    """The result record of one host from the agent's raw answer."""
    samples = raw["samples"]
    ok = [s for s in samples if s["ok"]]
    duration = raw["duration_s"]
    tokens = sum(s["output_tokens"] for s in ok)
    return {
        "host": host,
        "requests": len(samples),
        "errors": len(samples) - len(ok),
        "duration_s": round(duration, 3),
        "requests_per_s": round(len(ok) / duration, 3) if duration > 0 else None,
        "output_tokens_per_s": round(tokens / duration, 2) if duration > 0 else None,
        "ttft_ms": _ms([s["ttft_s"] for s in ok if s["ttft_s"] is not None]),
        "itl_ms": _ms([x for s in ok for x in s["itl_s"]]),
        "spec": metrics.rounded(spec),
        "tpot_ms": _ms([t for t in map(tpot_s, ok) if t is not None]),
        "server_ms": window_server(raw),
    }


def first_errors(raw, limit=3):
    seen = []
    for s in raw["samples"]:
        if not s["ok"] and s["error"] not in seen:
            seen.append(s["error"])
    return seen[:limit]


def _num(x, fmt):
    return "-" if x is None else format(x, fmt)


def human_lines(rec, engine, metrics_error=None, verdict=None):
    """Per-host table lines (the host prefix is added by the reporter). `verdict`: the
    doctor's (text, more lines), tasks/doctor/findings.py: the spec line ends with the verdict."""
    spec = rec["spec"]
    since = " (as SGLang reports it)" if engine == "sglang" else " (bench window)"
    spec_line = metrics.spec_text(spec, since if spec is not None else "") if not metrics_error \
        else f"speculative decoding: unknown (/metrics: {metrics_error})"
    text, more = verdict or (None, [])
    if text:
        spec_line = Block(f"{spec_line}; {text}")
    return [
        f"requests        {rec['requests']} ({rec['errors']} errors) in {rec['duration_s']:.2f} s",
        f"requests/s      {_num(rec['requests_per_s'], '.2f')}",
        f"output tok/s    {_num(rec['output_tokens_per_s'], '.1f')}",
        f"TTFT ms         p50 {_num(rec['ttft_ms']['p50'], '.1f')}  p90 {_num(rec['ttft_ms']['p90'], '.1f')}",
        f"ITL ms          p50 {_num(rec['itl_ms']['p50'], '.2f')}  p90 {_num(rec['itl_ms']['p90'], '.2f')}",
    ] + ([f"TPOT ms         p50 {_num(rec['tpot_ms']['p50'], '.2f')}  p90 {_num(rec['tpot_ms']['p90'], '.2f')}"]
         if rec.get("tpot_ms") else []) + server_lines(rec) + sampling_lines(rec) + [
        spec_line,
    ] + list(more)


def sampling_lines(rec):
    """The sampling the window was measured under (tasks/doctor/sampling.py), beside the
    speculative numbers it explains."""
    if not rec.get("sampling") or rec.get("spec") is None:
        return []
    from ..doctor.sampling import text
    return [f"sampling        {text(rec['sampling'])}"]


def server_lines(rec):
    """The server's own means over the window, and the burst note (see bursts)."""
    srv = rec.get("server_ms")
    if not srv:
        return []
    means = [f"{name} mean {srv[key]:{fmt}} ms" for name, key, fmt in
             (("TTFT", "ttft_mean", ".1f"), ("TPOT", "tpot_mean", ".2f")) if srv.get(key) is not None]
    if not means:
        return []
    lines = [f"server's own    {', '.join(means)} (its /metrics over the window)"]
    if bursts(rec):
        lines.append(Block(
            f"note: the tokens reached this client in bursts (ITL p50 {rec['itl_ms']['p50']:.2f} ms, "
            f"the server's {srv['tpot_mean']:.2f} ms a token): the TTFT and TPOT percentiles above "
            "show when the host let the client read (a loaded machine), not the server's speed; "
            "its own means do not depend on it", hang=6))
    return lines


# -- --compare ---------------------------------------------------------------------------

ROWS = (
    ("requests", lambda r: r["requests"], "d"),
    ("errors", lambda r: r["errors"], "d"),
    ("duration s", lambda r: r["duration_s"], ".2f"),
    ("requests/s", lambda r: r["requests_per_s"], ".2f"),
    ("output tok/s", lambda r: r["output_tokens_per_s"], ".1f"),
    ("TTFT p50 ms", lambda r: r["ttft_ms"]["p50"], ".1f"),
    ("TTFT p90 ms", lambda r: r["ttft_ms"]["p90"], ".1f"),
    ("ITL p50 ms", lambda r: r["itl_ms"]["p50"], ".2f"),
    ("ITL p90 ms", lambda r: r["itl_ms"]["p90"], ".2f"),
    ("TPOT p50 ms", lambda r: (r.get("tpot_ms") or {}).get("p50"), ".2f"),
    ("acceptance", lambda r: (r["spec"] or {}).get("acceptance_rate"), ".3f"),
    ("mean accept len", lambda r: (r["spec"] or {}).get("mean_acceptance_length"), ".2f"),
)

SPEC_ROWS = ("acceptance", "mean accept len")


def read_runs(path):
    """[(label, record)] from a saved `fab bench --json` file; UsageError if it is not one."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise UsageError(f"--compare: cannot read {path}: {e.strerror}") from None
    runs = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise UsageError(f"--compare: {path}:{n}: not JSON ({e})") from None
        missing = [k for k in FIELDS if not isinstance(rec, dict) or k not in rec]
        if missing:
            raise UsageError(f"--compare: {path}:{n}: not a `fab bench --json` result "
                             f"(missing {', '.join(missing)})")
        runs.append(rec)
    if not runs:
        raise UsageError(f"--compare: {path} holds no result")
    if len(runs) == 1:
        return [(p.stem, runs[0])]
    return [(f"{p.stem}:{r['host']}", r) for r in runs]


def compare_table(columns):
    """(headers, rows) comparing saved runs; with exactly two, a last column B/A."""
    headers = ["metric"] + [label for label, _ in columns]
    ratio = len(columns) == 2
    if ratio:
        headers.append("B/A")
    rows = []
    for name, get, fmt in ROWS:
        vals = [get(rec) for _, rec in columns]
        row = [name] + [("no spec" if name in SPEC_ROWS and rec["spec"] is None else _num(v, fmt))
                        for v, (_, rec) in zip(vals, columns)]
        if ratio:
            a, b = vals
            row.append(f"{b / a:.2f}x" if a and b is not None else "-")
        rows.append(row)
    return headers, rows
