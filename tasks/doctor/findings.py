"""The speculative-decoding doctor, client side: findings in check/deploy/status/bench.

The rules run on the host: the preflight's records carry each finding
(tasks/doctor/host/spec_check.py); op spec_evidence (tasks/doctor/host/spec_evidence.py) answers the
same findings plus the start-up log's evidence, scanned once the server is ready and kept
in the release directory as spec-evidence.json. Here: split findings out of preflight
records for --json, print the log evidence at the ready line, and join everything into the
live verdict (tasks/doctor/verdict.py).
"""
from . import sampling, verdict
from .host.spec_check import accept_hint, accepted_note
from ..output import Block
from .host_request import doctor_request

PREFIX_HITS = ("vllm:prefix_cache_hits_total",)
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total",)


def split(checks):
    """(checks without their finding, the findings) of preflight records, for --json."""
    plain = [{k: v for k, v in c.items() if k != "finding"} for c in checks]
    return plain, [c["finding"] for c in checks if c.get("finding")]


def evidence_lines(ev):
    """Human lines about what the start-up log showed (at deploy's ready line)."""
    if not ev:
        return []
    parts = []
    if ev.get("runner"):
        parts.append(f"{ev['runner'].upper()} model runner"
                     + (f" (V2 does not support {ev['v1_because']})" if ev.get("v1_because") else ""))
    if ev.get("aux_layers") is not None:
        ids = ev.get("layer_ids")
        rel = ""
        if ids:
            rel = (" = the drafter's target_layer_ids unshifted" if ev["aux_layers"] == ids else
                   " = the drafter's target_layer_ids + 1, as it was trained"
                   if ev["aux_layers"] == [i + 1 for i in ids] else f" (drafter's ids {ids})")
        parts.append(f"aux layers {tuple(ev['aux_layers'])} from the {ev.get('aux_from')}{rel}")
    lines = ["spec log: " + "; ".join(parts)] if parts else []
    return lines + [finding_block(f) for f in ev.get("findings") or []]


def finding_block(f):
    """A doctor's finding for people: `SEVERITY rule message`, then its fix and source on
    indented lines (the reporter wraps them to the terminal)."""
    return Block(f"{f['severity']:<4} {f['rule']} {f['message']}{accepted_note(f)}",
                 (("fix", f["fix"] + accept_hint(f)), ("source", f["source"])), hang=5)


def at_ready(host, doctor, ddir, release, checks, reporter):
    """Deploy, once ready: scan the start-up log, print its evidence; all findings for --json.
    `doctor`: the section deploy's preflight request carried (tasks/doctor/host_request.py),
    None without speculative decoding."""
    ev = None if doctor is None else host.call(
        "spec_evidence", deploy_dir=ddir, release=release, doctor=doctor, scan=True)["evidence"]
    reporter.lines(host.name, evidence_lines(ev))
    return merge(split(checks)[1], ev)


def merge(version_findings, ev):
    """One list: log findings win over version-based ones of the same rule, and a log showing
    the tuple shifted as it should be clears the version-based offset finding."""
    log = list((ev or {}).get("findings") or [])
    seen = {f["rule"] for f in log}
    fixed = ev and ev.get("aux_layers") is not None and ev.get("layer_ids") \
        and ev["aux_layers"] == [i + 1 for i in ev["layer_ids"]]
    out = [f for f in version_findings if f["rule"] not in seen
           and not (fixed and f["rule"] == "vllm-dflash-layer-offset")]
    return out + log


def deployment_findings(host, profile, ddir, release):
    """(the host's spec_evidence answer, findings incl. the log's) of a running deployment,
    or (None, []) without speculative decoding. One agent request."""
    req = doctor_request(profile)
    if req is None:
        return None, []
    ans = host.call("spec_evidence", deploy_dir=ddir, release=release, doctor=req, scan=False)
    return ans, merge(ans["findings"], ans["evidence"])


def prefix_hit_rate(after, before=None):
    """Prefix-cache hits / queries over the window (vLLM's counters), or None."""
    if after is None or after.get(PREFIX_QUERIES) is None:
        return None
    q = after.get(PREFIX_QUERIES) - (before.get(PREFIX_QUERIES, 0.0) if before is not None else 0.0)
    h = after.get(PREFIX_HITS, 0.0) - (before.get(PREFIX_HITS, 0.0) if before is not None else 0.0)
    if q <= 0 or h < 0:
        return None
    return round(h / q, 4)


