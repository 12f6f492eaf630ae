"""Static checks that CI runs with the tests: ruff (pyproject.toml [tool.ruff]: errors and
pyflakes) over the whole checkout, and vermin over everything llmfab ships to a host (the
agent's tasks/hostside/, the bootstrap it starts with, and launch.py as rendered: the goldens),
which must run on Python 3.9 with the standard library alone (tests/lab/test_python39.py runs it
there)."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ["tasks/hostside", "tasks/transport/agent_bootstrap.py", "tests/golden"]


def test_ruff_finds_nothing():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_shipped_code_needs_no_python_newer_than_3_9():
    vermin = Path(sys.executable).with_name("vermin")  # no `python -m vermin`: its script
    r = subprocess.run([str(vermin), "--no-tips", "--violations", "-t=3.9-",
                        "--eval-annotations", *SHIPPED], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_shipped_code_imports_only_the_standard_library():
    stdlib = set(sys.stdlib_module_names)
    import ast
    for path in sorted((REPO / "tasks" / "hostside").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                assert name.split(".")[0] in stdlib, f"{path.name} imports {name}"
