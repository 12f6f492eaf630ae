"""Host ops say what they take: each is op_<name>(named parameters) (tasks/transport/host/ops.py).

Statically (ast), every request the client code in tasks/ makes fits its op: `host.call("op", ...)`
and the wrappers that pass the op on (`call(host, "op", ...)`, `call_resilient(host, "op", ...)`),
and each batch sub-call `("op", dict(...))`. Each keyword must be a parameter of the op, and every
parameter without a default must be passed where the call's keywords are all known (a `**x` the
test can follow to a dict(...) or {...} in the same function counts as known).

Through the real agent (the local bootstrap, tests/agentstart.py): an unknown or a missing
argument is refused naming the op and the argument, and a TypeError raised inside an op is
reported as the op's own failure, not as a bad argument."""
import ast
import importlib
import inspect
import os
from pathlib import Path

import pytest

from agentstart import start
from tasks.transport.agent import AgentError
from tasks.transport.host.ops import OPS

TASKS = Path(__file__).resolve().parents[2] / "tasks"
CALLERS = {"call", "call_resilient"}  # Host.call(op, ...) and the wrappers that pass op and **kw on
CLIENT_ONLY = {"timeout", "on_reconnect", "budget"}  # what Host.call / call_resilient keep for themselves
# the agent's own (the greeting is sent unasked, batches are Host.batch's), and unlock, which no
# task sends today: a lock goes with its agent
UNCALLED = {"hello", "batch", "unlock"}


def signatures():
    out = {}
    for op, info in OPS.items():
        fn = getattr(importlib.import_module("tasks." + info.module), info.function)
        out[op] = inspect.signature(fn)
    return out


class _Sites(ast.NodeVisitor):
    """(file:line, op, keyword names, whether every keyword is known) of each request."""

    def __init__(self, where):
        self.where, self.scopes, self.found = where, [{}], []

    def visit_FunctionDef(self, node):
        names = {}
        for n in ast.walk(node):
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                names.setdefault(n.targets[0].id, []).append(n.value)
        self.scopes.append(names)
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def _value(self, node):
        """The one dict(...) / {...} a name stands for in the enclosing functions, else None."""
        if isinstance(node, ast.Name):
            for scope in reversed(self.scopes):
                if node.id in scope:
                    values = scope[node.id]
                    return values[0] if len(values) == 1 else None
            return None
        return node

    def _keys(self, node, depth=0):
        """(keyword names, all known) of a dict(...) call or {...} literal."""
        node = self._value(node)
        if depth > 4 or node is None:
            return set(), False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            keys, known = set(), True
            for arg in node.args:  # dict(other, k=v): the other's keys too
                more, ok = self._keys(arg, depth + 1)
                keys, known = keys | more, known and ok
            return self._keywords(node.keywords, keys, known, depth)
        if isinstance(node, ast.Dict):
            keys, known = set(), True
            for k, v in zip(node.keys, node.values):
                if k is None:  # {**other}
                    more, ok = self._keys(v, depth + 1)
                    keys, known = keys | more, known and ok
                elif isinstance(k, ast.Constant) and isinstance(k.value, str):
                    keys.add(k.value)
                else:
                    known = False
            return keys, known
        return set(), False

    def _keywords(self, keywords, keys, known, depth):
        for kw in keywords:
            if kw.arg is None:  # **other
                more, ok = self._keys(kw.value, depth + 1)
                keys, known = keys | more, known and ok
            else:
                keys.add(kw.arg)
        return keys, known

    def visit_Call(self, node):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        if name in CALLERS:
            op = next((a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)), None)
            if op is not None:
                keys, known = self._keywords(node.keywords, set(), True, 0)
                self.found.append((f"{self.where}:{node.lineno}", op, keys - CLIENT_ONLY, known))
        self.generic_visit(node)

    def visit_Tuple(self, node):  # a batch sub-call: ("op", dict(...) / {...} / a name for one)
        if len(node.elts) == 2 and isinstance(node.elts[0], ast.Constant) and node.elts[0].value in OPS:
            value = self._value(node.elts[1])
            if isinstance(value, ast.Dict) or (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                                               and value.func.id == "dict"):
                keys, known = self._keys(value)
                self.found.append((f"{self.where}:{node.lineno}", node.elts[0].value, keys, known))
        self.generic_visit(node)


