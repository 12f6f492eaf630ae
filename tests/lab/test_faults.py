"""Faults (issue 6): llmfab under dropped connections, dead hosts, dying servers, Ctrl-C,
a full disk, stale locks and a taken port -- the real `fab` against the lab's real sshd.

Each test deploys the stand-in vLLM (tests/standins) with a knob that produces the fault,
or produces the fault on the host itself (lab.kill_sessions, lab.restart_sshd, a tmpfs
mounted in the host's mount namespace, a process squatting the port). State is polled
with deadlines, never slept on. Covered elsewhere and listed in docs/guarantees.md:
a killed client never leaves the lock held (test_logs_releases.py
::test_a_killed_deploy_or_stop_never_leaves_the_lock_held) and two deploys at once
(::test_two_deploys_at_once_exactly_one_proceeds).
"""
import contextlib
import json
import os
import signal
import time

import pytest

from helpers import (HOST_PYTHON, Background, squat_port, deployment, fab, flat, host_pid_alive,  # noqa: F401
                     launched_once, releases, server_record, vllm_profile, write_profile)
from hostlab import wait_for

pytestmark = pytest.mark.e2e

# -- the SSH connection drops while deploy waits ---------------------------------------------

@pytest.mark.parametrize("fault", ["kill_sessions", "restart_sshd"])
def test_deploy_survives_a_dropped_connection_during_the_wait_and_launches_once(lab, fault):
    host, name = {"kill_sessions": ("h1", "fault-drop"), "restart_sshd": ("h2", "fault-sshd")}[fault]
    ready_file = f"/tmp/{name}-ready"
    (lab.tmp(host) / f"{name}-ready").unlink(missing_ok=True)
    prof = vllm_profile(lab, name, host, 31001, {"STANDIN_LOAD_SECONDS": "5",
                                                  "STANDIN_READY_FILE": ready_file})
    run = Background(lab, "deploy", profile=prof)
    try:
        run.wait_line("launched release")
        assert not (lab.tmp(host) / f"{name}-ready").exists(), "ready before the fault: too fast"
        before = lab.session_sshd_pids(host)
        assert before, "no SSH session to drop"
        getattr(lab, fault)(host)
        dropped_at = time.time()
        assert run.finish(120) == 0, run.text
        assert "connection re-opened; still waiting" in run.text, run.text
        assert "ready in" in run.text
        # It became ready after the drop, on the same (only) launch.
        assert float((lab.tmp(host) / f"{name}-ready").read_text()) > dropped_at
        launched_once(lab, host, name)
    finally:
        run.close()
        fab(lab, "stop", "--grace", "5", profile=prof)


def test_deploy_survives_a_hung_connection_and_ends_the_agent_it_left_holding_the_lock(lab):
    # A half-open connection (the network died, the host has not noticed): freeze the
    # session's sshd. The poll times out, deploy reconnects, and its old agent, still
    # alive on the host and holding the lock, is ended instead of blocking for hours.
    host, name = "h3", "fault-hung"
    prof = vllm_profile(lab, name, host, 31010, {"STANDIN_LOAD_SECONDS": "3"})
    try:
        hang_the_connection_and_expect_the_stale_agent_ended(lab, host, name, "deploy", prof,
                                                             "launched release")
        launched_once(lab, host, name)
    finally:
        fab(lab, "stop", "--grace", "5", profile=prof)


def hang_the_connection_and_expect_the_stale_agent_ended(lab, host, name, task, prof, started):
    """Run `fab TASK`; once it printed `started`, freeze its sshd session (half-open: the host
    never notices); the task must reconnect, end its own old agent that still holds the lock,
    and finish with exit 0."""
    lock = deployment(lab, host, name) / ".lock"
    run = Background(lab, task, profile=prof)
    frozen = []
    try:
        run.wait_line(started)
        agent = json.loads(lock.read_text())["pid"]
        frozen = lab.session_sshd_pids(host)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        assert run.finish(150) == 0, run.text
        assert "connection re-opened; still waiting" in run.text
        assert f"ended agent pid {agent} of the lost connection (it still held the lock)" in run.text
        assert not host_pid_alive(lab, host, agent)
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        run.close()


def test_rollback_survives_a_hung_connection_and_ends_the_agent_it_left_holding_the_lock(lab):
    # Rollback waits with the same step as deploy (tasks/steps/wait.py wait_or_clean_up): after a
    # half-open connection its own old agent, still holding the lock, is ended too.
    host, name = "h3", "fault-hung-rollback"
    old = vllm_profile(lab, name, host, 31011, {"STANDIN_LOAD_SECONDS": "3"})
    fab(lab, "deploy", profile=old)
    first = server_record(lab, host, name)["release"]
    new = vllm_profile(lab, name, host, 31011, {"STANDIN_TAG": "new"})
    fab(lab, "deploy", profile=new)
    try:
        hang_the_connection_and_expect_the_stale_agent_ended(lab, host, name, "rollback", new,
                                                             f"relaunched release {first}")
        server = server_record(lab, host, name)
        assert server["release"] == first and host_pid_alive(lab, host, server["pid"])
    finally:
        fab(lab, "stop", "--grace", "5", profile=new)


