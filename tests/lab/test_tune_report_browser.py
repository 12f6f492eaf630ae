"""report.html of `fab tune` in a real browser (in lab/, not unit/: it starts Chromium): Debian's headless Chromium renders the charts,
and the page makes no network request.

How "no request" is proven, in a way that can fail: Chromium writes every request it starts
to a NetLog (--log-net-log). Requests a page makes carry the page's site in their network
isolation key (file:// here); Chromium's own background requests do not. A control page with
one remote image must show that image's request in the log (so the method sees requests);
the report must show none, both as written and with its Content-Security-Policy removed (so
it is the page, not only the policy, that fetches nothing). The charts are checked in the
screenshot: the pixels of each variant's colour are there.
"""
import json
import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from tasks.tune import htmlreport, results, slo
from tasks.tune.tables import slo_inputs, slo_table
from tasks.tune.variants import Variant

pytestmark = pytest.mark.e2e  # a real browser, like the lab's real processes (tests/README.md)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


def run_chromium(page, tmp, *, shot):
    """Render `page` (a local file); (the page's own network requests, screenshot path)."""
    if not os.path.exists(CHROMIUM):
        pytest.fail("Debian's chromium is not installed (apt-get install chromium; .ci/run "
                    "installs it)", pytrace=False)
    profile = tmp / f"profile-{page.stem}"
    profile.mkdir()
    netlog = tmp / f"netlog-{page.stem}.json"
    png = tmp / shot
    subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--log-net-log={netlog}",
                    "--window-size=1100,1500", f"--screenshot={png}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    return page_requests(netlog), png


