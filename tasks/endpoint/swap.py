"""A running endpoint's members replaced without a failed request (`fab deploy` again), and put
back in seconds (`fab rollback`).

Each member has two slots (tasks/endpoint/profile.py): its own deployment on its port and
`<name>-b` on its swap port; the router's backend holds both and sends traffic to the live one
(llmfab_park.lua). A redeploy of a running endpoint, per member whose profile changed:

- both fit the GPU (its free memory now against the member's need, tasks/endpoint/plan.py):
  the new release starts in the other slot while the old one serves; the router switches to it
  once it answers a real completion (the known greedy completion); the old server then drains
  (HAProxy's maintenance lets its requests in flight finish) and is stopped.
- they do not fit: the old one is parked (vLLM sleep mode level 1; a request for the model in
  the meantime is answered 503 naming why, not woken), the new one starts, the router
  switches; the old release stays parked in its slot. `fab rollback` of the endpoint is then a
  park and a wake-and-switch: seconds, not a cold start.

A member whose profile did not change keeps serving, untouched. A new release that fails to
start changes nothing: the old one serves on (woken again where it was parked).
"""
import hashlib
import tempfile
import time

from ..errors import LlmfabError, OperationFailed
from ..fleet.fanout import HostResult
from .onhosts import admin, record_checks, run_body, say, with_hosts

DRAIN_TIMEOUT_S = 600  # the longest wait for the old slot's requests in flight to finish


def other(slot):
    return "b" if slot == "a" else "a"


def router_states(c, ep, opts):
    """{host: the router's /state (a dict per member), or None where no router answers}."""
    return {h: (a["body"] if a.get("status") == 200 and isinstance(a.get("body"), dict) else None)
            for h, a in admin(c, ep, opts, "/state").items()}


def can_swap(ep, states):
    """True when every host's router knows every member and its slots (one deployed by an
    llmfab with slots): the members can be replaced behind it."""
    return bool(states) and all(
        isinstance(s, dict) and all(isinstance(s.get(m.name), dict) and s[m.name].get("slot") in ("a", "b")
                                    for m in ep.members) for s in states.values())


def _admin_all(c, ep, opts, hosts, path):
    """POST `path` to the router's admin service on `hosts`; OperationFailed naming a host that
    did not answer 200."""
    with_hosts(c, hosts)
    answers = admin(c, ep, opts, path, method="POST")
    bad = {h: a for h, a in answers.items() if a.get("status") != 200}
    if bad:
        raise OperationFailed("; ".join(f"{h}: the router's {path.split('?')[0][1:]} {_why(a, ep)}"
                                        for h, a in bad.items()))
    return answers


def _why(answer, ep):
    """Why the router's admin service did not say yes, in words."""
    if answer.get("status") is None:
        return (f"got no answer: its admin port {ep.admin_port} does not answer ({answer.get('error')}); "
                "is the endpoint's router running? (fab status)")
    body = answer.get("body")
    return f"answered {answer['status']}: " + str((body or {}).get("error") if isinstance(body, dict) else body)


def _on_hosts(c, profile, opts, hosts, title, op):
    from ..fleet.runner import run_task
    with_hosts(c, hosts)
    run_task(c, profile, op, opts, title=title, hosts=hosts)


def _live_release(c, opts, prof, hosts):
    """{host: (current release stamp or None, its profile sha256, running)} of a slot."""
    from ..steps.preflight import deploy_dir
    out = {}

    def op(host, reporter):
        host.start()
        listing = host.call("release_list", deploy_dir=deploy_dir(prof))
        cur = next((r for r in listing["releases"] if r["release"] == listing["current"]), None)
        out[host.name] = (listing["current"], cur and cur["profile_sha256"], bool(cur and cur["running"]))
        return HostResult(host.name, summary=f"{prof.target.name}: current {listing['current']}")
    _on_hosts(c, prof, opts, hosts, f"releases of {prof.target.name}", op)
    return out


