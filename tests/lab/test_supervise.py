"""Supervision end to end (issue 15): restarts by the launcher's reaper on lab hosts.

The stand-in vLLM (tests/standins) plays the server: kill -9 of it, a server that always
fails (STANDIN_FAIL=oom), hangs after ready (STANDIN_HANG=http: nothing answers; tokens:
/health 200 but generation stops), an engine child that leaves the group (setsid) and
outlives its parent holding stand-in GPU memory, which the stand-in driver frees only
`teardown_s` after the holder is gone. Every wait is on a condition with a deadline.
"""
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import helpers
from helpers import flat, write_profile
from hostlab import REPO, HostLab, alive, wait_for

HOST = "h1"  # shares this machine's PID namespace: pids from the host are ours too
MIB = 1024


@pytest.fixture(scope="module")
def lab():
    with HostLab(1) as lab:
        yield lab


def profile(lab, name, port, env=(), supervise=(), timeout=60):
    lines = ["[target]", f'hosts = ["{HOST}"]', f'name = "{name}"',
             "[server]", 'engine = "vllm"', f'python = "{lab.ml_python}"',
             f'model = "{lab.model_dir("sup-model")}"', 'host = "127.0.0.1"', f"port = {port}",
             "[server.args]", 'served-model-name = "m"',
             "[server.env]"]
    env = dict({"STANDIN_GPU_MIB": str(MIB), "STANDIN_LOAD_SECONDS": "0.3"}, **dict(env))
    lines += [f'{k} = "{v}"' for k, v in env.items()]
    lines += ["[ready]", f"timeout = {timeout}", "poll_interval = 0.2", "[supervise]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in
              dict({"restart": "on-failure", "backoff": 1}, **dict(supervise)).items()]
    return write_profile(lab, name, lines)


fab = functools.partial(helpers.fab, timeout=180)


def release(lab, name):
    return (lab.home(HOST) / "llmfab" / name / "current").resolve()


