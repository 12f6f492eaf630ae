"""Render `launch.py`: the self-contained, readable launcher pushed into each release.

The launcher is the only thing that starts a server. It holds the argv as a Python
list literal and the plain environment as a dict literal; secrets are read from
`secrets.json` (0600) beside it, so they are never on argv, in this file or in `ps`.
It runs with the profile's interpreter (stdlib only, Python >= 3.9), forks a small
reaper that becomes a session leader (so the server gets its own process group and
never receives the SSH session's SIGHUP), starts the server with stdin from
/dev/null and stdout+stderr appended to `server.log`, writes `server.json`, and
returns at once. The reaper stays to record how the server ended in `exit.json`.
With [supervise] on, the reaper runs the supervisor instead (tasks/supervise/host/supervisor.py,
shipped beside launch.py with the host modules it uses, see supervisor_files), which
restarts the server per the profile; the rest of launch.py is the same. launch.py and so the
supervisor run isolated (`python -I -S`, LAUNCHER_FLAGS in tasks/release/host/launch.py): the server's or the host's PYTHONPATH,
PYTHONHOME, site .pth files and the release's own files never change what they import.
"""
import json

from ..steps.argv import DEFAULT_ENTRY, server_argv
from ..base.host.stopping import DEFAULT_GRACE_S
from ..transport.agent_code import HOST_PACKAGE, host_files
from ..profile.types import Profile

