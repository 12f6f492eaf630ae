"""Which host module runs a release, and the contract every one of them keeps.

A release of a runtime other than "process" carries runtime.json ({"runtime": name, ...},
written by the client half, tasks/runtime/); server.json then carries "runtime" and the
unit's or container's name. The launch, stop, state and process paths ask `for_release` /
`for_server` once and, for "process" (None), do what they always did.

Each module here offers (ddir: the deployment directory; server: server.json's record):
- check(runtime_spec) -> [finding]: the runtime is present and works (systemd is PID 1 and
  answers; the container engine answers, its version, GPU access); finding = the preflight's
  record {"check": "runtime", "status": "OK"|"WARN"|"FAIL", "message", "fix" (optional)};
  runtime_spec is the preflight request's (the client's preflight(profile)).
- launch(ddir, rpath, spec, python) -> the server record written to server.json (with
  "runtime", "pid", "pgid", "release", "port", "started_at" and "unit" or "container").
- stop(ddir, server, grace, by) -> procs.stop's answer (terminated, killed, survivors, seconds).
- state(ddir, server) -> {"alive": bool, "pid": main pid or None, "unit": {name, ActiveState,
  NRestarts, ...}} or {"alive", "pid", "container": {name, status, exit_code}}.
- pids(ddir, server) -> [host pids of this deployment] (systemd: the unit's cgroup).

Who is a deployment's, whatever runs it, is asked here: `members` (the marks of
base/host/identity.py and the runtime's own processes) and `server_alive`.
"""
import importlib
import json
import os

from ...base.host.identity import Table
from ...base.host.procfs import pid_alive
from ...base.host.statefiles import expand, read_json

HOST_MODULES = {  # runtime name -> module under the host package ("process": None)
    "systemd": "runtime.host.systemd_unit",
    "podman": "runtime.host.container",
    "docker": "runtime.host.container",
}
RUNTIME_FILE = "runtime.json"


def _module(name):
    path = HOST_MODULES.get(name or "process")
    if path is None:
        return None
    root = __name__.rsplit(".", 3)[0]  # llmfab_host here, tasks on the client
    return importlib.import_module("%s.%s" % (root, path))


def spec_of(rpath):
    """runtime.json of the release directory `rpath`, or None (a "process" release)."""
    try:
        with open(os.path.join(rpath, RUNTIME_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def for_release(rpath):
    """(module, spec) that launches the release at rpath; (None, None) for "process"."""
    spec = spec_of(rpath)
    module = _module(spec.get("runtime")) if spec else None
    return (module, spec) if module else (None, None)


def for_server(server):
    """The module that runs server.json's server, or None ("process", or no server)."""
    return _module((server or {}).get("runtime"))


def members(ddir, release=None, table=None):
    """{pid: release} of every live process of deployment `ddir` (of one release if given): the
    marks of base/host/identity.py (its cgroup, session or environment marker) and, under a
    systemd unit or a container, the processes its runtime names. `table`: a Table already read."""
    ddir = expand(ddir)
    server = read_json(os.path.join(ddir, "server.json")) or {}
    runtime = {}
    if server.get("runtime") not in (None, "process") and (release is None or server.get("release") == release):
        # a systemd unit's cgroup, a container's PID namespace: the runtime knows its processes
        module = for_server(server)
        try:
            runtime = {pid: server.get("release") for pid in (module.pids(ddir, server) if module else ())}
        except Exception:  # noqa: BLE001 - a runtime that cannot answer leaves the other marks
            pass
    return (table or Table()).members(ddir, release, runtime)


def server_alive(ddir, server):
    """Is server.json's process still this deployment's server? Alive, and one of its release's
    processes (cgroup, session, or the environment marker of an older release): after a
    reboot, or a long time, the kernel may have given its pid to another process, which
    `fab stop` rightly leaves alone and `fab status` must not call our server either. The one
    reader of "is it ours" for both."""
    if (server or {}).get("container"):  # a container runtime: its engine says, and restarts it
        return for_server(server).alive(ddir, server)
    pid = (server or {}).get("pid")
    if not pid or not pid_alive(pid) or not server.get("release"):
        return False
    return members(ddir, server["release"]).get(pid) == server["release"]
