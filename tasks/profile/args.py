"""`[server.args]` and `[server.env]`: turn TOML values into argv-ready and environ-ready values.

Everything that can break a launch late (bad JSON for a dict flag, nested arrays,
an unset secret) is refused here, before any host is touched.
"""
import json
import math
import re

from .serverargs import JsonTable, flag_key
from .types import Secret

ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"

# Flags whose value vLLM/SGLang parse with json.loads: a string given for one of these is
# checked now, because argparse would only reject it on the host, minutes into a deploy.
JSON_FLAGS = frozenset({
    "speculative-config", "compilation-config", "hf-overrides", "kv-transfer-config",
    "kv-events-config", "limit-mm-per-prompt", "override-generation-config",
    "model-loader-extra-config", "override-pooler-config", "pooler-config",
    "additional-config", "structured-outputs-config", "mm-processor-kwargs",
    "json-model-override-args", "json-overrides", "attention-config",
})
# Nesting this deep in an arg's table is a mistake, and bounding it keeps json.dumps safe.
MAX_DEPTH = 32


def read_args(ck, tbl, path):
    """`[server.args]` -> tuple of (flag, value) in file order; see module model.ArgValue."""
    if not isinstance(tbl, dict):
        ck.fail(path, "a table of flags", tbl)
    seen: dict = {}           # normalised flag name -> the key as written
    dotted_parts: dict = {}   # "speculative-config" -> "speculative-config.method" as written
    out = []
    for name, v in tbl.items():
        p = path + (name,)
        if not name or name.startswith("-") or "=" in name or re.search(r"[\s\x00-\x1f\x7f]", name):
            ck.fail(p, 'a flag name without leading dashes, "=" or whitespace '
                       '(write tensor-parallel-size, not --tensor-parallel-size)')
        norm = flag_key(name)
        whole = norm.split(".")[0]
        # vLLM keeps only the last of a repeated flag, and the dotted form
        # (speculative-config.method) silently overrides the whole JSON: refuse both mixes.
        clash = seen.get(norm) or (seen.get(whole) if "." in norm else dotted_parts.get(norm))
        if clash:
            ck.fail(p, f"one spelling per flag, but {clash!r} sets the same flag")
        seen[norm] = name
        if "." in norm:
            dotted_parts.setdefault(whole, name)
        out.append((name, _arg_value(ck, norm, v, p)))
    return tuple(out)


def _arg_value(ck, norm, v, path):
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return _finite(ck, v, path)
    if isinstance(v, str):
        wants_json = norm in JSON_FLAGS or (
            (norm.endswith("-config") or norm.endswith("-kwargs")) and v.lstrip().startswith("{"))
        return _json_string(ck, v, path) if wants_json else v
    if isinstance(v, dict):
        if "from_env" in v:
            ck.fail(path, _secret_in_args(norm, v.get("from_env")))
        _json_safe(ck, v, path, 0)
        return JsonTable(json.dumps(v, separators=(",", ":"), ensure_ascii=False))
    if isinstance(v, list):
        if not v:
            ck.fail(path, "an array with at least one item (to leave the flag out, remove the key)")
        for i, item in enumerate(v):
            if isinstance(item, (dict, list)):
                ck.fail(path + (i,), "a string, number or boolean: an array flag takes one argv "
                                     "element per item (use a table for JSON)", item)
            if isinstance(item, float):
                _finite(ck, item, path + (i,))
        return tuple(v)
    ck.fail(path, "a string, number, boolean, table or array", v)


# Where a secret flag's value goes instead of argv, per engine flag (a secret is never on argv: docs/security.md).
SECRET_FLAG_ENV = {"api-key": "VLLM_API_KEY"}


