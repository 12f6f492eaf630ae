"""The `doctor` section of a host request, derived from the profile. Pure; no I/O.

The host (tasks/doctor/host/spec_check.py) reads the engine version and the drafter's and the
target's config.json and evaluates the rule table over them; this module says which
method, directories, draft length, runner env and prefix caching the profile asks for, each
with the profile key a message should name, and which FAIL rules the profile accepts.
"""
from ..profile.types import Profile


def _prefix_caching(args):
    """{value: True | False | None (not set: vLLM's default, on), key} of prefix caching."""
    if not args.has("enable-prefix-caching"):
        # the negative flag as its own key
        if args.value("no-enable-prefix-caching") is True:
            return {"value": False, "key": args.key("no-enable-prefix-caching")}
        return {"value": None, "key": None}
    return {"value": bool(args.value("enable-prefix-caching")), "key": args.key("enable-prefix-caching")}


def _hub_only(profile):
    """vLLM models named by Hugging Face id (nothing to read on the host): the version rules
    still apply, so the method and draft length are taken from the speculative config."""
    spec = profile.server.flags.speculative
    if profile.server.engine != "vllm" or spec is None or spec.method is None:
        return None
    k = spec.tokens
    return {"engine": "vllm", "method": spec.method.lower(), "draft": None, "target": None,
            "keys": {"method": spec.key_of("method"), "draft": spec.key_of("model")},
            "spec_tokens": {"value": k, "key": spec.key_of("num_speculative_tokens"), "over": 0}
            if k is not None else None}


def doctor_request(profile: Profile):
    """The doctor's inputs for this profile, or None when it does no speculative decoding.
    Built once per task: deploy's preflight request carries it, and deploy passes that on."""
    m = profile.server.models or _hub_only(profile)
    if not m or not m.get("method"):
        return None
    v2 = profile.server.environ.v2_runner if profile.server.engine == "vllm" else None
    v2 = None if v2 is None else "1" if v2 else "0"  # the host's doctor reads it as vLLM's text
    check = getattr(profile, "check", None)
    return {
        "engine": m["engine"], "method": m["method"],
        "method_key": m["keys"].get("method"), "draft": m.get("draft"),
        "draft_key": m["keys"].get("draft"), "target": m.get("target"),
        "k": m.get("spec_tokens"), "v2_env": v2,
        "prefix_caching": _prefix_caching(profile.server.flags),
        "accept": list(check.accept) if check is not None else [],
        # where vLLM takes its default sampling from (tasks/doctor/sampling.py)
        "generation_config": profile.server.flags.value("generation-config")
        if profile.server.engine == "vllm" else "none",
    }