def page_requests(netlog):
    """URLs of the requests the page started (its site, file://, in their isolation key)."""
    data = json.loads(netlog.read_text())
    start = data["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    out = []
    for e in data["events"]:
        p = e.get("params") or {}
        if e["type"] == start and "file://" in p.get("network_isolation_key", "") \
                and not p.get("url", "").startswith(("file:", "data:")):
            out.append(p["url"])
    return out


def png_pixels(path):
    """{(r, g, b): count} of an 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes)."""
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", None
    while pos < len(raw):
        n, kind = struct.unpack(">I4s", raw[pos:pos + 8])
        body = raw[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    data = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    counts = {}
    for y in range(height):
        f, line = data[y * (stride + 1)], bytearray(data[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        for x in range(0, stride, bpp):
            px = tuple(line[x:x + 3])
            counts[px] = counts.get(px, 0) + 1
        prev = line
    return counts


def rgb(hex_colour):
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def sample_sweep():
    """Records as a sweep writes them: three variants at two concurrencies, one broken."""
    def run(tps, ttft, acc=None, pp=None, verdict=None):
        spec = None if acc is None else {"acceptance_rate": acc, "mean_acceptance_length": 1 + sum(pp),
                                         "per_position": pp, "verdict": verdict}
        return {"requests": 8, "errors": 0, "duration_s": 1.0, "requests_per_s": 8.0,
                "output_tokens_per_s": tps, "ttft_ms": {"p50": ttft, "p90": ttft * 1.2},
                "itl_ms": {"p50": 5.0, "p90": 6.0}, "spec": spec}
    variants = [Variant(i, n, s, Path(f"0{i}-{n}.toml"), None, {}, None) for i, (n, s) in enumerate(
        [("k=2", {"k": 2}), ("k=4", {"k": 4}), ("baseline", {"speculative": None}),
         ("random drafter", {"profile": "r.toml"})], 1)]
    recs = []
    for c, scale in ((1, 1.0), (8, 6.5)):
        recs.append(results.measured("k=2", {"k": 2}, "h1", "r1", c, [
            run(180 * scale, 20, 0.6, [0.7, 0.5], "healthy"), run(184 * scale, 21, 0.6, [0.7, 0.5], "healthy")]))
        recs.append(results.measured("k=4", {"k": 4}, "h2", "r2", c, [
            run(205 * scale, 22, 0.45, [0.7, 0.49, 0.34, 0.24], "healthy"),
            run(210 * scale, 23, 0.45, [0.7, 0.49, 0.34, 0.24], "healthy")]))
        recs.append(results.measured("baseline", {"speculative": None}, "h1", "r3", c, [
            run(120 * scale, 15), run(121 * scale, 15)]))
        recs.append(results.measured("random drafter", {"profile": "r.toml"}, "h2", "r4", c, [
            run(90 * scale, 30, 0.0, [0.0, 0.0, 0.0], "broken"),
            run(91 * scale, 30, 0.0, [0.0, 0.0, 0.0], "broken")]))
    return variants, recs


def write_report(tmp):
    variants, recs = sample_sweep()
    objective = ("tokens_per_s", 8)
    decision = results.decide(recs, objective)
    headers, rows = results.table(recs, variants, (1, 8), objective, decision)
    html = htmlreport.render(title="fab tune: sample", records=recs, variants=variants,
                             concurrencies=(1, 8), objective=objective, decision=decision,
                             headers=headers, rows=rows, meta=[("profile", "sample.toml")])
    page = tmp / "report.html"
    page.write_text(html)
    return page, decision


def test_the_report_renders_its_charts_with_no_network_request(tmp_path):
    control = tmp_path / "control.html"
    control.write_text('<!DOCTYPE html><html><body><p>control</p>'
                       '<img src="http://192.0.2.1/tune-control.png"></body></html>')
    seen, _ = run_chromium(control, tmp_path, shot="control.png")
    assert seen == ["http://192.0.2.1/tune-control.png"], "the NetLog method must see a page's request"

    page, decision = write_report(tmp_path)
    assert decision["winner"] == "k=4" and decision["excluded"] == ["random drafter"]
    seen, png = run_chromium(page, tmp_path, shot="tune-report.png")
    assert seen == [], seen
    no_csp = tmp_path / "report-no-csp.html"
    text = page.read_text()
    assert "Content-Security-Policy" in text
    no_csp.write_text("\n".join(l for l in text.splitlines() if "Content-Security-Policy" not in l))
    seen, _ = run_chromium(no_csp, tmp_path, shot="no-csp.png")
    assert seen == [], seen

    pixels = png_pixels(png)
    for i in range(4):  # each variant's colour is drawn (lines, points, bars, legend)
        assert pixels.get(rgb(htmlreport.color(i)), 0) > 50, (i, htmlreport.color(i))
    print(f"\nscreenshot of report.html: {png}")
    keep = os.environ.get("LLMFAB_ARTIFACTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(keep) / png.name)


def slo_sweep(shape):
    """Records of a sweep under --slo: 'two' variants with their points, 'one' variant with one
    point, or 'empty' (nothing measured)."""
    def pt(load, tps, tpot, meets):
        run = {"requests": 8, "errors": 0, "duration_s": 1.0, "requests_per_s": 8.0,
               "output_tokens_per_s": tps, "ttft_ms": {"p50": 20, "p90": 25},
               "itl_ms": {"p50": 5.0, "p90": 6.0}, "tpot_ms": {"p50": tpot, "p90": tpot * 1.1},
               "spec": None}
        rec = results.measured("x", {}, "h1", "r1", load, [run, dict(run), dict(run)])
        sc, med, mad = slo.score([tps] * 3)
        rec.update(load=load, meets=meets, misses=[], score=sc, median=med, mad=mad, noisy=False,
                   remeasured=False, runs_slo_ms=[{"tpot_p50": tpot}] * 3)
        return rec

    def variant(name, k, pts, cap):
        at = next((p for p in pts if p["load"] == cap), None)
        return {"variant": name, "settings": {}, "host": "h1", "release": "r", "concurrency": None,
                "status": "measured", "load_kind": "concurrency", "slo": {"tpot_p50": 40.0},
                "capacity": cap, "goodput": at["score"] if at else None, "step": 0, "k": k,
                "broken": False, "spec": None, "points": pts}
    names = {"two": [("k=4", 4), ("baseline", None)], "one": [("k=2", 2)], "empty": [("k=2", 2)]}[shape]
    variants = [Variant(i, n, {"k": k}, Path(f"0{i}.toml"), None, {}, None) for i, (n, k) in enumerate(names, 1)]
    if shape == "two":
        recs = [variant("k=4", 4, [pt(1, 90, 11, True), pt(4, 300, 13, True), pt(16, 700, 45, False),
                                   pt(10, 620, 38, True), pt(13, 660, 42, False)], 10),
                variant("baseline", None, [pt(1, 50, 20, True), pt(4, 190, 21, True), pt(16, 700, 36, True),
                                           pt(64, 900, 70, False), pt(40, 850, 41, False)], 16)]
    elif shape == "one":
        recs = [variant("k=2", 2, [pt(1, 80, 12, True)], 1)]
    else:
        recs = []
    return variants, recs


@pytest.mark.parametrize("shape", ["two", "one", "empty"])
def test_the_slo_report_renders_curves_bounds_and_the_front_with_no_network_request(tmp_path, shape):
    variants, recs = slo_sweep(shape)
    bounds = slo.parse_slo("tpot_p50<=40")
    decision = slo.decide(slo_inputs(recs, variants), "concurrency")
    headers, rows = slo_table(recs, variants, decision, "concurrency")
    html = htmlreport.render(title=f"fab tune --slo: {shape}", records=recs, variants=variants,
                             concurrencies=(1,), objective=("goodput", None), decision=decision,
                             headers=headers, rows=rows, meta=[("slo", "tpot_p50<=40")],
                             slo=bounds, load="concurrency")
    page = tmp_path / f"slo-{shape}.html"
    page.write_text(html)
    seen, png = run_chromium(page, tmp_path, shot=f"tune-slo-report-{shape}.png")
    assert seen == [], seen
    pixels = png_pixels(png)
    bound_red = rgb("#b00020")  # the bound line: a colour no variant has
    if shape == "empty":
        assert "<svg" not in html and "nothing was measured" in html.lower() or "no variant was measured" in html.lower()
    else:
        assert html.count("<svg") == 3  # goodput, the bound's curve, the Pareto chart
        assert "bound 40 ms" in html and "Pareto front" in html
        assert pixels.get(bound_red, 0) > 100  # the dashed bound is drawn
        for i in range(len(variants)):
            assert pixels.get(rgb(htmlreport.color(i)), 0) > 50, i
    if shape == "two":
        assert decision["ranges_text"] == "k=4 up to concurrency 10, baseline to 16, none meets the bounds from 40 on"
        assert "Winner per load range" in html
    keep = os.environ.get("LLMFAB_ARTIFACTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(keep) / png.name)