def _secret_in_args(norm, name):
    """The message for `{ from_env = ... }` under [server.args]: the server would receive the
    literal JSON text as the flag's value, and a secret never goes on argv anyway."""
    var = SECRET_FLAG_ENV.get(norm)
    where = (f'[server.env] {var} = {{ from_env = "{name}" }} (vLLM reads --{norm} from {var})'
             if var else f'[server.env] as an environment variable the server reads '
                         f'(e.g. {norm.upper().replace("-", "_")} = {{ from_env = "{name}" }})')
    return ("a plain value: a { from_env = ... } secret never goes on the command line (it "
            f"would show in `ps` and the server would get the JSON text); put it in {where}")


def _finite(ck, v, path):
    if isinstance(v, float) and not math.isfinite(v):
        ck.fail(path, "a finite number", v)
    return v


def _json_safe(ck, v, path, depth):
    """Table contents become JSON: any nesting is fine, but only finite numbers and no huge depth."""
    if depth > MAX_DEPTH:
        ck.fail(path, f"a table nested at most {MAX_DEPTH} levels deep")
    if isinstance(v, dict):
        for k, x in v.items():
            _json_safe(ck, x, path + (k,), depth + 1)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _json_safe(ck, x, path + (i,), depth + 1)
    elif isinstance(v, float):
        _finite(ck, v, path)


def _json_string(ck, text, path):
    """A JSON string for a dict flag: invalid -> error quoting the JSON error; object -> JsonTable."""
    def pairs(items):
        keys = [k for k, _ in items]
        dup = next((k for k in keys if keys.count(k) > 1), None)
        if dup is not None:
            raise ValueError(f"duplicate key {dup!r} (JSON keeps only the last)")
        return dict(items)

    def constant(name):
        raise ValueError(f"{name} is not valid JSON")

    try:
        parsed = json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except (ValueError, RecursionError) as e:
        ck.fail(path, f"valid JSON (use a TOML inline table instead of a string to avoid quoting); "
                      f"JSON error: {e}", text)
    if isinstance(parsed, dict):
        _json_safe(ck, parsed, path, 0)
        return JsonTable(json.dumps(parsed, separators=(",", ":"), ensure_ascii=False))
    return text  # valid JSON but not an object (e.g. compilation-config = "3"): passed verbatim


def read_env(ck, tbl, path):
    """`[server.env]` -> tuple of (NAME, str | Secret).

    Numbers become their decimal text; booleans become "1" / "0", because vLLM reads its
    boolean variables with int() (VLLM_USE_V2_MODEL_RUNNER = true would crash as "true").
    """
    if not isinstance(tbl, dict):
        ck.fail(path, "a table of environment variables", tbl)
    out = []
    for name, v in tbl.items():
        p = path + (name,)
        if not re.fullmatch(ENV_NAME, name):
            ck.fail(p, f"an environment variable name matching {ENV_NAME}")
        if isinstance(v, bool):
            out.append((name, "1" if v else "0"))
        elif isinstance(v, (int, float)):
            out.append((name, str(_finite(ck, v, p))))
        elif isinstance(v, str):
            out.append((name, v))
        elif isinstance(v, dict):
            out.append((name, _secret(ck, v, p)))
        else:
            ck.fail(p, 'a string, number, boolean or { from_env = "NAME" }', v)
    return tuple(out)


def _secret(ck, v, path):
    ck.table(v, path, ("from_env",))
    source = ck.get(v, path, "from_env", lambda c, x, p: c.matches(
        x, p, ENV_NAME, "the name of a variable in your local environment"),
        expected='the name of a local environment variable, e.g. { from_env = "HF_TOKEN" }')
    if source not in ck.environ:
        expected = (f"reads ${source} from your local environment, but it is not set; "
                    f"export {source}=... before running fab")
        if not ck.need_secrets:  # a task that launches nothing: say so only if asked
            from ..errors import ProfileError
            from .readers import dotted
            return Secret(source=source, value=None,
                          missing=ProfileError(ck.file_of(path), dotted(path), expected).message)
        ck.fail(path, expected)
    return Secret(source=source, value=ck.environ[source])
