"""The failure-rule table: every start-up failure llmfab explains, as data.

`RULES` holds every rule, highest priority first; `BY_ID[id]` finds one. The rule
`exited` has no pattern: it explains a server that ended without any known line
(the last exception of its traceback, else its exit status or signal). The reference
page docs/reference/failure-rules.md is rendered from this module (tasks/docsgen.py).
"""
from . import engine, runtime
from .types import ABOVE, BELOW, ROOT, Pattern, Rule

EXITED = Rule(
    "exited", "exited without a known line", 0,
    "{exit_cause}",
    "{exit_fix}",
)

RULES = tuple(sorted(engine.RULES + runtime.RULES + (EXITED,), key=lambda r: -r.priority))
BY_ID = {r.id: r for r in RULES}
if len(BY_ID) != len(RULES):
    raise RuntimeError("duplicate failure rule id in tasks/failures/rules")

__all__ = ["ABOVE", "BELOW", "BY_ID", "EXITED", "Pattern", "ROOT", "RULES", "Rule"]
