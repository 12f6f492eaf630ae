"""The validated, immutable profile: what every other module consumes.

`tasks.profile.load_profile(path)` builds these; nothing else does (tests build a few by hand).
They are frozen dataclasses: immutable, compared and hashed by their fields. Mappings are
kept as tuples of (key, value) pairs in file order so the objects stay hashable;
`dict(pairs)` gives a plain dict when needed. No `slots=True`: it needs Python 3.10 and
llmfab runs on 3.9 (setup.cfg), and there are only a handful of these objects per task.
"""
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Tuple, Union

from .checktable import CheckCfg
from .systemd_table import SystemdCfg
from ..base.host.layout import KEEP_RELEASES, NVIDIA_SMI, PYTHON
from .models import models_request
from .serverargs import JsonTable, ServerArgs
from .serverenv import ServerEnv

ENGINES = ("vllm", "sglang", "command")
# What runs the server on the host (docs/runtimes.md; tasks/runtime/ holds each one's code).
RUNTIMES = ("process", "systemd", "podman", "docker")


@dataclass(frozen=True, repr=False)
class Secret:
    """An env value read from the operator's environment (`{ from_env = "NAME" }`)."""

    source: str                      # the local environment variable it came from
    value: Optional[str]             # never printed (repr shows `value=...`), never on argv;
                                     # None when unset here and the task launches nothing
    missing: Optional[str] = None    # then: the exit-2 message a launching task gives

    def __repr__(self):
        return f"Secret(source={self.source!r}, value=...)"

    def __str__(self):
        return f"<secret from ${self.source}>"


# An arg value: str | int | float | bool | tuple of scalars | JsonTable (a table, kept as its
# compact JSON text in the order written: tasks/profile/serverargs.py).
ArgValue = Union[str, int, float, bool, Tuple[Union[str, int, float, bool], ...], JsonTable]


@dataclass(frozen=True)
class Target:
    hosts: Tuple[str, ...]           # () means: this machine, no SSH (same as ("local",))
    name: str                        # deployment name: [A-Za-z0-9._-], not "." / ".."
    workdir: str                     # on the host; "~" allowed at the start
    keep_releases: int = KEEP_RELEASES
    rolling: Optional[int] = None    # deploy in batches of N hosts (tasks/fleet/rolling.py); None: all at once


@dataclass(frozen=True)
class Server:
    engine: str                                  # one of ENGINES
    python: Optional[str]                        # interpreter on the host; None -> "python3"
    model: Optional[str]
    host: str = "0.0.0.0"
    port: int = 8000
    command: Tuple[str, ...] = ()                # engine = "command": the whole argv
    args: Tuple[Tuple[str, ArgValue], ...] = ()  # flag name (no "--") -> value, in file order
    env: Tuple[Tuple[str, Union[str, Secret]], ...] = ()
    files: Tuple[str, ...] = ()                  # local paths (absolute, resolved) copied into the release dir
    runtime: str = "process"                     # one of RUNTIMES
    # `args` read once, when the Server is made: what every reader of [server.args] asks
    flags: ServerArgs = field(init=False, repr=False, compare=False)
    # `env` read once: what every reader of [server.env] asks (tasks/profile/serverenv.py)
    environ: ServerEnv = field(init=False, repr=False, compare=False)
    # the models it names, read from both once: the preflight's `models` section, where the
    # doctor's request starts (tasks/profile/models.py); None: nothing to read. Never changed.
    models: Optional[dict] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "flags", ServerArgs.parse(self.args))
        object.__setattr__(self, "environ", ServerEnv(self.env))
        object.__setattr__(self, "models", models_request(self))

    @property
    def interpreter(self):
        return self.python or PYTHON


@dataclass(frozen=True)
class Ready:
    timeout: float = 1800.0
    poll_interval: float = 1.0
    health_path: str = "/health"
    models_path: str = "/v1/models"              # "" skips the model check
    served_name: Optional[str] = None            # None -> derived, see Profile.served_name


