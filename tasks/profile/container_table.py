"""[container]: the image and mounts of a container runtime ([server] runtime = "podman" or
"docker"; tasks/runtime/container.py turns them into the engine's `run`)."""
import re
from dataclasses import dataclass
from typing import Optional, Tuple

from .keys import Key, table

CONTAINER_KEYS = table(
    "container",
    Key("image", "string", 'required for runtime = "podman" or "docker"',
        "the image the server runs in, as the engine names it (`vllm/vllm-openai:v0.26.0`, "
        "`localhost/my-vllm`); it must be on the host already (llmfab never pulls: "
        "`podman pull` / `docker pull` it there). server.python is the interpreter inside it"),
    Key("mounts", "array of strings", "[]",
        "more bind mounts, each \"SRC:DST\" or \"SRC:DST:ro\" (absolute paths; SRC on the host). "
        "Always mounted at the same path: the model and drafter directories (read-only), the "
        "deployment's engine cache, the release directory, and the Hugging Face cache if "
        "[server.env] HF_HOME names one"),
    Key("gpus", '"cdi", "gpus" or "none"', '"cdi" for podman, "gpus" for docker',
        "how [gpu] devices reach the container: CDI devices (`--device nvidia.com/gpu=N`, the "
        "NVIDIA Container Toolkit's spec under /etc/cdi), `--gpus device=N` (the toolkit's hook), "
        "or none (a CPU-only server)"),
    Key("engine_args", "array of strings", "[]",
        "extra options for the engine's `run`, before the image (e.g. [\"--shm-size=16g\"]); "
        "never a secret (they are on the host's argv), never -e/--env (use [server.env])"),
)
GPU_MODES = ("cdi", "gpus", "none")  # tasks/runtime/host/container.py GPU_FLAGS
MOUNT = re.compile(r"(/[^:\x00-\x1f]*):(/[^:\x00-\x1f]*)(:ro)?")
# Options that would put a value on the host's argv or undo what llmfab relies on.
REFUSED_ARGS = ("-e", "--env", "--env-file", "--name", "--restart", "--rm", "-d", "--detach",
                "--network", "--net", "--init", "--entrypoint")


@dataclass(frozen=True)
class Container:
    image: str
    mounts: Tuple[Tuple[str, str, bool], ...] = ()   # (src, dst, read-only)
    engine_args: Tuple[str, ...] = ()
    gpus: Optional[str] = None                       # None: the engine's default (GPU_MODES)


def read_container(ck, data, runtime) -> Optional[Container]:
    """[container] -> Container, or None for a runtime without one (where it is an error)."""
    from ..runtime import CONTAINER_RUNTIMES
    t, p = data.get("container"), ("container",)
    if runtime not in CONTAINER_RUNTIMES:
        if t is not None:
            ck.fail(p, 'no [container] table unless [server] runtime = "podman" or "docker"',
                    t)
        return None
    t = t or {}
    ck.table(t, p, CONTAINER_KEYS)
    image = ck.get(t, p, "image", lambda c, v, q: c.matches(
        v, q, r"[A-Za-z0-9][^\s\x00-\x1f]*", "an image name without spaces"), None)
    if image is None:
        ck.missing(p + ("image",), f'image = "..." in [container] for runtime = "{runtime}" '
                                   '(the image the server runs in, already on the host)')
    mounts = ck.get(t, p, "mounts", _mounts, ())
    extra = ck.get(t, p, "engine_args", _engine_args, ())
    gpus = ck.get(t, p, "gpus", lambda c, v, q: c.matches(v, q, "|".join(GPU_MODES),
                                                         " | ".join('"%s"' % m for m in GPU_MODES)), None)
    return Container(image=image, mounts=mounts, engine_args=extra, gpus=gpus)


def _mounts(ck, v, path):
    out = []
    for i, text in enumerate(ck.strings(v, path, nonempty=False)):
        m = MOUNT.fullmatch(text)
        if not m or ".." in text.split("/"):
            ck.fail(path + (i,), '"SRC:DST" or "SRC:DST:ro", both absolute paths without ".." '
                                 "or ':'", text)
        else:
            out.append((m.group(1), m.group(2), bool(m.group(3))))
    return tuple(out)


def _engine_args(ck, v, path):
    args = ck.strings(v, path, nonempty=False)
    for i, a in enumerate(args):
        if a.split("=", 1)[0] in REFUSED_ARGS:
            ck.fail(path + (i,), "an engine option llmfab does not set itself (not one of %s; "
                                 "secrets go in [server.env])" % ", ".join(REFUSED_ARGS), a)
    return tuple(args)
