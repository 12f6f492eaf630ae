"""llmfab installed into a throwaway virtualenv, and a user's directory to run it from: for
tests/lab/test_installed_program.py and tests/lab/test_program_e2e.py."""
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
import pytest
from hostlab import REPO


USER_TASKS = 'from invoke import task\n\n\n@task\ndef hello(c):\n    """The user\'s own task."""\n'


COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache",
                                     ".hypothesis")


def _venv(root):
    """A fresh virtualenv whose site-packages also sees this interpreter's (for fabric & co)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
    # Lines of a .pth are only appended to sys.path: .pth files in those directories (an
    # editable install of another checkout, say) are not run, so they cannot leak in.
    outer = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    Path(purelib, "_outer_site.pth").write_text("\n".join(sorted(outer)) + "\n")
    return python


@pytest.fixture(scope="module", params=["editable", "built"])
def installed(request, tmp_path_factory):
    """(venv python, bin directory, how) with llmfab installed from a copy of this checkout."""
    base = tmp_path_factory.mktemp(f"llmfab-{request.param}")
    src = base / "src"
    shutil.copytree(REPO, src, ignore=COPY_IGNORE)
    python = _venv(base / "venv")
    argv = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
            "--no-build-isolation", "--no-index"] + (["-e", str(src)] if request.param == "editable" else [str(src)])
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return python, python.parent, request.param


@pytest.fixture
def userdir(tmp_path):
    d = tmp_path / "my-profiles"
    d.mkdir()
    (d / "tasks.py").write_text(USER_TASKS)
    return d


def run(argv, cwd, env=None, timeout=180):
    full = dict(os.environ)
    full.pop("INVOKE_RUNTIME_CONFIG", None)
    full.update(env or {})
    return subprocess.run([str(a) for a in argv], cwd=str(cwd), env=full, capture_output=True, text=True,
                          timeout=timeout)


def ok(r):
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r
