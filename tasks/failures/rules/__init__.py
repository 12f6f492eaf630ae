"""The failure-rule table: every start-up failure llmfab explains, as data.

`RULES` holds every rule, highest priority first; `BY_ID[id]` finds one. The rule
`exited` has no pattern: it explains a server that ended without any known line
(the last exception of its traceback, else its exit status or signal). The reference
page docs/reference/failure-rules.md is rendered from this module (tasks/docsgen.py).
"""
from . import engine, runtime
from ..host.records import ABOVE, BELOW, ROOT, Pattern, Rule

EXITED = Rule(
    "exited", "exited without a known line", 0,
    "{exit_cause}",
    "{exit_fix}",
)

# A server that could not even be started has no log to match: the host says why
# (tasks/release/host/launch.py EXEC_FAILURES, in its own words for each errno) and records it in
# the release (start-failed.json). These rows name the two kinds for the reference table.
CANNOT_EXEC = Rule(
    "cannot-exec", "the server's command could not be executed", 0,
    "exec of the server's command failed: not executable (EACCES), not there (ENOENT), argv "
    "and environment too long (E2BIG), not a program (ENOEXEC)",
    "make the command executable / install it / shorten [server.args] and [server.env], as "
    "the message names",
)
LAUNCHER_FAILED = Rule(
    "launcher-failed", "launch.py itself could not run or died", 0,
    "the release's launch.py did not report a started server: its interpreter cannot run, it "
    "crashed or was killed (e.g. by SIGKILL), or it did not return in time",
    "run it by hand on the host (`<python> <release>/launch.py`) to see why",
)

# Seen by the readiness wait, not in a log: the server's process tree answers /health on
# another port while nothing listens on the one llmfab probes (tasks/steps/host/watch.py).
WRONG_PORT = Rule(
    "wrong-port", "the server listens on another port than [server] port", 0,
    "the server answers on port {other}, but [server] port is {port} and nothing listens there",
    "make them the same: set [server] port = {other}, or make the command bind port {port} "
    "(its own flag in [server] command or [server.args])",
)

RULES = tuple(sorted(engine.RULES + runtime.RULES + (EXITED, CANNOT_EXEC, LAUNCHER_FAILED, WRONG_PORT),
                     key=lambda r: -r.priority))
BY_ID = {r.id: r for r in RULES}
if len(BY_ID) != len(RULES):
    raise RuntimeError("duplicate failure rule id in tasks/failures/rules")

__all__ = ["ABOVE", "BELOW", "BY_ID", "EXITED", "Pattern", "ROOT", "RULES", "Rule", "WRONG_PORT"]
