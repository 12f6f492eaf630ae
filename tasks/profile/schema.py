"""The profile schema: the keys of each table, their types, defaults and limits.

`build(ck, data, default_name)` turns the merged TOML tree into the frozen model
objects (see tasks/profile/types.py) or raises ProfileError naming file, key and expectation.
"""
import os
import re

from .types import ENGINES, RESTART_POLICIES, Cluster, Gpu, Ready, Server, Supervise, Target
from .args import flag_key, read_args, read_env
from .check import REQUIRED, no_nul_or_dates

TOP_KEYS = ("extends", "target", "server", "ready", "gpu", "cluster")
TOP_KEYS += ("check",)  # [check] accept: tasks/profile/checktable.py
TOP_KEYS += ("supervise",)  # [supervise]: supervise() below
TARGET_KEYS = ("hosts", "name", "workdir", "keep_releases", "rolling")
SERVER_KEYS = ("engine", "python", "model", "host", "port", "command", "files", "args", "env")
READY_KEYS = ("timeout", "poll_interval", "health_path", "models_path", "served_name")
GPU_KEYS = ("devices", "min_free_mib", "nvidia_smi")
CLUSTER_KEYS = ("backend", "workers", "ray_port", "head_address")
SUPERVISE_KEYS = ("restart", "max_restarts", "window", "backoff", "backoff_max", "hang_timeout",
                  "memory_timeout")

NAME_RULE = ("a deployment name: letters, digits, '.', '_' or '-', starting with a letter or "
             "digit, no '..', at most 100 characters")
# Host strings go to SSH config lookups, never a shell; still, whitespace or a leading "-" is
# never a real host and would read as an ssh option if anyone ever did shell out.
HOST_PATTERN = r"[^\s\x00-\x1f\x7f-][^\s\x00-\x1f\x7f]*"
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Names the release directory already uses for its own files.
RESERVED_FILES = frozenset({"launch.py", "argv.json", "profile.toml", "server.log", "secrets.json",
                            "supervise.py", "supervise_rules.json", "llmfab_host"})


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
    keep = ck.get(t, p, "keep_releases", lambda c, v, q: c.integer(v, q, lo=2), 5)
    # deploy in batches of this many hosts (tasks/rolling.py); None: all at once
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
    if engine != "command":
        # Readiness polls server.port; a different --port in args would wait on the wrong port.
        for name, value in args:
            if flag_key(name) == "port" and value != port:
                ck.fail(p + ("args", name), f"the same port as server.port ({port}); "
                                            "set the port in [server] instead", value)
    return Server(engine=engine, python=python, model=model, host=host, port=port,
                  command=command, args=args, env=env, files=files)


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
    out, seen = [], {}
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
               nvidia_smi=ck.get(g, p, "nvidia_smi", lambda c, v, q: c.string(v, q), "nvidia-smi"))


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
