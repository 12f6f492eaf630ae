"""`[server.args]`, read once: every flag by its normalised name, and the values readers ask for.

    flags = profile.server.flags        # built with the Server (tasks/profile/types.py)
    flags.value("max_model_len")        # dashes and underscores name the same flag: 4096 or None
    flags.get("max-model-len")          # Flag(key="max_model_len", value=4096) or None
    flags.speculative                   # SpecConfig(key, method, model, num_speculative_tokens, ...)
    flags.served_model_name             # "x" (the first name of several) or None
    flags.api_key                       # the key the server demands on /v1/*, or None
    flags.model_paths()                 # [("server.args.speculative-config.model", "/m")]

Every reader of `[server.args]` asks this object; none looks into the raw pairs by name. The
raw pairs (`Server.args`, in file order) are what tasks/steps/argv.py renders onto the command line.

Dotted keys (`"speculative-config.model" = "/m"`) fold into a table under their flag, as
vLLM's parser does, so a drafter named that way is found like one written as a whole table.
This module imports nothing from the package: tasks/profile/types.py builds on it.
"""
import json
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple


def flag_key(name):
    """Dashes and underscores name the same flag for vLLM's parser: compare names this way."""
    return name.replace("_", "-")


# Every [server.args] flag that turns speculative decoding on or shapes it, by normalised name
# (flag_key), with where each comes from. `fab tune --baseline` removes them all: a baseline
# with any of them left still speculates.
SPECULATIVE_FLAG_PREFIXES = (
    # vLLM --speculative-config (and its dotted form speculative-config.KEY); SGLang
    # --speculative-algorithm, --speculative-draft-model-path, --speculative-num-steps,
    # --speculative-eagle-topk, --speculative-num-draft-tokens (sglang/srt/server_args.py);
    # vLLM 0.32's shortcuts --spec-method, --spec-model, --spec-tokens (vllm/engine/arg_utils.py)
    # and any abbreviation of these, which vLLM's argparse accepts (allow_abbrev).
    "spec",
)
SPECULATIVE_FLAG_NAMES = (
    "sc",                      # vLLM's alias of --speculative-config (vllm/engine/arg_utils.py)
    "num-speculative-tokens",  # vLLM before --speculative-config (0.7 and older)
    "ngram-prompt-lookup-max", "ngram-prompt-lookup-min",  # the same, for ngram drafting
)


def is_speculative_flag(name):
    """True when the [server.args] key `name` (any spelling, dotted or not) is a speculative flag."""
    norm = flag_key(name).split(".")[0]
    return norm.startswith(SPECULATIVE_FLAG_PREFIXES) or norm in SPECULATIVE_FLAG_NAMES


@dataclass(frozen=True)
class JsonTable:
    """A table-valued flag (e.g. speculative-config), rendered as ONE argv element of compact JSON.

    `text` is compact JSON (`separators=(",", ":")`, key order as written, ensure_ascii=False).
    """
    text: str

    def value(self):
        """A fresh dict (or list) of the JSON: callers may change it."""
        return json.loads(self.text)


@dataclass(frozen=True)
class Flag:
    """One flag of [server.args]: the key as the profile wrote it (for messages) and its value.
    Tables (whole, or folded from dotted keys) are JsonTable; arrays are tuples."""
    key: str
    value: Any

    @property
    def table(self):
        """The value as a dict when it is a JSON object, else None."""
        if isinstance(self.value, JsonTable):
            out = self.value.value()
            return out if isinstance(out, dict) else None
        return None


@dataclass(frozen=True)
class SpecConfig:
    """vLLM's `speculative-config`, as a table (its keys as vLLM names them, with underscores)."""
    key: str                           # the profile key: "server.args.speculative-config"
    method: Optional[str]              # as written (None when missing or not text)
    model: Optional[str]               # the drafter: a path or a hub id
    num_speculative_tokens: Any        # as written (3, "3", 3.0): `tokens` is what vLLM reads
    table: JsonTable                   # the whole table

    @property
    def tokens(self):
        """num_speculative_tokens as vLLM reads it, or None when unset or not a whole number."""
        return lax_int(self.num_speculative_tokens)

    def key_of(self, name):
        """The profile key of one entry: `server.args.speculative-config.model`."""
        return f"{self.key}.{name}"


