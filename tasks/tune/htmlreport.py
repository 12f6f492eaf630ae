"""report.html of a sweep: one self-contained page, readable offline. Pure.

Charts are inline SVG drawn here (no script, no font, no image, no stylesheet from
anywhere): output tokens/s against concurrency per variant, and acceptance per draft
position per variant; then the table, and the winner with the reason. A Content-Security-
Policy of `default-src 'none'` makes the browser refuse any fetch the page might still try.
"""
from html import escape

from . import results

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
W, H, PAD_L, PAD_R, PAD_T, PAD_B = 640, 320, 60, 180, 20, 44


def setting_text(key, value):
    """One variant setting in words: the baseline's `speculative = None` is no speculation."""
    if value is None:
        return "no speculative decoding (every speculative flag removed)" if key == "speculative" \
            else f"{key} removed"
    return f"{key} = {value}"


def color(i):
    return PALETTE[i % len(PALETTE)]


def _ticks(top, n=5):
    """Round tick values from 0 to at least `top`."""
    if top <= 0:
        return [0, 1]
    import math
    raw = top / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    ticks, v = [], 0.0
    while v < top + step * 0.999:
        ticks.append(round(v, 10))
        v += step
    return ticks


def _fmt(v):
    return f"{v:g}" if abs(v) < 1e4 else f"{v:.0f}"


def _frame(title, ylabel, xlabels, ymax):
    """(svg parts, x(i), y(v)) for a chart with categorical x and a 0-based y axis."""
    ticks = _ticks(ymax)
    top = ticks[-1] or 1
    iw, ih = W - PAD_L - PAD_R, H - PAD_T - PAD_B
    n = max(1, len(xlabels))

    def x(i):
        return PAD_L + (iw * (i + 0.5) / n)

    def y(v):
        return PAD_T + ih - ih * (v / top)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'viewBox="0 0 {W} {H}" role="img" aria-label="{escape(title)}">',
             f'<rect x="0" y="0" width="{W}" height="{H}" fill="#fff"/>']
    for t in ticks:
        parts.append(f'<line x1="{PAD_L}" x2="{PAD_L + iw}" y1="{y(t):.1f}" y2="{y(t):.1f}" '
                     f'stroke="#e5e5e5"/>')
        parts.append(f'<text x="{PAD_L - 6}" y="{y(t) + 4:.1f}" text-anchor="end" '
                     f'font-size="11">{_fmt(t)}</text>')
    parts.append(f'<line x1="{PAD_L}" x2="{PAD_L}" y1="{PAD_T}" y2="{PAD_T + ih}" stroke="#333"/>')
    parts.append(f'<line x1="{PAD_L}" x2="{PAD_L + iw}" y1="{PAD_T + ih}" y2="{PAD_T + ih}" '
                 f'stroke="#333"/>')
    for i, label in enumerate(xlabels):
        parts.append(f'<text x="{x(i):.1f}" y="{PAD_T + ih + 16}" text-anchor="middle" '
                     f'font-size="11">{escape(str(label))}</text>')
    parts.append(f'<text x="{PAD_L + iw / 2:.1f}" y="{H - 6}" text-anchor="middle" '
                 f'font-size="12">{escape(title)}</text>')
    parts.append(f'<text x="14" y="{PAD_T + ih / 2:.1f}" text-anchor="middle" font-size="12" '
                 f'transform="rotate(-90 14 {PAD_T + ih / 2:.1f})">{escape(ylabel)}</text>')
    return parts, x, y


def _legend(parts, entries):
    """entries: [(variant index, name)]: a variant keeps its colour in every chart."""
    for row, (i, name) in enumerate(entries):
        ly = PAD_T + 8 + 18 * row
        parts.append(f'<rect x="{W - PAD_R + 14}" y="{ly - 9}" width="12" height="12" '
                     f'fill="{color(i)}"/>')
        parts.append(f'<text x="{W - PAD_R + 32}" y="{ly + 1}" font-size="11">'
                     f'{escape(name[:26])}</text>')


def throughput_chart(records, variants, concurrencies):
    """Output tokens/s (median, with the min..max spread as a bar) against concurrency."""
    by = {(r["variant"], r["concurrency"]): r for r in results.latest(records)
          if r["status"] == "measured" and r.get("concurrency") is not None}
    if not by:
        return None
    vals = [r["output_tokens_per_s"] or 0 for r in by.values()] + \
           [(r.get("spread") or {}).get("output_tokens_per_s", {}).get("max") or 0 for r in by.values()]
    parts, x0, y = _frame("concurrency", "output tokens/s", concurrencies, max(vals + [1]))
    n = len(variants)
    for vi, v in enumerate(variants):
        # each variant a few pixels aside, so equal values never hide one another's dot
        def x(i, vi=vi):
            return x0(i) + (vi - (n - 1) / 2) * 6
        pts = [(i, by[(v.name, c)]) for i, c in enumerate(concurrencies) if (v.name, c) in by]
        if not pts:
            continue
        col = color(vi)
        if len(pts) > 1:
            path = " ".join(f"{x(i):.1f},{y(r['output_tokens_per_s'] or 0):.1f}" for i, r in pts)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{col}" stroke-width="2"/>')
        for i, r in pts:
            s = (r.get("spread") or {}).get("output_tokens_per_s")
            if s and r.get("repeats", 0) > 1:
                parts.append(f'<line x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{y(s["min"]):.1f}" '
                             f'y2="{y(s["max"]):.1f}" stroke="{col}" stroke-width="1.5"/>')
            parts.append(f'<circle cx="{x(i):.1f}" cy="{y(r["output_tokens_per_s"] or 0):.1f}" '
                         f'r="4" fill="{col}"><title>{escape(v.name)}: '
                         f'{r["output_tokens_per_s"]} tok/s at concurrency {r["concurrency"]}'
                         f'</title></circle>')
    _legend(parts, list(enumerate(v.name for v in variants)))
    return "".join(parts) + "</svg>"


