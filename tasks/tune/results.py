"""What a sweep measured, and who won: results.jsonl records, resume, the winner. Pure.

One record per variant x concurrency:

    {variant, settings, host, release, concurrency, status,          # measured|skipped|failed
     requests, errors, duration_s, requests_per_s, output_tokens_per_s, ttft_ms, itl_ms,
     spec {acceptance_rate, mean_acceptance_length, per_position, verdict, ...} | null,
     repeats, spread {output_tokens_per_s|ttft_p90_ms|acceptance_rate: {min, median, max}},
     finding | fatal | error}                                        # why, when not measured

The figures are the medians of the `repeats` runs; `spread` is their range. The winner
maximises the objective among measured variants whose verdict is not `broken`; when its
lead over the second is within the spread (the two [min, max] ranges overlap) there is no
clear winner and both are named. With --repeat 1 there is no spread, and the reason says so.
"""
import json
import re

from ..measure.repeats import beyond_spread, lead_pct

OBJECTIVE = re.compile(r"^(tokens_per_s|ttft_p90)@([1-9][0-9]*)$")
BENCH_FIELDS = ("requests", "errors", "duration_s", "requests_per_s", "output_tokens_per_s",
                "ttft_ms", "itl_ms")
SPREAD = {
    "output_tokens_per_s": lambda r: r.get("output_tokens_per_s"),
    "ttft_p90_ms": lambda r: (r.get("ttft_ms") or {}).get("p90"),
    "acceptance_rate": lambda r: (r.get("spec") or {}).get("acceptance_rate"),
}
# objective -> (spread figure, larger is better, unit)
OBJECTIVES = {"tokens_per_s": ("output_tokens_per_s", True, "output tok/s"),
              "ttft_p90": ("ttft_p90_ms", False, "ms TTFT p90")}


# tune's spread names -> the figure names of tasks/measure/repeats.py (one summary of runs)
SPREAD_OF = {"output_tokens_per_s": "output tok/s", "ttft_p90_ms": "TTFT p90 ms",
             "acceptance_rate": "acceptance"}


def measured(variant, settings, host, release, concurrency, runs):
    """The record of one variant at one concurrency from its bench runs (tasks/bench.py),
    summarized as `fab bench --repeat` summarizes (tasks/measure/repeats.py summarize)."""
    from ..measure.repeats import summarize
    summary = summarize(runs)
    rep = summary.pop("repeat")
    summary.pop("host", None)
    rec = {"variant": variant, "settings": settings, "host": host, "release": release,
           "concurrency": concurrency, "status": "measured"}
    rec.update(summary)
    rec["spec"] = summary.get("spec")
    rec["repeats"] = rep["n"]
    rec["spread"] = {name: rep["spread"][fig] for name, fig in SPREAD_OF.items()
                     if fig in rep["spread"]}
    return rec


def not_measured(variant, settings, host, release, concurrency, status, why):
    """A skipped (preflight FAIL) or failed (did not start, bench failed) variant's record.
    `why`: {"finding": ...} | {"fatal": ...} | {"error": ...}."""
    rec = {"variant": variant, "settings": settings, "host": host, "release": release,
           "concurrency": concurrency, "status": status}
    rec.update({k: None for k in BENCH_FIELDS})
    rec.update(spec=None, repeats=0, spread={})
    rec.update(why)
    return rec


def read(path):
    """The records of a results.jsonl (a missing file: none)."""
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def missing(variants, concurrencies, records):
    """[(variant, [concurrency, ...])] still to measure: measured records count as done;
    skipped or failed ones are tried again (their cause may be fixed). Under --slo
    `concurrencies` is (None,): one record per variant, its capacity."""
    done = {(r["variant"], r["concurrency"]) for r in records if r["status"] == "measured"}
    out = []
    for v in variants:
        todo = [c for c in concurrencies if (v.name, c) not in done]
        if todo:
            out.append((v, todo))
    return out


def latest(records):
    """One record per (variant, concurrency): the last one written (a resumed sweep appends)."""
    seen = {}
    for r in records:
        seen[(r["variant"], r["concurrency"])] = r
    return list(seen.values())


def parse_objective(text):
    m = OBJECTIVE.match(str(text))
    if not m:
        return None
    return m.group(1), int(m.group(2))


def _value(rec, figure):
    return SPREAD[figure](rec)


def _range(rec, figure):
    s = (rec.get("spread") or {}).get(figure)
    return (s["min"], s["max"]) if s and rec.get("repeats", 0) > 1 else None


def broken(rec):
    return ((rec.get("spec") or {}).get("verdict")) == "broken"


