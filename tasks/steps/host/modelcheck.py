"""Model-aware preflight: read the target's and the drafter's config.json before a long load.

`run(models)` takes the `models` section built by tasks/profile/models.py and returns
records {check, status: OK | WARN | FAIL, message}; each message names the file and
the key at fault. Where a field may live follows vLLM (vllm/config/speculative.py,
vllm/model_executor/models/qwen3_dflash.py, eagle3_utils.py):
  - DFlash block_size and mask_token_id: `dflash_config.<key>`, else top-level `<key>`
    (z-lab's Qwen3.6-27B-DFlash has block_size at the top level);
  - target_layer_ids: `dflash_config.target_layer_ids`, else top-level `target_layer_ids`;
  - layer_types: top level only;
  - the target's sizes: under `text_config` when the model has one (multimodal Qwen3.6),
    else top level.
Standard library only; Python >= 3.9.
"""
import json
import os

SLIDING = "sliding_attention"
# How each engine spells a method, for the fix a message suggests.
NAMES = {"eagle": "an EAGLE", "eagle3": "an EAGLE3", "mtp": "an MTP", "dflash": "a DFlash"}
SPELLING = {"sglang": {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "dflash": "DFLASH"}}


def _rec(check, status, message):
    return {"check": check, "status": status, "message": message}


