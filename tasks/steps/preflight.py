"""The preflight, from the client: what to ask the host to check, and the verdict.

The host runs the checks (tasks/steps/host/preflight_checks.py: Python, engine version from
package metadata, model paths and config.json files, port, disk, GPU memory); the
client adds what it alone can judge from the profile (an open port without a key),
prints one line per check and stops the task on any FAIL (exit 1, nothing launched).
"""
from ..errors import PreflightFailed
from .host.probe import ALL_INTERFACES
from ..output import Block
from ..profile.types import Profile
from ..doctor.host_request import doctor_request
from ..weights.sources import pull_fixes
from ..gpu.ask import memory_ask
from ..runtime import preflight_fields


def deploy_dir(profile: Profile):
    return f"{profile.target.workdir.rstrip('/')}/{profile.target.name}"


def model_paths(profile: Profile):
    """(key, absolute path) pairs the host must have: the model and any drafter/model path in args."""
    s = profile.server
    head = [("server.model", s.model)] if s.model and s.model.startswith("/") else []
    return head + s.flags.model_paths()


def engine_request(profile: Profile):
    """What the host's engine check needs (tasks/steps/host/preflight_checks.check_engine), the
    same for every task that asks (deploy's preflight, check, tune's survey of its hosts): the
    engine looked for as the launch will run it, by this interpreter in this environment
    (the profile's plain [server.env]), in the container's image where one runs it."""
    s = profile.server
    return dict(engine=s.engine, python=s.interpreter, env=profile.plain_env(),
                argv0=s.command[0] if s.engine == "command" and s.command else None,
                **preflight_fields(profile))  # runtime, runtime_spec: a unit's or a container's check


def preflight_request(profile: Profile, state=None):
    """The host's preflight request. `state` (the agent's "state" answer) tells whether this
    deployment is running on the same port: then the port counts as ours, to be freed by the
    stop that precedes the launch, not as taken."""
    s = profile.server
    args = dict(
        engine_request(profile),
        paths=model_paths(profile),
        pulled=pull_fixes(profile),  # [weights]: a missing one's fix is `fab pull`
        host=s.host, port=s.port, deploy_dir=deploy_dir(profile),
        nvidia_smi=profile.gpu.nvidia_smi,
        devices=list(profile.gpu.devices) if profile.gpu.devices is not None else None,
        min_free_mib=profile.gpu.min_free_mib,
        ask=memory_ask(profile),  # what the engine will take of each GPU (tasks/gpu/ask.py)
        models=profile.server.models,  # built with the profile (tasks/profile/models.py)
        # the rules of tasks/doctor/host/spec_rules.py; deploy hands this section on to the
        # ready line's log scan (tasks/doctor/findings.py at_ready) instead of building it again
        doctor=doctor_request(profile),
    )
    server = (state or {}).get("server") or {}
    if state and state.get("alive") and server.get("port") == s.port:
        args["port_owner_pgid"] = server["pgid"]
    return args


# What vLLM's API key leaves open: its middleware checks the key only on paths under these
# prefixes (vLLM 0.32 vllm/entrypoints/serve/middleware/authenticate.py GUARDED_PREFIX), so
# every other route answers without it. Seen in vLLM 0.32.0 (CPU build) started with --api-key,
# asked without the key: /v1/models and /v1/completions 401; /health, /metrics, /version, /ping,
# /load and POST /tokenize 200; POST /invocations (SageMaker's route) 200 with a completion.
VLLM_KEY_GUARDS = ("/v1", "/v2", "/inference", "/cohere")
VLLM_KEY_LEAVES_OPEN = ("/metrics", "/health", "/version", "/tokenize")


def exposure_checks(profile: Profile):
    """WARN when the server listens on every address: with no API key, anyone who reaches
    the port can use it (vLLM and SGLang take --api-key, vLLM also VLLM_API_KEY); with a key,
    vLLM still answers every path outside VLLM_KEY_GUARDS to anyone, /invocations (which
    generates) included."""
    s = profile.server
    if s.engine == "command":  # [server] host is only where llmfab reaches it: its argv says
        host = s.flags.value("host", default=None) or s.flags.value("bind", default=None) \
            or _command_bind(s.command)
        port = s.flags.value("port", default=s.port)
    else:
        host = s.flags.value("host", default=s.host)
        port = s.flags.value("port", default=s.port)
    if str(host) not in ALL_INTERFACES:
        return []
    return exposure_warning(profile, host, port)


