"""The facts the doctor's rules are conditions over, read on the host.

`facts(doctor, version)` takes the `doctor` section of a request (built by tasks/doctor/host_request.py
from the profile: method, drafter and target directories, draft length, the runner env,
prefix caching, each with the profile key it came from) and the engine version, reads the
drafter's and the target's config.json, and returns a flat dict: plain values the rules
compare (`sliding`, `runner`, ...) and the words their messages quote (`draft_config`, ...).
Where a field may live follows vLLM, as in modelcheck.py: DFlash's block_size,
mask_token_id and target_layer_ids under `dflash_config`, else at the top level; the
target's sizes under `text_config` when it has one.

They are computed once per deployment, by the preflight (the engine version as the
server's environment has it), and kept in the release directory as FACTS_FILE (deploy
pushes them there with the release's other files); the ready line's log scan, status and
bench read them with `kept(rdir)`, and compute them again only where the file is missing
(a release by an older llmfab) or damaged.
Standard library only; Python >= 3.9.
"""
import json
import os

from . import versions
from .spec_rules import FORCES_V2_FOR_MIXED_DFLASH, RUNNER_DEFAULTS
from ...base.host.hosterrors import Damaged
from ...base.host.statefiles import read_json

SLIDING = "sliding_attention"
FACTS_FILE = "spec-facts.json"
NEEDS = {"dflash": ("block_size", "mask_token_id", "target_layer_ids")}


def _int(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def read_config(directory):
    """(data, problem): the parsed config.json of a model directory; problem in words or None."""
    path = os.path.join(directory, "config.json")
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        return None, "%s is missing" % path
    except (OSError, ValueError) as e:
        return None, "%s is unreadable (%s)" % (path, e)
    if not isinstance(data, dict):
        return None, "%s is not a JSON object" % path
    return data, None


def _field(data, key, sections=()):
    for s in sections:
        sub = data.get(s)
        if isinstance(sub, dict) and key in sub:
            return sub[key], "%s.%s" % (s, key)
    return data.get(key), key


def _size(data, key):
    return _field(data, key, ("text_config",))


def _runner(f, env, version):
    if env in ("0", "1"):
        f["runner"] = "v2" if env == "1" else "v1"
        f["runner_why"] = "VLLM_USE_V2_MODEL_RUNNER = \"%s\" is set in [server.env]" % env
        return
    if f.get("sliding_mixed") and f.get("method") == "dflash" \
            and versions.in_range(version, FORCES_V2_FOR_MIXED_DFLASH):
        f["runner"], f["runner_why"] = "v2", "vLLM %s picks the V2 runner for such drafters" % version
        return
    for spec, runner, why in RUNNER_DEFAULTS:
        if versions.in_range(version, spec):
            f["runner"], f["runner_why"] = runner, why.format(version=version)
            return


def _drafter(f, data, method):
    sections = ("dflash_config",) if method == "dflash" else ()
    missing = []
    for key in NEEDS.get(method, ()):
        value, named = _field(data, key, sections)
        f[key + "_key"] = named
        if value is None:
            missing.append("dflash_config.%s" % key)
        else:
            f[key] = value
    if missing:
        f["drafter_config_bad"] = True
        f["drafter_config_why"] = "%s lacks %s, which %s drafters need" % (
            f["draft_config"], ", ".join(missing), method)
    ids = f.get("target_layer_ids")
    if isinstance(ids, list) and ids and all(_int(i) is not None for i in ids):
        f.update(has_layer_ids=True, layer_ids=list(ids), layer_ids_key=f["target_layer_ids_key"],
                 layer_ids_shifted=[i + 1 for i in ids])
    types = data.get("layer_types")
    if isinstance(types, list) and types:
        n = sum(t == SLIDING for t in types)
        f.update(sliding=n > 0, sliding_mixed=0 < n < len(types), n_sliding=n,
                 sliding_window=data.get("sliding_window"))
    block = _int(f.get("block_size"))
    if block is not None and f.get("k") is not None:
        f["block_limit"] = block - 1 + f.get("k_over", 0)
        f["draft_too_long"] = f["k"] > f["block_limit"]


def _against_target(f, target):
    layers, _ = _size(target, "num_hidden_layers")
    if f.get("has_layer_ids") and _int(layers) is not None:
        bad = [i for i in f["layer_ids"] if not 0 <= i < layers]
        f.update(n_layers=layers, last_layer=layers - 1, bad_layers=bad, layers_out_of_range=bool(bad))
    mask = f.get("mask_token_id")
    vocab, vkey = _size(target, "vocab_size")
    if mask is not None and _int(mask) is None:
        f.update(mask_bad=True, mask_why="%s = %s is not a token id" % (
            f["mask_token_id_key"], json.dumps(mask)))
    elif _int(mask) is not None and _int(vocab) is not None and not 0 <= mask < vocab:
        f.update(mask_bad=True, mask_why="%s = %d is not below the target's %s = %d (%s): "
                 "this drafter was made for another tokenizer" % (
                     f["mask_token_id_key"], mask, vkey, vocab, f["target_config"]))


def facts(doctor, version):
    """The flat fact dict for one deployment (see the module docstring)."""
    method = doctor.get("method")
    f = {"engine": doctor.get("engine"), "version": version, "method": method,
         "method_key": doctor.get("method_key") or "the speculative method",
         "draft_key": doctor.get("draft_key") or "the draft model"}
    k = doctor.get("k") or {}
    if k.get("value") is not None:
        f.update(k=k["value"], k_key=k.get("key"), k_over=k.get("over", 0))
    pc = doctor.get("prefix_caching") or {}
    f["prefix_caching"] = pc.get("value") is not False
    f["prefix_caching_why"] = ("%s = true" % pc["key"]) if pc.get("value") else \
        "the default; enable-prefix-caching is not set"
    draft, target = doctor.get("draft"), doctor.get("target")
    draft_data = target_data = None
    if target and os.path.isdir(target):
        target_data, _ = read_config(target)
        f["target_config"] = os.path.join(target, "config.json")
    if method and draft and os.path.isdir(draft):
        f["draft_config"] = os.path.join(draft, "config.json")
        draft_data, problem = read_config(draft)
        if problem and method in NEEDS:
            f.update(drafter_config_bad=True, drafter_config_why="the drafter's config.json "
                     "(%s): %s" % (f["draft_key"], problem))
        if draft_data is not None:
            _drafter(f, draft_data, method)
            if target_data is not None:
                _against_target(f, target_data)
    _runner(f, doctor.get("v2_env"), version)
    return f


def kept(rdir):
    """The facts the preflight found for the release in directory `rdir` (FACTS_FILE), or
    None: never kept (a release by an older llmfab, or one without speculative decoding) or
    damaged (read_json's Damaged); then the caller computes them again."""
    try:
        return read_json(os.path.join(rdir, FACTS_FILE))
    except Damaged:
        return None