@dataclass(frozen=True)
class Gpu:
    devices: Optional[Tuple[int, ...]] = None    # None -> CUDA_VISIBLE_DEVICES, else all: Profile.devices
    min_free_mib: int = 0
    nvidia_smi: str = NVIDIA_SMI                 # path or name on the host


@dataclass(frozen=True)
class Cluster:
    backend: str                                 # "ray"
    workers: Tuple[str, ...]
    ray_port: int = 6379
    head_address: Optional[str] = None           # address workers use to reach the head; default: head's host name


RESTART_POLICIES = ("no", "on-failure", "always")


@dataclass(frozen=True)
class Supervise:
    """[supervise]: restarts by the launcher's reaper on the host (docs/supervision.md)."""
    restart: str = "no"                          # one of RESTART_POLICIES
    max_restarts: int = 5                        # within `window` s; one more gives up
    window: float = 600.0
    backoff: float = 5.0                         # before the first restart; doubles up to backoff_max
    backoff_max: float = 300.0
    hang_timeout: float = 0.0                    # 0 = off
    memory_timeout: float = 120.0                # GPU memory back to the baseline before a restart

    @property
    def on(self):
        return self.restart != "no"


@dataclass(frozen=True)
class Profile:
    path: Path                                   # the file given by the user (resolved)
    target: Target
    server: Server
    ready: Ready
    gpu: Gpu
    cluster: Optional[Cluster]
    resolved_toml: str                           # merged profile as TOML, secrets redacted; saved in each release
    digest: str                                  # sha256 of resolved_toml (first 12 hex digits shown)
    sources: Tuple[Path, ...] = ()               # the files read: the given one first, then each it extends
    check: CheckCfg = CheckCfg()                 # [check] accept = [doctor rule ids]
    supervise: Supervise = Supervise()
    weights: tuple = ()                          # [weights]: WeightSource per model path (fab pull)
    systemd: SystemdCfg = SystemdCfg()           # [systemd] (runtime = "systemd")
    container: Optional[object] = None           # [container] (tasks/profile/container_table.py) for podman/docker

    @property
    def served_name(self):
        """The name /v1/models lists: [ready] served_name, else --served-model-name (either
        spelling; the first of several), else the model (vLLM's and SGLang's default)."""
        if self.ready.served_name is not None:
            return self.ready.served_name
        name = self.server.flags.served_model_name
        if name is not None or self.server.engine == "command":
            return name
        return self.server.model

    @property
    def api_key(self):
        """The bearer token the server demands on /v1/*, if any: --api-key (either spelling;
        the first of several), else the VLLM_API_KEY environment variable."""
        key = self.server.flags.api_key
        if key is not None:
            return key
        return self.server.environ.get("VLLM_API_KEY")

    # The GPUs a deployment uses, one reading for every reader: [gpu] devices (nvidia-smi's
    # indexes, in the order the server numbers them) when set, else [server.env]
    # CUDA_VISIBLE_DEVICES; neither: every GPU of the host.
    @property
    def devices(self):
        """nvidia-smi indexes as a list, or None: every GPU, or ids (UUIDs, MIG names) that
        cannot be mapped to indexes here."""
        if self.gpu.devices is not None:
            return list(self.gpu.devices)
        visible = self.server.environ.visible_devices
        if visible is not None and all(d.isdigit() for d in visible):
            return [int(d) for d in visible]
        return None

    @property
    def gpu_count(self):
        """How many GPUs the server sees, or None when that is every GPU of the host."""
        if self.gpu.devices is not None:
            return len(self.gpu.devices)
        visible = self.server.environ.visible_devices
        return None if visible is None else len(visible)

    def host_gpu(self, n):
        """The nvidia-smi index of the server's `cuda:n`."""
        devices = self.devices
        return devices[n] if devices is not None and n < len(devices) else n

    @property
    def secrets(self):
        return {k: v for k, v in self.server.env if isinstance(v, Secret)}

    def missing_secrets(self):
        """The messages of secrets whose variable is not set here (only a profile loaded for a
        task that launches nothing has any: tasks/profile/load.py)."""
        return [v.missing for v in self.secrets.values() if v.missing]

    def plain_env(self):
        return {k: v for k, v in self.server.env if not isinstance(v, Secret)}
