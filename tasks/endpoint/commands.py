"""`fab deploy|status|stop|tail-log|bench|sleep|wake` on an endpoint profile (tasks/endpoint/profile.py).

deploy: the GPU memory plan on every host first (nothing starts when it does not fit: exit 1
with the numbers), then each member in order as the ordinary deployment it is (on every host
before the next member), its known greedy completion recorded at ready, parked right away
where the profile says so, then the router (HAProxy, an ordinary engine = "command"
deployment). The other tasks run the ordinary task on each member and on the router, each
under its name; sleep and wake ask the router's parking hook.
"""
import dataclasses
import json
import sys

from ..errors import ExitCode, LlmfabError, OperationFailed, TaskFailed
from ..fleet.fanout import HostResult
from ..output import write_text
from .onhosts import admin, hosts_of, record_checks, run_body, say, with_hosts
from .swap import can_swap, redeploy, rollback as rollback_members, router_states

def _each(c, ep, opts, module, function, title, *, router=True, reverse=False, slots=None):
    """Run one ordinary task on every member (and the router), each named; the worst code.
    `slots`: {member: the slots ("a", "b") it runs on} (default: its own profile, slot a)."""
    from .profile import slot_profile, write_router_profile
    import tempfile
    hosts = hosts_of(c, ep)
    with_hosts(c, hosts)
    folder = tempfile.mkdtemp(prefix=f"llmfab-endpoint-{ep.name}-")
    targets = []
    for m in ep.members:
        for slot in (slots or {}).get(m.name, ("a",)):
            label = f"member {m.name}" + (f" (slot {slot}, port {m.slot_port(slot)})" if slots else "")
            targets.append((label, str(slot_profile(m, slot, folder))))
    if router:
        rpath = write_router_profile(ep, tempfile.mkdtemp(prefix=f"llmfab-endpoint-{ep.name}-"), hosts)
        targets.append((f"router {ep.name} (HAProxy on port {ep.port})", str(rpath)))
    if reverse:
        targets.reverse()
    worst = 0
    for label, path in targets:
        say(f"== endpoint {ep.name}: {label} ({title}) ==")
        with_hosts(c, hosts)
        try:
            run_body(module, function, c, dataclasses.replace(opts, profile=path))
        except LlmfabError as e:
            if e.message:
                say(f"error: {e.message}")
            worst = max(worst, int(e.code))
    return worst


# -- deploy ---------------------------------------------------------------------------------

def plan_on_hosts(c, ep, opts):
    """The memory plan on every host; OperationFailed (exit 1) with the numbers when one does
    not fit. Returns {host: plan_json}."""
    from ..fleet.runner import run_task
    from .plan import make_plan, model_paths, plan_json, plan_lines
    models = model_paths(ep.members)
    first = ep.members[0].profile
    plans = {}

    def op(host, reporter):
        host.start()
        facts = host.call("endpoint_facts", nvidia_smi=first.gpu.nvidia_smi, models=models)
        if facts["gpus"] is None:
            reporter.line(host.name, f"no GPU reading ({facts.get('gpu_error')}): no memory plan")
            plans[host.name] = []
            return HostResult(host.name, summary="no GPUs: not planned")
        plan = make_plan(ep, facts["gpus"], facts["weights"])
        plans[host.name] = plan_json(plan)
        reporter.lines(host.name, plan_lines(plan))
        short = [p for p in plan if not p.fits]
        if short:
            raise OperationFailed(
                "the members do not fit: " + "; ".join(
                    f"GPU {p.index} needs {p.peak_mib:.0f} MiB (while {p.peak_at} starts), "
                    f"{p.free_mib} MiB free" for p in short)
                + ". Nothing was started: lower a member's --kv-cache-memory-bytes or "
                  "gpu-memory-utilization, park members ([endpoint.parked]), or free the GPU")
        return HostResult(host.name, summary="memory plan fits")
    run_task(c, first, op, opts, title="endpoint memory plan", hosts=hosts_of(c, ep))
    return plans


