"""Load a deployment profile (TOML) into the frozen `Profile` every task consumes.

    profile = load_profile("configs/qwen3.6-27b-dflash.toml")

Steps: read and parse each file of the `extends` chain, deep-merge the tables (the
extending file wins; arrays are replaced, not concatenated; a table VALUE in [server.args]
or [server.env], such as speculative-config, is one value and replaced whole), check the merged tree
against the schema (tasks/profile/schema.py), and keep the merged profile as TOML
text with secrets left as `{ from_env = "NAME" }`. Every problem, from a TOML
syntax error to an unset secret, is a ProfileError (exit 2) that names the file
that wrote the bad key, the dotted key path and what was expected.
"""
import hashlib
import os
import sys
from pathlib import Path

from ..errors import ProfileError
from .types import Profile
from .readers import Checker, describe
from .checktable import read_check
from .schema import build, supervise
from .systemd_table import read_systemd
from .container_table import read_container
from .toml_text import dumps
from ..weights.sources import read_weights

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.9/3.10 only
    import tomli as tomllib

DEFAULT_PROFILE = os.path.join("configs", "demo.toml")
MAX_EXTENDS = 32  # deeper chains are a mistake, and bounding them bounds recursion
# Tables whose entries are values, not sections: a table there (speculative-config = { ... },
# a { from_env = ... } secret) is one value, which the extending profile replaces whole.
# Merged key by key, an n-gram config over a base's EAGLE3 one kept the base's drafter model.
VALUE_TABLES = (("server", "args"), ("server", "env"))
PROFILE_HINT = "pass --profile PATH, or set llmfab.profile in your Invoke/Fabric config"


def load_profile(path, *, environ=os.environ, need_secrets=True):
    """Read, merge, validate: `path` (str or Path) -> Profile.

    `environ` supplies the values of `{ from_env = "NAME" }` secrets (default: os.environ).
    Only a task that launches a new release needs their values (`need_secrets`); for any
    other an unset one is kept as a Secret with no value (its `missing` message says what a
    launch would refuse), so the on-call person without the key can still stop the server.
    Raises ProfileError for anything wrong; never another exception for bad input.
    """
    top = os.fspath(path)
    try:
        data, origins, chain = _load_tree(top, ())
        ck = Checker(top, origins, environ, need_secrets)
        target, server, ready, gpu, cluster = build(ck, data, Path(top).stem)
        check = read_check(ck, data)  # [check] accept (tasks/profile/checktable.py)
        supervision = supervise(ck, data)
        systemd = read_systemd(ck, data, server.runtime)  # [systemd] (tasks/profile/systemd_table.py)
        weights = read_weights(ck, data, _model_paths(server))
        container = read_container(ck, data, server.runtime)  # [container] (tasks/profile/container_table.py)
        # Saved in every release: make it stand alone (no extends, name explicit, files absolute).
        data.setdefault("target", {})["name"] = target.name
        if server.files:
            data["server"]["files"] = list(server.files)
        resolved = dumps(data)
    except RecursionError:
        raise ProfileError(top, None, "the profile is nested too deeply") from None
    # The path as given (made absolute, links NOT resolved): `extends` is found beside it, so
    # the file named in every message and hint is the one whose neighbours were read.
    return Profile(
        path=Path(os.path.abspath(top)), target=target, server=server, ready=ready, gpu=gpu,
        cluster=cluster, resolved_toml=resolved,
        digest=hashlib.sha256(resolved.encode("utf-8")).hexdigest(),
        sources=tuple(Path(f).resolve() for f in chain), check=check,
        supervise=supervision, weights=weights, systemd=systemd, container=container,
    )


def _model_paths(server):
    """The absolute model paths the profile names: server.model and the drafters."""
    paths = [p for _, p in server.flags.model_paths()]
    if isinstance(server.model, str) and server.model.startswith("/"):
        paths.insert(0, server.model)
    return set(paths)


