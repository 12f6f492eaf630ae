"""Profile -> the server's argv, as a list of strings. Pure; no I/O.

vLLM is launched as `<python> -m vllm.entrypoints.cli.main serve MODEL ...`: the same
entry point as the `vllm` script, but tied to the profile's interpreter, so a user's
`ml-env` is used even when its `bin/` is not on the host's PATH.

Rules for `[server.args]` (in file order):
  table   -> `--flag` + ONE element of compact JSON
  true    -> `--flag`;  false -> `--no-flag`  (vLLM/SGLang BooleanOptionalAction)
  array   -> `--flag` + one element per item
  number  -> `--flag` + str(number);  string -> `--flag` + the string, verbatim
"""
from .profile.types import JsonTable, Profile

VLLM_MODULE = "vllm.entrypoints.cli.main"
SGLANG_MODULE = "sglang.launch_server"


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


def server_argv(profile: Profile):
    """The complete argv the launcher executes on the host."""
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
        head = [s.interpreter, "-m", VLLM_MODULE, "serve", s.model]
        if profile.cluster is not None and not args.has("distributed-executor-backend"):
            extra += ["--distributed-executor-backend", "ray"]
    elif s.engine == "sglang":
        head = [s.interpreter, "-m", SGLANG_MODULE, "--model-path", s.model]
    else:
        head = list(s.command)
    return head + render_args(s.args) + extra
