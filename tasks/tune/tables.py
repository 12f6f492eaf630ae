"""The table of a sweep under --slo, and the decision's inputs, from the variants' records. Pure."""
from . import results
from .slo import LOAD_UNIT


def slo_records(records):
    """{variant: its latest record} of a sweep under --slo."""
    return {r["variant"]: r for r in results.latest(records)}


def slo_inputs(records, variants):
    """[{name, capacity, goodput, k, broken, points}] for slo.decide, in sweep order."""
    by = slo_records(records)
    out = []
    for v in variants:
        r = by.get(v.name)
        if r is None or r.get("status") != "measured":
            continue
        out.append({"name": v.name, "capacity": r.get("capacity") or 0, "goodput": r.get("goodput"),
                    "k": r.get("k"), "broken": r.get("broken"), "points": r.get("points") or []})
    return out


def slo_table(records, variants, decision, kind):
    """(headers, rows): per variant its capacity, goodput, the points it took, acceptance."""
    by = slo_records(records)
    unit = LOAD_UNIT[kind]
    headers = ["variant", f"capacity ({unit})", "goodput tok/s", "points", "noisy", "accept",
               "verdict", "host", "note"]
    rows = []
    for v in variants:
        r = by.get(v.name) or {}
        mark = " *" if decision.get("winner") == v.name else ""
        spec = r.get("spec") or {}
        pts = r.get("points") or []
        measured = r.get("status") == "measured"
        cap = r.get("capacity")
        rows.append([
            v.name + mark,
            "-" if not measured else (f"{cap:g}" + (f" (+<{r['step'] + 1:g})" if r.get("step") else "")),
            "-" if r.get("goodput") is None else f"{r['goodput']:.1f}",
            " ".join(f"{p['load']:g}{'' if p['meets'] else 'x'}" for p in pts) or "-",
            str(sum(1 for p in pts if p.get("noisy"))) if pts else "-",
            "-" if spec.get("acceptance_rate") is None else f"{spec['acceptance_rate']:.2f}",
            results.spec_label(spec, measured),
            r.get("host") or "-",
            (results.note(r) if r else "not measured") if not measured
            else ("misses the bounds at load 1" if not cap else ""),
        ])
    return headers, rows