def _load_tree(path, chain):
    """-> (merged data, {key path: file that wrote it}, files from top to the last base).

    `chain` holds (shown path, real path) of the files that extended this one.
    """
    real = os.path.realpath(path)
    if any(real == r for _, r in chain):
        loop = " -> ".join([p for p, _ in chain] + [path])
        raise ProfileError(chain[-1][0], "extends", f"profiles extend each other in a loop: {loop}")
    data = _parse(path)
    base_name = data.pop("extends", None)
    origins = {p: path for p in _key_paths(data, ())}
    if base_name is None:
        return data, origins, (path,)
    if not isinstance(base_name, str) or not base_name or "\0" in base_name:
        raise ProfileError(path, "extends", "the path of another profile, relative to this file",
                           got=describe(base_name))
    if len(chain) >= MAX_EXTENDS:
        raise ProfileError(path, "extends", f"at most {MAX_EXTENDS} levels of extends")
    base_path = os.path.normpath(os.path.join(os.path.dirname(path), base_name))
    if not os.path.isfile(base_path):
        raise ProfileError(path, "extends", f"{base_name!r} not found (looked for {base_path}; "
                                            "extends is relative to the file that says it)")
    base, base_origins, files = _load_tree(base_path, chain + ((path, real),))
    merged = _merge(base, data)
    origins = {p: origins.get(p) or base_origins.get(p) for p in _key_paths(merged, ())}
    return merged, origins, (path,) + files


def _parse(path):
    """One file -> dict. Unreadable files, bad UTF-8 and TOML syntax errors become ProfileError."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        reason = e.strerror or str(e)
        raise ProfileError(path, None, f"cannot read the profile: {reason}") from None
    try:
        text = raw.decode("utf-8-sig")  # tolerate the BOM some Windows editors write
    except UnicodeDecodeError as e:
        bad = f"an invalid byte at offset {e.start}"
        raise ProfileError(path, None, f"not UTF-8 text: {bad}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        # The message carries "(at line L, column C)".
        raise ProfileError(path, None, f"not valid TOML: {e}") from None
    except RecursionError:
        raise ProfileError(path, None, "not valid TOML: nested too deeply") from None


def _merge(base, over, path=()):
    """Deep merge: tables merge key by key, anything else in `over` replaces what `base` had;
    the entries of VALUE_TABLES are values, replaced whole even when they are tables."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and path not in VALUE_TABLES:
            out[k] = _merge(out[k], v, path + (k,))
        else:
            out[k] = v
    return out


def _key_paths(data, prefix):
    """Every key path of nested tables (arrays are leaves)."""
    for k, v in data.items():
        yield prefix + (k,)
        if isinstance(v, dict):
            yield from _key_paths(v, prefix + (k,))


def resolve_profile_path(arg=None, config_value=None, *, cwd=None):
    """Which profile a task uses: `--profile` if given, else the `llmfab.profile` config value,
    else the default (see find_default_profile). Relative paths are relative to `cwd`
    (default: the current directory). Raises ProfileError if the file does not exist.
    """
    chosen = arg or config_value
    if not chosen:
        return find_default_profile(cwd=cwd)
    full = Path(cwd or os.getcwd()) / chosen
    if full.is_dir():
        where = "--profile" if arg else "llmfab.profile"
        raise ProfileError(chosen, None, f"is a directory, not a profile (given by {where}); "
                                         "name a .toml file in it")
    if not full.is_file():
        where = "--profile" if arg else "llmfab.profile"
        raise ProfileError(chosen, None, f"profile not found (given by {where}); {PROFILE_HINT}")
    return Path(chosen) if cwd is None else full


def find_default_profile(*, cwd=None):
    """`configs/demo.toml` in `cwd` if there is one, else the demo shipped with llmfab: inside
    the installed package (llmfab/configs/, see setup.cfg), or in the checkout beside tasks/."""
    here = Path(cwd or os.getcwd()) / DEFAULT_PROFILE
    if here.is_file():
        return Path(DEFAULT_PROFILE) if cwd is None else here
    package = Path(__file__).resolve().parents[1]
    for shipped in (package / DEFAULT_PROFILE, package.parent / DEFAULT_PROFILE):
        if shipped.is_file():
            return shipped
    raise ProfileError(DEFAULT_PROFILE, None, "no profile given, and no default found here or "
                                              f"beside llmfab; {PROFILE_HINT}")
