"""The host agent's code: every module of the host/ packages of tasks/, sent only when the host lacks that
version, verified before it runs (tasks/transport/agent_code.py); its ops in one table
(tasks/transport/host/ops.py).

These run the real bootstrap with the real profile Python as a subprocess (the `local`
host: the same agent, the same bootstrap, without the SSH hop), with XDG_CACHE_HOME
pointing at a fresh directory so every test starts on a host that has never seen llmfab.

Here: the rest; the tests on lab hosts are in tests/lab/test_agent_over_ssh.py."""
import importlib
import json
import os
import shutil
import stat
import subprocess
import sys
import pytest
from tasks.transport.agent import AgentError, AgentStartFailed, Host
from tasks.transport.agent_code import BOOTSTRAP_FILE, TASKS, Payload, bootstrap, minify
from tasks.transport.host.ops import OPS
from agentstart import start


MARKER_CODE = "open(%r, 'w').write('ran')\n"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(root))
    return root


def version_dir(cache, code_dir=TASKS):
    return cache / "llmfab" / "agent" / Payload(code_dir).digest[:32]


def host_modules():
    """Every module of a host/ package, as its path inside llmfab_host/ (found here by hand)."""
    return sorted(p.relative_to(TASKS).as_posix() for p in TASKS.rglob("*.py")
                  if "host" in p.relative_to(TASKS).parts[:-1] and "__pycache__" not in p.parts)


def test_every_host_module_travels_and_nothing_else():
    """Exactly the host/ packages, plus empty __init__.py files for the packages above them
    (tasks/doctor/__init__.py imports client code: its host copy is empty)."""
    files = dict(Payload().files)
    assert sorted(n for n in files if "/host/" in "/" + n) == host_modules()
    above = sorted(n for n in files if "/host/" not in "/" + n)
    assert above == ["__init__.py"] + sorted({n.split("/host/")[0] + "/__init__.py" for n in host_modules()})
    assert all(files[n] == b"" for n in above)


def test_the_op_table_names_every_op_function_and_nothing_else():
    """ops.py is the one place every op is listed: each row's function exists, and every
    `op_*` function of the package is a row's (an op nobody can call is a mistake)."""
    served = set()
    for path in host_modules():
        name = path[:-3].replace("/", ".")
        module = importlib.import_module("tasks." + name)
        served |= {(name, f) for f in vars(module) if f.startswith("op_") and callable(vars(module)[f])}
    assert {(i.module, i.function) for i in OPS.values()} == served
    assert all(i.function == "op_" + op for op, i in OPS.items())


def test_a_module_added_to_the_package_travels_and_serves_its_table_row(tmp_path, cache):
    tree = tmp_path / "tasks"
    shutil.copytree(TASKS, tree, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "zz_new" / "host").mkdir(parents=True)  # a new capability: its package travels too
    (tree / "zz_new" / "host" / "__init__.py").write_text("")
    (tree / "zz_new" / "host" / "extra.py").write_text(
        "from ...base.host.statefiles import expand\n\n\ndef op_ping():\n    return {'pong': expand('~')}\n")
    table = (tree / "transport" / "host" / "ops.py").read_text()
    (tree / "transport" / "host" / "ops.py").write_text(
        table.replace('OPS = {', 'OPS = {\n    "ping": OpInfo("zz_new.host.extra", "op_ping", "t"),'))
    host, _ = start(tree)
    try:
        assert host.call("ping") == {"pong": os.path.expanduser("~")}
        with pytest.raises(AgentError, match="unknown agent operation 'nope'"):
            host.call("nope")
    finally:
        host.close()


def test_sent_once_then_run_from_the_verified_cache(cache):
    host, hello = start()
    host.close()
    assert hello["code"] == "sent"
    vdir = version_dir(cache)
    assert hello["agent_dir"] == str(vdir)
    assert stat.S_IMODE(vdir.stat().st_mode) == 0o700
    host, hello = start()
    try:
        assert hello["code"] == "cached" and host.call("hello")["pid"] == hello["pid"]
        assert host.stats == {"connections": 0, "commands": 1, "requests": 1}
    finally:
        host.close()
    assert list((vdir / "llmfab_host" / "transport" / "host" / "__pycache__").glob("agent_main.*.pyc"))  # bytecode


