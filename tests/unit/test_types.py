"""mypy over the files setup.cfg's [mypy] names: the profile's types and readers, the client's
end of the wire (tasks/transport/agent.py and the code it ships) and the host agent's ops
table. mypy comes with the `test` extra; without it this test fails, never skips."""
import configparser
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MUST_BE_CHECKED = ("tasks/profile/", "tasks/transport/agent.py", "tasks/transport/host/ops.py")


def test_the_checked_set_holds_the_wire_and_profile_modules():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    files = [f.strip() for f in cfg["mypy"]["files"].replace("\n", " ").split(",") if f.strip()]
    assert set(MUST_BE_CHECKED) <= set(files), files
    assert all((REPO / f).exists() for f in files), files


def test_mypy_finds_nothing():
    r = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("Success: no issues found"), r.stdout
