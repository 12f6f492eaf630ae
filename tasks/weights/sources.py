"""The profile's `[weights]` table: each model path on the host -> where its files come from.

    [weights]
    "/root/models/Qwen3.6-27B" = "local:/data/models/Qwen3.6-27B"

Keys are model paths the profile names (server.model, and every drafter path in
[server.args]); a key the profile does not name is an error (exit 2), so a typo never pulls
to a path nothing reads. Sources: `local:/absolute/dir` on this machine. Pure; no I/O.
"""
from dataclasses import dataclass
from typing import Tuple

SCHEMES = ("local:",)


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
