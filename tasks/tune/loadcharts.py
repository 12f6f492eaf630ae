"""report.html's charts of a sweep under --slo: inline SVG, drawn here. Pure.

* per bound, each variant's load curve: the bound's figure (median of the runs) against the
  load, the bound drawn as a dashed line, a point that missed a bound hollow;
* goodput (the conservative score, output tok/s) against the load, each variant's capacity
  ringed;
* tokens/s per user (1000 / TPOT p50) against tokens/s per GPU, every point, the Pareto front
  of the points that met the bounds joined and ringed.

The load axis is logarithmic (the search brackets by x4); one load alone sits mid-axis. A
variant's colour is the same in every chart (htmlreport.color).
"""
import math
from html import escape

from ..measure.repeats import median
from . import slo as slo_rules
from .svg import H, PAD_B, PAD_L, PAD_R, PAD_T, W, color, fmt, legend, round_ticks
from .slots import gpus_per_variant
from .tables import slo_records


TICK_CHAR_PX = 7   # a generous width of one character of an 11 px tick label
TICK_GAP_PX = 6    # the least space between two tick labels


def tick_label(v):
    return fmt(round(v, 1))


def tick_values(xs, x):
    """The x values to label, left to right, no two labels overlapping: the first and the last
    (where there is room for both), those in between while they leave room."""
    def half(v):
        return len(tick_label(v)) * TICK_CHAR_PX / 2

    def clear(a, b):
        return x(b) - half(b) - (x(a) + half(a)) >= TICK_GAP_PX
    shown = []
    for v in xs:
        if not shown or clear(shown[-1], v):
            shown.append(v)
    if shown[-1] != xs[-1]:
        while len(shown) > 1 and not clear(shown[-1], xs[-1]):
            shown.pop()
        if clear(shown[-1], xs[-1]):
            shown.append(xs[-1])
    return shown


def _axes(title, xlabel, ylabel, xs, ymax, log):
    """(svg parts, x(v), y(v)): a numeric x (log or linear) and a 0-based y."""
    ticks = round_ticks(ymax)
    top = ticks[-1] or 1
    iw, ih = W - PAD_L - PAD_R, H - PAD_T - PAD_B
    xs = sorted({v for v in xs if v is not None and (v > 0 or not log)}) or [1]
    f = (lambda v: math.log(v)) if log else (lambda v: v)
    lo, hi = f(xs[0]), f(xs[-1])
    if hi == lo:
        lo, hi = lo - 1, hi + 1  # one value: mid-axis

    def x(v):
        return PAD_L + 12 + (iw - 24) * (f(v) - lo) / (hi - lo)

    def y(v):
        return PAD_T + ih - ih * (min(v, top) / top)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'viewBox="0 0 {W} {H}" role="img" aria-label="{escape(title)}">',
             f'<rect x="0" y="0" width="{W}" height="{H}" fill="#fff"/>']
    for t in ticks:
        parts.append(f'<line x1="{PAD_L}" x2="{PAD_L + iw}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#e5e5e5"/>')
        parts.append(f'<text x="{PAD_L - 6}" y="{y(t) + 4:.1f}" text-anchor="end" font-size="11">{fmt(t)}</text>')
    parts.append(f'<line x1="{PAD_L}" x2="{PAD_L}" y1="{PAD_T}" y2="{PAD_T + ih}" stroke="#333"/>')
    parts.append(f'<line x1="{PAD_L}" x2="{PAD_L + iw}" y1="{PAD_T + ih}" y2="{PAD_T + ih}" stroke="#333"/>')
    for v in tick_values(xs, x):
        parts.append(f'<text x="{x(v):.1f}" y="{PAD_T + ih + 16}" text-anchor="middle" '
                     f'font-size="11">{tick_label(v)}</text>')
    parts.append(f'<text x="{PAD_L + iw / 2:.1f}" y="{H - 6}" text-anchor="middle" font-size="12">'
                 f'{escape(xlabel)}</text>')
    parts.append(f'<text x="14" y="{PAD_T + ih / 2:.1f}" text-anchor="middle" font-size="12" '
                 f'transform="rotate(-90 14 {PAD_T + ih / 2:.1f})">{escape(ylabel)}</text>')
    parts.append(f'<title>{escape(title)}</title>')
    return parts, x, y, top


