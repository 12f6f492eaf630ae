"""What runs a deployment's server on the host: the runtimes, in one table.

`[server] runtime` names a row of RUNTIMES. "process" is llmfab's own launcher (launch.py's
reaper, and its supervisor with [supervise]); "systemd" a unit of the host's systemd;
"podman" and "docker" a container of that engine, one code path with the engine's binary as
a parameter (tasks/runtime/container.py here, tasks/runtime/host/container.py on the host).
Each row names its client module (None: the launcher does it all) and what it needs on
the host, so docs and the preflight say the same.
"""
from collections import namedtuple

Runtime = namedtuple("Runtime", "name module engine summary")

RUNTIMES = {
    "process": Runtime("process", None, None,
                       "llmfab's launcher: a detached process group, restarted by its own "
                       "supervisor ([supervise])"),
    "systemd": Runtime("systemd", "runtime.systemd", "systemctl",
                       "a unit of the host's systemd (systemd as PID 1)"),
    "podman": Runtime("podman", "runtime.container", "podman",
                      "a container of podman (rootful), `[container] image`"),
    "docker": Runtime("docker", "runtime.container", "docker",
                      "a container of docker, `[container] image`"),
}
DEFAULT_RUNTIME = "process"
CONTAINER_RUNTIMES = tuple(n for n, r in RUNTIMES.items() if r.module == "runtime.container")


def host_python(profile):
    """The interpreter on the host that runs llmfab's agent and launch.py. A container's
    server.python is the one inside its image, so the host's own python3 does that work."""
    if profile.server.runtime in CONTAINER_RUNTIMES:
        return "python3"
    return profile.server.interpreter
