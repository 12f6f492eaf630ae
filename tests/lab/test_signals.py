"""`fab stop` sends each process of a deployment exactly one SIGTERM (issue 12).

The server (tests/servers/signal_server.py) and its two children, one in its process
group and one that called setsid (found by the release marker), append every signal
they receive to signals.log. The old stop sent killpg to the group and then kill to
every member: two SIGTERMs for each group member.
"""
from collections import Counter
from pathlib import Path

import pytest

from hostlab import HostLab, wait_for
from tasks.profile.toml_text import dumps

SERVER = Path(__file__).resolve().parents[1] / "servers" / "signal_server.py"


@pytest.fixture(scope="module")
def lab():
    with HostLab(1) as lab:
        yield lab


def profile(lab, name, port, linger):
    doc = {
        "target": {"hosts": ["h1"], "name": name},
        "server": {"engine": "command", "command": ["python3", "signal_server.py"],
                   "files": [str(SERVER)], "host": "127.0.0.1", "port": port,
                   "args": {"port": port, "linger": linger}},
        "ready": {"poll_interval": 0.2, "timeout": 30, "models_path": ""},
    }
    path = lab.root / f"{name}.toml"
    path.write_text(dumps(doc))
    return path


def fab(lab, *args, profile):
    r = lab.fab(*args, profile=profile, timeout=120)
    assert r.returncode == 0, f"fab {' '.join(args)}: {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def received(release):
    """{(pid, role): Counter of signal names} from the release's signals.log."""
    out = {}
    log = release / "signals.log"
    for line in (log.read_text().splitlines() if log.exists() else ()):
        pid, role, name = line.split()
        out.setdefault((int(pid), role), Counter())[name] += 1
    return out


@pytest.mark.parametrize("linger", [0.5, 3.0])
def test_every_process_gets_exactly_one_sigterm_per_stop(lab, linger):
    """linger 3 s: each process stays long after its TERM, so a second one would be seen."""
    name = f"signals-{int(linger * 10)}"
    prof = profile(lab, name, 31000 + int(linger * 10), linger)
    releases = []
    for _ in range(2):  # a redeploy stops by the same path: count that stop too
        fab(lab, "deploy", profile=prof)
        release = (lab.home("h1") / "llmfab" / name / "current").resolve()
        releases.append(release)
        wait_for(lambda: (release / "children.txt").exists(), 10, "the server's children")
    fab(lab, "stop", "--grace", "10", profile=prof)
    for release in releases:
        children = [int(p) for p in (release / "children.txt").read_text().split()]
        got = received(release)
        roles = {role for _, role in got}
        assert roles == {"server", "group", "setsid"}, got
        assert {pid for pid, _ in got} >= set(children)
        for who, counts in got.items():
            assert counts == Counter({"SIGTERM": 1}), f"{who} received {dict(counts)}"