def _int(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else None


class Config:
    """One config.json: `path` for messages, `data` the parsed object."""

    def __init__(self, path, data):
        self.path, self.data = path, data

    def get(self, key, sections=()):
        """(value, key as named in messages): the first of `<section>.<key>`, then `<key>`."""
        for section in sections:
            sub = self.data.get(section)
            if isinstance(sub, dict) and key in sub:
                return sub[key], "%s.%s" % (section, key)
        return self.data.get(key), key

    def size(self, key):
        """A target size: text_config first (multimodal models), else the top level."""
        return self.get(key, ("text_config",))


def load(directory, key, out):
    """The Config of a local model directory, or None (a FAIL is appended when it is unusable).

    A directory that does not exist is left to the path check; a file (a GGUF, say) is not
    a Hugging Face model directory and is not read.
    """
    if not directory or not os.path.isdir(directory):
        return None
    path = os.path.join(directory, "config.json")
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        out.append(_rec("config", "FAIL", "%s does not exist (%s = %s): not a Hugging Face model "
                        "directory; download the model again or point %s at the directory that "
                        "holds config.json" % (path, key, directory, key)))
        return None
    except (OSError, ValueError) as e:
        out.append(_rec("config", "FAIL", "%s: not valid JSON (%s); the model download is "
                        "incomplete or the file was edited by hand" % (path, e)))
        return None
    if not isinstance(data, dict):
        out.append(_rec("config", "FAIL", "%s: not a JSON object (got %s)" % (path, type(data).__name__)))
        return None
    cfg = Config(path, data)
    arch = data.get("architectures")
    arch = ", ".join(map(str, arch)) if isinstance(arch, list) and arch else "no architectures"
    layers, _ = cfg.size("num_hidden_layers")
    out.append(_rec("config", "OK", "%s: %s%s" % (path, arch, ", %s layers" % layers if _int(layers) else "")))
    return cfg


def check_dflash(draft, target, m, out):
    """The DFlash drafter's own fields, then each against the target."""
    sections = ("dflash_config",)
    fails = []
    found = {}
    for key in ("block_size", "mask_token_id", "target_layer_ids"):
        value, named = draft.get(key, sections)
        if value is None:
            continue  # the doctor's rule spec-drafter-config (doctor/host/spec_rules.py) reports it
        elif key == "target_layer_ids" and not (
                isinstance(value, list) and value and all(_int(i) is not None for i in value)):
            fails.append("%s: %s = %s is not a non-empty list of layer numbers" % (draft.path, named, json.dumps(value)))
        elif key != "target_layer_ids" and (_int(value) is None or value < (1 if key == "block_size" else 0)):
            fails.append("%s: %s = %s is not a %s integer" % (
                draft.path, named, json.dumps(value), "positive" if key == "block_size" else "non-negative"))
        else:
            found[key] = (value, named)
    if target is not None:
        fails += _against_target(draft, target, found)
    out += [_rec("dflash", "FAIL", f) for f in fails]
    # Draft length, layer ranges, the mask token and sliding-window layers are the doctor's
    # rules (doctor/host/spec_rules.py: ids a profile can accept), judged with the engine version there.
    notes = []
    spec = m.get("spec_tokens")
    if "block_size" in found and spec and spec["value"] <= found["block_size"][0] - 1 + spec["over"]:
        block, named = found["block_size"]
        notes.append("%s %d fits %s %d" % (spec["key"].rsplit(".", 1)[-1], spec["value"], named, block))
    layer_types = draft.data.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        sliding = sum(t == SLIDING for t in layer_types)
        if sliding:
            notes.append("layer_types: %d of %d %s" % (sliding, len(layer_types), SLIDING))
    if not fails:
        got = ", ".join("%s %s" % (named, json.dumps(v)) for v, named in found.values())
        out.append(_rec("dflash", "OK", "%s: %s%s" % (draft.path, got, "".join("; " + n for n in notes))))


def _against_target(draft, target, found):
    fails = []
    hidden, hkey = draft.get("target_hidden_size")
    if hidden is None:
        hidden, hkey = draft.get("hidden_size")
    want, wkey = target.size("hidden_size")
    if _int(hidden) is not None and _int(want) is not None and hidden != want:
        fails.append("%s: %s = %d differs from the target's %s = %d (%s): this drafter was made for "
                     "another model" % (draft.path, hkey, hidden, wkey, want, target.path))
    return fails


def _family(architectures):
    """The speculative method an architecture list names, or None when it does not say."""
    names = " ".join(str(a) for a in architectures).lower()
    for word, family in (("eagle3", "eagle3"), ("eagle", "eagle"), ("dflash", "dflash"),
                         ("mtp", "mtp"), ("nextn", "mtp")):
        if word in names:
            return family
    return None


def check_architecture(draft, m, out):
    arch = draft.data.get("architectures")
    if not isinstance(arch, list) or not arch:
        return
    family = _family(arch)
    method, key = m["method"], m["keys"].get("method", "the speculative method")
    if family is None:
        out.append(_rec("spec", "OK", "%s: architectures %s do not name a method; %s %r not checked "
                        "against them" % (draft.path, json.dumps(arch), key, method)))
    elif family == method:
        out.append(_rec("spec", "OK", "%s: architectures %s match %s %r" % (draft.path, json.dumps(arch), key, method)))
    else:
        spell = SPELLING.get(m.get("engine"), {})
        out.append(_rec("spec", "FAIL", "%s: architectures = %s name %s draft model, but %s is %r: set "
                        "it to %r (a mismatched head loads, then accepts almost nothing)" % (
                            draft.path, json.dumps(arch), NAMES[family], key,
                            spell.get(method, method), spell.get(family, family))))


def check_target(target, m, out):
    ctx = m.get("max_model_len")
    pos, pkey = target.size("max_position_embeddings")
    if ctx and _int(pos) is not None:
        if ctx["value"] > pos:
            out.append(_rec("context", "WARN", "%s = %d is above %s = %d in %s: the model was trained "
                            "for fewer positions (the engine may refuse it, or quality drops past %d)" % (
                                ctx["key"], ctx["value"], pkey, pos, target.path, pos)))
        else:
            out.append(_rec("context", "OK", "%s %d <= %s %d" % (ctx["key"], ctx["value"], pkey, pos)))
    tp = m.get("tp")
    heads, hkey = target.size("num_attention_heads")
    if tp and _int(heads) is not None and tp["value"] > 0:
        if heads % tp["value"]:
            divisors = [d for d in range(1, heads + 1) if heads % d == 0 and d <= 16]
            out.append(_rec("tp", "WARN", "%s = %d does not divide %s = %d in %s: the engine cannot "
                            "split the attention heads evenly; use one of %s" % (
                                tp["key"], tp["value"], hkey, heads, target.path, divisors)))
        else:
            out.append(_rec("tp", "OK", "%s %d divides %s %d" % (tp["key"], tp["value"], hkey, heads)))


def run(models):
    """All model checks for one preflight request; [] when the profile names no local model."""
    if not models:
        return []
    out = []
    keys = models.get("keys") or {}
    target = load(models.get("target"), keys.get("target", "server.model"), out)
    if models.get("draft") and models.get("draft") == models.get("target"):
        draft = target  # MTP heads often ship inside the target checkpoint: read it once
    else:
        mine = []
        draft = load(models.get("draft"), keys.get("draft", "the draft model"), mine)
        # A DFlash drafter's unusable config.json is the doctor's spec-drafter-config rule.
        out += [r for r in mine if r["status"] != "FAIL" or models.get("method") != "dflash"]
    method = models.get("method")
    if draft is not None and method in ("eagle", "eagle3", "mtp", "dflash"):
        check_architecture(draft, models, out)
    if draft is not None and method == "dflash":
        check_dflash(draft, target, models, out)
    if target is not None:
        check_target(target, models, out)
    return out
