"""One variant's capacity under --slo: measure load points as the search asks (tasks/tune/slo.py),
each point >= 3 bench runs summarized as `fab bench --repeat` does, and one record for the
variant with every point.

The variant's record in results.jsonl:

    {variant, settings, host, release, status: "measured", load_kind, slo {key: ms},
     capacity, goodput, step, k, broken, spec (at the capacity point, or the first),
     points: [{load, concurrency | request_rate, meets, misses, score, median, mad, noisy,
               remeasured, runs_slo_ms: [{key: ms}], ...the bench summary's fields}]}

`capacity` is the largest load whose runs all met every bound (0: not even load 1),
`goodput` that point's conservative score (output tok/s), `step` how far the true capacity
may lie above it with the points spent (0: exact, or --max-load met the bounds).
"""
from . import slo


class SloPlan:
    """What --slo, --load, --max-load and --repeat ask for."""

    def __init__(self, bounds, kind, max_load, repeat, requests):
        self.bounds, self.kind, self.max_load = bounds, kind, max_load
        self.repeat = max(slo.MIN_RUNS, repeat)
        self.requests = requests

    def request(self, load, workload):
        """The bench request of one run at `load`: at least twice the load's requests, so the
        window holds the load for a while (the last requests of a closed loop run with fewer
        at a time)."""
        n = max(self.requests, 2 * int(load))
        window = {"requests": n, "max_tokens": workload.max_tokens, "sampling": dict(workload.sampling)}
        if self.kind == "rate":
            window.update(concurrency=n, request_rate=float(load), seed=0)
        else:
            window["concurrency"] = int(load)
        return window


def measure_point(bench, plan, workload, load, say):
    """(point record, bench records): `repeat` runs at `load`; a point whose MAD/median of
    output tok/s exceeds slo.NOISY is measured once more, then marked noisy. `bench(req)` is
    one run: (record, raw)."""
    def runs_at():
        recs = []
        for n in range(plan.repeat):
            say(f"bench {plan.kind} {load:g}, run {n + 1} of {plan.repeat}")
            rec, raw = bench(plan.request(load, workload))
            rec.pop("_verdict_lines", None)
            rec["slo_ms"] = slo.observe(raw["samples"], plan.bounds)
            recs.append(rec)
        return recs
    recs = runs_at()
    sc, med, mad = slo.score([r["output_tokens_per_s"] for r in recs])
    remeasured = False
    if med is not None and slo.noisy(med, mad):
        remeasured = True
        recs = runs_at()
        sc, med, mad = slo.score([r["output_tokens_per_s"] for r in recs])
    missed = [m for r in recs for m in slo.misses(r["slo_ms"], plan.bounds)]
    errors = sum(r["errors"] for r in recs)
    point = {"load": load, "meets": not missed and errors == 0,
             "misses": [{"key": k, "ms": v, "bound_ms": b} for k, v, b in missed],
             "score": sc, "median": med, "mad": mad,
             "noisy": bool(med is not None and slo.noisy(med, mad)), "remeasured": remeasured,
             "runs_slo_ms": [r["slo_ms"] for r in recs]}
    return point, recs


def search(bench, plan, workload, say, summarize):
    """(points, capacity, step): the search over loads; `summarize(load, runs)` makes the bench
    summary a point record carries (tasks/tune/results.py measured)."""
    s = slo.Search(plan.max_load)
    points = []
    while True:
        load = s.next()
        if load is None:
            break
        point, runs = measure_point(bench, plan, workload, load, say)
        rec = summarize(load, runs)
        rec.update(point)
        points.append(rec)
        s.record(load, point["meets"])
        say(f"{plan.kind} {load:g}: " + ("meets the bounds" if point["meets"] else "misses " + ", ".join(
            f"{m['key']} {m['ms']} > {m['bound_ms']:g} ms" if m["ms"] is not None else f"{m['key']} (no value)"
            for m in point["misses"][:3])))
    return points, s.passed(), s.step()


def variant_record(base, plan, points, capacity, step, k):
    """The variant's one record: `base` (variant, settings, host, release, status) + the search."""
    at = next((p for p in points if p["load"] == capacity), None)
    spec = (at or (points[0] if points else {})).get("spec")
    broken = any((p.get("spec") or {}).get("verdict") == "broken" for p in points)
    rec = dict(base)
    rec.update(load_kind=plan.kind, slo={b.key: b.limit_ms for b in plan.bounds},
               capacity=capacity, goodput=at["score"] if at else None, step=step, k=k,
               broken=broken, spec=spec, points=points)
    return rec