def park_now(c, ep, m, opts):
    """Sleep member `m` (level 1) on every host, straight after its start (the router is not
    up yet); the router finds it asleep and keeps it in maintenance until a request wakes it."""
    from ..fleet.runner import run_task
    prof = m.profile

    def op(host, reporter):
        host.start()
        r = host.call("endpoint_http", host_addr=prof.server.host, port=prof.server.port,
                      path="/sleep?level=1", method="POST", body="")
        if r.get("status") != 200:
            raise OperationFailed(f"member {m.name}: /sleep?level=1 answered {r.get('status') or r.get('error')}")
        return HostResult(host.name, summary=f"{m.name}: parked ({r['seconds']:.2f} s)")
    run_task(c, prof, op, opts, title=f"park {m.name}", hosts=hosts_of(c, ep))


def deploy(c, opts, ep):
    from ..deploy import deploy as deploy_one
    from .profile import write_router_profile
    import tempfile
    hosts = hosts_of(c, ep)
    with_hosts(c, hosts)
    if opts.dry_run:
        for m in ep.members:
            say(f"== endpoint {ep.name}: member {m.name} ==")
            deploy_one(c, dataclasses.replace(opts, profile=str(m.path)))
        return None
    states = router_states(c, ep, opts)
    if not opts.no_wait and can_swap(ep, states):  # running: each changed member moves slot (swap.py)
        return redeploy(c, opts, ep, states)
    with_hosts(c, hosts)
    plan_on_hosts(c, ep, opts)
    expects = {}
    for i, m in enumerate(ep.members):
        say(f"== endpoint {ep.name}: member {m.name} ({i + 1}/{len(ep.members)}) ==")
        try:
            deploy_one(c, dataclasses.replace(opts, profile=str(m.path)))
        except LlmfabError:
            started = ", ".join(x.name for x in ep.members[:i]) or "none"
            say(f"error: member {m.name} did not start (above). Members running: {started}; "
                 f"the router was not started. Fix it and run the endpoint's deploy again.")
            raise
        if not opts.no_wait:
            texts = record_checks(c, ep, m, opts)
            expects[m.name] = next(iter(texts.values()), None)
            if m.parked:
                park_now(c, ep, m, opts)
    say(f"== endpoint {ep.name}: router (HAProxy on {ep.host}:{ep.port}) ==")
    rdir = tempfile.mkdtemp(prefix=f"llmfab-endpoint-{ep.name}-")
    rpath = write_router_profile(ep, rdir, hosts, expects=expects)
    deploy_one(c, dataclasses.replace(opts, profile=str(rpath)))
    return None


# -- sleep, wake, status ---------------------------------------------------------------------

def park(c, opts, ep, action):
    """`fab sleep` / `fab wake`: ask the router's hook on every host, each member named."""
    from .profile import parked_member
    members = parked_member(ep, opts.member)
    worst = 0
    for m in members:
        answers = admin(c, ep, opts, f"/{action}?member={m.name}", method="POST")
        for host, a in answers.items():
            body = a.get("body") or {}
            if a.get("status") == 200:
                verb = "parked" if action == "sleep" else "awake"
                say(f"{host}: {m.name}: {verb} in {body.get('seconds', 0):.2f} s")
            else:
                worst = ExitCode.FAILED
                why = body.get("error") if isinstance(body, dict) else None
                why = why or a.get("error") or f"HTTP {a.get('status')}"
                if a.get("status") is None:
                    why = f"the router's admin port {ep.admin_port} does not answer ({why}): is the endpoint deployed?"
                say(f"{host}: {m.name}: {action} failed: {why}")
    if worst:
        raise TaskFailed(worst)


def park_state_lines(ep, answers):
    from .plan import fact
    out = []
    for host, a in answers.items():
        body = a.get("body")
        if a.get("status") != 200 or not isinstance(body, dict):
            out.append(f"{host}: parking state unknown: the router's admin port {ep.admin_port} "
                       f"answered {a.get('status') or a.get('error')}")
            continue
        import time
        for m in ep.members:
            st = body.get(m.name) or {}
            ago = time.time() - st["last_use"] if st.get("last_use") else None
            state = "asleep" if st.get("asleep") else "awake"
            keeps = f", keeps ~{fact('asleep_mib')} MiB per GPU asleep" if (m.parked or m.idle_s) else ""
            extra = "".join([
                f", last wake {st['last_wake_s']:.2f} s" if st.get("last_wake_s") is not None else "",
                f", parks after {m.idle_s:.0f} s idle" if m.idle_s else "",
                f", ERROR: {st['error']}" if st.get("error") else ""])
            slot = st.get("slot")
            if slot:
                state += f", slot {slot} (port {m.slot_port(slot)})" + (", other slot parked" if st.get("other_parked") else "")
            if st.get("held"):
                state += f", held: {st['held']}"
            out.append(f"{host}: {m.name} ({m.profile.served_name}): {state}, last use "
                       f"{'never' if ago is None else f'{ago:.0f} s ago'}, wakes {st.get('wakes', 0)}"
                       f"{extra}{keeps}")
    return out


