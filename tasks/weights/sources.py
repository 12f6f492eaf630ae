"""The profile's `[weights]` table: each model path on the host -> where its files come from.

    [weights]
    "/root/models/Qwen3.6-27B" = "hf://Qwen/Qwen3.6-27B@main"      # the Hugging Face hub
    "/root/models/drafter" = "local:/data/models/drafter"          # a directory here
    HF_TOKEN = { from_env = "HF_TOKEN" }                           # for private/gated repos

Keys are model paths the profile names (server.model, and every drafter path in
[server.args]); a key the profile does not name is an error (exit 2), so a typo never pulls
to a path nothing reads. `HF_TOKEN` is the one other key: a secret read from this machine's
environment (never a literal in the file), handed to the hub client in-process. Pure; no I/O.
"""
import re
from dataclasses import dataclass
from typing import Optional

from ..profile.args import _secret
from ..profile.keys import Key, table
from ..profile.types import Secret

TOKEN_KEY = "HF_TOKEN"
WEIGHTS_KEYS = table(
    "weights",
    Key("<model path on the host>", 'string "hf://ORG/NAME@REV" or "local:/dir"', "none",
        "where `fab pull` copies that model directory from: a Hugging Face hub repo (REV: a "
        "branch, tag or commit, default main; resolved to a commit and recorded) or a "
        "directory on this machine; the key is server.model or a drafter path of "
        "[server.args] (docs/pull.md)"),
    Key(TOKEN_KEY, '{ from_env = "NAME" }', "none",
        "the hub token for hf:// sources (private or gated repos), read from this machine's "
        "environment; never in the file, on argv or in output. Unset: the hub client's own "
        "login, if any"),
)

# A hub repo id is ORG/NAME; each part as the hub allows it (letters, digits, - _ .; no
# leading/trailing - or ., no "--" or "..", 96 characters at most: huggingface_hub's
# validate_repo_id). A revision is a branch, a tag or a commit.
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
HF_SOURCE = re.compile(rf"hf://(?P<repo>{_PART}/{_PART})(?:@(?P<rev>[A-Za-z0-9][A-Za-z0-9._/-]*))?")
EXPECTED = ('a source: "hf://ORG/NAME" or "hf://ORG/NAME@REVISION" (Hugging Face hub) or '
            '"local:/absolute/dir/on/this/machine"')


@dataclass(frozen=True)
class WeightSource:
    path: str                       # the model directory on the host
    source: str                     # as written in the profile
    local: Optional[str] = None     # local: the directory on this machine
    repo: Optional[str] = None      # hf: ORG/NAME
    revision: str = "main"          # hf: branch, tag or commit as written
    token: Optional[Secret] = None  # hf: [weights] HF_TOKEN, if set

    @property
    def hub(self):
        return self.repo is not None


def parse_source(value):
    """"hf://ORG/NAME@REV" | "local:/dir" -> dict(local=..) or dict(repo=.., revision=..);
    None when it is neither."""
    if value.startswith("local:/"):
        return {"local": value[len("local:"):]}
    m = HF_SOURCE.fullmatch(value)
    if not m or len(m["repo"]) > 96 or any(bad in value for bad in ("--", "..")):
        return None
    return {"repo": m["repo"], "revision": m["rev"] or "main"}


def read_weights(ck, data, model_paths):
    """[weights] of the merged tree -> (WeightSource, ...); `model_paths`: the absolute model
    paths the profile names (server.model and the drafters)."""
    if "weights" not in data:
        return ()
    t, p = data["weights"], ("weights",)
    if not isinstance(t, dict):
        ck.fail(p, "a table: model path on the host = \"hf://ORG/NAME@REV\" or \"local:/dir\"", t)
    token = None
    if TOKEN_KEY in t:
        v = t[TOKEN_KEY]
        if not isinstance(v, dict):  # its value is never shown: it may be the token itself
            ck.fail(p + (TOKEN_KEY,), f'{{ from_env = "{TOKEN_KEY}" }} (the name of a variable in your '
                                      "environment): a token is a secret, never written in the profile")
        token = _secret(ck, v, p + (TOKEN_KEY,))
    out = []
    for key, value in t.items():
        if key == TOKEN_KEY:
            continue
        q = p + (key,)
        if key not in model_paths:
            named = ", ".join(sorted(model_paths)) or "none (no absolute model path)"
            ck.fail(q, f"a model path the profile names (server.model or a drafter path): {named}")
        ck.string(value, q)
        parsed = parse_source(value)
        if parsed is None:
            ck.fail(q, EXPECTED, value)
        out.append(WeightSource(path=key, source=value, token=token if "repo" in parsed else None,
                                **parsed))
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
