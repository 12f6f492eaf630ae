"""runtime = "systemd", the client half: what a release carries for its unit.

The host half (tasks/runtime/host/systemd_unit.py) writes the unit from runtime.json and runs
the release through llmfab_host, which the release carries (the agent's own files, as a
supervised release does: tasks/release/launcher.py supervisor_files).
"""
from ..release.launcher import SUPERVISOR_PACKAGE
from .container import hang_spec
from ..base.host.stopping import DEFAULT_GRACE_S
from ..transport.agent_code import host_files
from . import runtime_json


def unit_name(profile):
    """The deployment's unit, as status shows it (the host half names it the same way)."""
    return f"llmfab-{profile.target.name}.service"


def spec(profile):
    """runtime.json: [supervise] mapped onto Restart=, RestartSec=, StartLimitBurst= and
    StartLimitIntervalSec=; with hang_timeout, `hang`: what the unit's hang watch probes (the
    supervisor's own watch, tasks/supervise/host/hangwatch.py), which kills a hung server for
    systemd to restart."""
    s = profile.supervise
    return {"runtime": "systemd", "unit": unit_name(profile), "enable": profile.systemd.enable,
            "restart": s.restart, "backoff": s.backoff if s.on else 0, "max_restarts": s.max_restarts,
            "window": s.window, "memory_timeout": s.memory_timeout, "grace": DEFAULT_GRACE_S,
            "hang": hang_spec(profile)}


def release_files(profile):
    files = [("runtime.json", runtime_json(spec(profile)), 0o600)]
    if not profile.supervise.on:  # else supervisor_files already brings llmfab_host
        files += [(f"{SUPERVISOR_PACKAGE}/{name}", data, 0o600) for name, data in host_files()]
    return files


def preflight(profile):
    """What the host's check needs (runtime_spec of the preflight request)."""
    return {"enable": profile.systemd.enable, "unit": unit_name(profile)}