def _dot(parts, cx, cy, col, filled, tip, r=4):
    fill = col if filled else "#fff"
    parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{r}" fill="{fill}" stroke="{col}" '
                 f'stroke-width="2"><title>{escape(tip)}</title></circle>')


def _series(records, variants):
    """[(variant index, variant, record)] of the variants measured with points."""
    by = slo_records(records)
    return [(vi, v, by[v.name]) for vi, v in enumerate(variants)
            if v.name in by and by[v.name].get("status") == "measured" and by[v.name].get("points")]


def bound_chart(series, bound, unit):
    """One bound: each variant's figure against the load, the bound dashed."""
    vals = [median([r.get(bound.key) for r in p.get("runs_slo_ms") or []])
            for _, _, rec in series for p in rec["points"]]
    loads = [p["load"] for _, _, rec in series for p in rec["points"]]
    top = max([v for v in vals if v is not None] + [bound.limit_ms]) * 1.1
    parts, x, y, ytop = _axes(f"{bound.key} against {unit}", unit, f"{bound.key} (ms)", loads, top, True)
    parts.append(f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y(bound.limit_ms):.1f}" '
                 f'y2="{y(bound.limit_ms):.1f}" stroke="#b00020" stroke-width="3" stroke-dasharray="8 4"/>')
    parts.append(f'<text x="{W - PAD_R - 4}" y="{y(bound.limit_ms) - 5:.1f}" text-anchor="end" '
                 f'font-size="11" fill="#b00020">bound {bound.limit_ms:g} ms</text>')
    n = len(series)
    for si, (vi, v, rec) in enumerate(series):
        col = color(vi)
        pts = sorted((p["load"], median([r.get(bound.key) for r in p.get("runs_slo_ms") or []]), p)
                     for p in rec["points"])
        pts = [(ld, val, p) for ld, val, p in pts if val is not None]
        off = (si - (n - 1) / 2) * 4
        if len(pts) > 1:
            parts.append('<polyline points="' + " ".join(f"{x(ld) + off:.1f},{y(val):.1f}" for ld, val, _ in pts)
                         + f'" fill="none" stroke="{col}" stroke-width="2"/>')
        for ld, val, p in pts:
            _dot(parts, x(ld) + off, y(val), col, p["meets"],
                 f"{v.name}: {bound.key} {val:g} ms at {unit} {ld:g}"
                 + ("" if p["meets"] else " (misses the bounds)"))
    legend(parts, [(vi, v.name) for vi, v, _ in series])
    return "".join(parts) + "</svg>"


def goodput_chart(series, unit):
    """The conservative score against the load; each capacity point ringed."""
    vals = [p.get("score") or 0 for _, _, rec in series for p in rec["points"]]
    loads = [p["load"] for _, _, rec in series for p in rec["points"]]
    parts, x, y, _ = _axes(f"output tok/s against {unit}", unit, "output tok/s (median - 1.4826 MAD)",
                           loads, max(vals + [1]) * 1.05, True)
    n = len(series)
    for si, (vi, v, rec) in enumerate(series):
        col = color(vi)
        off = (si - (n - 1) / 2) * 4
        pts = sorted((p["load"], p.get("score") or 0, p) for p in rec["points"])
        if len(pts) > 1:
            parts.append('<polyline points="' + " ".join(f"{x(ld) + off:.1f},{y(s):.1f}" for ld, s, _ in pts)
                         + f'" fill="none" stroke="{col}" stroke-width="2"/>')
        for ld, sc, p in pts:
            _dot(parts, x(ld) + off, y(sc), col, p["meets"],
                 f"{v.name}: {sc:g} tok/s at {unit} {ld:g}" + ("" if p["meets"] else " (misses the bounds)")
                 + (" (noisy)" if p.get("noisy") else ""))
            if rec.get("capacity") == ld and p["meets"]:
                parts.append(f'<circle cx="{x(ld) + off:.1f}" cy="{y(sc):.1f}" r="9" fill="none" '
                             f'stroke="{col}" stroke-width="1.5"><title>{escape(v.name)}: capacity '
                             f'{ld:g}</title></circle>')
    legend(parts, [(vi, v.name) for vi, v, _ in series])
    return "".join(parts) + "</svg>"


