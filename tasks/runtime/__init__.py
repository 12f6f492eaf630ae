"""What runs the server on the host: `[server] runtime` (docs/runtimes.md).

One table, name -> RuntimeInfo(client module, host module, summary), read lazily like pip's
command table: a reader (or grep) sees every runtime here. "process" is llmfab's own
launcher (tasks/release/launcher.py) and needs no module; the others hand the release to the
host's service manager or container engine.

The two halves of a runtime:
- client (tasks/runtime/<name>.py): `release_files(profile)` -> [(name, bytes, mode)] added to
  the release directory (at least runtime.json: what the host half needs to start that
  release, so `fab rollback` starts an old release exactly as it was deployed), and
  `preflight(profile)` -> the request fields its host check needs.
- host (tasks/runtime/host/<module>.py, standard library only, shipped in llmfab_host):
  check, launch, stop, state, pids (their contract: tasks/runtime/host/runtimes.py).
"""
import importlib
import json
from collections import namedtuple

from ..base.host.layout import PYTHON

RuntimeInfo = namedtuple("RuntimeInfo", "client host summary")

RUNTIMES = {
    "process": RuntimeInfo(None, None, "llmfab's launcher: a detached process group, restarts by "
                                       "llmfab's supervisor ([supervise])"),
    "systemd": RuntimeInfo("runtime.systemd", "runtime.host.systemd_unit",
                           "one systemd unit per deployment: Restart= from [supervise], enabled at "
                           "boot with [systemd] enable"),
    "podman": RuntimeInfo("runtime.container", "runtime.host.container",
                          "a podman container from [container] image"),
    "docker": RuntimeInfo("runtime.container", "runtime.host.container",
                          "a docker container from [container] image"),
}
RUNTIME_FILE = "runtime.json"  # in each release of a runtime other than "process"
DEFAULT_RUNTIME = "process"
CONTAINER_RUNTIMES = tuple(n for n, r in RUNTIMES.items() if r.client == "runtime.container")


def host_python(profile):
    """The interpreter on the host that runs llmfab's agent and launch.py. A container's
    server.python is the one inside its image, so the host's own python3 does that work."""
    if profile.server.runtime in CONTAINER_RUNTIMES:
        return PYTHON
    return profile.server.interpreter


def client(name):
    """The client module of runtime `name`, or None for "process"."""
    info = RUNTIMES[name]
    return importlib.import_module(f"{__package__.rsplit('.', 1)[0]}.{info.client}") if info.client else None


def release_files(profile):
    """[(name, bytes, mode)] the profile's runtime adds to a release ([] for "process")."""
    module = client(profile.server.runtime)
    return module.release_files(profile) if module else []


def preflight_fields(profile):
    """The preflight request's runtime and runtime_spec (the host half's check reads them)."""
    module = client(profile.server.runtime)
    return {"runtime": profile.server.runtime, "runtime_spec": module.preflight(profile) if module else {}}


def runtime_json(record):
    """runtime.json's bytes: {"runtime": name, ...} as the host half reads it."""
    return (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()


def status_fields(state):
    """`fab status --json` fields from the agent's state answer: runtime, and the unit's
    (systemd) or the container's (podman, docker) own state; None where it has none."""
    return {"runtime": state.get("runtime") or "process", "unit": state.get("unit"),
            "container": state.get("container")}


def status_lines(record):
    """The human line naming what runs the server, or [] for "process"."""
    unit, box = record.get("unit"), record.get("container")
    if unit:
        restarts = unit.get("NRestarts") or 0
        return [f"runtime systemd: unit {unit['name']} {unit.get('ActiveState')} ({unit.get('SubState')}), "
                f"{restarts} restart{'s' if restarts != 1 else ''} by systemd, "
                f"{'enabled at boot' if unit.get('UnitFileState') == 'enabled' else 'not enabled at boot'}"]
    if box:
        code = box.get("exit_code")
        return [f"runtime {record['runtime']}: container {box.get('name')} {box.get('status')}"
                + (f", exit code {code}" if code not in (None, 0) or box.get("status") == "exited" else "")
                + (f", restarts {box['restarts']} by {record['runtime']}" if box.get("restarts") else "")]
    return []


def restarting(record):
    """True when the runtime has the server down between restarts (systemd's auto-restart)."""
    unit = record.get("unit") or {}
    return unit.get("SubState") in ("auto-restart", "start-pre") and unit.get("ActiveState") in ("activating",)
