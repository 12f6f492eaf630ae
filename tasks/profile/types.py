"""The validated, immutable profile: what every other module consumes.

`tasks.profile.load_profile(path)` builds these; nothing else does.
Mappings are kept as tuples of (key, value) pairs in file order so the objects
stay hashable and immutable; `dict(pairs)` gives a plain dict when needed.
"""
from ..record import Record
from .checktable import CheckCfg
from pathlib import Path
from typing import Optional, Tuple, Union

ENGINES = ("vllm", "sglang", "command")


class Secret(Record, hidden=("value",)):
    """An env value read from the operator's environment (`{ from_env = "NAME" }`)."""

    source: str                      # the local environment variable it came from
    value: str                       # never printed (hidden), never on argv

    def __str__(self):
        return f"<secret from ${self.source}>"


# An arg value: str | int | float | bool | tuple of scalars | JSON table (as a plain
# nested structure of dict/list/scalars, deep-frozen into tuples of pairs is NOT
# used for tables: tables stay `FrozenJSON`, i.e. a JSON text string sorted as written).
ArgValue = Union[str, int, float, bool, Tuple[Union[str, int, float, bool], ...], "JsonTable"]


class JsonTable(Record):
    """A table-valued flag (e.g. speculative-config), rendered as ONE argv element of compact JSON.

    `text` is compact JSON (`separators=(",", ":")`, key order as written, ensure_ascii=False).
    """

    text: str

    def value(self):
        import json
        return json.loads(self.text)


class Target(Record):
    hosts: Tuple[str, ...]           # () means: this machine, no SSH (same as ("local",))
    name: str                        # deployment name: [A-Za-z0-9._-], not "." / ".."
    workdir: str                     # on the host; "~" allowed at the start
    keep_releases: int = 5
    rolling: Optional[int] = None    # deploy in batches of N hosts (tasks/rolling.py); None: all at once


class Server(Record):
    engine: str                                  # one of ENGINES
    python: Optional[str]                        # interpreter on the host; None -> "python3"
    model: Optional[str]
    host: str = "0.0.0.0"
    port: int = 8000
    command: Tuple[str, ...] = ()                # engine = "command": the whole argv
    args: Tuple[Tuple[str, ArgValue], ...] = ()  # flag name (no "--") -> value, in file order
    env: Tuple[Tuple[str, Union[str, Secret]], ...] = ()
    files: Tuple[str, ...] = ()                  # local paths (absolute, resolved) copied into the release dir

    @property
    def interpreter(self):
        return self.python or "python3"

    def arg(self, name, default=None):
        for k, v in self.args:
            if k == name:
                return v
        return default


class Ready(Record):
    timeout: float = 1800.0
    poll_interval: float = 1.0
    health_path: str = "/health"
    models_path: str = "/v1/models"              # "" skips the model check
    served_name: Optional[str] = None            # None -> derived, see Profile.served_name


class Gpu(Record):
    devices: Optional[Tuple[int, ...]] = None    # None -> CUDA_VISIBLE_DEVICES, else all
    min_free_mib: int = 0
    nvidia_smi: str = "nvidia-smi"               # path or name on the host


class Cluster(Record):
    backend: str                                 # "ray"
    workers: Tuple[str, ...]
    ray_port: int = 6379
    head_address: Optional[str] = None           # address workers use to reach the head; default: head's host name


RESTART_POLICIES = ("no", "on-failure", "always")


class Supervise(Record):
    """[supervise]: restarts by the launcher's reaper on the host (DESIGN.md "Supervision")."""
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


class Profile(Record):
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

    @property
    def served_name(self):
        if self.ready.served_name is not None:
            return self.ready.served_name
        name = self.server.arg("served-model-name")
        if isinstance(name, tuple):
            name = name[0] if name else None
        if name is not None:
            return str(name)
        if self.server.engine == "command":
            return None
        return self.server.model

    @property
    def secrets(self):
        return {k: v for k, v in self.server.env if isinstance(v, Secret)}

    def plain_env(self):
        return {k: v for k, v in self.server.env if not isinstance(v, Secret)}