def decide(records, objective):
    """{winner, second, tie, why, excluded, ranking}: names of variants and the reason in words."""
    kind, conc = objective
    figure, bigger, unit = OBJECTIVES[kind]
    at = [r for r in latest(records) if r["concurrency"] == conc and r["status"] == "measured"
          and r.get("errors", 0) < r.get("requests", 0) and _value(r, figure) is not None]
    excluded = [r for r in at if broken(r)]
    ranked = sorted((r for r in at if not broken(r)), key=lambda r: _value(r, figure),
                    reverse=bigger)
    out = {"objective": f"{kind}@{conc}", "winner": None, "second": None, "tie": False,
           "ranking": [r["variant"] for r in ranked],
           "excluded": [r["variant"] for r in excluded], "why": ""}
    notes = [f"{r['variant']} excluded: verdict broken ({_broken_text(r)})" for r in excluded]
    if not ranked:
        out["why"] = "; ".join([f"no variant was measured at concurrency {conc}" if not at else
                                f"every variant measured at concurrency {conc} is broken"] + notes)
        return out
    best = ranked[0]
    out["winner"] = best["variant"]
    head = f"{best['variant']}: {_fmt(_value(best, figure))} {unit} at concurrency {conc}"
    if len(ranked) == 1:
        out["why"] = "; ".join([head + ", the only variant measured that is not broken"] + notes)
        return out
    second = ranked[1]
    out["second"] = second["variant"]
    a, b = _value(best, figure), _value(second, figure)
    lead = lead_pct(b, a)  # in percent of the second, as `fab bench --compare` says A -> B
    ra, rb = _range(best, figure), _range(second, figure)
    vs = f"{second['variant']} ({_fmt(b)})"
    apart = beyond_spread(ra, rb)
    if apart is None:
        judged = "no spread measured (--repeat 1): run with --repeat 3 to know whether it holds"
    elif apart:
        judged = (f"beyond the spread ({_fmt(ra[0])}..{_fmt(ra[1])} against "
                  f"{_fmt(rb[0])}..{_fmt(rb[1])})")
    else:
        out["tie"] = True
        judged = (f"within the spread ({_fmt(ra[0])}..{_fmt(ra[1])} against "
                  f"{_fmt(rb[0])}..{_fmt(rb[1])})")
    if out["tie"]:
        out["why"] = "; ".join([f"no clear winner: {head}, {lead:.1f}% "
                                f"{'ahead of' if bigger else 'below'} {vs}, {judged}"] + notes)
    else:
        out["why"] = "; ".join([f"{head}, {lead:.1f}% {'more than' if bigger else 'less than'} "
                                f"{vs}, {judged}"] + notes)
    return out


def _broken_text(rec):
    spec = rec.get("spec") or {}
    return (spec.get("evidence") or {}).get("why") or "the doctor's live verdict"


def _fmt(x):
    if x is None:
        return "-"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


# -- the table -----------------------------------------------------------------------------

def table(records, variants, concurrencies, objective, decision):
    """(headers, rows): one row per variant, tokens/s per concurrency, the objective's figures."""
    kind, conc = objective
    by = {(r["variant"], r["concurrency"]): r for r in latest(records)}
    headers = ["variant"] + [f"tok/s c={c}" for c in concurrencies] + \
              [f"TTFT p90 ms c={conc}", "accept", "len", "verdict", "host", "note"]
    rows = []
    for v in variants:
        recs = [by.get((v.name, c)) for c in concurrencies]
        first = next((r for r in recs if r is not None), None)
        at = by.get((v.name, conc)) or first or {}
        spec = at.get("spec") or {}
        mark = " *" if decision.get("winner") == v.name else ""
        cells = [v.name + mark]
        for r in recs:
            cells.append(_cell(r, "output_tokens_per_s"))
        cells.append(_cell(at or None, "ttft_p90_ms"))
        cells.append("-" if spec.get("acceptance_rate") is None else f"{spec['acceptance_rate']:.2f}")
        cells.append("-" if spec.get("mean_acceptance_length") is None
                     else f"{spec['mean_acceptance_length']:.2f}")
        cells.append(spec_label(spec, at.get("status") == "measured"))
        cells.append(at.get("host") or "-")
        cells.append(note(at) if at else "not measured")
        rows.append(cells)
    return headers, rows


def _cell(rec, figure):
    if rec is None or rec.get("status") != "measured":
        return "-"
    val = _value(rec, figure)
    rng = _range(rec, figure)
    if val is None:
        return "-"
    return _fmt(val) + (f" ±{_fmt((rng[1] - rng[0]) / 2)}" if rng else "")


def spec_label(spec, measured):
    """A variant's verdict cell: the doctor's verdict; `few drafts` when it saw too few to judge;
    `not judged` when it judges none for this engine (a `command` server: no drafter to know);
    `no spec` when the server drafted nothing."""
    if not spec:
        return "no spec" if measured else "-"
    if "verdict" not in spec:
        return "not judged"
    return spec["verdict"] or "few drafts"


def still_speculates(rec):
    """Whether a baseline (no speculative flag in [server.args]) drafted anyway: the server
    speculates by itself (the demo server without num-speculative-tokens = 0 did)."""
    spec = rec.get("spec") or {}
    return "speculative" in (rec.get("settings") or {}) and (
        spec.get("acceptance_rate") is not None or bool(spec.get("drafts")))


def note(rec):
    """Why a variant was not measured, in one short phrase."""
    if rec.get("status") == "measured":
        if still_speculates(rec):
            return "still speculates: the server drafts with no speculative flag"
        return f"{rec['errors']} errors" if rec.get("errors") else ""
    if rec.get("finding"):
        f = rec["finding"]
        return f"skipped: {f.get('rule') or f.get('check')}: {f.get('message', '')}"[:120]
    if rec.get("fatal"):
        f = rec["fatal"]
        return f"failed to start: {f.get('rule')}: {f.get('cause', '')}"[:120]
    return f"{rec.get('status')}: {rec.get('error') or '?'}"[:120]
