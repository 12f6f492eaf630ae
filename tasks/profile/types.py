"""The validated, immutable profile: what every other module consumes.

`tasks.profile.load_profile(path)` builds these; nothing else does.
Mappings are kept as tuples of (key, value) pairs in file order so the objects
stay hashable and immutable; `dict(pairs)` gives a plain dict when needed.
"""
from dataclasses import dataclass, field

from .checktable import CheckCfg
from pathlib import Path
from typing import Optional, Tuple, Union

ENGINES = ("vllm", "sglang", "command")


@dataclass(frozen=True)
class Secret:
    """An env value read from the operator's environment (`{ from_env = "NAME" }`)."""

    source: str                      # the local environment variable it came from
    value: str = field(repr=False)   # never printed, never on argv

    def __str__(self):
        return f"<secret from ${self.source}>"


# An arg value: str | int | float | bool | tuple of scalars | JSON table (as a plain
# nested structure of dict/list/scalars, deep-frozen into tuples of pairs is NOT
# used for tables: tables stay `FrozenJSON`, i.e. a JSON text string sorted as written).
ArgValue = Union[str, int, float, bool, Tuple[Union[str, int, float, bool], ...], "JsonTable"]


@dataclass(frozen=True)
class JsonTable:
    """A table-valued flag (e.g. speculative-config), rendered as ONE argv element of compact JSON.

    `text` is compact JSON (`separators=(",", ":")`, key order as written, ensure_ascii=False).
    """

    text: str

    def value(self):
        import json
        return json.loads(self.text)


@dataclass(frozen=True)
class Target:
    hosts: Tuple[str, ...]           # () means: this machine, no SSH (same as ("local",))
    name: str                        # deployment name: [A-Za-z0-9._-], not "." / ".."
    workdir: str                     # on the host; "~" allowed at the start
    keep_releases: int = 5
    rolling: Optional[int] = None    # deploy in batches of N hosts (tasks/rolling.py); None: all at once


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

    @property
    def interpreter(self):
        return self.python or "python3"

    def arg(self, name, default=None):
        for k, v in self.args:
            if k == name:
                return v
        return default


@dataclass(frozen=True)
class Ready:
    timeout: float = 1800.0
    poll_interval: float = 1.0
    health_path: str = "/health"
    models_path: str = "/v1/models"              # "" skips the model check
    served_name: Optional[str] = None            # None -> derived, see Profile.served_name


@dataclass(frozen=True)
class Gpu:
    devices: Optional[Tuple[int, ...]] = None    # None -> CUDA_VISIBLE_DEVICES, else all
    min_free_mib: int = 0
    nvidia_smi: str = "nvidia-smi"               # path or name on the host


@dataclass(frozen=True)
class Cluster:
    backend: str                                 # "ray"
    workers: Tuple[str, ...]
    ray_port: int = 6379
    head_address: Optional[str] = None           # address workers use to reach the head; default: head's host name


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
