"""The host agent's event-driven wait tick (tasks/steps/host/watch.py), on real processes,
files and sockets: it answers when the state the client last saw changes, not after the
poll interval. (How fast it answers is measured in benchmarks/, not here.)"""
import http.server
import json
import subprocess
import sys
import threading

import pytest

from tasks.steps.host import watch

SEEN_LOADING = {"alive": True, "health": None, "models": None}


@pytest.fixture
def release(tmp_path):
    rdir = tmp_path / "d" / "releases" / "r1"
    rdir.mkdir(parents=True)
    (rdir / "server.log").write_text("")
    return tmp_path / "d", rdir


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait()


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def req(ddir, pid, port, **kw):
    return dict(dict(deploy_dir=str(ddir), release="r1", pid=pid, port=port, host="127.0.0.1",
                     health_path="/health", models_path="/v1/models", wait_s=30,
                     seen=SEEN_LOADING, hints=[[r"CUDA out of memory", 0]]), **kw)


def test_first_request_answers_at_once_with_the_state(release, sleeper):
    ddir, rdir = release
    out = watch.op_watch(**req(ddir, sleeper.pid, free_port(), seen=None))
    assert out["why"] == "first" and out["state"] == SEEN_LOADING


def test_nothing_changes_answers_after_wait_s_with_the_new_lines(release, sleeper):
    ddir, rdir = release
    (rdir / "server.log").write_text("Loading weights\nhalf a li")
    out = watch.op_watch(**req(ddir, sleeper.pid, free_port(), wait_s=0.3))
    assert out["why"] == "timeout" and out["alive"] is True
    assert out["log"]["text"] == "Loading weights\n" and out["log"]["offset"] == 16


def test_a_hinted_line_answers_at_once_with_the_lines_after_it(release, sleeper):
    ddir, rdir = release
    (rdir / "server.log").write_text("Loading weights\ntorch.OutOfMemoryError: CUDA out of memory. "
                                     "Tried to allocate 2.00 GiB\n  File \"x.py\"\n")
    out = watch.op_watch(**req(ddir, sleeper.pid, free_port()))
    assert out["why"] == "hint" and "CUDA out of memory" in out["log"]["text"]
    assert out["log"]["text"].endswith('  File "x.py"\n')


def test_the_process_exiting_answers_at_once_with_its_last_words(release):
    ddir, rdir = release
    with open(rdir / "server.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", "print('last words')"], stdout=log)
    proc.wait()
    (rdir / "exit.json").write_text(json.dumps({"returncode": 0}))
    out = watch.op_watch(**req(ddir, proc.pid, free_port()))
    assert out["why"] == "exited" and out["alive"] is False
    assert out["log"]["text"] == "last words\n" and out["exit"] == {"returncode": 0}