def pareto_points(series):
    """[(variant index, variant, point, per-user tok/s, per-GPU tok/s)] of every point."""
    out = []
    for vi, v, rec in series:
        gpus = gpus_per_variant(v.profile) if v.profile is not None else 1
        for p in rec["points"]:
            tpot = (p.get("tpot_ms") or {}).get("p50")
            user = round(1000.0 / tpot, 3) if tpot else None
            per_gpu = (p.get("score") or 0) / gpus
            out.append((vi, v, p, user, round(per_gpu, 3)))
    return out


def pareto_chart(series):
    """Per-user tok/s against per-GPU tok/s; the front of the points meeting the bounds."""
    pts = pareto_points(series)
    usable = [q for q in pts if q[3] is not None]
    if not usable:
        return None
    meeting = [q for q in usable if q[2]["meets"]]
    front = [meeting[i] for i in slo_rules.pareto([(q[3], q[4]) for q in meeting])]
    parts, x, y, _ = _axes("tokens/s per user against tokens/s per GPU", "tokens/s per user (1000 / TPOT p50)",
                           "output tokens/s per GPU", [q[3] for q in usable],
                           max(q[4] for q in usable) * 1.1 or 1, False)
    front.sort(key=lambda q: q[3])
    if len(front) > 1:
        parts.append('<polyline points="' + " ".join(f"{x(q[3]):.1f},{y(q[4]):.1f}" for q in front)
                     + '" fill="none" stroke="#333" stroke-width="1.5" stroke-dasharray="3 3"/>')
    for vi, v, p, user, gpu in usable:
        _dot(parts, x(user), y(gpu), color(vi), p["meets"],
             f"{v.name} at load {p['load']:g}: {user:g} tok/s per user, {gpu:g} per GPU"
             + ("" if p["meets"] else " (misses the bounds)"))
    for vi, v, p, user, gpu in front:
        parts.append(f'<rect x="{x(user) - 8:.1f}" y="{y(gpu) - 8:.1f}" width="16" height="16" '
                     f'fill="none" stroke="#333" stroke-width="1.5"><title>Pareto front: {escape(v.name)} '
                     f'at load {p["load"]:g}</title></rect>')
    legend(parts, sorted({(vi, v.name) for vi, v, *_ in usable}))
    return "".join(parts) + "</svg>"


def slo_sections(records, variants, bounds, kind, decision):
    """The report's parts under --slo: the winner per load range, then the charts."""
    unit = slo_rules.LOAD_UNIT[kind]
    out = []
    if decision.get("ranges_text"):
        out.append(f'<p class="ranges"><strong>Winner per load range</strong> (bounds '
                   f'<code>{escape(slo_rules.slo_text(bounds))}</code>): '
                   f'{escape(decision["ranges_text"])}</p>')
    series = _series(records, variants)
    if not series:
        out.append("<p>No variant was measured at any load, so there is no chart: the table says why.</p>")
        return out
    out += ["<figure>", goodput_chart(series, unit),
            f"<figcaption>Output tokens/s (the conservative score of each point's runs) against "
            f"{unit}; a hollow point missed a bound, a ring marks each variant's capacity."
            "</figcaption></figure>"]
    for b in bounds:
        out += ["<figure>", bound_chart(series, b, unit),
                f"<figcaption>{escape(b.key)} (median of the runs) against {unit}, per variant; "
                f"the dashed line is the bound, {b.limit_ms:g} ms.</figcaption></figure>"]
    par = pareto_chart(series)
    if par:
        out += ["<figure>", par,
                "<figcaption>Every point: tokens/s per user against output tokens/s per GPU; the "
                "squares joined by a dashed line are the Pareto front of the points that met the "
                "bounds (no other is better in both).</figcaption></figure>"]
    return out
