"""The launch op (tasks/release/host/launch.py): launch.py runs as its own process,
`PYTHON launch.py`, and what a user, `ps` and `fab stop` see is that launcher and its server.

Each case runs a real agent-like process (`PYTHON -c ...` calling op_launch, holding an
flock as the agent's deploy lock does) and a real launch.py rendered by llmfab, whose
server (`sleep`) is left to the reaper.
"""
import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hostlab import wait_for
from tasks.release.launcher import render_launcher
from agentstart import host_package
from tasks.profile import load_profile

REPO = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

# The agent side: take a lock like op_lock, launch, report, exit (the lock goes with it).
AGENT = textwrap.dedent("""
    import fcntl, json, os, sys
    sys.path.insert(0, sys.argv[1])
    from llmfab_host.release.host import launch
    launch.LAUNCH_TIMEOUT_S = float(sys.argv[5])
    fd = os.open(sys.argv[2], os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        out = launch.op_launch(**{"deploy_dir": sys.argv[3], "release": "r1", "python": sys.argv[4]})
    except Exception as e:
        out = {"error": str(e), "kind": getattr(e, "kind", None), "data": getattr(e, "data", None)}
    print(json.dumps(out))
""")


def _release(tmp_path, command, python=PYTHON):
    prof = tmp_path / "p.toml"
    prof.write_text('[target]\nname = "fork"\n[server]\nengine = "command"\npython = %s\n'
                    'command = %s\nport = 18777\n[ready]\nmodels_path = ""\n'
                    % (json.dumps(python), json.dumps(command)))
    rel = tmp_path / "d" / "releases" / "r1"
    rel.mkdir(parents=True)
    (rel / "launch.py").write_text(render_launcher(load_profile(str(prof))))
    return rel