class _Server(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": "m"}]}).encode() if self.path == "/v1/models" else b"{}"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_the_port_opening_answers_with_health_and_models(release, sleeper):
    ddir, rdir = release
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = watch.op_watch(**req(ddir, sleeper.pid, server.server_address[1]))
    finally:
        server.shutdown()
        server.server_close()
    assert out["why"] == "changed"
    assert out["state"] == {"alive": True, "health": 200, "models": ["m"]}
    again = watch.op_watch(**req(ddir, sleeper.pid, server.server_address[1], seen=out["state"],
                               wait_s=0.2))
    assert again["why"] == "changed" and again["state"]["health"] is None  # it went away


def test_gpu_readings_are_rate_limited_across_requests(release, sleeper, tmp_path):
    ddir, _ = release
    runs = tmp_path / "runs"
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho run >> %s\necho '0, GPU-0, NVIDIA H100, 4, 81559, 0'\n" % runs)
    smi.chmod(0o755)
    watch.CONTEXT.pop("watch_gpus", None)
    r = req(ddir, sleeper.pid, free_port(), seen=None, nvidia_smi=str(smi), gpu_every_s=3600)
    first, second = watch.op_watch(**r), watch.op_watch(**r)
    assert first["gpus"][0]["used_mib"] == 4 and second["gpus"] == first["gpus"]
    assert runs.read_text() == "run\n"


def test_hints_match_line_by_line_and_none_means_any_line(release, sleeper):
    ddir, rdir = release
    (rdir / "server.log").write_text("Loading\napi_server.py: error: argument --port: invalid\n")
    anchored = [[r"^(?:[\w.-]+(?: [\w.-]+)?): error: ", 0]]
    assert watch.op_watch(**req(ddir, sleeper.pid, free_port(), hints=anchored))["why"] == "hint"
    assert watch.op_watch(**req(ddir, sleeper.pid, free_port(), hints=None))["why"] == "hint"
    quiet = watch.op_watch(**req(ddir, sleeper.pid, free_port(), hints=[], wait_s=0.2))
    assert quiet["why"] == "timeout" and quiet["log"]["text"].count("\n") == 2
    bad = [[r"(?P<x", 0]]  # what a host's older Python could not compile: any line answers
    assert watch.op_watch(**req(ddir, sleeper.pid, free_port(), hints=bad))["why"] == "hint"


def test_the_hints_are_logscans_rules_so_a_fatal_line_answers_early(release, sleeper):
    """The client sends logscan's own patterns (tasks/failures/rules): a line its scanner calls
    fatal makes the agent answer at once, and the scanner then names it."""
    from tasks.failures.logscan import LogScanner
    from tasks.steps.wait import fatal_hints
    ddir, rdir = release
    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    (rdir / "server.log").write_text("Loading weights\n" + line)
    out = watch.op_watch(**req(ddir, sleeper.pid, free_port(), hints=fatal_hints()))
    assert out["why"] == "hint"
    scanner = LogScanner()
    assert scanner.feed(out["log"]["text"], final=True) is not None
    with open(rdir / "server.log", "a") as f:
        f.write("INFO 12-01 08:00:00 [loader.py:1] Loading safetensors checkpoint shards: 50%\n")
    healthy = watch.op_watch(**req(ddir, sleeper.pid, free_port(), hints=fatal_hints(), wait_s=0.2,
                                 log_offset=out["log"]["offset"]))
    assert healthy["why"] == "timeout" and "safetensors" in healthy["log"]["text"]


def test_the_ops_at_ready_answer_from_what_the_watch_read(release, sleeper):
    """One read of the log (tasks/base/host/startlog.py): the watch feeds the phases' parser and
    the speculative-decoding evidence as it reads; `startup` and `spec_evidence` at ready answer
    from that, so they still answer it with the log gone (moved away after the watch)."""
    from tasks.doctor.host import spec_evidence
    from tasks.startup.host import phases
    ddir, rdir = release
    lines = ["INFO 12-01 08:00:01 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config",
             "INFO 12-01 08:00:02 [gpu_worker.py:272] Using V2 Model Runner",
             "INFO 12-01 08:00:03 [default_loader.py:501] Loading weights took 0.50 seconds"]
    (rdir / "server.log").write_text("\n".join(lines) + "\n")
    out = watch.op_watch(**req(ddir, sleeper.pid, free_port(), wait_s=0.2, engine="vllm",
                             engine_version="0.32.0", start_offset=0))
    assert out["startup"] == {"phase": "kv_cache", "ended": ["engine_start", "weights"]}
    (rdir / "server.log").rename(rdir / "moved.log")
    rec = phases.op_startup(**dict(deploy_dir=str(ddir), release="r1", pid=sleeper.pid, engine="vllm",
                                 engine_version="0.32.0", log_offset=0))["startup"]
    assert [p["phase"] for p in rec["phases"]] == ["process", "engine_start", "weights", "ready"]
    head = spec_evidence.head_of(watch.startlog.of(str(rdir / "server.log"), 0))
    assert head.seen["runner"] == "v2" and head.seen["runner_line"] == "Using V2 Model Runner"


def test_a_watch_the_client_is_not_in_step_with_reads_the_start_anew(release, sleeper):
    ddir, rdir = release
    (rdir / "server.log").write_text("INFO 12-01 08:00:03 [default_loader.py:501] Loading weights took 0.50 seconds\n"
                                     "INFO 12-01 08:00:04 [x.py:1] more\n")
    first = watch.op_watch(**req(ddir, sleeper.pid, free_port(), wait_s=0.1, engine="vllm", start_offset=0))
    assert first["startup"]["ended"] == ["weights"] and first["log"]["offset"] > 0
    again = watch.op_watch(**req(ddir, sleeper.pid, free_port(), wait_s=0.1, engine="vllm", start_offset=0,
                               log_offset=0))  # an answer the client never got: it asks from 0 again
    assert again["log"]["text"] == first["log"]["text"] and again["startup"]["ended"] == ["weights"]
