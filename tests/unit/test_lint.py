"""Static checks that CI runs with the tests: ruff (pyproject.toml [tool.ruff]: errors and
pyflakes) over the whole checkout, and vermin over everything llmfab ships to a host (the
agent's package: every `host/` package under tasks/, the bootstrap it starts with, and launch.py
as rendered: the goldens), which must run on Python 3.9 with the standard library alone
(tests/lab/test_python39.py runs it there); a shipped module imports only shipped modules."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(str(p.parent.relative_to(REPO)) for p in (REPO / "tasks").rglob("host/__init__.py")) \
    + ["tasks/transport/agent_bootstrap.py", "tests/golden"]


def test_ruff_finds_nothing():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_shipped_code_needs_no_python_newer_than_3_9():
    vermin = Path(sys.executable).with_name("vermin")  # no `python -m vermin`: its script
    r = subprocess.run([str(vermin), "--no-tips", "--violations", "-t=3.9-",
                        "--eval-annotations", *SHIPPED], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_shipped_code_imports_only_the_standard_library_and_itself():
    """On a host there is the standard library and llmfab_host/ (tasks/transport/agent_code.py
    host_files): an import of anything else, a client module of ours included, fails there."""
    import ast
    from tasks.transport.agent_code import host_files
    stdlib = set(sys.stdlib_module_names)
    shipped = {name[:-3].replace("/", ".").removesuffix(".__init__") for name, _ in host_files()}
    assert "transport.host.agent_main" in shipped and "doctor.host.spec_check" in shipped
    for name, data in host_files():
        package = name.split("/")[:-1]
        for node in ast.walk(ast.parse(data)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                targets = [node.module]
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
                assert mod in shipped or all(f"{mod}.{a.name}" in shipped for a in node.names), \
                    f"{name} imports {'.' * node.level}{node.module or ''}: not shipped to the host"
                continue
            else:
                continue
            for target in targets:
                assert target.split(".")[0] in stdlib, f"{name} imports {target}"


def test_no_module_name_is_used_twice_under_tasks():
    """A name says what a module holds: two `startup.py` make a reader hunt (and grep lie)."""
    paths = [p for p in (REPO / "tasks").rglob("*.py") if p.name != "__init__.py"
             and "__pycache__" not in p.parts]
    # One exception: a capability's client module and its host half, X/name.py beside
    # X/host/name.py (tasks/runtime/container.py and tasks/runtime/host/container.py).
    paths = [p for p in paths if not (p.parent.name == "host" and (p.parent.parent / p.name).exists())]
    names = [p.name for p in paths]
    assert sorted({n for n in names if names.count(n) > 1}) == []