def _fits_beside(c, ep, m, opts, hosts):
    """{host: (fits, words)}: would the member's new release fit the GPU beside the old one now
    (the endpoint's memory plan of this one member against what is free now)."""
    import dataclasses
    from .plan import make_plan, model_paths
    prof = m.profile
    out = {}

    def op(host, reporter):
        host.start()
        facts = host.call("endpoint_facts", nvidia_smi=prof.gpu.nvidia_smi, models=model_paths([m]))
        if facts["gpus"] is None:
            out[host.name] = (True, "no GPU reading: started beside")
            return HostResult(host.name, summary="no GPUs")
        plan = make_plan(dataclasses.replace(ep, members=(m,)), facts["gpus"], facts["weights"])
        short = [f"GPU {p.index} needs {p.peak_mib:.0f} MiB, {p.free_mib} MiB free" for p in plan if not p.fits]
        out[host.name] = (not short, "; ".join(short) or "fits beside the old release")
        return HostResult(host.name, summary=out[host.name][1])
    _on_hosts(c, prof, opts, hosts, f"memory for {m.name}'s new release", op)
    return out


def _wait_drained(c, ep, opts, hosts, m, slot):
    """Until the router on every host has no request in flight on member m's `slot`."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while True:
        with_hosts(c, hosts)
        answers = admin(c, ep, opts, "/state")
        busy = {h: ((a.get("body") or {}).get(m.name) or {}).get("slots", {}).get(slot, {}).get("scur", 0)
                for h, a in answers.items() if isinstance(a.get("body"), dict)}
        if not any(busy.values()):
            return
        if time.monotonic() > deadline:
            raise OperationFailed(f"member {m.name}: slot {slot} still has requests in flight after "
                                  f"{DRAIN_TIMEOUT_S} s ({busy}); it was left running: stop it with "
                                  f"fab stop --profile for that slot once they end")
        time.sleep(0.5)


def _run(module, function, c, opts, path, hosts):
    import dataclasses
    with_hosts(c, hosts)
    return run_body(module, function, c, dataclasses.replace(opts, profile=str(path)))


def _stop_opts(opts):
    from ..options import StopOptions
    return StopOptions.from_flags(profile=opts.profile, parallel=getattr(opts, "parallel", None),
                                  accept_new_host_keys=getattr(opts, "accept_new_host_keys", False))


def move(c, opts, ep, m, live, hosts, folder, start, why):
    """Traffic for member `m` on `hosts` from slot `live` to the other one, started by
    `start(path, hosts)` unless it already runs (parked): see the module's docstring."""
    from ..profile import load_profile
    from .profile import _need_sleep_mode, slot_profile
    new = other(live)
    new_path, live_path = slot_profile(m, new, folder), slot_profile(m, live, folder)
    new_prof = load_profile(new_path, need_secrets=start is not None)
    fits = _fits_beside(c, ep, m, opts, hosts) if start is not None else {h: (False, "parked") for h in hosts}
    park = not all(ok for ok, _ in fits.values())
    where = ", ".join(sorted(hosts))
    if park and start is not None:
        try:
            _need_sleep_mode(m.path, m.profile)
        except LlmfabError as e:
            raise OperationFailed(
                f"member {m.name}: its new release does not fit beside the old one on {where} ("
                + "; ".join(w for ok, w in fits.values() if not ok) + ") and the old one cannot be parked ("
                + e.message + "). Nothing was changed: free GPU memory, or stop the endpoint and deploy it") from None
    say(f"== endpoint {ep.name}: member {m.name}: {why} in slot {new} (port {m.slot_port(new)}) on {where}"
         + (", the old one parked meanwhile ==" if park and start is not None else " ==") )
    if park:
        _admin_all(c, ep, opts, hosts, f"/sleep?member={m.name}&hold=1")
    try:
        if start is not None:
            start(new_path, hosts)
            record_checks(c, ep, m, opts, profile=new_prof, hosts=hosts)
        t0 = time.monotonic()
        _admin_all(c, ep, opts, hosts, f"/switch?member={m.name}&to={new}")
    except (LlmfabError, KeyboardInterrupt):
        if park:  # the old one serves again
            say(f"member {m.name}: the old release in slot {live} is woken to serve again")
            try:
                _admin_all(c, ep, opts, hosts, f"/wake?member={m.name}")
            except LlmfabError as e:
                say(f"error: member {m.name}: the old release did not wake: {e.message}")
        raise
    say(f"member {m.name}: the router sends it to slot {new} ({time.monotonic() - t0:.2f} s to switch)")
    if park:
        say(f"member {m.name}: slot {live} stays parked: `fab rollback` of the endpoint switches back in seconds")
        return
    _wait_drained(c, ep, opts, hosts, m, live)
    say(f"member {m.name}: slot {live} drained; stopping it")
    _run("stop", "stop", c, _stop_opts(opts), live_path, hosts)


