"""Tuning under a latency budget: the bounds, the search for each variant's capacity, the
conservative score, and the winner per load range. Pure (no I/O).

    bounds = parse_slo("ttft_p90<=800,tpot_p50<=40")      # (Bound, ...), milliseconds
    search = Search(max_load=64)                            # bracket, then bisect
    while (load := search.next()) is not None:
        search.record(load, meets(observed, bounds))        # a point = >= 3 runs, all meet

A variant's capacity is the largest load (concurrency, or requests/s with --load rate) whose
runs all meet every bound. The search brackets it by growing the load by FACTOR from 1 (1, 4,
16, 64, ... and --max-load itself) until a point fails, then bisects between the last load that
met the bounds and the first that did not, to a step of 1 or until MAX_POINTS loads are spent
(vLLM's `vllm bench sweep serve_sla` narrows the same bracket to a step of 1 too, with an
interpolated guess in place of the midpoint). A load above a failing one is never tried, so a
noisy failure can only make the capacity smaller, never larger.

The score of a point is conservative: median - 1.4826 x MAD of its runs' output tokens/s
(1.4826 x MAD estimates one standard deviation of normal noise, robust to one outlier), so a
point whose runs scatter scores lower than a steady one with the same median. A point whose
MAD/median exceeds NOISY is measured once more, then marked noisy. Two scores within TIE of
each other are a tie, and a tie goes to the simpler variant: no speculation before fewer draft
tokens before more.
"""
import re
import statistics
from collections import namedtuple

from ..errors import UsageError
from ..measure.bench_stats import percentile, tpot_s

MAX_POINTS = 8          # load points per variant
FACTOR = 4              # the bracket grows the load by this factor
MIN_RUNS = 3            # runs per point
MAD_SIGMA = 1.4826      # MAD -> standard deviation of normal noise
NOISY = 0.10            # MAD / median above this: measured again once, then marked noisy
TIE = 0.01              # scores within 1% of each other are a tie
LOADS = ("concurrency", "rate")
LOAD_UNIT = {"concurrency": "concurrency", "rate": "req/s"}

# metric -> what one sample gives, in seconds (bench samples, tasks/measure/host/loadgen.py)
METRICS = {
    "ttft": ("time to first token", lambda s: [s["ttft_s"]] if s["ttft_s"] is not None else []),
    "tpot": ("time per output token after the first", lambda s: [t] if (t := tpot_s(s)) is not None else []),
    "itl": ("gap between streamed token chunks", lambda s: list(s["itl_s"])),
    "e2e": ("request latency, end to end", lambda s: [s["latency_s"]] if s.get("latency_s") is not None else []),
}
BOUND = re.compile(r"^(ttft|tpot|itl|e2e)_p([0-9]{1,2}(?:\.[0-9]+)?|100)\s*<=\s*([0-9]+(?:\.[0-9]+)?)$")

Bound = namedtuple("Bound", "key metric q limit_ms")


def parse_slo(text):
    """'ttft_p90<=800,tpot_p50<=40' -> (Bound, ...); UsageError naming --slo otherwise."""
    out = []
    for part in (p.strip() for p in str(text).split(",")):
        m = BOUND.match(part)
        if not m:
            raise UsageError(f"--slo expects bounds like ttft_p90<=800,tpot_p50<=40 (milliseconds; "
                             f"keys {', '.join(k + '_pXX' for k in METRICS)}), got {part!r}")
        metric, q, limit = m.group(1), float(m.group(2)), float(m.group(3))
        key = f"{metric}_p{q:g}"  # one spelling per percentile: p90, p90.0 and p090 are one key
        if limit <= 0:
            raise UsageError(f"--slo {part}: the bound must be above 0 ms")
        if key in [b.key for b in out]:
            raise UsageError(f"--slo {key} is given twice ({part!r} bounds it again)")
        out.append(Bound(key, metric, q, limit))
    return tuple(out)


def slo_text(bounds):
    return ",".join(f"{b.key}<={b.limit_ms:g}" for b in bounds)


