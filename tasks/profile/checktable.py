"""The profile's `[check]` table: what the preflight may let through.

    [check]
    accept = ["vllm-dflash-swa-ignored"]   # doctor rule ids (docs/reference/doctor-rules.md)

An accepted FAIL prints as WARN ("accepted in the profile") and no longer stops a deploy.
Ids are checked against the rule table, so a typo is an error (exit 2), not a FAIL that
silently still blocks.
"""
from dataclasses import dataclass
from typing import Tuple

from .keys import Key, table

CHECK_KEYS = table(
    "check",
    Key("accept", "array of strings", "[]",
        "ids of the speculative-decoding doctor's rules whose FAIL may pass: it prints as WARN "
        "(accepted in the profile) and no longer stops a deploy; an unknown id is an error"),
)


@dataclass(frozen=True)
class CheckCfg:
    accept: Tuple[str, ...] = ()


def read_check(ck, data):
    """The [check] table of the merged tree (an empty CheckCfg when absent)."""
    from ..doctor.host.spec_rules import LOG_RULES, RULES
    if "check" not in data:
        return CheckCfg()
    t, p = data["check"], ("check",)
    ck.table(t, p, CHECK_KEYS)
    known = sorted({r.id for r in RULES + LOG_RULES})

    def rule_id(c, v, q):
        c.string(v, q)
        if v not in known:
            c.fail(q, "a rule id of the speculative-decoding doctor: " + ", ".join(known), v)
        return v
    accept = ck.get(t, p, "accept", lambda c, v, q: c.strings(v, q, nonempty=False, item=rule_id), ())
    return CheckCfg(accept=tuple(accept))