# -- a host that accepts TCP and never speaks SSH -------------------------------------------

def test_a_host_that_never_answers_ssh_exits_3_within_the_connect_timeout(lab):
    prof = write_profile(lab, "fault-silent", [
        "[target]", 'hosts = ["silent"]', 'name = "fault-silent"',
        "[server]", 'engine = "command"', 'command = ["true"]', "port = 31002"])
    t0 = time.monotonic()
    r = lab.fab("-t", "2", "deploy", profile=prof, timeout=60)
    elapsed = time.monotonic() - t0
    assert r.returncode == 3, r.stdout + r.stderr
    assert "[silent]" in r.stdout or "silent" in r.stdout, r.stdout
    assert "did not answer" in r.stdout and "2 s" in r.stdout, r.stdout
    assert "Traceback" not in r.stdout + r.stderr
    # -t 2 bounds the wait: 2 s plus Python start-up, far below the 10 s default.
    assert elapsed < 8, f"took {elapsed:.1f} s with -t 2"


# -- the server never becomes ready ---------------------------------------------------------

def test_never_ready_exits_1_at_the_timeout_leaves_it_running_unless_stop_on_timeout(lab):
    host, name = "h3", "fault-never"
    prof = vllm_profile(lab, name, host, 31003, {"STANDIN_FAIL": "never_ready",
                                                  "STANDIN_LOAD_SECONDS": "0.2"})
    try:
        t0 = time.monotonic()
        r = fab(lab, "deploy", "--timeout", "3", profile=prof, code=1)
        assert time.monotonic() - t0 < 30
        out = r.stdout
        assert "server not ready after 3 s" in out and "still running" in out, out
        assert "Capturing CUDA graphs" in out  # the last log lines are shown
        server = server_record(lab, host, name)
        assert f"release {server['release']}" in out and f"pid {server['pid']}" in out, out
        assert "fab stop" in out
        assert host_pid_alive(lab, host, server["pid"])

        # --no-restore: the release it stopped first is not put back (that is test_unexpected.py's)
        r = fab(lab, "deploy", "--timeout", "2", "--stop-on-timeout", "--no-restore", profile=prof, code=1)
        second = server_record(lab, host, name)
        assert second["release"] != server["release"]
        assert "not ready after 2 s" in r.stdout and "stopped it (--stop-on-timeout)" in r.stdout, r.stdout
        assert "still running" not in r.stdout
        assert not host_pid_alive(lab, host, server["pid"]) and not host_pid_alive(lab, host, second["pid"])
    finally:
        fab(lab, "stop", "--grace", "5", profile=prof)


# -- the server dies after being ready -------------------------------------------------------

def test_engine_death_during_the_wait_fails_the_deploy_with_its_line(lab):
    # Ready never comes (the served name is not listed), the engine dies one second after
    # the port opens: the wait must report that death, not time out.
    prof = vllm_profile(lab, "fault-death-wait", "h1", 31004,
                        {"STANDIN_FAIL": "engine_death", "STANDIN_DEATH_AFTER": "1"},
                        ready=['served_name = "a-name-nobody-serves"'])
    t0 = time.monotonic()
    r = fab(lab, "deploy", profile=prof, code=1)
    assert time.monotonic() - t0 < 45
    assert "server failed: the engine process died: RuntimeError: CUDA error: an illegal memory" in r.stdout, r.stdout
    assert "EngineCore encountered a fatal error" in r.stdout
    assert "not ready after" not in r.stdout


def test_engine_death_after_ready_status_says_dead_and_why(lab):
    host, name = "h2", "fault-death"
    prof = vllm_profile(lab, name, host, 31005, {"STANDIN_FAIL": "engine_death",
                                                  "STANDIN_DEATH_AFTER": "6"})
    fab(lab, "deploy", profile=prof)
    server = server_record(lab, host, name)

    def dead():
        r = lab.fab("status", "--json", profile=prof, timeout=60)
        record = json.loads(r.stdout.splitlines()[0])
        return (r, record) if not record["running"] else None
    r, record = wait_for(dead, 60, "status to report the server dead")
    assert r.returncode == 1
    assert record["exit"]["returncode"] == 0  # an engine crash can exit 0
    assert record["fatal"]["rule"] == "engine-dead"
    assert "EngineCore encountered a fatal error" in record["fatal"]["line"]
    human = fab(lab, "status", profile=prof, code=1).stdout
    assert f"not running: release {server['release']} exited with status 0" in human, human
    assert "why: the engine process died" in human and "  fix: " in human, human
    assert "  source: failure rule engine-dead" in human, human


# -- Ctrl-C during the wait ------------------------------------------------------------------

