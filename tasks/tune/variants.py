"""The variants of a sweep: each one a real profile file, validated before any host is touched.

    variants = build(base, vary=[("server.args.speculative-config.num_speculative_tokens",
                                  (1, 2, 4))], profiles=(), baseline=True, out=Path("tune-x"))

A variant is written to `<out>/variants/NN-<name>.toml` and loaded with the profile loader
(exit 2 naming the variant and the key on anything wrong), so what is deployed is a
profile like any other:

* `--vary KEY=V1,V2`: a file that `extends` the original and sets KEY. Under
  [server.args] a table-valued flag (speculative-config) is written whole, since a child's
  table replaces the parent's; a flag written as a JSON string becomes the same table.
* `--profiles a.toml`: a file that `extends` a.toml.
* `--baseline`: the original's merged profile without its speculative flags (every flag
  tasks/profile/serverargs.py names speculative); `extends` cannot remove a key, so this one file
  stands alone.

Every variant file also pins [target] name to the original's, so all variants are
releases of ONE deployment (what ran before is put back from its own release), and raises
keep_releases so that release is not pruned while the sweep runs.
"""
import copy
import itertools
import os
import re
from pathlib import Path

from ..errors import LlmfabError, UsageError
from ..profile import load_profile, tomllib
from ..profile.args import flag_key
from ..profile.serverargs import is_speculative_flag
from ..profile.toml_text import dumps, value as toml_value

MAX_VARIANTS = 32
# Short names in tables and charts for keys users vary most.
SHORT = {"num_speculative_tokens": "k", "speculative-num-draft-tokens": "k"}


class Variant:
    """One measured configuration: `name` (shown), `settings` (what differs), `path` (the
    profile file written for it), `profile` (loaded), `overrides` (the tree its file sets)."""

    def __init__(self, index, name, settings, path, profile, overrides, extends):
        self.index, self.name, self.settings = index, name, settings
        self.path, self.profile, self.overrides, self.extends = path, profile, overrides, extends

    def __repr__(self):
        return f"Variant({self.index}, {self.name!r})"


def parse_vary(items):
    """['KEY=V1,V2', ...] -> [(KEY, (v1, v2))]; values are TOML scalars, else strings."""
    out = []
    for item in items or ():
        key, sep, values = str(item).partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            raise UsageError(f"--vary expects KEY=V1,V2,... (a dotted key into the profile), "
                             f"got {item!r}")
        if any(not part for part in key.split(".")):
            raise UsageError(f"--vary {key!r}: an empty part in the dotted key")
        vals = tuple(_scalar(v.strip()) for v in values.split(","))
        if any(v == "" for v in vals):
            raise UsageError(f"--vary {key}: an empty value in {values!r}")
        if len(set(map(repr, vals))) != len(vals):
            raise UsageError(f"--vary {key}: a value is given twice in {values!r}")
        if key in [k for k, _ in out]:
            raise UsageError(f"--vary {key} is given twice; give all its values at once")
        out.append((key, vals))
    return out


def _scalar(text):
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except Exception:
        return text


def count(vary, profiles, baseline):
    n = 1
    for _, vals in vary:
        n *= len(vals)
    return (n if vary else 0) + len(profiles) + (1 if baseline else 0)


def build(base, *, vary, profiles, baseline, out):
    """[Variant] in sweep order; UsageError/ProfileError (exit 2) before any host is touched."""
    n = count(vary, profiles, baseline)
    if n == 0:
        raise UsageError("nothing to tune: give --vary KEY=V1,V2, --profiles A.toml,B.toml "
                         "and/or --baseline")
    if n > MAX_VARIANTS:
        raise UsageError(f"{n} variants: at most {MAX_VARIANTS} (each one is a deploy and a "
                         "bench); vary fewer keys or values")
    data = tomllib.loads(base.resolved_toml)
    keep = max(base.target.keep_releases, n + 2)
    pin = {"name": base.target.name, "keep_releases": keep}
    folder = Path(out) / "variants"
    folder.mkdir(parents=True, exist_ok=True)
    todo = []
    keys = [k for k, _ in vary]
    for combo in (itertools.product(*[v for _, v in vary]) if vary else ()):
        settings = dict(zip(keys, combo))
        name = " ".join(f"{_short(k, keys)}={_show(v)}" for k, v in settings.items())
        todo.append((name, settings, "vary"))
    for p in profiles:
        todo.append((Path(p).stem, {"profile": str(p)}, "profile"))
    if baseline:
        todo.append(("baseline", {"speculative": None}, "baseline"))
    names = [t[0] for t in todo]
    variants = []
    for i, (name, settings, kind) in enumerate(todo, 1):
        if names.count(name) > 1:
            name = f"{name} #{i}"
        label = f"variant {i} ({name})"
        path = folder / f"{i:02d}-{_slug(name)}.toml"
        if kind == "vary":
            overrides = {}
            tree = copy.deepcopy(data)
            for key, val in settings.items():
                where = set_key(tree, key, val, label)
                _put(overrides, where, _get(tree, where))
            overrides.setdefault("target", {}).update(pin)
            extends = base.path
        elif kind == "profile":
            if not Path(settings["profile"]).is_file():
                raise UsageError(f"{label}: --profiles {settings['profile']}: no such file")
            overrides, extends = {"target": dict(pin)}, Path(settings["profile"]).resolve()
        else:
            overrides = without_speculation(data)
            overrides["target"].update(pin)
            extends = None
        from ..base.host.safefile import replace
        replace(str(path), profile_text(overrides, extends, path.parent,
                                        f"fab tune {label} of {base.path.name}"))
        try:
            profile = load_profile(path)
        except LlmfabError as e:
            raise UsageError(f"{label}: {e.message}") from None
        if profile.cluster is not None:
            raise UsageError(f"{label}: fab tune does not sweep [cluster] profiles")
        variants.append(Variant(i, name, settings, path, profile, overrides, extends))
    return variants


