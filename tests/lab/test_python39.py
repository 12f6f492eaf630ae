"""The code llmfab ships to a host runs on the oldest Python it promises (3.9): the agent
(the host/ packages of tasks/), the rendered launch.py and the supervisor, all started by `[server] python`,
through a whole deploy, status, bench, a crash the supervisor restarts, and a stop of the demo
server on this machine ("local": no SSH needed). tests/unit/test_lint.py checks the same code
statically (vermin, 3.9); this runs it. pyenv's 3.9 is on these machines; LLMFAB_PY39 names
another."""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from hostlab import REPO, alive, wait_for

pytestmark = pytest.mark.e2e


def python39():
    found = [os.environ.get("LLMFAB_PY39")] + sorted(glob.glob("/root/.pyenv/versions/3.9*/bin/python3")) \
        + [shutil.which("python3.9")]
    return next((p for p in found if p and os.path.exists(p)), None)


def fab(*args, profile, code=0):
    r = subprocess.run([sys.executable, "-m", "fabric", *args, "--profile", str(profile)],
                       cwd=str(REPO), capture_output=True, text=True, timeout=180)
    assert r.returncode == code, f"fab {' '.join(args)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def test_the_shipped_code_runs_on_python_3_9(tmp_path):
    py = python39()
    assert py, "no Python 3.9 here: set LLMFAB_PY39 to one (pyenv install 3.9)"
    version = subprocess.run([py, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True).stdout.strip()
    assert version == "3.9", version
    prof = tmp_path / "py39.toml"
    prof.write_text("\n".join([
        f'extends = "{REPO / "configs" / "demo.toml"}"',
        "[target]", f'workdir = "{tmp_path / "w"}"', 'name = "py39"',
        "[server]", f'python = "{py}"', f'command = ["{py}", "demo_server.py"]', "port = 18939",
        "[server.args]", "port = 18939", "load-seconds = 0.3",
        "[supervise]", 'restart = "on-failure"', "backoff = 1", ""]))
    try:
        r = fab("deploy", profile=prof)
        assert "Python 3.9." in r.stdout, r.stdout  # the agent's hello: it runs on 3.9
        st = json.loads(fab("status", "--json", profile=prof).stdout)
        assert st["running"] and st["supervisor"]["state"] == "running", st
        server = st["pid"]
        launcher = open(f"/proc/{server}/cmdline", "rb").read().split(b"\0")[0].decode()
        assert launcher == py, launcher  # the server itself, started by launch.py under 3.9
        bench = json.loads(fab("bench", "--json", "--requests", "4", "--max-tokens", "8", profile=prof).stdout)
        assert bench["ok"] and bench["errors"] == 0, bench
        os.kill(server, signal.SIGKILL)  # the supervisor (3.9) restarts it

        def restarted():
            r = subprocess.run([sys.executable, "-m", "fabric", "status", "--json", "--profile", str(prof)],
                               cwd=str(REPO), capture_output=True, text=True, timeout=60)
            s = json.loads(r.stdout)
            return s if r.returncode == 0 and s["supervisor"]["restarts"] == 1 else None
        st = wait_for(restarted, 60, "the supervisor's restart")
        assert st["pid"] != server
    finally:
        subprocess.run([sys.executable, "-m", "fabric", "stop", "--profile", str(prof)],
                       cwd=str(REPO), capture_output=True, timeout=120)
    assert not alive(st["pid"])