def acceptance_chart(records, variants, concurrency):
    """Acceptance per draft position (bench window), grouped bars per position."""
    by = {r["variant"]: r for r in results.latest(records)
          if r["status"] == "measured" and (r["concurrency"] == concurrency or concurrency is None)}
    with_spec = [(vi, v, by[v.name]["spec"]["per_position"]) for vi, v in enumerate(variants)
                 if v.name in by and (by[v.name].get("spec") or {}).get("per_position")]
    width = max((len(pp) for _, _, pp in with_spec), default=0)
    if not width:
        return None
    parts, x, y = _frame("draft position", "acceptance (0..1)", list(range(width)), 1.0)
    iw = W - PAD_L - PAD_R
    slot = iw / width
    bar = max(1.0, slot * 0.8 / len(with_spec))
    for k, (vi, v, pp) in enumerate(with_spec):
        for pos, val in enumerate(pp):
            if val is None:
                continue
            left = PAD_L + slot * pos + slot * 0.1 + bar * k
            height = max(1.5, y(0) - y(val))  # a zero still shows, as a line on the axis
            parts.append(f'<rect x="{left:.1f}" y="{y(0) - height:.1f}" width="{bar:.1f}" '
                         f'height="{height:.1f}" fill="{color(vi)}">'
                         f'<title>{escape(v.name)}: position {pos}: {val:.3f}</title></rect>')
    _legend(parts, [(vi, v.name) for vi, v, _ in with_spec])
    return "".join(parts) + "</svg>"


CSS = """body{font-family:sans-serif;margin:24px;color:#222;max-width:1100px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:4px 8px;
text-align:left}th{background:#f3f3f3}.win{background:#eaf6ea;font-weight:bold}
.verdict{padding:10px 14px;background:#f6f6f6;border-left:4px solid #2ca02c;margin:12px 0}
.tie{border-left-color:#ff7f0e}.none{border-left-color:#d62728}figure{margin:16px 0}
figcaption{font-size:13px;color:#555}code{background:#f3f3f3;padding:1px 4px}"""


def render(*, title, records, variants, concurrencies, objective, decision, headers, rows,
           meta, slo=None, load="concurrency"):
    """The whole page as text. `meta`: [(label, value)] shown under the title; `slo`: the
    bounds (tasks/tune/slo.py) of a sweep under --slo, whose charts are loadcharts.py's."""
    kind, conc = objective
    if decision.get("winner") and (not decision.get("tie") or slo):
        head, cls = f"Winner: {decision['winner']}", "verdict"
    elif decision.get("tie"):
        head, cls = f"No clear winner: {decision['winner']} and {decision['second']}", "verdict tie"
    else:
        head, cls = "No winner", "verdict none"
    acc = acceptance_chart(records, variants, conc)
    tput = None if slo else throughput_chart(records, variants, concurrencies)
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
           "style-src 'unsafe-inline'; img-src data:\">",
           f"<title>{escape(title)}</title><style>{CSS}</style></head><body>",
           f"<h1>{escape(title)}</h1>",
           "<p>" + " &middot; ".join(f"{escape(k)}: <code>{escape(str(v))}</code>"
                                     for k, v in meta) + "</p>",
           f'<div class="{cls}"><strong>{escape(head)}</strong> (objective '
           f'<code>{escape(decision["objective"])}</code>)<br>{escape(decision["why"])}</div>']
    if slo:
        from .loadcharts import slo_sections
        out += slo_sections(records, variants, slo, load, decision)
    elif tput:
        out += ["<figure>", tput,
                "<figcaption>Output tokens/s against concurrency, per variant (median of the runs; "
                "the vertical bar is the min..max spread).</figcaption></figure>"]
    else:
        out.append("<p>Nothing was measured, so there is no chart: the table says why.</p>")
    if acc:
        where = "at each variant's capacity" if slo else f"at concurrency {conc}"
        out += ["<figure>", acc, f"<figcaption>Acceptance per draft position {where}, per "
                                 f"variant (bench window).</figcaption></figure>"]
    else:
        out.append("<p>No variant reported per-position acceptance.</p>")
    out.append("<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in headers) + "</tr>")
    for row in rows:
        win = decision.get("winner") and row[0].rstrip(" *") == decision["winner"]
        attr = ' class="win"' if win else ""
        out.append(f"<tr{attr}>"
                   + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>")
    out.append("</table>")
    out.append("<p>Settings of each variant:</p><ul>")
    for v in variants:
        out.append(f"<li><strong>{escape(v.name)}</strong>: <code>"
                   f"{escape(', '.join(setting_text(k, val) for k, val in v.settings.items()))}</code>"
                   f" ({escape(v.path.name)})</li>")
    out.append("</ul></body></html>")
    return "\n".join(out) + "\n"
