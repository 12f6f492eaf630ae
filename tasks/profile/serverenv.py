"""`[server.env]`, read once: the variables llmfab itself looks at, read as the engine reads them.

    env = profile.server.environ        # built with the Server (tasks/profile/types.py)
    env.get("VLLM_API_KEY")             # the text the server gets (a secret's value), or None
    env.v2_runner                       # True / False as vLLM reads VLLM_USE_V2_MODEL_RUNNER; None: unset
    env.visible_devices                 # CUDA_VISIBLE_DEVICES as ("2", "3"); None: unset (every GPU)

Every reader of these variables asks this object (the GPUs a deployment uses combine it with
[gpu] devices in Profile.devices); none looks into the raw pairs (`Server.env`) by name.
This module imports nothing from the package: tasks/profile/types.py builds on it.
"""
from dataclasses import dataclass
from typing import Optional, Tuple

# vLLM reads these with `bool(int(value))` (vllm/envs.py, 0.26 to 0.32: `maybe_convert_bool`
# from 0.29, a bare `int(os.getenv(...))` before): "1", "0", " 2 " are read, "true" or "yes" stop
# the server with ValueError. The loader refuses such a value (tasks/profile/schema.py).
VLLM_INT_FLAGS = ("VLLM_USE_V2_MODEL_RUNNER",)


def vllm_flag(text):
    """True / False as vLLM reads an integer flag variable; raises ValueError as vLLM does."""
    return bool(int(text))


@dataclass(frozen=True)
class ServerEnv:
    pairs: tuple    # (NAME, str | Secret) in file order: Server.env

    def get(self, name):
        """The value the server's environment holds for `name` (a secret's value), or None."""
        for k, v in self.pairs:
            if k == name:
                return getattr(v, "value", v)
        return None

    @property
    def v2_runner(self) -> Optional[bool]:
        """VLLM_USE_V2_MODEL_RUNNER as vLLM reads it; None when unset (the version's default)."""
        text = self.get("VLLM_USE_V2_MODEL_RUNNER")
        return None if text is None else vllm_flag(text)

    @property
    def visible_devices(self) -> Optional[Tuple[str, ...]]:
        """CUDA_VISIBLE_DEVICES as a tuple of device ids (indexes, or UUIDs / MIG names), in the
        order CUDA numbers them; None when unset. "" selects no GPU, as it does for CUDA."""
        text = self.get("CUDA_VISIBLE_DEVICES")
        if text is None:
            return None
        return tuple(t.strip() for t in text.split(",") if t.strip())