TEMPLATE = '''\
#!/usr/bin/env python3
"""llmfab launcher: deployment {name}, profile {profile_name} (sha256 {digest}).

Rerun by hand from anywhere:  <python> {{this file}}
It starts the server detached (own session and process group), appends its output
to server.log beside this file, records ../../server.json, and returns at once.
Standard library only; Python >= 3.9.
"""
import sys

# This launcher and its reaper (the supervisor) run isolated: `-I` (no PYTHONPATH, PYTHONHOME
# or other PYTHON* variable, no user site, not this directory on sys.path) and `-S` (no site
# start-up, no .pth code). Nothing the host's environment points Python at, and none of the
# profile's [server] files beside this file, can stand in for the standard library used here.
# The server gets the environment as it is (plus ENV below). Run otherwise (by hand), the
# interpreter restarts itself so.
if __name__ == "__main__" and not (sys.flags.isolated and sys.flags.no_site) and sys.executable:
    import posix  # built in: never found on a path
    posix.execv(sys.executable, [sys.executable, "-I", "-S", __file__] + sys.argv[1:])

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time

# The server's argv, exactly as the server receives it. No shell is involved.
ARGV = {argv}

# Added to the host's environment. Secrets live in secrets.json (mode 0600) beside
# this file and are merged in at launch; their values never appear here.
ENV = {env}
SECRET_NAMES = {secret_names}

# The engine's cache directory (compiled graphs), relative to the deployment directory:
# one per engine version, shared by every release and restart of this deployment, so a
# redeploy starts warm. Empty when the profile sets it itself or the engine has none.
CACHE_ENV = {cache_env}

PORT = {port}

# Which deployment this is, for the cgroup its processes run in: llmfab/<KEY>/<release>.
NAME = {name_literal}


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())


def _write_json(path, data):
    # A fresh name nobody could have planted (never through a link), then one rename.
    tmp = "%s.%d.%s.tmp" % (path, os.getpid(), os.urandom(4).hex())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
        f.write("\\n")
    os.replace(tmp, path)


def _open_log(here):
    # Appended to, never through a link planted at its name.
    return os.open(os.path.join(here, "server.log"),
                   os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)


def _environment(here):
    env = dict(os.environ)
    env.update(ENV)
    # Inherited by every child, even one that leaves the process group: `fab stop`
    # finds this deployment's stragglers by it.
    env["LLMFAB_RELEASE"] = here
    deployment = os.path.dirname(os.path.dirname(here))
    for name, rel in CACHE_ENV.items():
        env[name] = os.path.join(deployment, rel)
        os.makedirs(env[name], exist_ok=True)
    if SECRET_NAMES:
        with open(os.path.join(here, "secrets.json")) as f:
            secrets = json.load(f)
        env.update({{k: secrets[k] for k in SECRET_NAMES}})
    return env


def _start_ticks():
    with open("/proc/self/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19])


def _key(deployment):
    """`<NAME>-<8 hex>`: the hex hashes the deployment directory's path and inode, so two hosts
    sharing /sys never share a cgroup (the same as tasks/base/host/identity.py deployment_key)."""
    st = os.stat(deployment)
    ident = "%s\\0%d\\0%d" % (deployment, st.st_dev, st.st_ino)
    digest = hashlib.sha256(ident.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return "%s-%s" % ((re.sub(r"[^A-Za-z0-9._-]+", "_", NAME).strip("._-") or "deployment")[:40], digest)


def _cgroup_mount():
    """The cgroup2 mount point, else a v1 hierarchy that only groups processes, or None."""
    v1 = None
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        parts, fs = left.split(), right.split()
        if len(parts) < 5 or len(fs) < 3:
            continue
        if fs[0] == "cgroup2":
            return parts[4].replace("\\\\040", " ")
        if fs[0] == "cgroup" and v1 is None and {{"name=systemd", "pids"}} & set(fs[2].split(",")):
            v1 = parts[4].replace("\\\\040", " ")
    return v1


def _identity(here):
    """Put this process (the reaper: the server and everything it starts follow) in a cgroup
    of the release's own, llmfab/<KEY>/<release>; where none can be made, the session it leads
    identifies them. identity.json says which (read by tasks/base/host/identity.py)."""
    record = {{"identity": "session", "cgroup": None, "sid": os.getsid(0), "sid_start": _start_ticks()}}
    mount = None if os.environ.get("LLMFAB_NO_CGROUP") or ENV.get("LLMFAB_NO_CGROUP") else _cgroup_mount()
    if mount:
        rel = "/llmfab/%s/%s" % (_key(os.path.dirname(os.path.dirname(here))), os.path.basename(here))
        try:
            os.makedirs(mount + rel, exist_ok=True)
            with open(mount + rel + "/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
            record.update(identity="cgroup", cgroup=rel)
        except OSError as e:
            record["cgroup_error"] = "%s: %s" % (mount + rel, e.strerror)
    _write_json(os.path.join(here, "identity.json"), record)


{reaper}
def main():
    here = os.path.dirname(os.path.abspath(__file__))
    env = _environment(here)
    read_fd, write_fd = os.pipe()
    reaper = os.fork()
    if reaper == 0:
        os.close(read_fd)
        _reaper(here, env, write_fd)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as r:
        report = json.loads(r.read() or b'{{"error": "launcher child died"}}')
    if "error" in report:
        print(json.dumps(report))
        return 1
    identity = {{}}
    try:
        with open(os.path.join(here, "identity.json")) as f:
            identity = json.load(f)
    except (OSError, ValueError):
        pass
    record = {{
        "pid": report["pid"],
        "pgid": reaper,
        "started_at": _now(),
        "release": os.path.basename(here),
        "port": PORT,
        "name": NAME,
        "identity": identity.get("identity"),
        "cgroup": identity.get("cgroup"),
    }}
    _write_json(os.path.join(os.path.dirname(os.path.dirname(here)), "server.json"), record)
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


# launch.py's reaper: one of these two is its {reaper} (the plain one, or [supervise]'s).
PLAIN_REAPER = '''\
def _reaper(here, env, report_fd):
    """Child: lead a new session, start the server in it, record how it ended."""
    os.setsid()
    _identity(here)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    # A handler (not SIG_IGN, which exec would inherit): the reaper outlives a
    # SIGTERM of the group so it can record the server's exit status.
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGHUP, lambda *_: None)
    try:
        log_fd = _open_log(here)
    except OSError as e:
        os.write(report_fd, json.dumps({{"error": "cannot write %s: %s" % (
            os.path.join(here, "server.log"), e.strerror)}}).encode())
        os._exit(1)
    try:
        with os.fdopen(log_fd, "ab") as log:
            proc = subprocess.Popen(
                ARGV, cwd=here, env=env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, close_fds=True,
            )
    except OSError as e:  # exec failed (EACCES, ENOENT, E2BIG, ...): llmfab records why
        os.write(report_fd, json.dumps({{"error": "cannot start %s: %s" % (ARGV[0], e.strerror),
                                         "errno": e.errno, "argv0": ARGV[0]}}).encode())
        os._exit(1)
    os.write(report_fd, json.dumps({{"pid": proc.pid}}).encode())
    os.close(report_fd)
    while True:
        try:
            status = proc.wait()
            break
        except InterruptedError:
            continue
    _write_json(os.path.join(here, "exit.json"), {{"returncode": status, "ended_at": _now()}})
    os._exit(0)

'''


SUPERVISED_REAPER = '''\
# The profile's [supervise]: restart policy, backoff, crash-loop limit, hang detection,
# carried out by llmfab_host/supervise/host/supervisor.py beside this file (standard library
# only, like this file).
SUPERVISE = {supervise}


def _reaper(here, env, report_fd):
    """Child: lead a new session; the supervisor starts the server and restarts it per SUPERVISE,
    records every attempt in restarts.jsonl and how the last one ended in exit.json."""
    os.setsid()
    _identity(here)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os._exit(_supervisor(here).run(here, ARGV, env, SUPERVISE, report_fd))


def _supervisor(here):
    """llmfab_host/supervise/host/supervisor.py beside this file, its package imported by path:
    this directory, which also holds the profile's [server] files, never goes on sys.path."""
    import importlib.util
    package = os.path.join(here, "llmfab_host")
    spec = importlib.util.spec_from_file_location(
        "llmfab_host", os.path.join(package, "__init__.py"), submodule_search_locations=[package])
    sys.modules["llmfab_host"] = module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import llmfab_host.supervise.host.supervisor as supervisor
    return supervisor
