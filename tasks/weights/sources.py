"""The profile's `[weights]` table: each model path on the host -> where its files come from.

    [weights]
    "/root/models/Qwen3.6-27B" = "local:/data/models/Qwen3.6-27B"

Keys are model paths the profile names (server.model, and every drafter path in
[server.args]); a key the profile does not name is an error (exit 2), so a typo never pulls
to a path nothing reads. Sources: `local:/absolute/dir` on this machine. Pure; no I/O.
"""
from dataclasses import dataclass

from ..profile.keys import Key, table

SCHEMES = ("local:",)
WEIGHTS_KEYS = table(
    "weights",
    Key("<model path on the host>", 'string "local:/dir"', "none",
        "where `fab pull` copies that model directory from: a directory on this machine; the "
        "key is server.model or a drafter path of [server.args] (docs/pull.md)"),
)


@dataclass(frozen=True)
class WeightSource:
    path: str       # the model directory on the host
    source: str     # as written in the profile
    local: str      # the directory on this machine (local:)


def read_weights(ck, data, model_paths):
    """[weights] of the merged tree -> (WeightSource, ...); `model_paths`: the absolute model
    paths the profile names (server.model and the drafters)."""
    if "weights" not in data:
        return ()
    t, p = data["weights"], ("weights",)
    if not isinstance(t, dict):
        ck.fail(p, "a table: model path on the host = \"local:/dir\"", t)
    out = []
    for key, value in t.items():
        q = p + (key,)
        if key not in model_paths:
            named = ", ".join(sorted(model_paths)) or "none (no absolute model path)"
            ck.fail(q, f"a model path the profile names (server.model or a drafter path): {named}")
        ck.string(value, q)
        if not value.startswith("local:/"):
            ck.fail(q, 'a source: "local:/absolute/dir/on/this/machine"', value)
        out.append(WeightSource(path=key, source=value, local=value[len("local:"):]))
    return tuple(out)


# What the engine gets at launch for a model llmfab pulled: the hub client never reaches out
# (huggingface_hub's HF_HUB_OFFLINE, which vLLM and transformers honour) for files that are
# complete on the host. Only when every model the profile names is a pulled path: a drafter
# named by hub id still needs the hub.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1"}


def offline_env(profile):
    """{"HF_HUB_OFFLINE": "1"} when the profile's models are all pulled paths, else {};
    never over what [server.env] sets itself."""
    pulled = {w.path for w in profile.weights}
    model = profile.server.model
    if not pulled or model not in pulled:
        return {}
    named = [v for _, v in profile.server.flags.model_values()]
    if any(v not in pulled for v in named):
        return {}
    set_here = {k for k, _ in profile.server.env}
    return {k: v for k, v in OFFLINE_ENV.items() if k not in set_here}


def pull_fixes(profile):
    """{model path on the host: its [weights] source}: what preflight names `fab pull` for."""
    return {w.path: w.source for w in profile.weights}