def profile_text(tree, extends, folder, comment):
    """A profile file: `extends` (relative to `folder`) then the tree's tables."""
    head = [f"# {line}" for line in comment.splitlines()]
    if extends is not None:
        head.append(f"extends = {toml_value(os.path.relpath(extends, folder))}")
    return "\n".join(head) + "\n" + dumps(tree)


def set_key(tree, key, val, label):
    """Set dotted `key` in the profile tree; returns the path its variant file writes.

    Flags under [server.args] match with dashes and underscores alike, a flag written as a
    JSON string is read as its table, and a key with dots of its own
    (`"speculative-config.method"`) is found whole. Missing tables and keys are created
    (the profile's schema then judges them), except inside a table-valued flag such as
    speculative-config: the engine, not llmfab, would refuse a misspelt key there, after a
    deploy per variant, so such a key must already be in the profile."""
    parts = key.split(".")
    args = ["server", "args"]
    node, walked, i = tree, [], 0
    while True:
        hit = _find(node, parts, i, flags=walked == args)
        if hit is None:
            in_flag = len(walked) >= 3 and walked[:2] == args
            if in_flag or (walked == args and i < len(parts) - 1):
                where = ".".join(walked + [parts[i]])
                has = ", ".join(node) if isinstance(node, dict) and node else "none"
                raise UsageError(f"{label}: --vary {key}: {where} is not in the profile "
                                 f"(keys there: {has})")
            if i == len(parts) - 1:
                name = parts[i]
                break
            node[parts[i]] = {}
            hit = (parts[i], 1)
        name, used = hit
        if i + used == len(parts):
            break
        child = node[name]
        if isinstance(child, str) and walked == args:
            import json
            try:
                child = node[name] = json.loads(child)
            except ValueError:
                pass
        if not isinstance(child, dict):
            raise UsageError(f"{label}: --vary {key}: {'.'.join(walked + [name])} is not a table")
        node, walked, i = child, walked + [name], i + used
    if isinstance(node.get(name), dict):
        raise UsageError(f"{label}: --vary {key}: {'.'.join(walked + [name])} is a table; "
                         "vary one of its keys")
    node[name] = val
    path = walked + [name]
    # Under [server.args] the whole flag is the unit a child profile replaces.
    return tuple(path[:3]) if path[:2] == args else tuple(path)


def _find(node, parts, i, flags):
    """(key in `node`, how many parts it spans) for parts[i:], longest dotted match first;
    `flags`: names match as flags do (dashes and underscores alike)."""
    for j in range(len(parts), i, -1):
        want = ".".join(parts[i:j])
        for k in node:
            if k == want or (flags and flag_key(k) == flag_key(want)):
                return k, j - i
    return None


def _get(tree, path):
    for p in path:
        tree = tree[p]
    return tree


def _put(tree, path, val):
    for p in path[:-1]:
        tree = tree.setdefault(p, {})
    tree[path[-1]] = copy.deepcopy(val)


def without_speculation(data):
    """The merged profile with no speculative flag in [server.args] (the baseline): every flag
    tasks/profile/serverargs.py names speculative, in any spelling."""
    tree = copy.deepcopy(data)
    args = tree.get("server", {}).get("args", {})
    for k in [k for k in args if is_speculative_flag(k)]:
        del args[k]
    tree.setdefault("target", {})
    return tree


def _short(key, keys):
    last = key.split(".")[-1]
    short = SHORT.get(last, last)
    clash = sum(1 for k in keys if SHORT.get(k.split(".")[-1], k.split(".")[-1]) == short) > 1
    return key if clash else short


def _show(v):
    return str(v).lower() if isinstance(v, bool) else str(v)


def _slug(name):
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")[:60] or "variant"


def tuned_text(base, winner, why, folder):
    """The `<stem>.tuned.toml` text: the winner's file, with `extends` relative to `folder`
    and the reason on top. The baseline stands alone (it removes keys)."""
    comment = (f"fab tune: the winner of a sweep over {base.path.name}\n{why}\n"
               f"deploy it with: fab deploy --profile <this file>")
    tree = copy.deepcopy(winner.overrides)
    tree["target"].pop("keep_releases", None)  # the sweep's; the original's applies again
    if winner.extends is None:
        tree["target"]["keep_releases"] = base.target.keep_releases
    return profile_text(tree, winner.extends, folder, comment)