'''
# A supervised release carries the supervisor as the host agent's own package: llmfab_host/,
# exactly the files the agent runs (tasks/transport/agent_code.py host_files, the one way code
# travels; the reaper above imports it by path), and the failure rules as data.
SUPERVISOR_PACKAGE = HOST_PACKAGE
SUPERVISOR_FILES = ("supervise_rules.json", SUPERVISOR_PACKAGE)  # names in the release
SUPERVISING = ("running", "backoff", "waiting-for-gpu")  # supervisor states that may still launch


def supervise_config(profile: Profile):
    """The SUPERVISE dict of launch.py: [supervise] plus where the hang probes look."""
    from ..steps.host.probe import probe_host
    s, srv = profile.supervise, profile.server
    host = probe_host(srv.host)
    return {"restart": s.restart, "max_restarts": s.max_restarts, "window": s.window,
            "backoff": s.backoff, "backoff_max": s.backoff_max, "hang_timeout": s.hang_timeout,
            "memory_timeout": s.memory_timeout,
            "grace": DEFAULT_GRACE_S,  # what is left of a crashed attempt: fab stop's default grace
            "port": srv.port,
            "probe_host": host, "health_path": profile.ready.health_path,
            "metrics_path": None if srv.engine == "command" else "/metrics"}


def supervisor_rules():
    """supervise_rules.json: the failure-rule table (tasks/failures/rules/) as data the supervisor
    matches on the host, so restarts.jsonl and the restart marker name the rule."""
    from ..failures.rules import RULES
    table = [{"id": r.id, "priority": r.priority, "wrapper": r.wrapper,
              "patterns": [{"regex": p.regex, "after": p.after} for p in r.patterns]}
             for r in RULES if r.patterns]
    return (json.dumps(table, indent=0) + "\n").encode()


def supervisor_files(profile: Profile):
    """[(name, bytes, mode)] of the supervisor, for the release directory; [] when off."""
    from ..runtime import CONTAINER_RUNTIMES
    if not profile.supervise.on or profile.server.runtime in CONTAINER_RUNTIMES:
        return []  # a container's restarts are its engine's (tasks/runtime/container.py)
    modules = [(f"{SUPERVISOR_PACKAGE}/{name}", data, 0o600) for name, data in host_files()]
    return [("supervise_rules.json", supervisor_rules(), 0o600)] + modules


def _reaper(profile):
    """launch.py's reaper: the supervised one when [supervise] is on, else the plain one."""
    if profile.supervise.on:
        return SUPERVISED_REAPER.format(supervise=_literal(supervise_config(profile))) + "\n"
    return PLAIN_REAPER.format()


def _literal(value):
    """A list or dict as a Python literal, one item per line (readable and diffable)."""
    if not value:
        return repr(value)
    if isinstance(value, dict):
        body = "".join(f"    {k!r}: {v!r},\n" for k, v in value.items())
        return "{\n" + body + "}"
    return "[\n" + "".join(f"    {v!r},\n" for v in value) + "]"


def _in_docstring(text):
    """`text` made safe inside the launcher's docstring. A profile file named with three
    double quotes followed by Python code must not end the docstring and run on the host:
    JSON escapes quotes, backslashes, control and non-ASCII characters; plain names stay as written."""
    return json.dumps(text)[1:-1]


def render_launcher(profile: Profile, entry=DEFAULT_ENTRY, engine_version=None) -> str:
    """The text of launch.py for this profile (`entry`: tasks/steps/argv.py) and the engine version
    the host has (None: not known here, e.g. a dry run; it names the engine's cache directory,
    tasks/startup/estimate.py). Deterministic: golden-tested."""
    from ..startup.estimate import cache_env
    from ..weights.sources import offline_env
    return TEMPLATE.format(
        cache_env=_literal(cache_env(profile, engine_version)),
        name="'%s'" % _in_docstring(profile.target.name),
        name_literal=repr(profile.target.name),
        profile_name=_in_docstring(profile.path.name),
        digest=profile.digest[:12],
        argv=_literal(server_argv(profile, entry)),
        env=_literal(dict(profile.plain_env(), **offline_env(profile))),
        secret_names=_literal(sorted(profile.secrets)),
        port=profile.server.port,
        reaper=_reaper(profile),
    )


def render_secrets(profile: Profile) -> bytes:
    """secrets.json contents (written 0600), or b"" when the profile has none."""
    secrets = {k: v.value for k, v in profile.secrets.items()}
    return (json.dumps(secrets) + "\n").encode() if secrets else b""


def render_argv_json(profile: Profile, entry=DEFAULT_ENTRY) -> bytes:
    return (json.dumps(server_argv(profile, entry), ensure_ascii=False, indent=1) + "\n").encode("utf-8", "surrogateescape")