def call_sites():
    found = []
    for path in sorted(TASKS.rglob("*.py")):
        if "host" in path.relative_to(TASKS).parts[:-1]:
            continue  # the host's own code calls functions, not requests
        v = _Sites(path.relative_to(TASKS.parent).as_posix())
        v.visit(ast.parse(path.read_text(), str(path)))
        found += v.found
    return found


def test_every_request_in_tasks_fits_its_ops_parameters():
    sigs, sites = signatures(), call_sites()
    bad = []
    for where, op, keys, known in sites:
        if op not in sigs:
            bad.append(f"{where}: no op {op!r} in tasks/transport/host/ops.py")
            continue
        params = sigs[op].parameters
        bad += [f"{where}: op {op}: unknown argument {k!r} (it takes: {', '.join(params)})"
                for k in sorted(keys - set(params))]
        if known:
            bad += [f"{where}: op {op}: missing argument {p!r}" for p, v in params.items()
                    if v.default is v.empty and p not in keys]
    assert not bad, "\n".join(bad)
    # the search finds requests at all: every op has a caller, most with every keyword known
    assert set(OPS) - UNCALLED - {op for _, op, _, _ in sites} == set()
    assert sum(known for *_, known in sites) >= 0.8 * len(sites)


def test_the_search_sees_a_misspelt_and_a_missing_argument(tmp_path):
    text = ("def f(host, ddir):\n"
            "    host.call('launch', deploy_dir=ddir, release='r', keepp=3)\n"
            "    base = dict(deploy_dir=ddir)\n"
            "    host.batch({'l': ('launch', dict(base, python='p'))})\n")
    v = _Sites("t.py")
    v.visit(ast.parse(text))
    assert [(w, op, sorted(k), known) for w, op, k, known in v.found] == [
        ("t.py:2", "launch", ["deploy_dir", "keepp", "release"], True),
        ("t.py:4", "launch", ["deploy_dir", "python"], True)]


@pytest.fixture(scope="module")
def agent():
    host, _ = start()
    yield host
    host.close()


def test_an_unknown_argument_is_refused_naming_the_op_and_the_argument(agent, tmp_path):
    with pytest.raises(AgentError) as e:
        agent.call("launch", deploy_dir=str(tmp_path), release="r1", keepp=3)
    assert str(e.value) == ("op launch: unknown argument 'keepp' "
                            "(it takes: deploy_dir, release, python, keep)")
    assert e.value.data == {"op": "launch", "argument": "keepp"}


def test_a_missing_argument_is_refused_naming_the_op_and_the_argument(agent, tmp_path):
    with pytest.raises(AgentError) as e:
        agent.call("discard_release", deploy_dir=str(tmp_path))
    assert str(e.value) == "op discard_release: missing argument 'release' (it takes: deploy_dir, release)"


def test_a_bad_argument_in_a_batch_names_its_call(agent, tmp_path):
    with pytest.raises(AgentError) as e:
        agent.batch({"first": ("state", {"deploy_dir": str(tmp_path)}),
                     "second": ("state", {"deploy_dir": str(tmp_path), "relase": "r1"})})
    assert "op state: unknown argument 'relase'" in str(e.value)
    assert e.value.data["batch_call"] == "second"


def test_a_batch_answers_by_the_names_its_caller_gave(agent, tmp_path):
    got = agent.batch({"here": ("state", {"deploy_dir": str(tmp_path)}),
                       "absent": ("state", {"deploy_dir": str(tmp_path / "none")})})
    assert list(got) == ["here", "absent"]
    assert got["here"]["exists"] is True and got["absent"]["exists"] is False


def test_a_type_error_inside_an_op_is_the_ops_own_not_a_bad_argument(agent, tmp_path):
    # prune's keep goes through int(): a list there raises TypeError inside the op
    os.makedirs(tmp_path / "releases")
    with pytest.raises(AgentError) as e:
        agent.call("prune", deploy_dir=str(tmp_path), keep=[1])
    assert e.value.kind == "internal" and str(e.value).startswith("TypeError: int() argument")
    assert "traceback" in e.value.data