@pytest.mark.parametrize("damage", ["tampered", "half-written", "extra file", "group-writable"])
def test_a_damaged_copy_is_replaced_never_run(cache, tmp_path, damage):
    start()[0].close()
    pkg = version_dir(cache) / "llmfab_host"
    marker = tmp_path / "marker"
    module = pkg / "base" / "host" / "hosterrors.py"  # every op imports it
    original = module.read_bytes()
    if damage == "tampered":
        module.write_text(MARKER_CODE % str(marker) + original.decode())
    elif damage == "half-written":
        module.write_bytes(original[:len(original) // 2])
        (pkg / "transport" / "host" / "agent_main.py").unlink()
    elif damage == "extra file":
        (pkg / "gpu" / "zz_evil.py").write_text(MARKER_CODE % str(marker))
    else:
        os.chmod(pkg.parent, 0o770)
    host, hello = start()
    try:
        assert hello["code"] == "sent"
        assert host.call("lock", deploy_dir=str(tmp_path / "d")) is not None
    finally:
        host.close()
    assert not marker.exists()
    assert module.read_bytes() == original and not (pkg / "gpu" / "zz_evil.py").exists()
    assert stat.S_IMODE(pkg.parent.stat().st_mode) == 0o700
    assert [p.name for p in pkg.parent.parent.iterdir()] == [pkg.parent.name]  # nothing left over


def test_no_writable_cache_runs_from_a_private_copy_then_removes_it(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    host, hello = start()
    try:
        assert hello["code"] == "temporary" and os.path.isdir(hello["agent_dir"])
        assert stat.S_IMODE(os.stat(hello["agent_dir"]).st_mode) == 0o700
    finally:
        host.close()
    assert not os.path.exists(hello["agent_dir"])


def test_code_that_does_not_match_its_hash_is_refused(cache):
    payload = Payload()
    r = subprocess.run([sys.executable, "-c", bootstrap(), "0" * 64], input=payload.line,
                       capture_output=True, timeout=60)
    assert r.returncode == 1 and r.stdout == b'{"need": 1}\n'
    assert b"does not match its hash " + b"0" * 64 in r.stderr
    assert not (cache / "llmfab" / "agent" / ("0" * 32)).exists()


def _first_stage(argv, cache_home, payload, digest=None):
    """Run a first stage (`-c MINIFIED` or the readable file) with a real interpreter as the
    client does: the files when it asks, then its hello, then stdin closed (the agent ends).
    -> (exit status, [the JSON lines it wrote; the hello's result], stderr)."""
    proc = subprocess.Popen([sys.executable, "-S", *argv, digest or payload.digest],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, XDG_CACHE_HOME=str(cache_home)))
    out = []
    for line in proc.stdout:
        out.append(json.loads(line))
        out[-1] = out[-1].get("result", out[-1])
        if out[-1] != {"need": 1}:
            break
        proc.stdin.write(payload.line)
        proc.stdin.flush()
    proc.stdin.close()
    out += [json.loads(line) for line in proc.stdout]
    err = proc.stderr.read().decode()
    proc.stdout.close()
    proc.stderr.close()
    return proc.wait(60), out, err


@pytest.mark.parametrize("variant", ["minified", "readable"])
def test_the_first_stage_installs_verifies_and_reuses_the_agent(tmp_path, variant):
    argv = ["-c", bootstrap()] if variant == "minified" else [str(BOOTSTRAP_FILE)]
    payload, cache_home = Payload(), tmp_path / "cache"
    code, out, _ = _first_stage(argv, cache_home, payload)
    vdir = cache_home / "llmfab" / "agent" / payload.digest[:32]
    assert code == 0 and out[0] == {"need": 1}
    assert (out[1]["code"], out[1]["agent_dir"]) == ("sent", str(vdir)), out
    assert sorted(p.relative_to(vdir / "llmfab_host").as_posix() for p in (vdir / "llmfab_host").rglob("*.py")) \
        == [n for n, _ in payload.files]
    code, out, _ = _first_stage(argv, cache_home, payload)
    assert code == 0 and [o.get("code") for o in out] == ["cached"]
    code, out, err = _first_stage(argv, cache_home, payload, digest="1" * 64)
    assert code == 1 and out == [{"need": 1}] and err.strip().endswith("does not match its hash " + "1" * 64)
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    code, out, _ = _first_stage(argv, blocked, payload)
    assert code == 0 and out[1]["code"] == "temporary" and not os.path.exists(out[1]["agent_dir"])


def _statements(source):
    """The program's syntax tree without docstrings (what comments and layout never reach)."""
    import ast
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def test_the_minified_first_stage_is_the_readable_one_without_comments():
    text, readable = bootstrap(), BOOTSTRAP_FILE.read_text()
    assert _statements(text) == _statements(readable)
    assert "# " not in text and '"""' not in text and "\n\n" not in text
    assert len(text) < len(readable) / 2


SOURCE = '''"""A module docstring."""
import os  # a comment
X = 1 if True else 2
def only_doc():
    """Nothing but a docstring: the block keeps a body."""
class K:
    "a class docstring"
    def m(self, a, *args, **kw):
        return [a, -1, 0o22 and 'x', "#not a comment", b"%s\\0", len(args) + len(kw)]
def joined(a,
           b):
    return a in'ab' and not b
RESULT = (only_doc(), K().m(1, 2, k=3), joined("a", False), X)
'''


def test_minify_keeps_the_program_and_refuses_f_strings():
    small = minify(SOURCE)

    def run(text):
        namespace = {}
        exec(compile(text, "<minified>", "exec"), namespace)
        return namespace["RESULT"]
    assert run(small) == run(SOURCE) == (None, [1, -1, "x", "#not a comment", b"%s\0", 2], True, 1)
    assert "docstring" not in small and "# a comment" not in small and " pass" in small
    assert len(small.splitlines()) == 10 and small == minify(small)
    with pytest.raises(ValueError, match="line 1 has an f-string"):
        minify('x = f"{1}"\n')


def test_a_missing_python_is_reported_as_a_start_failure():
    host = Host("local", python="/nonexistent/python3")
    with pytest.raises(AgentStartFailed, match="/nonexistent/python3"):
        host.start()


def test_each_request_imports_only_the_modules_it_needs():
    probe = ("import io, json, sys\n"
             "from tasks.transport.host import agent_main\n"
             "reqs = b''.join(json.dumps(r).encode() + b'\\n' for r in sys.argv[1:] and\n"
             "                [{'op': op} for op in sys.argv[1:]])\n"
             "agent_main.serve(io.BytesIO(reqs), io.BytesIO())\n"
             "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules if '.host.' in m))\n")

    def loaded(*ops):
        r = subprocess.run([sys.executable, "-c", probe, *ops], capture_output=True, text=True,
                           cwd=str(TASKS.parent), timeout=60, check=True)
        return set(json.loads(r.stdout.replace("'", '"')))

    base = loaded("hello")
    assert base == {"agent_main", "hostenv", "hosterrors", "ops"}
    assert loaded("hello", "lock") == base | {"flock", "statefiles", "safefile"}
    assert "loadgen" not in loaded("hello", "lock", "poll") and "probe" in loaded("poll")
