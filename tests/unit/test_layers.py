"""Imports run down the layers, and no modules import each other in a circle.

LAYERS is the order, bottom first: a module may import its own layer and those below it,
never one above. What a module is comes from its path under tasks/ (a package, or a module
at the top); a host half (X/host/) stands where its capability stands. Every import counts,
at the top of a module or inside a function (ast, nothing is run): a local import still runs
when its function does. BACK_UP lists the few imports that run up today, KNOWN_CIRCLES the\ncircles, each with why.
"""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "tasks"

# Bottom first. base: tasks/base/ (imports nothing else of tasks/) and the client's words,
# errors and interrupt handling, which every layer uses.
LAYERS = [
    ("base", {"base", "errors", "output", "interrupts"}),
    ("profile, transport", {"profile", "transport"}),
    ("capabilities", {"release", "startup", "supervise", "gpu", "doctor", "measure", "failures",
                      "fleet", "weights", "runtime"}),
    ("steps", {"steps"}),
    # everything else: a task (one module per task at the top of tasks/; tune and endpoint,
    # the task packages), cli, options, program, docsgen, log_lines
]

# (importer, imported): an import that runs up a layer, and why it stays.
BACK_UP = {
    # profile reads tables its capabilities own (their keys are declared beside the code that uses them)
    ("tasks.profile.checktable", "tasks.doctor.host.spec_rules"): "the doctor's rule table, checked by `fab check`",
    ("tasks.profile.container_table", "tasks.runtime"): "the container runtime's keys and their check",
    ("tasks.profile.load", "tasks.weights.sources"): "[weights] is read where it is fetched",
    # fleet runs other layers' work on many hosts: its rolling and Ray halves drive steps
    ("tasks.fleet.executor", "tasks.cli"): "a task's context for each host (the tasks' own table)",
    ("tasks.fleet.ray_cluster", "tasks.steps.lock"): "a Ray cluster's nodes take the deploy lock",
    ("tasks.fleet.rolling", "tasks.steps.preflight"): "a rolling deploy resolves each host's deploy_dir",
    ("tasks.fleet.rolling", "tasks.steps.shutdown"): "a rolling deploy stops a host's old release",
    # the launcher writes launch.py from the server's argv (the argv step builds it)
    ("tasks.release.launcher", "tasks.steps.argv"): "launch.py carries the argv step's argv",
    ("tasks.runtime.container", "tasks.steps.preflight"): "a container mounts the model paths the preflight checks",
    # log and health reading, in steps/host/ until the one start-up log reader (base/host) lands
    ("tasks.release.launcher", "tasks.steps.host.probe"): "the supervisor's health probe",
    ("tasks.measure.host.loadgen", "tasks.steps.host.probe"): "the load generator's readiness probe",
    ("tasks.release.host.history", "tasks.steps.host.logs"): "a release's server.log (resolve)",
}

# Circles that are known, each with why it is still there (the goal: none).
KNOWN_CIRCLES = {}


def modules():
    """{dotted name: path} of every module under tasks/."""
    out = {}
    for path in TASKS.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(REPO).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(mods):
    """{(importer, imported)} between modules under tasks/: every import, top or local."""
    edges = set()
    for name, path in mods.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module if node.level == 0 else ".".join(
                    package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
                targets = [base + "." + a.name if base + "." + a.name in mods else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target not in (name, "tasks"):
                    edges.add((name, target))
    return edges


def layer(name):
    part = name.split(".")[1] if "." in name else name
    return next((i for i, (_, members) in enumerate(LAYERS) if part in members), len(LAYERS))


def test_imports_never_run_up_a_layer():
    found = {(a, b) for a, b in imports(modules()) if layer(b) > layer(a)}
    names = [n for n, _ in LAYERS] + ["tasks"]
    new = ["%s (%s) imports %s (%s)" % (a, names[layer(a)], b, names[layer(b)]) for a, b in sorted(found - set(BACK_UP))]
    assert new == [], "imports that run up the layers (tests/unit/test_layers.py LAYERS):\n" + "\n".join(new)
    assert sorted(set(BACK_UP) - found) == [], "BACK_UP lists imports that no longer run up: remove them"


def test_base_imports_nothing_else_of_tasks():
    mods = modules()
    assert sorted((a, b) for a, b in imports(mods) if a.startswith("tasks.base")
                  and not b.startswith("tasks.base")) == []


def test_no_modules_import_each_other_in_a_circle():
    edges = imports(modules())
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    circles, state = [], {}

    def visit(node, path):  # depth first; a node on the current path seen again closes a circle
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    new = [c for c in circles if frozenset(c) not in KNOWN_CIRCLES]
    assert new == [], "\n".join(" -> ".join(c) for c in new)
    seen = {frozenset(c) for c in circles}
    assert [sorted(c) for c in KNOWN_CIRCLES if c not in seen] == [], "a known circle is gone: remove it"
