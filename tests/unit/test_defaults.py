"""Each op default is written once, as a named constant in a shipped host module, and the client
(flags, help texts, profile defaults) uses that constant: the stop grace (30 s), the grace of
kill-gpu-procs (10 s) and the releases a host keeps (5). A lint check fails if a number comes
back as a default for one of these (`req.get("grace", 30)`, `grace=30`, `grace: float = 30.0`)."""
import ast
import re
import subprocess
import sys

import pytest
from hostlab import REPO

from tasks.options import KillGpuProcsOptions, StopOptions
from tasks.profile.schema import TARGET_KEYS
from tasks.profile.types import Target
from tasks.base.host.layout import KEEP_RELEASES
from tasks.base.host.stopping import DEFAULT_GRACE_S, KILL_GPU_GRACE_S

NAMES = {"grace", "keep", "keep_releases"}  # defaults that must be a named constant, never a number


def _help_default(task, flag):
    r = subprocess.run([sys.executable, "-m", "fabric", "--help", task], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if l.strip().startswith(f"--{flag}="))
    return float(re.search(r"\(default ([0-9.]+)\)", line).group(1))


@pytest.mark.parametrize("task,options,constant", [("stop", StopOptions, DEFAULT_GRACE_S),
                                                   ("kill-gpu-procs", KillGpuProcsOptions, KILL_GPU_GRACE_S)])
def test_the_grace_fab_help_states_and_applies_is_the_host_constant(task, options, constant):
    assert _help_default(task, "grace") == constant
    assert options.from_flags(grace=None).grace == constant


def test_the_profile_keeps_as_many_releases_as_the_host_constant():
    import dataclasses
    assert {f.name: f.default for f in dataclasses.fields(Target)}["keep_releases"] == KEEP_RELEASES
    assert TARGET_KEYS["keep_releases"].default == str(KEEP_RELEASES)


def _numeric(node):
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _literal_defaults(tree):
    """(line, what) of every number given as a default for a name in NAMES."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            # req.get("grace", 30), cfg.get("keep", 5)
            if (isinstance(node.func, ast.Attribute) and node.func.attr == "get" and len(node.args) == 2
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value in NAMES
                    and _numeric(node.args[1])):
                yield node.lineno, f'.get("{node.args[0].value}", {node.args[1].value})'
            for kw in node.keywords:  # host.call("stop", grace=30)
                if kw.arg in NAMES and _numeric(kw.value):
                    yield node.lineno, f"{kw.arg}={kw.value.value}"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):  # def stop(grace=30)
            a = node.args
            pairs = list(zip(a.args[len(a.args) - len(a.defaults):], a.defaults)) + list(zip(a.kwonlyargs, a.kw_defaults))
            for arg, default in pairs:
                if arg.arg in NAMES and default is not None and _numeric(default):
                    yield node.lineno, f"def {node.name}({arg.arg}={default.value})"
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):  # grace: float = 30.0
            if node.target.id in NAMES and node.value is not None and _numeric(node.value):
                yield node.lineno, f"{node.target.id} = {node.value.value}"
        elif isinstance(node, ast.IfExp) and _numeric(node.body) and isinstance(node.test, ast.Compare):
            # grace = 30.0 if grace is None else grace
            if isinstance(node.test.left, ast.Name) and node.test.left.id in NAMES:
                yield node.lineno, f"{node.body.value} if {node.test.left.id} is None"


def test_no_op_default_is_written_as_a_number():
    found = [f"{p.relative_to(REPO)}:{line}: {what}" for p in sorted((REPO / "tasks").rglob("*.py"))
             for line, what in _literal_defaults(ast.parse(p.read_text(), str(p)))]
    assert not found, ("defaults written as numbers; use DEFAULT_GRACE_S / KILL_GPU_GRACE_S "
                       "(tasks/steps/host/procs.py) or KEEP_RELEASES (tasks/release/host/release_dirs.py):\n"
                       + "\n".join(found))
