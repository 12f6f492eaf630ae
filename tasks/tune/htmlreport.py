"""report.html of a sweep: one self-contained page, readable offline. Pure.

Charts are inline SVG drawn here (no script, no font, no image, no stylesheet from
anywhere): output tokens/s against concurrency per variant, and acceptance per draft
position per variant; then the table, and the winner with the reason. A Content-Security-
Policy of `default-src 'none'` makes the browser refuse any fetch the page might still try.
"""
from html import escape

from . import results
from .svg import PAD_L, PAD_R, W, color, frame, legend

def setting_text(key, value):
    """One variant setting in words: the baseline's `speculative = None` is no speculation."""
    if value is None:
        return "no speculative decoding (every speculative flag removed)" if key == "speculative" \
            else f"{key} removed"
    return f"{key} = {value}"


def throughput_chart(records, variants, concurrencies):
    """Output tokens/s (median, with the min..max spread as a bar) against concurrency."""
    by = {(r["variant"], r["concurrency"]): r for r in results.latest(records)
          if r["status"] == "measured" and r.get("concurrency") is not None}
    if not by:
        return None
    vals = [r["output_tokens_per_s"] or 0 for r in by.values()] + \
           [(r.get("spread") or {}).get("output_tokens_per_s", {}).get("max") or 0 for r in by.values()]
    parts, x0, y = frame("concurrency", "output tokens/s", concurrencies, max(vals + [1]))
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
    legend(parts, list(enumerate(v.name for v in variants)))
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
    parts, x, y = frame("draft position", "acceptance (0..1)", list(range(width)), 1.0)
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
    legend(parts, [(vi, v.name) for vi, v, _ in with_spec])
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