def test_ctrl_c_during_the_wait_exits_130_keeps_the_server_and_frees_the_lock(lab):
    host, name = "h3", "fault-sigint"
    prof = vllm_profile(lab, name, host, 31006, {"STANDIN_FAIL": "never_ready",
                                                  "STANDIN_LOAD_SECONDS": "0.2"})
    run = Background(lab, "deploy", profile=prof)
    try:
        run.wait_line("launched release")
        run.wait_line("cuda_graphs")  # well inside the wait (the stand-in captures forever)
        t0 = time.monotonic()
        run.proc.send_signal(signal.SIGINT)
        assert run.finish(30) == 130, run.text
        assert time.monotonic() - t0 < 5
        server = server_record(lab, host, name)
        assert f"release {server['release']} (pid {server['pid']}) keeps running" in run.text, run.text
        assert "fab stop" in run.text and "Traceback" not in run.text
        assert host_pid_alive(lab, host, server["pid"])
    finally:
        run.close()
        t1 = time.monotonic()
        r = fab(lab, "stop", "--grace", "5", profile=prof)
    assert "locked" not in r.stdout and "stopped release" in r.stdout, r.stdout
    assert time.monotonic() - t1 < 30
    assert not host_pid_alive(lab, host, server["pid"])


# -- the disk is full ------------------------------------------------------------------------

def test_full_disk_is_a_clear_error_and_earlier_releases_stay_intact(lab):
    host, name, mnt = "h1", "fault-disk", "/tmp/fault-small-disk"
    (lab.tmp(host) / "fault-small-disk").mkdir(exist_ok=True)
    lab.exec(host, ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", mnt], check=True)
    prof = vllm_profile(lab, name, host, 31007, workdir=mnt)

    def snapshot():
        # every file of the deployment with its bytes' digest, read inside the host
        r = lab.exec(host, ["sh", "-c", 'cd "$1" && find . -type f ! -name .lock ! -name server.log '
                                        '-exec sha256sum {} + | sort', "-", f"{mnt}/{name}"],
                     capture_output=True, text=True, check=True)
        return r.stdout

    try:
        fab(lab, "deploy", profile=prof)
        before = snapshot()
        first = server_record_in(lab, host, f"{mnt}/{name}")
        # fill the disk (dd stops with ENOSPC)
        lab.exec(host, ["dd", "if=/dev/zero", f"of={mnt}/filler", "bs=4k"], capture_output=True)
        r = fab(lab, "deploy", profile=prof, code=1)
        assert f"FAIL disk 0 MiB free at {mnt}/{name} (disk full?)" in flat(r.stdout), r.stdout
        assert "nothing was launched" in r.stdout
        assert "Traceback" not in r.stdout + r.stderr and "internal error" not in r.stdout
        assert snapshot() == before  # nothing changed, nothing half-written left behind
        assert server_record_in(lab, host, f"{mnt}/{name}") == first
        assert host_pid_alive(lab, host, first["pid"])  # the running release was not touched
    finally:
        lab.exec(host, ["rm", "-f", f"{mnt}/filler"])
        lab.fab("stop", "--grace", "5", profile=prof, timeout=120)
        lab.exec(host, ["umount", "-l", mnt])


def server_record_in(lab, host, ddir):
    r = lab.exec(host, ["cat", f"{ddir}/server.json"], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


# -- a stale lock from a killed deploy -------------------------------------------------------

def test_stale_lock_left_by_a_killed_deploy_does_not_block_the_next(lab):
    host, name = "h2", "fault-stale"
    slow = vllm_profile(lab, name, host, 31008, {"STANDIN_FAIL": "never_ready",
                                                  "STANDIN_LOAD_SECONDS": "0.2"})
    lock = deployment(lab, host, name) / ".lock"
    run = Background(lab, "deploy", profile=slow)
    try:
        run.wait_line("launched release")
        holder = json.loads(lock.read_text())
        # kill -9 both ends, neither getting a chance to clean up: freeze the client, kill
        # the host agent holding the lock, then kill the client
        run.proc.send_signal(signal.SIGSTOP)
        lab.exec(host, ["kill", "-9", str(holder["pid"])], check=True)
        wait_for(lambda: not host_pid_alive(lab, host, holder["pid"]), 10, "the agent to die")
    finally:
        run.close()
    assert json.loads(lock.read_text())["pid"] == holder["pid"]  # the lock file still names it
    ok = vllm_profile(lab, name, host, 31008)
    try:
        r = fab(lab, "deploy", profile=ok)
        assert "locked" not in r.stdout and "ready in" in r.stdout
        assert len(releases(lab, host, name)) == 2
    finally:
        fab(lab, "stop", "--grace", "5", profile=ok)


# -- the port is already taken on the host ---------------------------------------------------


def test_taken_port_is_refused_by_preflight_naming_the_holder(lab):
    host, name, port = "h3", "fault-port", 31009
    pid = squat_port(lab, host, port, "fault-squatter")
    prof = vllm_profile(lab, name, host, port)
    try:
        r = fab(lab, "deploy", profile=prof, code=1)
        assert f"port {port} is already in use by pid {pid} (" in flat(r.stdout), r.stdout
        assert f"({HOST_PYTHON} -c " in flat(r.stdout)  # with its command line
        assert "nothing was launched" in r.stdout and "launched release" not in r.stdout
        ddir = deployment(lab, host, name)
        assert not (ddir / "releases").exists() or not list((ddir / "releases").iterdir())
        assert not (ddir / "server.json").exists()
    finally:
        lab.exec(host, ["kill", "-9", str(pid)])