def with_verdict(lines, text):
    """The metric lines with the spec line ending in the verdict (docs/doctor.md), wrapped."""
    return [Block(f"{line}; {text}") if line.startswith("speculative decoding:") else line
            for line in lines]


def status_verdict(host, profile, ddir, release, m, spec_out):
    """`fab status`: judge acceptance since start; (verdict text, extra lines, sampling).
    The requests since start carried their own sampling: only the server's default is known."""
    info, findings = deployment_findings(host, profile, ddir, release)
    samp = sampling.server_default(profile, (info or {}).get("generation_config"))
    text, lines = judge(m.get("spec_raw"), spec_out, info, findings,
                        prefix_hit_rate(m.get("snapshot")), samp)
    return text, lines, samp


def bench_verdict(host, profile, ddir, release, raw, spec_raw, spec_out, sent=None, probe=None):
    """`fab bench`: judge acceptance over the bench window; (verdict text, extra lines,
    sampling). `sent`: the sampling fields every request carried; `probe()`: the spec numbers
    of a short greedy run (tasks/bench.py), called only when the rule table needs it."""
    from ..measure.metrics import parse
    info, findings = deployment_findings(host, profile, ddir, release)
    samp = sampling.window_sampling(sent, sampling.server_default(
        profile, (info or {}).get("generation_config")))
    before, after = raw["before"].get("text"), raw["after"].get("text")
    hit = prefix_hit_rate(parse(after), parse(before) if before else None) if after else None
    text, lines = judge(spec_raw, spec_out, info, findings, hit, samp, probe)
    return text, lines, samp


def judge(spec_raw, spec_out, info, findings, hit_rate=None, samp=None, probe=None):
    """Add verdict, evidence and findings to an output spec record; (verdict text, more lines).
    Under sampling a `broken`/`low` window is judged again greedily (tasks/doctor/sampling.py)."""
    if spec_out is None or spec_raw is None or info is None:
        return None, []
    method, k = info.get("method"), info.get("k")
    v = verdict.verdict(spec_raw, method, k, findings)
    if samp is not None:
        v = under_sampling(v, samp, probe, method, k, findings)
    if method == "dflash" and info.get("prefix_caching"):
        v["evidence"]["prefix_cache_hit_rate"] = hit_rate
    spec_out.update(v)
    lines = []
    if "prefix_cache_hit_rate" in v["evidence"]:
        lines.append("prefix cache hit rate " + ("unknown" if hit_rate is None else f"{hit_rate * 100:.1f}%")
                     + " over the same window (DFlash acceptance falls as it rises)")
    return verdict.verdict_text(v), lines + verdict.cause_lines(v)


def under_sampling(v, samp, probe, method, k, findings):
    """The window's verdict `v` through the sampling rule table: a greedy probe when the
    window was sampled and would be `broken`/`low` (and `probe` can run one)."""
    window = v["verdict"]
    ev = v["evidence"]
    ev["sampling"] = samp
    probe_v, probe_rec = "none", None
    if sampling.needs_probe(window, samp) and probe is not None:
        p_raw, requests = probe()
        pv = verdict.verdict(p_raw, method, k, findings) if p_raw is not None else None
        probe_v = pv["verdict"] if pv else None
        pe = pv["evidence"] if pv else {}
        probe_rec = {"requests": requests, "sampling": {"temperature": 0.0, "source": "request"},
                     "verdict": probe_v, "drafts": pe.get("drafts"),
                     "acceptance_rate": None if p_raw is None else verdict._r(p_raw.get("acceptance_rate")),
                     "position_0": pe.get("position_0"),
                     "mean_acceptance_length": pe.get("mean_acceptance_length"), "why": pe.get("why")}
    final, why = sampling.rule(window, sampling.is_greedy(samp), probe_v)
    ev["window_verdict"] = window
    if probe_rec is not None:
        ev["greedy_probe"] = probe_rec
    if why is not None:
        probe_why = None
        if probe_rec is not None:
            acc = probe_rec["acceptance_rate"]
            probe_why = f"over {probe_rec['requests']} requests at temperature 0, " + (
                probe_rec["why"] or "" if probe_rec["verdict"] in sampling.NEEDS_GREEDY
                else "acceptance unknown" if acc is None else f"acceptance {acc:.2f}")
            if probe_rec["verdict"] is None:
                probe_why = f"{probe_rec['why']}, {probe_rec['requests']} requests at temperature 0"
        ev["why"] = sampling.explain(why, ev["why"], samp, probe_why)
    v["verdict"] = final
    return v