def exposure_warning(profile: Profile, host, port, *, seen=False):
    """The `exposure` WARN of a server listening on every address `host` at `port` ([] when
    its API key covers it); `seen`: read from its listening sockets, not from the profile."""
    s = profile.server
    tunnel = (f'bind [server] host = "127.0.0.1" and reach it through an SSH tunnel '
              f"(ssh -L {port}:127.0.0.1:{port} HOST)")
    if seen and s.engine == "command":
        tunnel = (f"make the command bind 127.0.0.1 (its own flag for the address: "
                  f"`python -m http.server` takes --bind) and reach it through an SSH tunnel "
                  f"(ssh -L {port}:127.0.0.1:{port} HOST)")
    where = f"[{host}]:{port}" if ":" in str(host) and not str(host).startswith("[") else f"{host}:{port}"
    if seen:
        where += " (its own listening socket says so, whatever the profile says)"
    if profile.api_key is None:
        key = ("give the command a key of its own (from [server.env], never on its argv)"
               if s.engine == "command" else
               'set a key from your environment ([server.env] VLLM_API_KEY = { from_env = "VLLM_API_KEY" })')
        message = (f"the server listens on {where} with no API key: anyone who can reach port "
                   f"{port} can use it. Either {key}, or {tunnel}")
    elif s.engine == "vllm":
        message = (f"the server listens on {where}, and vLLM's API key guards only paths under "
                   f"{', '.join(VLLM_KEY_GUARDS)}: {', '.join(VLLM_KEY_LEAVES_OPEN)} and /invocations "
                   f"(which generates, as /v1/completions does) answer anyone who can reach port {port} "
                   f"without it. To close them, {tunnel}, or let only your clients reach the port")
    else:
        return []
    return [{"status": "WARN", "check": "exposure", "message": message}]


def seen_exposure(profile: Profile, listening, predicted=()):
    """The `exposure` WARNs of where the running server really listens (`listening`: [[address,
    port]] of its process tree on its port, from the host): one per address meaning every
    interface, unless the preflight's `predicted` checks already gave it from the profile."""
    if any(c.get("check") == "exposure" for c in predicted):
        return []
    out = []
    for address, port in listening or ():
        if address in ALL_INTERFACES:
            out += [dict(w, address=address, port=port)
                    for w in exposure_warning(profile, address, port, seen=True)]
    return out


def ray_port_checks(profile: Profile):
    """WARN when a Ray cluster's server port lies where Ray gives its workers ports: a worker on
    the head may hold it first, and the server then cannot bind it (or the probe meets the
    worker's gRPC)."""
    from ..fleet.host.ray_node import RAY_WORKER_PORTS
    low, high = RAY_WORKER_PORTS
    port = profile.server.port
    if profile.cluster is None or profile.cluster.backend != "ray" or not low <= port <= high:
        return []
    return [{"status": "WARN", "check": "port", "message":
             f"[server] port {port} lies in {low}-{high}, the ports Ray gives its worker processes: "
             f"a Ray worker on the head may take it before the server binds it; choose a port "
             f"outside that range (vLLM's own default is 8000)"}]


# The flags by which a command server is told its address (uvicorn, http.server, gunicorn, ...).
BIND_FLAGS = ("--host", "--bind", "-b")


def _command_bind(argv):
    """The address a `command` server is given on its argv (`--host X`, `--bind=X`), or None."""
    argv = list(argv or ())
    for i, a in enumerate(argv):
        name, eq, value = a.partition("=")
        if name in BIND_FLAGS:
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
            if value is not None:
                return value.rsplit(":", 1)[0] if value.count(":") == 1 else value
    return None


def check_block(c):
    """A preflight record for people: `STATUS check message`, wrapped under its message; a
    doctor's finding as its headline, fix and source (tasks/doctor/findings.py)."""
    if c.get("finding"):
        from ..doctor.findings import finding_block
        return finding_block(c["finding"])
    head = f"{c['status']:<4} {c['check']:<8} "
    return Block(head + c["message"], hang=len(head))


def print_checks(reporter, name, checks):
    for c in checks:
        reporter.line(name, check_block(c))


def secret_checks(profile: Profile):
    """WARN for each `from_env` secret unset here: `fab check` needs no secret's value (only a
    launch reads them), but the deploy it checks for would refuse (exit 2)."""
    return [{"status": "WARN", "check": "secret",
             "message": f"{m}; `fab deploy` refuses to launch without it (nothing else needs it)"}
            for m in profile.missing_secrets()]


def run_preflight(host, reporter, req, extra=()):
    """Run the host's preflight (plus the client's `extra` checks); print one line per check;
    raise PreflightFailed on any FAIL. Returns the host's answer: {checks: every check,
    spec_facts: the doctor's facts, which deploy keeps in the release, or None}."""
    answer = host.call("preflight", timeout=120, **req)
    checks = answer["checks"] + list(extra)
    print_checks(reporter, host.name, checks)
    counts = {s: sum(c["status"] == s for c in checks) for s in ("OK", "WARN", "FAIL")}
    reporter.line(host.name, f"preflight: {len(checks)} checks: {counts['OK']} OK, "
                             f"{counts['WARN']} WARN, {counts['FAIL']} FAIL")
    failed = [c for c in checks if c["status"] == "FAIL"]
    if failed:
        err = PreflightFailed(f"preflight failed ({len(failed)} check(s)); nothing was launched",
                              details=[check_block(c) for c in failed])
        err.checks = checks
        from ..doctor.findings import split  # --json: {host, ok: false, error, checks, findings}
        plain, findings = split(checks)
        err.json_extra = {"checks": plain, "findings": findings}
        raise err
    return dict(answer, checks=checks)