def observe(samples, bounds):
    """{bound key: milliseconds} of one bench run's raw samples (the successful ones)."""
    ok = [s for s in samples if s["ok"]]
    out = {}
    for b in bounds:
        values = [x for s in ok for x in METRICS[b.metric][1](s)]
        v = percentile(values, b.q)
        out[b.key] = None if v is None else round(v * 1000.0, 3)
    return out


def misses(observed, bounds):
    """[(key, observed ms, bound ms)] of the bounds one run does not meet (no value: missed)."""
    return [(b.key, observed.get(b.key), b.limit_ms) for b in bounds
            if observed.get(b.key) is None or observed[b.key] > b.limit_ms]


def score(values):
    """(conservative score, median, MAD) of a point's runs."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None, None, None
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    return round(med - MAD_SIGMA * mad, 3), round(med, 3), round(mad, 3)


def noisy(median, mad):
    return bool(median) and mad / median > NOISY


class Search:
    """The loads to measure one variant at: bracket from 1 by FACTOR up to max_load, then
    bisect. `next()` the load to measure (None: done), `record(load, met)` its verdict."""

    def __init__(self, max_load, max_points=MAX_POINTS):
        self.max_load, self.max_points = int(max_load), max_points
        self.seen = {}  # load -> met every bound

    def passed(self):
        return max((x for x, ok in self.seen.items() if ok), default=0)

    def failed(self):
        """The smallest failing load, or None if none failed."""
        return min((x for x, ok in self.seen.items() if not ok), default=None)

    def next(self):
        if len(self.seen) >= self.max_points:
            return None
        lo, hi = self.passed(), self.failed()
        if hi is None:  # still bracketing
            if lo >= self.max_load:
                return None
            return 1 if lo == 0 else min(self.max_load, lo * FACTOR)
        if hi - lo <= 1:
            return None
        return (lo + hi) // 2

    def record(self, load, met):
        self.seen[load] = bool(met)

    def step(self):
        """How far the capacity may lie below the true one: the gap left to the first failing
        load (0 when --max-load itself met the bounds)."""
        hi = self.failed()
        return 0 if hi is None else hi - self.passed() - 1


# -- deciding --------------------------------------------------------------------------------

def simplicity(settings_k):
    """Sort key of a variant's simplicity from its number of draft tokens (None: no
    speculation): no speculation < fewer draft tokens < more."""
    return (0, 0) if settings_k is None else (1, settings_k)


def _rank(cands):
    """cands: [(name, score, simplicity key)] -> (winner, second, tie): the best score; a lead
    within TIE goes to the simpler variant."""
    ranked = sorted(cands, key=lambda c: -c[1])
    best = ranked[0]
    close = [c for c in ranked if best[1] - c[1] <= TIE * abs(best[1])]
    pick = min(close, key=lambda c: c[2])
    others = [c for c in ranked if c is not pick]
    second = others[0] if others else None
    return pick, second, len(close) > 1


def curve(points):
    """[(load, score)] of the points that met every bound, by load."""
    return sorted((p["load"], p["score"]) for p in points if p.get("meets") and p.get("score") is not None)


def at_load(points, load, capacity):
    """A variant's score at `load` from its measured points (linear between them); None above
    its capacity or below its first point."""
    if load > capacity:
        return None
    pts = curve(points)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= load <= x1:
            return y0 + (y1 - y0) * (load - x0) / (x1 - x0) if x1 != x0 else y1
    if pts and pts[-1][0] == load:
        return pts[-1][1]
    return None


def ranges(variants, kind):
    """The winner per load range. `variants`: [{name, capacity, points, k}] (k: draft tokens, or
    None). Returns [{from, to, winner, tie_with}] over the loads measured, consecutive loads
    with the same winner merged; a range with winner None: no variant meets the bounds there."""
    loads = sorted({p["load"] for v in variants for p in v["points"]})
    out = []
    for load in loads:
        cands = [(v["name"], s, simplicity(v["k"])) for v in variants
                 for s in [at_load(v["points"], load, v["capacity"] or 0)] if s is not None]
        winner, tie = (None, None)
        if cands:
            pick, second, tied = _rank(cands)
            winner, tie = pick[0], (second[0] if tied and second else None)
        if out and out[-1]["winner"] == winner:
            out[-1]["to"] = load
        else:
            out.append({"from": load, "to": load, "winner": winner, "tie_with": tie})
    return out


def ranges_text(rngs, kind, names=None):
    """'k=4 up to concurrency 8, k=2 to 32, no speculation beyond' (names: variant -> words)."""
    names = names or {}
    unit = LOAD_UNIT[kind]
    parts = []
    meeting = [r for r in rngs if r["winner"] is not None]
    for i, r in enumerate(meeting):
        who = names.get(r["winner"], r["winner"])
        tie = f" (a tie with {names.get(r['tie_with'], r['tie_with'])})" if r.get("tie_with") else ""
        parts.append(f"{who}{tie} up to {unit} {_num(r['to'])}" if i == 0 else f"{who}{tie} to {_num(r['to'])}")
    if not meeting:
        return f"no variant meets the bounds at any {unit} measured"
    if rngs[-1]["winner"] is None:
        parts.append(f"none meets the bounds from {_num(rngs[-1]['from'])} on")
    return ", ".join(parts)


def decide(variants, kind):
    """{winner, second, tie, why, excluded, ranking, ranges, ranges_text}: the most goodput at
    capacity among variants that are not broken; ties within TIE to the simpler one.
    `variants`: [{name, capacity, goodput, k, broken, points}]."""
    unit = LOAD_UNIT[kind]
    excluded = [v["name"] for v in variants if v.get("broken")]
    fair = [v for v in variants if not v.get("broken") and v.get("goodput") is not None
            and v.get("capacity")]
    out = {"objective": "goodput", "winner": None, "second": None, "tie": False,
           "excluded": excluded, "ranking": [], "why": ""}
    rngs = ranges([v for v in variants if not v.get("broken")], kind)
    out["ranges"] = rngs
    out["ranges_text"] = ranges_text(rngs, kind) if rngs else ""
    notes = [f"{n} excluded: verdict broken" for n in excluded]
    if not fair:
        none = ("no variant was measured: each failed to start or was not reached (see each "
                "one's line above and results.jsonl)" if not any(v.get("points") for v in variants)
                else "no variant meets the bounds at any load measured")
        out["why"] = "; ".join([none] + notes)
        return out
    pick, second, tied = _rank([(v["name"], v["goodput"], simplicity(v["k"])) for v in fair])
    by = {v["name"]: v for v in fair}
    out["ranking"] = [c[0] for c in sorted(((v["name"], v["goodput"]) for v in fair), key=lambda c: -c[1])]
    best = by[pick[0]]
    out["winner"] = best["name"]
    head = (f"{best['name']}: {best['goodput']:.1f} output tok/s (conservative) at {unit} "
            f"{_num(best['capacity'])}, its capacity")
    if second is None:
        out["why"] = "; ".join([head + ", the only variant that meets the bounds"] + notes)
        return out
    out["second"] = second[0]
    lead = (pick[1] - second[1]) / abs(second[1]) * 100.0 if second[1] else float("inf")
    vs = f"{second[0]} ({second[1]:.1f} at {unit} {_num(by[second[0]]['capacity'])})"
    if tied:
        out["tie"] = True
        text = (f"{head}; a tie with {vs}: within {TIE * 100:g}%, so the simpler variant" if
                lead <= 0 else f"{head}; a tie with {vs}: {abs(lead):.1f}% apart, within "
                f"{TIE * 100:g}%, so the simpler variant")
    else:
        text = f"{head}, {lead:.1f}% more than {vs}"
    out["why"] = "; ".join([text] + notes)
    return out


def pareto(points):
    """Indices of the points on the Pareto front of (per-user tok/s, per-GPU tok/s), both
    larger is better: no other point is at least as good in both and better in one."""
    front = []
    for i, (u, g) in enumerate(points):
        if u is None or g is None:
            continue
        if not any((u2 >= u and g2 >= g and (u2 > u or g2 > g)) for j, (u2, g2) in enumerate(points)
                   if j != i and u2 is not None and g2 is not None):
            front.append(i)
    return front


def _num(x):
    return f"{x:g}" if isinstance(x, (int, float)) else str(x)