def read(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def attempts(lab, name):
    path = release(lab, name) / "restarts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def status(lab, prof):
    r = lab.fab("status", "--json", profile=prof, timeout=60)
    return json.loads(r.stdout), r


def server_pid(lab, name):
    return read(lab.home(HOST) / "llmfab" / name / "server.json")["pid"]


def restarted_and_ready(lab, prof, n):
    def check():
        st, r = status(lab, prof)
        return st if r.returncode == 0 and st["supervisor"]["restarts"] == n else None
    return wait_for(check, 60, f"restart {n} and ready")


def test_kill9_is_restarted_ready_again_one_restart_and_both_attempts_logged(lab):
    name = "sup-kill"
    prof = profile(lab, name, 31101)
    fab(lab, "deploy", profile=prof)
    first = server_pid(lab, name)
    follow = subprocess.Popen([sys.executable, "-m", "fabric", "-S", str(lab.ssh_config), "tail-log", "--follow",
                               "--lines", "1", "--profile", str(prof)],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    followed = []
    threading.Thread(target=lambda: followed.extend(follow.stdout), daemon=True).start()
    try:
        wait_for(lambda: followed, 30, "tail-log to start")
        os.kill(first, signal.SIGKILL)
        st = restarted_and_ready(lab, prof, 1)
        # --follow keeps following across the restart: the marker, then the new attempt's start.
        wait_for(lambda: "--- llmfab: restart 1" in "".join(followed) and
                 "Application startup complete." in "".join(followed).split("--- llmfab: restart 1")[1],
                 30, "the restart in tail-log --follow")
    finally:
        follow.kill()
        follow.wait()
    sup = st["supervisor"]
    assert st["running"] and st["health"] == 200 and st["pid"] != first
    assert sup["restart"] == "on-failure" and sup["state"] == "running"
    assert sup["last"]["signal"] == "SIGKILL" and sup["last"]["exit"] is None
    [rec] = attempts(lab, name)
    assert list(rec) == ["attempt", "started_at", "ended_at", "exit", "signal", "rule", "line"]
    assert rec["attempt"] == 1 and rec["signal"] == "SIGKILL"
    log = (release(lab, name) / "server.log").read_text()
    markers = [line for line in log.splitlines() if line.startswith("--- llmfab: restart")]
    assert len(markers) == 1 and "restart 1 of the server (previous attempt: killed by SIGKILL) at " in markers[0]
    assert log.count("Application startup complete.") == 2
    assert log.index("Application startup complete.") < log.index(markers[0])
    human = fab(lab, "status", profile=prof).stdout
    assert "supervisor: restart on-failure, 1 restart, running" in human and "killed by SIGKILL" in human
    fab(lab, "stop", profile=prof)


def test_a_server_that_always_fails_gives_up_after_max_restarts_naming_the_loop_and_line(lab):
    name = "sup-loop"
    prof = profile(lab, name, 31102, {"STANDIN_FAIL": "oom"}, {"max_restarts": 2, "backoff": 0.2})
    fab(lab, "deploy", "--no-wait", profile=prof)
    st = wait_for(lambda: (lambda s: s if s["supervisor"]["state"] == "gave-up" else None)(status(lab, prof)[0]),
                  60, "the supervisor to give up")
    assert not st["running"] and st["supervisor"]["restarts"] == 2
    recs = attempts(lab, name)
    assert [r["attempt"] for r in recs] == [1, 2, 3]
    assert all(r["exit"] == 1 and r["rule"] == "cuda-oom" and "CUDA out of memory" in r["line"] for r in recs)
    r = lab.fab("status", profile=prof, timeout=60)
    assert r.returncode == 1
    assert "crash loop: 2 restarts within 600 s (max_restarts = 2)" in flat(r.stdout), r.stdout
    assert "fatal line: " in flat(r.stdout) and "CUDA out of memory" in flat(r.stdout)
    log = (release(lab, name) / "server.log").read_text()
    assert log.count("--- llmfab: restart") == 2 and log.count("CUDA out of memory") >= 3
    assert "--- llmfab: restart 2 of the server (previous attempt: exited with status 1, cuda-oom) at " in log
    assert st["supervisor"]["last"]["rule"] == "cuda-oom"
    fab(lab, "stop", profile=prof)


def mode_of(prof):
    return "http" if '"http"' in prof.read_text() else "tokens"


def _hang_detected_within(lab, name, prof, hang_timeout):
    stamp = lab.tmp(HOST) / f"{name}-hung"  # STANDIN_HANG_STAMP: when the (first) hang began
    stamp.unlink(missing_ok=True)
    fab(lab, "deploy", profile=prof)
    first = server_pid(lab, name)
    path = release(lab, name) / "restarts.jsonl"
    wait_for(path.exists, 30, "the hang to be detected and recorded")
    hung_at = float(stamp.read_text())
    detected_at = read(release(lab, name) / "supervisor.json")["hang_detected_at"]
    interval = min(5.0, hang_timeout) / 2
    # Within hang_timeout + one probe: the probe after the last good one comes `interval`
    # later and fails after its own timeout, which is within hang_timeout of that good one.
    assert 0 < detected_at - hung_at <= hang_timeout + interval + 0.25, (detected_at - hung_at)
    print(f"hang ({mode_of(prof)}) detected {detected_at - hung_at:.2f} s after it began")
    [rec] = attempts(lab, name)
    assert rec["rule"] == "hung" and rec["line"].startswith("llmfab: hung: ")
    assert rec["exit"] is not None or rec["signal"] in ("SIGTERM", "SIGKILL")
    st = restarted_and_ready(lab, prof, 1)
    assert st["pid"] != first and not alive(first)
    fab(lab, "stop", profile=prof)
    return rec


def test_a_server_whose_http_hangs_after_ready_is_detected_and_restarted(lab):
    name = "sup-hang"
    prof = profile(lab, name, 31103, {"STANDIN_HANG": "http", "STANDIN_HANG_STAMP": f"/tmp/{name}-hung"},
                   {"hang_timeout": 2})
    rec = _hang_detected_within(lab, name, prof, 2.0)
    assert "no /health 200" in rec["line"]


def test_a_server_whose_tokens_stop_while_requests_wait_is_hung_though_health_says_200(lab):
    name = "sup-stall"
    prof = profile(lab, name, 31104, {"STANDIN_HANG": "tokens", "STANDIN_HANG_STAMP": f"/tmp/{name}-hung",
                                      "STANDIN_READY_FILE": f"/tmp/{name}-ready"},
                   {"hang_timeout": 2})
    body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 5000})
    client = None
    try:
        ready_file = lab.tmp(HOST) / f"{name}-ready"
        ready_file.unlink(missing_ok=True)
        # A request that starts before the stall and then waits on it, sent from the host.
        client = subprocess.Popen(lab.ssh_argv(HOST, "sh", "-c", shlex_quote(
            f"while ! test -e /tmp/{name}-ready; do sleep 0.05; done; curl -s -m 60 "
            f"-H 'content-type: application/json' -d '{body}' http://127.0.0.1:31104/v1/completions")),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rec = _hang_detected_within(lab, name, prof, 2.0)
        assert "requests waiting and no token generated" in rec["line"]
    finally:
        if client is not None:
            client.kill()
            client.wait()


def shlex_quote(text):
    import shlex
    return shlex.quote(text)


def test_a_busy_server_under_bench_is_never_restarted_nor_when_idle_after(lab):
    name = "sup-busy"
    prof = profile(lab, name, 31105, {"STANDIN_TOKENS_PER_S": "40"}, {"hang_timeout": 5})
    fab(lab, "deploy", profile=prof)
    # 32 requests of 96 tokens at 40 tokens/s, 8 at a time: ~10 s of load (twice
    # hang_timeout), the engine never without a request in it.
    r = fab(lab, "bench", "--json", "--requests", "32", "--concurrency", "8", "--max-tokens", "96",
            profile=prof)
    assert json.loads(r.stdout)["errors"] == 0
    idle_until = time.monotonic() + 10  # idle, nothing waiting, for 2x hang_timeout
    while time.monotonic() < idle_until:
        assert not (release(lab, name) / "restarts.jsonl").exists()
        time.sleep(0.2)
    st, r = status(lab, prof)
    assert r.returncode == 0 and st["supervisor"]["restarts"] == 0 and st["supervisor"]["state"] == "running"
    fab(lab, "stop", profile=prof)


def test_orphaned_workers_are_swept_and_the_relaunch_waits_until_their_memory_is_gone(lab):
    name = "sup-orphan"
    fake = lab.fakegpu_dir(HOST)
    (fake / "teardown_s").write_text("1.5")  # the "driver" frees a dead holder's memory 1.5 s late
    (fake / "readings.jsonl").write_text("")
    try:
        # 4096 MiB: the server's quarter alone (1024 per GPU) is well over the 256 MiB that
        # "back to the baseline" tolerates, so no lingering part can pass for freed.
        prof = profile(lab, name, 31106, {"STANDIN_WORKER_SETSID": "1", "STANDIN_GPU_MIB": "4096"})
        fab(lab, "deploy", profile=prof)
        server = server_pid(lab, name)
        regs = [read(p) for p in (fake / "procs").glob("*.json")]
        old = {r["host_pid"] for r in regs if r and "released_at" not in r and alive(r["host_pid"])}
        assert server in old and len(old) == 2  # the server and its engine child (own session)
        os.kill(server, signal.SIGKILL)
        killed_at = time.time()
        restarted_and_ready(lab, prof, 1)
        assert not any(alive(p) for p in old)  # the setsid'd engine child was swept
        readings = [json.loads(line) for line in (fake / "readings.jsonl").read_text().splitlines()]
        new_regs = [read(p) for p in (fake / "procs").glob("*.json")]
        new = [r for r in new_regs if r and r["host_pid"] not in old and r["registered_at"] > killed_at]
        assert new, "the new attempt registered no GPU memory"
        first_alloc = min(r["registered_at"] for r in new)
        after_kill = [x for x in readings if x["t"] > killed_at]
        held = [x for x in after_kill if set(x["pids"] + x["lingering"]) & old]
        assert held, "no reading saw the orphan's memory: the wait was not exercised"
        clear = [x for x in after_kill if x["t"] < first_alloc and not set(x["pids"] + x["lingering"]) & old
                 and all(v == 4 for v in x["used"].values())]
        assert clear, "the relaunch did not wait for a reading back at the baseline"
        assert max(x["t"] for x in held) < min(x["t"] for x in clear) < first_alloc
        newpids = {r["host_pid"] for r in new}
        assert not any(set(x["pids"] + x["lingering"]) & old and set(x["pids"]) & newpids for x in readings)
        fab(lab, "stop", profile=prof)
    finally:
        (fake / "teardown_s").unlink(missing_ok=True)
        (fake / "readings.jsonl").unlink(missing_ok=True)


def test_an_engine_child_left_holding_gpu_memory_is_named_refused_and_freed(lab):
    """kill -9 of the server only (no supervisor): its setsid'd engine child keeps its GPU memory.
    status names it (pid, MiB, the kill-gpu-procs to run), deploy refuses, kill-gpu-procs frees it."""
    name = "sup-holder"
    prof = profile(lab, name, 31108, {"STANDIN_WORKER_SETSID": "1"}, supervise={"restart": "no"})
    fab(lab, "deploy", profile=prof)
    server = server_pid(lab, name)
    fake = lab.fakegpu_dir(HOST)
    regs = [read(p) for p in (fake / "procs").glob("*.json")]
    child = {r["host_pid"] for r in regs if r and "released_at" not in r and alive(r["host_pid"])} - {server}
    assert len(child) == 1
    child = child.pop()
    os.kill(server, signal.SIGKILL)
    wait_for(lambda: not alive(server), 10, "the server to die")
    st, r = status(lab, prof)
    assert r.returncode == 1 and not st["running"]
    ours = [h for h in st["gpu_holders"] if h["ours"]]
    assert {h["pid"] for h in ours} == {child} and sum(h["mib"] for h in ours) > 0
    text = lab.fab("status", profile=prof, timeout=60)
    assert f"pid {child} (" in text.stdout and "fab kill-gpu-procs --profile" in text.stdout
    assert f"holds {ours[0]['mib']} MiB" in text.stdout
    r = lab.fab("deploy", profile=prof, timeout=180)
    assert r.returncode != 0 and f"pid {child} (" in r.stdout + r.stderr
    fab(lab, "kill-gpu-procs", profile=prof)
    wait_for(lambda: not alive(child), 20, "the engine child to be killed")
    fab(lab, "deploy", profile=prof)
    assert status(lab, prof)[1].returncode == 0
    fab(lab, "stop", profile=prof)


def test_stop_during_backoff_ends_the_supervisor_and_nothing_launches_after(lab):
    name = "sup-backoff"
    prof = profile(lab, name, 31107, supervise={"backoff": 30})
    fab(lab, "deploy", profile=prof)
    server = read(lab.home(HOST) / "llmfab" / name / "server.json")
    os.kill(server["pid"], signal.SIGKILL)
    st = wait_for(lambda: (lambda s: s if s["supervisor"]["state"] == "backoff" else None)(status(lab, prof)[0]),
                  30, "the backoff")
    assert st["supervisor"]["next_attempt_in_s"] > 20
    r = fab(lab, "stop", profile=prof)
    assert "supervisor ended first (it was backoff); nothing restarts" in r.stdout
    reaper = server["pgid"]
    wait_for(lambda: not alive(reaper), 10, "the supervisor (the launcher's reaper) to end")
    sup = read(release(lab, name) / "supervisor.json")
    assert sup["state"] == "off" and sup["attempt"] == 1
    assert read(lab.home(HOST) / "llmfab" / name / "server.json")["pid"] == server["pid"]
    assert (release(lab, name) / "server.log").read_text().count("--- llmfab: restart") == 0
    st, r = status(lab, prof)
    assert r.returncode == 1 and not st["running"] and st["supervisor"]["state"] == "off"


def test_a_redeploy_during_backoff_replaces_the_supervisor_and_the_old_release_stays_down(lab):
    name = "sup-redeploy"
    prof = profile(lab, name, 31108, supervise={"backoff": 30})
    fab(lab, "deploy", profile=prof)
    old = read(lab.home(HOST) / "llmfab" / name / "server.json")
    os.kill(old["pid"], signal.SIGKILL)
    wait_for(lambda: status(lab, prof)[0]["supervisor"]["state"] == "backoff", 30, "the backoff")
    r = fab(lab, "deploy", profile=prof)
    assert "is waiting to be restarted: stopping it first" in r.stdout
    assert "supervisor ended first (it was backoff); nothing restarts" in r.stdout
    wait_for(lambda: not alive(old["pgid"]), 10, "the old supervisor to end")
    oldrel = lab.home(HOST) / "llmfab" / name / "releases" / old["release"]
    assert read(oldrel / "supervisor.json")["state"] == "off"
    assert "--- llmfab: restart" not in (oldrel / "server.log").read_text()
    st, r = status(lab, prof)
    assert r.returncode == 0 and st["release"] != old["release"] and st["supervisor"]["restarts"] == 0
    fab(lab, "stop", profile=prof)


def test_memory_that_does_not_come_back_gives_up_without_relaunching(lab):
    name = "sup-memory"
    fake = lab.fakegpu_dir(HOST)
    (fake / "teardown_s").write_text("120")  # a dead holder's memory stays "in use" for 2 minutes
    try:
        prof = profile(lab, name, 31109, {"STANDIN_WORKER_SETSID": "1"}, {"memory_timeout": 1})
        fab(lab, "deploy", profile=prof)
        os.kill(server_pid(lab, name), signal.SIGKILL)
        st = wait_for(lambda: (lambda s: s if s["supervisor"]["state"] == "gave-up" else None)(status(lab, prof)[0]),
                      60, "the supervisor to give up")
        assert st["supervisor"]["restarts"] == 0 and len(attempts(lab, name)) == 1
        r = lab.fab("status", profile=prof, timeout=60)
        assert r.returncode == 1 and "GPU memory not back to the baseline after 1 s: GPU 0 uses" in r.stdout
        assert "--- llmfab: restart" not in (release(lab, name) / "server.log").read_text()
    finally:
        (fake / "teardown_s").unlink(missing_ok=True)
    lab.fab("stop", profile=prof, timeout=120)


def test_while_a_dead_servers_leftovers_are_ended_the_supervisor_does_not_say_running(lab):
    # Seen on an H200 (vLLM 0.26.0): after kill -9 of the API server its EngineCore lingered
    # and `fab status` said supervisor "running", 0 restarts, for the whole sweep of up to 30 s.
    name = "sup-linger"
    prof = profile(lab, name, 31108, {"STANDIN_IGNORE_TERM": "1"})
    fab(lab, "deploy", profile=prof)
    try:
        server = server_pid(lab, name)
        kids = [int(p) for p in open(f"/proc/{server}/task/{server}/children").read().split()]
        assert kids, "the stand-in server has no engine child"
        os.kill(server, signal.SIGKILL)
        st = wait_for(lambda: (lambda s: s if s["supervisor"]["state"] != "running" else None)(status(lab, prof)[0]),
                      20, "the supervisor to stop saying running")
        assert any(alive(k) for k in kids), "the engine child was gone already: no sweep was watched"
        assert st["supervisor"]["state"] == "waiting-for-gpu" and st["running"] is False, st
        assert st["supervisor"]["restarts"] == 0, st
    finally:
        fab(lab, "stop", "--grace", "1", profile=prof)
    assert not any(alive(k) for k in kids)


# A directory like vLLM's dependency tree on the H200 (issue 36): a top-level `supervisor`
# (supervisord), and modules named like the supervisor's own; a sitecustomize records where it ran.
SHADOW = {
    "supervisor/__init__.py": "raise ImportError('the shadow supervisor package was imported')\n",
    "supervise.py": "raise ImportError('the shadow supervise module was imported')\n",
    "llmfab_host/__init__.py": "raise ImportError('the shadow llmfab_host was imported')\n",
    "sitecustomize.py": "import os, sys\nwith open(os.environ['SHADOW_LOG'], 'a') as f:\n"
                        "    f.write('%d %s\\n' % (os.getpid(), ' '.join(sys.argv)))\n",
}


def test_a_sigstopped_server_is_restarted_though_pythonpath_names_a_supervisor_package(lab):
    """SIGSTOP of the server as soon as deploy says ready (before the supervisor's own probe saw a
    200: the watch is armed by deploy's startup.json, else it stays "never ready" for ever, the
    cause seen on the H200): /health is never answered, the supervisor must stop it and
    start a new one within hang_timeout + one probe + the stop + a start. The host's PYTHONPATH
    (exported in ~/.bashrc, so the agent and launch.py inherit it) and [server.env] PYTHONPATH
    both name a directory holding a `supervisor` package and modules named like the supervisor's:
    launch.py and the supervisor run isolated and import none of it; the server still gets its
    PYTHONPATH. The stopped server is resumed before the TERM, so it ends on the TERM at once,
    not by the KILL after the 30 s grace."""
    name, hang_timeout = "sup-stop", 3.0
    shadow = lab.tmp(HOST) / "pyshadow"  # /tmp/pyshadow on the host
    for rel_name, text in SHADOW.items():
        (shadow / rel_name).parent.mkdir(parents=True, exist_ok=True)
        (shadow / rel_name).write_text(text)
    log = lab.tmp(HOST) / "pyshadow.log"
    log.unlink(missing_ok=True)
    bashrc = lab.home(HOST) / ".bashrc"
    original = bashrc.read_text() if bashrc.exists() else None
    bashrc.write_text((original or "") + "\nexport PYTHONPATH=/tmp/pyshadow SHADOW_LOG=/tmp/pyshadow.log\n")
    prof = profile(lab, name, 31110, {"PYTHONPATH": "/tmp/pyshadow", "SHADOW_LOG": "/tmp/pyshadow.log"},
                   {"hang_timeout": hang_timeout})
    first = None
    try:
        fab(lab, "deploy", profile=prof)
        first = server_pid(lab, name)
        assert b"PYTHONPATH=/tmp/pyshadow" in Path(f"/proc/{first}/environ").read_bytes().split(b"\0")
        t0 = time.monotonic()
        os.kill(first, signal.SIGSTOP)
        st = restarted_and_ready(lab, prof, 1)
        took = time.monotonic() - t0
        interval = min(5.0, hang_timeout) / 2
        print(f"SIGSTOP -> restarted and ready in {took:.1f} s (hang_timeout {hang_timeout:g} s)")
        # detection <= hang_timeout + one probe (+ the probe's own timeout), the stop ~1 s, the
        # stand-in's start < 2 s, status polls; the 30 s grace would be far over.
        assert took < hang_timeout + 2 * interval + 12, took
        [rec] = attempts(lab, name)
        assert rec["rule"] == "hung" and "no /health 200" in rec["line"], rec
        assert rec["signal"] != "SIGKILL", rec  # ended on the TERM (exit 0), not by the KILL after the grace
        assert st["pid"] != first and not alive(first)
        # the new attempt's hang watch looks too: its own probe sees the 200 (fab status may see the
        # server ready before that probe, one interval at most: the race CI once hit)
        wait_for(lambda: ((read(release(lab, name) / "supervisor.json").get("health") or {}).get("answering")
                          is True), 3 * interval + 5, "the supervisor's probe of the new server to answer")
        ran = log.read_text().splitlines() if log.exists() else []
        assert ran and not [line for line in ran if "launch.py" in line], ran  # the servers ran it, launch.py not
    finally:
        if original is None:
            bashrc.unlink(missing_ok=True)
        else:
            bashrc.write_text(original)
        if first and alive(first):
            os.kill(first, signal.SIGKILL)
        fab(lab, "stop", "--grace", "5", profile=prof)
