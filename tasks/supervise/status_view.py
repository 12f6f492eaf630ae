"""What `fab status` says about a release's supervisor (docs/supervision.md).

The host reads supervisor.json (tasks/supervise/host/supervisor_state.py); this side shapes the
`supervisor` object of `--json` (`restart, restarts, state, last: {exit, signal, rule,
line, ended_at}, next_attempt_in_s`) and the human lines. An unsupervised release reads
`restart: "no", state: "off"`.

The failure rule of a crash is the one the host recorded: "hung" for a hang the supervisor
detected, else the rule the host named from the rule table (tasks/failures/rules/), or null.
"""
from ..base.host.hosterrors import exit_words  # one wording for every end


OFF = {"restart": "no", "restarts": 0, "state": "off", "last": None, "next_attempt_in_s": None}


def record(host_view):
    """The `supervisor` object from the state op's `supervisor` (None: unsupervised)."""
    if not host_view:
        return dict(OFF)
    last = host_view.get("last")
    if last:
        last = {k: last.get(k) for k in ("exit", "signal", "rule", "line", "ended_at")}
    return {"restart": host_view.get("restart") or "no", "restarts": host_view.get("restarts") or 0,
            "state": host_view.get("state") or "off", "last": last,
            "next_attempt_in_s": host_view.get("next_attempt_in_s")}


def how_it_ended(last):
    if not last:
        return "?"
    text = f"killed by {last['signal']}" if last.get("signal") else exit_words(last.get("exit"))
    return text + (f", {last['rule']}" if last.get("rule") else "")


def lines(sup, reason=None):
    """Human lines for a supervised release; [] when supervision is off and never ran."""
    if sup["restart"] == "no":
        return []
    n = sup["restarts"]
    head = f"supervisor: restart {sup['restart']}, {n} restart{'s' if n != 1 else ''}, {sup['state']}"
    if sup["state"] == "backoff" and sup["next_attempt_in_s"] is not None:
        head += f", next attempt in {sup['next_attempt_in_s']:.{0 if sup['next_attempt_in_s'] >= 10 else 1}f} s"
    out = [head]
    last = sup["last"]
    if last:
        out.append(f"  last attempt ended {last.get('ended_at')}: {how_it_ended(last)}"
                   + (f": {last['line']}" if last.get("line") else ""))
    if sup["state"] == "gave-up" and reason:
        out.append(f"  gave up: {reason}")
    return out


def gave_up_why(sup, reason):
    """The `why` of a deployment whose supervisor gave up: the reason and the fatal line."""
    last = sup.get("last") or {}
    why = f"the supervisor gave up: {reason or 'restarts exhausted'}"
    if last.get("line"):
        why += f"; fatal line: {last['line']}"
    return why
