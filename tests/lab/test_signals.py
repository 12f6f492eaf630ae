"""`fab stop` sends each process of a deployment exactly one SIGTERM (issue 12); SIGTERM and
SIGHUP sent to `fab` itself end a task as Ctrl-C does (issue 38).

The server (tests/servers/signal_server.py) and its two children, one in its process
group and one that called setsid (found by the release marker), append every signal
they receive to signals.log. The old stop sent killpg to the group and then kill to
every member: two SIGTERMs for each group member.
"""
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

import helpers
from helpers import Background, host_pid_alive, server_record
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


# -- SIGTERM and SIGHUP sent to `fab` ------------------------------------------------------------

@pytest.mark.parametrize("sig, code, words", [(signal.SIGTERM, 143, "SIGTERM"),
                                              (signal.SIGHUP, 129, "SIGHUP")])
def test_a_kill_during_the_wait_ends_deploy_as_ctrl_c_does(lab, sig, code, words):
    """Exit 128 + n within seconds, the words name the signal, the server keeps running and is
    named, the lock is free (the default action of SIGTERM killed fab with no word)."""
    name = f"sig-wait-{int(sig)}"
    prof = helpers.vllm_profile(lab, name, "h1", 31100 + int(sig),
                                {"STANDIN_FAIL": "never_ready", "STANDIN_LOAD_SECONDS": "0.2"})
    run = Background(lab, "deploy", profile=prof)
    try:
        run.wait_line("launched release")
        run.wait_line("cuda_graphs")  # inside the wait: the stand-in captures forever
        t0 = time.monotonic()
        run.proc.send_signal(sig)
        assert run.finish(30) == code, run.text
        assert time.monotonic() - t0 < 10
        server = server_record(lab, "h1", name)
        assert f"interrupted ({words})" in run.text, run.text
        assert f"release {server['release']} (pid {server['pid']}) keeps running" in run.text
        assert "Traceback" not in run.text and host_pid_alive(lab, "h1", server["pid"])
    finally:
        run.close()
        r = helpers.fab(lab, "stop", "--grace", "5", profile=prof)
    assert "locked" not in r.stdout and "stopped release" in r.stdout, r.stdout


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 0), (signal.SIGTERM, 143),
                                       (signal.SIGHUP, 129)])
def test_tail_log_follow_ends_cleanly_on_ctrl_c_or_a_kill(lab, sig, code):
    name = "sig-follow"
    prof = profile(lab, name, 31120, 0.5)
    fab(lab, "deploy", profile=prof)
    run = Background(lab, "tail-log", "--follow", profile=prof)
    try:
        wait_for(lambda: run.out or run.err, 30, "the first lines of the follow")
        run.proc.send_signal(sig)
        assert run.finish(30) == code, run.text
        assert "Traceback" not in run.text, run.text
    finally:
        run.close()
