"""Containers (podman, docker), client half: what the release's container is made of.

`container_spec(profile)` is the release's runtime.json, read on the host
by tasks/runtime/host/container.py: the engine's binary (the only difference
between podman and docker), the container's name, image, GPUs, mounts and the restart policy
mapped from [supervise]; the release carries it as runtime.json (tasks/runtime/host/runtimes.py
for_release reads it there, so `fab rollback` starts an old release as it was deployed). What is
mounted, always at the same path as on the host: the
deployment directory (releases, server.log, the engine's compile cache kept across releases),
every absolute model path the profile names (read-only: server.model, a drafter, a pulled
model), the Hugging Face cache [server.env] HF_HOME or HF_HUB_CACHE names, then [container]
mounts. Its secrets travel as today (secrets.json, 0600) into a 0600 env file the engine reads.
"""
from ..profile.types import Profile
from ..base.host.stopping import DEFAULT_GRACE_S
from . import runtime_json
from .host.container import RESTART_POLICY, container_name

DEFAULT_GPUS = {"podman": "cdi", "docker": "gpus"}
CACHE_VARS = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")


def container_spec(profile: Profile):
    from ..steps.preflight import model_paths
    s, c, sup = profile.server, profile.container, profile.supervise
    engine = s.runtime  # the engine's binary: podman or docker
    mounts, seen = [], set()

    def mount(src, dst, ro):
        if dst not in seen:
            seen.add(dst)
            mounts.append([src, dst, ro])
    for _, path in model_paths(profile):
        mount(path, path, True)
    env = dict(profile.plain_env())
    for name in CACHE_VARS:
        if str(env.get(name, "")).startswith("/"):
            mount(env[name], env[name], False)
    for src, dst, ro in c.mounts:
        mount(src, dst, ro)
    return {"runtime": engine, "engine": engine, "name": container_name(profile.target.name), "image": c.image,
            "gpus": c.gpus or DEFAULT_GPUS[engine], "devices": profile.devices, "mounts": mounts,
            "engine_args": list(c.engine_args),
            "restart": RESTART_POLICY[sup.restart].format(max_restarts=sup.max_restarts),
            "grace": DEFAULT_GRACE_S, "port": s.port, "hang": hang_spec(profile)}


def hang_spec(profile: Profile):
    """With [supervise] hang_timeout (and a restart policy): what the hang watch beside the
    container probes (the supervisor's HangWatch); None without."""
    from ..release.launcher import supervise_config
    if not (profile.supervise.on and profile.supervise.hang_timeout):
        return None
    cfg = supervise_config(profile)
    return {k: cfg[k] for k in ("hang_timeout", "port", "probe_host", "health_path", "metrics_path")}


def release_files(profile: Profile):
    """[(name, bytes, mode)] a container release carries: runtime.json (the container's spec),
    and llmfab_host where its hang watch runs beside the container."""
    files = [("runtime.json", runtime_json(container_spec(profile)), 0o600)]
    if hang_spec(profile):
        from ..release.launcher import SUPERVISOR_PACKAGE
        from ..transport.agent_code import host_files
        files += [(f"{SUPERVISOR_PACKAGE}/{name}", data, 0o600) for name, data in host_files()]
    return files


def preflight(profile: Profile):
    """The host check's runtime_spec: the engine, image and GPUs the container needs."""
    return container_spec(profile)
