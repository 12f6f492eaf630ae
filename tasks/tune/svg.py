"""The SVG primitives of a sweep's charts (report.html): palette, frame, ticks, legend. Pure.

Shared by the throughput and acceptance charts (htmlreport.py) and the load charts of an
SLO sweep (loadcharts.py), so the page (htmlreport) calls the load charts and nothing calls
back: the two modules no longer import each other.
"""
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
W, H, PAD_L, PAD_R, PAD_T, PAD_B = 640, 320, 60, 180, 20, 44


def color(i):
    return PALETTE[i % len(PALETTE)]


def round_ticks(top, n=5):
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


def fmt(v):
    return f"{v:g}" if abs(v) < 1e4 else f"{v:.0f}"


def frame(title, ylabel, xlabels, ymax):
    """(svg parts, x(i), y(v)) for a chart with categorical x and a 0-based y axis."""
    ticks = round_ticks(ymax)
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
                     f'font-size="11">{fmt(t)}</text>')
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


def legend(parts, entries):
    """entries: [(variant index, name)]: a variant keeps its colour in every chart."""
    for row, (i, name) in enumerate(entries):
        ly = PAD_T + 8 + 18 * row
        parts.append(f'<rect x="{W - PAD_R + 14}" y="{ly - 9}" width="12" height="12" '
                     f'fill="{color(i)}"/>')
        parts.append(f'<text x="{W - PAD_R + 32}" y="{ly + 1}" font-size="11">'
                     f'{escape(name[:26])}</text>')