def _sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def redeploy(c, opts, ep, states):
    """`fab deploy` of an endpoint whose router runs on every host: each changed member moved
    to its other slot (see the module's docstring); the router keeps running."""
    from ..profile import load_profile
    from .profile import slot_profile
    folder = tempfile.mkdtemp(prefix=f"llmfab-endpoint-{ep.name}-")
    moved = 0
    for m in ep.members:
        groups = {}
        for h, s in states.items():
            groups.setdefault(s[m.name]["slot"], []).append(h)
        for live, hosts in sorted(groups.items()):
            live_prof = load_profile(slot_profile(m, live, folder), need_secrets=False)
            now = _live_release(c, opts, live_prof, hosts)
            if all(running and sha == _sha(live_prof.resolved_toml) for _, sha, running in now.values()):
                say(f"member {m.name}: unchanged on {', '.join(sorted(hosts))}: serving from slot {live} "
                     f"(release {next(iter(now.values()))[0]})")
                continue
            move(c, opts, ep, m, live, hosts, folder,
                 lambda path, hs: _run("deploy", "deploy", c, opts, path, hs), "new release")
            moved += 1
    say(f"== endpoint {ep.name}: {moved} member(s) moved to a new release; the router kept serving ==")


def rollback(c, opts, ep):
    """`fab rollback` of an endpoint: each member (or --member) back to the release in its
    other slot: woken and switched to where it is parked (seconds), else relaunched there (its
    current release) and switched; the release it leaves is parked (or stopped after its drain
    where both fit)."""
    from ..errors import TaskFailed
    from ..options import RollbackOptions
    from .profile import parked_member, slot_profile
    from ..profile import load_profile
    if opts.release:
        raise OperationFailed("--release names a release of one deployment: on an endpoint, run it "
                              "with --profile MEMBER.toml (or that member's slot profile)")
    states = router_states(c, ep, opts)
    if not can_swap(ep, states):
        down = [h for h, s in states.items() if s is None]
        raise OperationFailed(f"the endpoint's router does not answer on {', '.join(down) or 'some host'} "
                              "(or runs without member slots): deploy the endpoint first")
    folder = tempfile.mkdtemp(prefix=f"llmfab-endpoint-{ep.name}-")
    worst = 0
    for m in parked_member(ep, getattr(opts, "member", None)):
        groups = {}
        for h, s in states.items():
            groups.setdefault(s[m.name]["slot"], []).append(h)
        for live, hosts in sorted(groups.items()):
            new = other(live)
            new_prof = load_profile(slot_profile(m, new, folder), need_secrets=False)
            there = _live_release(c, opts, new_prof, hosts)
            if all(running for _, _, running in there.values()):
                start = None  # parked there: a wake and a switch
            elif all(cur for cur, _, _ in there.values()) and len({cur for cur, _, _ in there.values()}) == 1:
                stamp = next(iter(there.values()))[0]

                def start(path, hs, stamp=stamp):
                    ropts = RollbackOptions.from_flags(profile=str(path), release=stamp,
                                                       parallel=getattr(opts, "parallel", None),
                                                       accept_new_host_keys=getattr(opts, "accept_new_host_keys", False))
                    _run("releases", "rollback", c, ropts, path, hs)
            else:
                say(f"error: member {m.name}: slot {new} has no release to go back to on "
                     f"{', '.join(sorted(hosts))}")
                worst = 1
                continue
            try:
                move(c, opts, ep, m, live, hosts, folder, start,
                     "back to the parked release" if start is None else "back to the previous release")
            except LlmfabError as e:
                say(f"error: member {m.name}: {e.message}")
                worst = max(worst, int(e.code))
    if worst:
        raise TaskFailed(worst)