def _slots_used(ep, answers, parked=True):
    """{member: its slots that run on some host}: the live one, and the other where it is
    parked (the router's state); slot a where no router answers."""
    used = {m.name: set() for m in ep.members}
    for a in answers.values():
        body = a.get("body") if isinstance(a.get("body"), dict) else {}
        for m in ep.members:
            st = body.get(m.name) or {}
            live = st.get("slot") or "a"
            used[m.name].add(live)
            if parked and st.get("other_parked"):
                used[m.name].add("b" if live == "a" else "a")
    return {name: tuple(sorted(slots or {"a"})) for name, slots in used.items()}


def status(c, opts, ep):
    answers = admin(c, ep, opts, "/state")
    worst = _each(c, ep, opts, "status", "status", "status", slots=_slots_used(ep, answers))
    say(f"== endpoint {ep.name}: parking ==")
    if opts.json:
        write_text(sys.stdout, json.dumps({"endpoint": ep.name, "port": ep.port, "parking": answers}) + "\n")
    for line in park_state_lines(ep, answers):
        say(line)
    if worst:
        raise TaskFailed(worst)


def run_on_each(c, opts, ep, task):
    module, function, router, reverse = {
        "stop": ("stop", "stop", True, True),
        "tail-log": ("tail_log", "tail_log", True, False),
        "bench": ("bench", "bench", False, False),
        "releases": ("releases", "releases", False, False),
    }[task]
    # stop: both slots of every member, so nothing is left behind; releases: every release listed
    if task in ("stop", "releases"):
        slots = {m.name: ("a", "b") for m in ep.members}
    else:  # bench: the live slot (a parked one never answers a completion); tail-log: the parked one too
        slots = _slots_used(ep, admin(c, ep, opts, "/state"), parked=(task == "tail-log"))
    worst = _each(c, ep, opts, module, function, task, router=router, reverse=reverse, slots=slots)
    if worst:
        raise TaskFailed(worst)


ENDPOINT_TASKS = ("deploy", "status", "stop", "tail-log", "bench", "sleep", "wake", "rollback", "releases")


def dispatch(c, name, opts):
    """The endpoint's body of task `name`, or None when opts.profile is no endpoint profile
    (the ordinary task runs). The one hook in tasks/cli.py."""
    from ..fleet.runner import load  # noqa: F401 (the same profile resolution as every task)
    from ..profile.load import resolve_profile_path
    from .profile import is_endpoint, load_endpoint
    cfg = c.config.get("llmfab") or {}
    path = resolve_profile_path(opts.profile, cfg.get("profile") if hasattr(cfg, "get") else None)
    if not is_endpoint(path):
        if name in ("sleep", "wake"):
            from ..errors import ProfileError
            raise ProfileError(path, "endpoint", f"an endpoint profile: `fab {name}` parks members of an "
                                                 "endpoint ([endpoint] members = [...])")
        return None
    if name not in ENDPOINT_TASKS:
        from ..errors import ProfileError
        raise ProfileError(path, "endpoint", f"a member's own profile: `fab {name}` works on one "
                                             "deployment (run it with --profile MEMBER.toml)")
    ep = load_endpoint(path, need_secrets=(name == "deploy" and not opts.dry_run))
    if name == "deploy":
        return deploy(c, opts, ep) or 0
    if name == "status":
        return status(c, opts, ep) or 0
    if name in ("sleep", "wake"):
        return park(c, opts, ep, name) or 0
    if name == "rollback":
        return rollback_members(c, opts, ep) or 0
    return run_on_each(c, opts, ep, name) or 0


def sleep(c, opts):
    """Body of `fab sleep` (reached through dispatch; an ordinary profile is refused there)."""
    dispatch(c, "sleep", opts)


def wake(c, opts):
    dispatch(c, "wake", opts)