def _agent(tmp_path, launch_python, agent_python=PYTHON, timeout_s=60, env=None):
    r = subprocess.run([agent_python, "-S", "-c", AGENT, host_package(tmp_path / "agent"), str(tmp_path / "lock"),
                        str(tmp_path / "d"), launch_python, str(timeout_s)],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _cmdline(pid):
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")


@pytest.fixture
def stop_group():
    groups = []
    yield groups.append
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_launch_py_runs_as_its_own_process_and_leaves_the_server_detached(tmp_path, stop_group):
    rel = _release(tmp_path, ["sleep", "60"])
    out = _agent(tmp_path, PYTHON)
    server = out["server"]
    stop_group(server["pgid"])
    reaper, pid = server["pgid"], server["pid"]
    # What ps, `fab stop` and kill-gpu-procs show for the reaper: the launcher, isolated.
    assert _cmdline(reaper) == [PYTHON.encode(), b"-I", b"-S", str(rel / "launch.py").encode()]
    assert _cmdline(pid) == [b"sleep", b"60"]
    # Detached: its own session, its group led by the reaper.
    assert os.getsid(pid) == reaper and os.getpgid(pid) == reaper
    # Nothing of the agent's: no lock file, no pipe; only /dev/null.
    for proc in (reaper, pid):
        fds = {os.readlink(f"/proc/{proc}/fd/{fd}") for fd in os.listdir(f"/proc/{proc}/fd")}
        assert fds <= {"/dev/null", str(rel / "server.log")}, (proc, fds)
    # The agent is gone, the reaper lives on: its deploy lock is free at once.
    fd = os.open(tmp_path / "lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)
    assert json.loads((tmp_path / "d" / "server.json").read_text()) == server
    assert os.readlink(tmp_path / "d" / "current") == "releases/r1"
    os.killpg(reaper, signal.SIGTERM)
    wait_for(lambda: (rel / "exit.json").exists(), 10, "the reaper to record the exit")
    assert json.loads((rel / "exit.json").read_text())["returncode"] == -signal.SIGTERM


def test_the_profiles_interpreter_runs_it_under_its_own_name(tmp_path, stop_group):
    other = tmp_path / "bin" / "python-alias"  # the same binary, another command word
    other.parent.mkdir()
    other.symlink_to(PYTHON)
    rel = _release(tmp_path, ["sleep", "60"], python=str(other))
    server = _agent(tmp_path, str(other))["server"]
    stop_group(server["pgid"])
    assert _cmdline(server["pgid"]) == [str(other).encode(), b"-I", b"-S", str(rel / "launch.py").encode()]


def test_a_server_that_cannot_start_is_launch_failed(tmp_path):
    _release(tmp_path, ["/nonexistent/server"])
    out = _agent(tmp_path, PYTHON)
    assert out["kind"] == "launch_failed"
    assert out["error"].startswith("/nonexistent/server does not exist on the host"), out
    assert out["data"]["rule"] == "cannot-exec" and out["data"]["errno"] == "ENOENT", out
    failed = json.loads((tmp_path / "d" / "releases" / "r1" / "start-failed.json").read_text())
    assert failed["rule"] == "cannot-exec" and failed["cause"] == out["error"], failed


@pytest.mark.parametrize("text, start, error", [
    ("import sys\nraise RuntimeError('launcher broke')\n", "Traceback", "RuntimeError: launcher broke"),
    ("def main(:\n", 'File "', "SyntaxError: invalid syntax"),  # as the interpreter reports it
])
def test_a_broken_launcher_reports_its_traceback(tmp_path, text, start, error):
    rel = _release(tmp_path, ["sleep", "60"])
    (rel / "launch.py").write_text(text)
    out = _agent(tmp_path, PYTHON)
    assert out["error"].startswith("launch.py failed (exit 1): " + start), out
    assert out["error"].endswith(error) and str(rel / "launch.py") in out["error"], out


def test_a_launcher_that_never_returns_or_cannot_run_is_a_host_error(tmp_path):
    rel = _release(tmp_path, ["sleep", "60"])
    (rel / "launch.py").write_text("import time\ntime.sleep(30)\n")
    out = _agent(tmp_path, PYTHON, timeout_s=0.5)
    assert out["error"] == "launch.py did not return within 0.5 s", out
    out = _agent(tmp_path, str(tmp_path / "no-such-python"))
    assert out["error"].startswith(f"cannot run {tmp_path / 'no-such-python'} "), out


# A directory a host's PYTHONPATH (or a profile's [server.env]) may name: vLLM's dependencies
# hold a top-level `supervisor` (supervisord); others hold a sitecustomize. Each module here
# records that it ran, and where; none may run in launch.py or its supervisor.
SHADOW = {
    "sitecustomize.py": "import os, sys\nwith open(os.environ['SHADOW_LOG'], 'a') as f:\n"
                        "    f.write('%d %s\\n' % (os.getpid(), ' '.join(sys.argv)))\n",
    "supervisor/__init__.py": "raise ImportError('the shadow supervisor package was imported')\n",
    "supervise.py": "raise ImportError('the shadow supervise module was imported')\n",
    "llmfab_host/__init__.py": "raise ImportError('the shadow llmfab_host was imported')\n",
}
# What a profile's [server] files put beside launch.py: named like modules the launcher imports.
BESIDE = {"json.py": "raise ImportError('json.py of the release directory was imported')\n",
          "signal.py": "raise ImportError('signal.py of the release directory was imported')\n"}


@pytest.mark.parametrize("by_hand", [False, True], ids=["op_launch", "by-hand"])
def test_launch_py_and_its_supervisor_import_nothing_of_pythonpath_or_the_release_dir(tmp_path, stop_group, by_hand):
    from tasks.release.launcher import supervisor_files
    shadow = tmp_path / "shadow"
    for name, text in SHADOW.items():
        (shadow / name).parent.mkdir(parents=True, exist_ok=True)
        (shadow / name).write_text(text)
    log = tmp_path / "shadow.log"
    server = [PYTHON, "-c", "import os, time; open('seen.part', 'w').write(os.environ['PYTHONPATH']); "
              "os.rename('seen.part', 'seen'); time.sleep(60)"]
    rel = _release(tmp_path, server)
    prof = tmp_path / "p.toml"
    prof.write_text(prof.read_text() + '[supervise]\nrestart = "always"\nhang_timeout = 5\n')
    profile = load_profile(str(prof))
    (rel / "launch.py").write_text(render_launcher(profile))
    for name, data, _mode in supervisor_files(profile):
        (rel / name).parent.mkdir(parents=True, exist_ok=True)
        (rel / name).write_bytes(data)
    for name, text in BESIDE.items():
        (rel / name).write_text(text)
    env = dict(os.environ, PYTHONPATH=str(shadow), SHADOW_LOG=str(log))
    if by_hand:  # as a user reruns it: `python launch.py`, the host's PYTHONPATH set
        r = subprocess.run([PYTHON, str(rel / "launch.py")], env=env, capture_output=True, text=True,
                           timeout=60, cwd=str(tmp_path))
        assert r.returncode == 0, r.stderr
        record = json.loads(r.stdout.strip().splitlines()[-1])
    else:
        record = _agent(tmp_path, PYTHON, env=env)["server"]
    stop_group(record["pgid"])
    assert _cmdline(record["pgid"]) == [PYTHON.encode(), b"-I", b"-S", str(rel / "launch.py").encode()]
    wait_for(lambda: (rel / "seen").exists(), 30, "the server to start")
    # The server keeps its environment (and runs the host's sitecustomize, as it would anyway)...
    assert (rel / "seen").read_text() == str(shadow)
    sup = json.loads((rel / "supervisor.json").read_text())
    assert sup["state"] == "running" and sup["pid"] == record["pgid"], sup
    # ... launch.py and the supervisor ran nothing of it (by hand, the interpreter the user
    # started ran the site's sitecustomize before launch.py could restart it isolated).
    ran = log.read_text().splitlines() if log.exists() else []
    assert len([line for line in ran if "launch.py" in line]) == (1 if by_hand else 0), ran
    assert "Traceback" not in (rel / "server.log").read_text()
