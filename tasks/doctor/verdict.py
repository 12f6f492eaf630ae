"""The live verdict on speculative acceptance: `healthy`, `low` or `broken`. Pure.

The thresholds (docs/doctor.md):
  - no verdict (None) until MIN_DRAFTS drafts were seen in the window;
  - `broken`: a model-based drafter (dflash, eagle, eagle3, mtp, draft_model) whose
    position-0 acceptance is below 0.3, or whose mean acceptance length is below 1.3 with
    k >= 3: the drafter sees the wrong hidden states (or is the wrong drafter), it is not
    merely weak;
  - `low`: mean acceptance length below 60% of the method's reference for its k
    (tasks/doctor/host/spec_rules.py REFERENCES, with their sources);
  - otherwise `healthy`. ngram/suffix depend on the workload: `healthy` or `low` only.
`broken`/`low` need greedy evidence: tasks/doctor/sampling.py's rule table turns a sampled
window's verdict into `sampling` (a greedy probe is healthy), the probe's verdict, or
`unconfirmed` (no greedy evidence).
The reference for a k is the record of the same method with the largest k at or below it
(else the smallest), capped at 1 + k, the most a step can yield.
"""
from .host.spec_rules import MODEL_BASED, REFERENCES, RULES, LOG_RULES
from ..output import Block

MIN_DRAFTS = 100
BROKEN_POS0 = 0.3
BROKEN_LENGTH = 1.3
LOW_SHARE = 0.6
RANKS = {r.id: r.rank for r in RULES + LOG_RULES}
SEVERITY_ORDER = {"FAIL": 0, "WARN": 1, "INFO": 2}


def reference(method, k):
    """(length, source) the verdict holds a method's acceptance against, or (None, None)."""
    refs = sorted((r for r in REFERENCES if r.method == method), key=lambda r: r.k)
    if not refs or not k:
        return None, None
    below = [r for r in refs if r.k <= k]
    ref = below[-1] if below else refs[0]
    return round(min(ref.length, 1.0 + k), 3), ref.source


def causes(findings):
    """Findings as likely causes of low acceptance, most likely first (the table's rank)."""
    return sorted(findings, key=lambda f: (RANKS.get(f["rule"], 9), SEVERITY_ORDER.get(f["severity"], 3)))


def verdict(spec, method, k, findings=()):
    """{verdict, evidence, findings} to add to a `spec` record (metrics.spec_window + drafts)."""
    drafts = spec.get("drafts")
    pos0 = spec["per_position"][0] if spec.get("per_position") else None
    length = spec.get("mean_acceptance_length")
    ref, source = reference(method, k)
    evidence = {"drafts": None if drafts is None else int(drafts), "position_0": _r(pos0),
                "mean_acceptance_length": _r(length), "k": k, "method": method,
                "reference_length": ref, "reference_source": source, "min_drafts": MIN_DRAFTS}
    why = None
    if drafts is None or drafts < MIN_DRAFTS or length is None:
        result = None
        why = f"{int(drafts or 0)} drafts so far, a verdict needs {MIN_DRAFTS}"
    elif method in MODEL_BASED and pos0 is not None and pos0 < BROKEN_POS0:
        result = "broken"
        why = f"position-0 acceptance {pos0:.2f} < {BROKEN_POS0}: wrong hidden states or wrong drafter"
    elif method in MODEL_BASED and (k or 0) >= 3 and length < BROKEN_LENGTH:
        result = "broken"
        why = f"mean acceptance length {length:.2f} < {BROKEN_LENGTH} at k = {k}"
    elif ref is not None and length < LOW_SHARE * ref:
        result = "low"
        why = f"mean acceptance length {length:.2f} < 60% of the {method} reference {ref:g} for k = {k}"
    else:
        result = "healthy"
        if ref is not None:
            why = f"mean acceptance length {length:.2f} against the {method} reference {ref:g} for k = {k}"
    evidence["why"] = why
    return {"verdict": result, "evidence": evidence, "findings": causes(list(findings))}


def _r(x):
    return None if x is None else round(x, 4)


def verdict_text(v):
    """The end of the human spec line: the verdict and why (its likely causes follow it)."""
    if v["verdict"] is None:
        return f"verdict: none yet ({v['evidence']['why']})"
    return f"verdict: {v['verdict']} ({v['evidence']['why']})" if v["evidence"]["why"] \
        else f"verdict: {v['verdict']}"


def cause_lines(v):
    """One Block per finding listed as a likely cause, most likely first, each with its fix
    and source (only when the verdict is not healthy)."""
    if v["verdict"] in (None, "healthy", "sampling"):
        return []
    return [Block(f"likely cause {i}: {f['severity']} {f['rule']} ({f['evidence']}): {f['message']}",
                  (("fix", f.get("fix")), ("source", f.get("source"))), indent=2, hang=2)
            for i, f in enumerate(v["findings"], 1)]