def lax_int(value):
    """An int as pydantic's lax mode reads one (vLLM's config classes are pydantic dataclasses:
    `num_speculative_tokens: int` takes 3, "3", " 3 ", "+3", 3.0, "3.0" and True, seen in vLLM
    0.32.0 with pydantic 2.14), else None."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str) and value.isascii():
        try:
            return int(value)
        except ValueError:
            try:
                number = float(value)
            except ValueError:
                return None
            return int(number) if number.is_integer() else None
    return None


def _is_model_key(name):
    return name == "model" or name.endswith("model_path") or name.endswith("model-path")


def _first_text(value):
    """A flag that takes one or more strings (served-model-name, api-key): the first."""
    if isinstance(value, tuple):
        value = value[0] if value else None
    return None if value is None else str(value)


@dataclass(frozen=True)
class ServerArgs:
    flags: Tuple[Tuple[str, Flag], ...]    # (normalised name, Flag), in file order

    @classmethod
    def parse(cls, pairs):
        """The (key as written, value) pairs of [server.args] -> ServerArgs."""
        by_flag: Dict[str, Optional[Flag]] = {}  # normalised flag -> Flag, in file order
        tables: Dict[str, Tuple[str, dict]] = {}  # flag given as dotted keys -> (its name as written, {key: value})
        for name, value in pairs:
            whole, dot, sub = flag_key(name).partition(".")
            if not dot:
                by_flag[whole] = Flag(name, value)
                continue
            if whole not in tables:
                tables[whole] = (name.partition(".")[0], {})
                by_flag.setdefault(whole, None)  # its place: where its first part is
            tables[whole][1][sub.replace("-", "_")] = value.value() if isinstance(value, JsonTable) else value
        for whole, (key, table) in tables.items():
            if by_flag[whole] is None:  # (a whole value as well is refused by profile/args.py)
                by_flag[whole] = Flag(key, JsonTable(json.dumps(table, separators=(",", ":"),
                                                                ensure_ascii=False)))
        return cls(tuple((k, f) for k, f in by_flag.items() if f is not None))  # none is left None

    def get(self, *names):
        """The Flag of the first of `names` that is set (any spelling), else None."""
        for n in names:
            norm = flag_key(n)
            for k, f in self.flags:
                if k == norm:
                    return f
        return None

    def has(self, *names):
        return self.get(*names) is not None

    def value(self, *names, default=None):
        f = self.get(*names)
        return default if f is None else f.value

    def key(self, *names):
        """`server.args.<key as written>` of the first of `names` that is set, else None."""
        f = self.get(*names)
        return None if f is None else f"server.args.{f.key}"

    @property
    def served_model_name(self):
        return _first_text(self.value("served-model-name"))

    @property
    def api_key(self):
        return _first_text(self.value("api-key"))

    @property
    def speculative(self):
        """vLLM's speculative-config as a SpecConfig, or None when not set (or not a table)."""
        f = self.get("speculative-config")
        table = f.table if f is not None else None
        if table is None:
            return None
        text = lambda k: table[k] if isinstance(table.get(k), str) else None  # noqa: E731
        return SpecConfig(key=f"server.args.{f.key}", method=text("method"), model=text("model"),
                          num_speculative_tokens=table.get("num_speculative_tokens"),
                          table=f.value)

    def model_values(self):
        """(profile key, value) of every model the args name, a path or a hub id alike."""
        out = []
        for norm, f in self.flags:
            key = f"server.args.{f.key}"
            if f.table is not None:
                out += [(f"{key}.{k}", v) for k, v in f.table.items()
                        if _is_model_key(k) and isinstance(v, str)]
            elif _is_model_key(norm) and isinstance(f.value, str):
                out.append((key, f.value))
        return out

    def model_paths(self):
        """(profile key, absolute path) of every model directory the args name: a `model`
        or `*-model-path` flag, or such a key inside a table (the speculative drafter)."""
        out = []
        for norm, f in self.flags:
            key = f"server.args.{f.key}"
            table = f.table
            if table is not None:
                for k, v in table.items():
                    if _is_model_key(k) and isinstance(v, str) and v.startswith("/"):
                        out.append((f"{key}.{k}", v))
            elif _is_model_key(norm) and isinstance(f.value, str) and f.value.startswith("/"):
                out.append((key, f.value))
        return out
