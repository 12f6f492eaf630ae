"""Logs, releases, rollback and the deploy lock against real sshd hosts (tests/hostlab.py), with a tiny `engine = "command"` server."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
import pytest
from hostlab import REPO, wait_for


# -- end to end, against real sshd hosts (tests/hostlab.py) ----------------------------------
HOST_PYTHON = "/usr/bin/python3"


# A tiny `engine = "command"` server. Every byte it puts on stdout (server.log) it also
# appends to wrote.bin beside it, so a test can compare the two byte for byte; it
# records each run's argv in received.jsonl. Its output mixes invalid UTF-8, multi-byte
# characters, lines written in two pieces and numbered lines.
SERVER = r'''
import argparse, json, os, signal, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ap = argparse.ArgumentParser()
for flag, kind in (("--tag", str), ("--port", int), ("--lines", int), ("--interval", float),
                   ("--ready-after", float)):
    ap.add_argument(flag, type=kind, default=kind())
ap.add_argument("--ignore-term", action="store_true")
a = ap.parse_args()
with open("received.jsonl", "a") as f:
    f.write(json.dumps({"argv": sys.argv, "pid": os.getpid()}) + "\n")
wrote = open("wrote.bin", "ab")
term = []
signal.signal(signal.SIGTERM, lambda *_: term.append(1))

def out(data):
    os.write(1, data)
    wrote.write(data)
    wrote.flush()

t0 = time.monotonic()

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        ok = time.monotonic() - t0 >= a.ready_after
        self.send_response(200 if ok else 503)
        self.end_headers()
    def log_message(self, *args):
        pass

srv = ThreadingHTTPServer(("127.0.0.1", a.port), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()

def check_term():
    if not term:
        return
    term.clear()
    out(b"got TERM\n")
    if not a.ignore_term:
        out(b"bye without newline")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

out(b"start " + a.tag.encode() + b"\n")
out(b"bad bytes \xff\xfe and \xc3\x28 end\n")
out("multi-byte \u00fcn\u00efc\u00f6d\u00e9 \u65e5\u672c \U0001F680\n".encode())
out(b"half a li")
time.sleep(0.05)
out(b"ne\n")
for i in range(1, a.lines + 1):
    line = b"n %06d\n" % i
    if i % 5 == 0:  # a line in two writes: the follower must hold the first piece
        out(line[:4])
        time.sleep(a.interval / 2)
        out(line[4:])
    else:
        out(line)
    time.sleep(a.interval)
    check_term()
out(b"done " + a.tag.encode() + b"\n")
while True:
    time.sleep(0.02)
    check_term()
'''


@pytest.fixture(scope="module")
def server_script(lab):
    path = Path(lab.root) / "logs_releases_server.py"
    path.write_text(SERVER)
    return path


def profile(lab, script, name, host, port, tag, *, lines=10, interval=0.0, ready_after=0.0,
            ignore_term=False):
    cmd = [HOST_PYTHON, str(script), "--tag", tag, "--port", str(port), "--lines", str(lines),
           "--interval", str(interval), "--ready-after", str(ready_after)]
    cmd += ["--ignore-term"] if ignore_term else []
    text = "\n".join([
        "[target]", f'hosts = ["{host}"]', f'name = "{name}"',
        "[server]", 'engine = "command"', f'python = "{HOST_PYTHON}"', f"command = {json.dumps(cmd)}",
        'host = "127.0.0.1"', f"port = {port}",
        "[ready]", "timeout = 60", "poll_interval = 0.2", 'models_path = ""', ""])
    path = Path(lab.root) / f"{name}-{tag}.toml"
    path.write_text(text)
    return path


def fab(lab, *args, profile, code=0):
    r = lab.fab(*args, profile=profile, timeout=180)
    assert r.returncode == code, f"fab {' '.join(args)} exited {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


class Running:
    """`fab ...` in the background; its stdout lines gathered as they come."""

    def __init__(self, lab, *args, profile):
        argv = [sys.executable, "-m", "fabric", "-S", str(lab.ssh_config), *map(str, args),
                "--profile", str(profile)]
        self.proc = subprocess.Popen(argv, cwd=str(REPO), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.lines, self.err = [], b""
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()
        self._e = threading.Thread(target=self._read_err, daemon=True)
        self._e.start()

    def _read(self):
        for raw in self.proc.stdout:
            self.lines.append(raw.decode("utf-8", "surrogateescape").rstrip("\n"))

    def _read_err(self):
        self.err = self.proc.stderr.read()

    def finish(self, timeout=30):
        code = self.proc.wait(timeout)
        self._t.join(5)
        self._e.join(5)
        return code


def deployment(lab, host, name):
    return Path(lab.home(host)) / "llmfab" / name


def release_dirs(lab, host, name):
    return sorted((deployment(lab, host, name) / "releases").iterdir())


@pytest.mark.e2e
def test_two_deploys_keep_both_logs_byte_identical(lab, server_script):
    p1 = profile(lab, server_script, "bytes", "h1", 8301, "one", lines=30)
    p2 = profile(lab, server_script, "bytes", "h1", 8301, "two", lines=30)
    fab(lab, "deploy", profile=p1)
    fab(lab, "deploy", profile=p2)
    fab(lab, "stop", "--grace", "10", profile=p2)
    first, second = release_dirs(lab, "h1", "bytes")
    for rel in (first, second):
        log = (rel / "server.log").read_bytes()
        assert log == (rel / "wrote.bin").read_bytes()
        assert b"bad bytes \xff\xfe and \xc3\x28 end\n" in log and log.endswith(b"bye without newline")
    listing = json.loads(fab(lab, "releases", "--json", profile=p2).stdout)
    assert [r["release"] for r in listing["releases"]] == [first.name, second.name]
    assert listing["current"] == second.name and listing["releases"][1]["current"]
    # Both were stopped on purpose (stopped.json in each release), by whom is said.
    assert [r["ended"] for r in listing["releases"]] == [
        "stopped by fab deploy (a new release replaces it): killed by SIGTERM",
        "stopped by fab stop: killed by SIGTERM"]
    assert listing["releases"][0]["log_bytes"] == (first / "server.log").stat().st_size
    assert listing["releases"][0]["profile_sha"] != listing["releases"][1]["profile_sha"]
    kept = fab(lab, "releases", "--keep", "1", profile=p2).stdout  # current + the one before
    assert "pruned 0 release(s)" in kept and len(release_dirs(lab, "h1", "bytes")) == 2

    out = fab(lab, "tail-log", "--release", first.name, "--lines", "200", profile=p2).stdout
    lines = out.splitlines()
    assert lines[0] == "start one" and lines[1] == "bad bytes \ufffd\ufffd and \ufffd( end"
    assert lines[2] == "multi-byte \u00fcn\u00efc\u00f6d\u00e9 \u65e5\u672c \U0001F680"
    assert lines[3] == "half a line" and lines[-1] == "bye without newline"
    assert [l for l in lines if l.startswith("n ")] == ["n %06d" % i for i in range(1, 31)]
    grep = fab(lab, "tail-log", "--grep", r"^n 00001\d$", "--lines", "3", profile=p2).stdout
    assert grep.splitlines() == ["n 000017", "n 000018", "n 000019"]
    bad = fab(lab, "tail-log", "--grep", "(", profile=p2, code=2)
    assert "--grep" in bad.stderr and "regular expression" in bad.stderr
    missing = fab(lab, "tail-log", "--release", "20000101T000000Z", profile=p2, code=1)
    assert first.name in missing.stdout and second.name in missing.stdout


@pytest.mark.e2e
def test_follow_across_killed_sessions_shows_each_line_once_in_order(lab, server_script):
    total = 1500
    prof = profile(lab, server_script, "follow", "h2", 8302, "f", lines=total, interval=0.005)
    fab(lab, "deploy", profile=prof)
    try:
        tail = Running(lab, "tail-log", "--follow", "--lines", "100000", profile=prof)
        numbered = lambda: [l for l in tail.lines if l.startswith("n ")]  # noqa: E731
        wait_for(lambda: numbered(), 30, "the first numbered lines")
        start = len(numbered())
        kills = 0
        for more in (100, 400):
            wait_for(lambda: len(numbered()) >= start + more, 60, f"{more} more lines")
            assert "done f" not in tail.lines, "the server finished before the disconnect"
            lab.kill_sessions("h2")
            kills += 1
        wait_for(lambda: "done f" in tail.lines, 120, "the last line")
        tail.proc.send_signal(signal.SIGINT)
        assert tail.finish() == 0, tail.err.decode(errors="replace")
        assert numbered() == ["n %06d" % i for i in range(1, total + 1)]
        assert tail.lines.count("half a line") == 1
        assert tail.err.count(b"reconnected; resuming at byte") == kills
    finally:
        fab(lab, "stop", "--grace", "5", profile=prof)


@pytest.mark.e2e
def test_two_deploys_at_once_exactly_one_proceeds(lab, server_script):
    prof = profile(lab, server_script, "race", "h3", 8303, "r", ready_after=3)
    a = Running(lab, "deploy", profile=prof)
    b = Running(lab, "deploy", profile=prof)
    codes = [a.finish(120), b.finish(120)]
    assert sorted(codes) == [0, 1], (a.lines, b.lines)
    loser = (a, b)[codes.index(1)]
    text = "\n".join(loser.lines)
    assert "is locked by root@" in text and "since 20" in text and "agent pid" in text, text
    assert not any("launched" in l or "preflight" in l for l in loser.lines)
    rels = release_dirs(lab, "h3", "race")
    assert len(rels) == 1  # the loser created nothing
    dep = deployment(lab, "h3", "race")
    assert os.readlink(dep / "current") == f"releases/{rels[0].name}"
    assert json.loads((dep / "server.json").read_text())["release"] == rels[0].name
    fab(lab, "stop", "--grace", "5", profile=prof)  # the lock is free again


@pytest.mark.e2e
def test_rollback_relaunches_the_previous_release_with_its_own_argv(lab, server_script):
    old = profile(lab, server_script, "rb", "h1", 8304, "old")
    new = profile(lab, server_script, "rb", "h1", 8305, "new")
    fab(lab, "deploy", profile=old)
    fab(lab, "deploy", profile=new)
    first, second = release_dirs(lab, "h1", "rb")
    before = (first / "server.log").read_bytes()
    r = fab(lab, "rollback", profile=new)
    assert f"rolling back from {second.name} to {first.name}" in r.stdout and "ready in" in r.stdout
    assert "note:" not in r.stdout  # readiness came from the old release's own profile.toml
    dep = deployment(lab, "h1", "rb")
    assert os.readlink(dep / "current") == f"releases/{first.name}"
    runs = [json.loads(l) for l in (first / "received.jsonl").read_text().splitlines()]
    assert len(runs) == 2 and runs[0]["argv"] == runs[1]["argv"]
    assert runs[1]["argv"] == [str(server_script), "--tag", "old", "--port", "8304", "--lines",
                                   "10", "--interval", "0.0", "--ready-after", "0.0"]
    log = (first / "server.log").read_bytes()
    assert log.startswith(before) and log == (first / "wrote.bin").read_bytes()
    assert log.count(b"start old\n") == 2
    st = json.loads(fab(lab, "status", "--json", profile=new).stdout)
    assert st["running"] and st["release"] == first.name and st["port"] == 8304 and st["health"] == 200
    ended = {r["release"]: r["ended"] for r in
             json.loads(fab(lab, "releases", "--json", profile=new).stdout)["releases"]}
    assert ended[second.name] == "stopped by fab rollback: killed by SIGTERM" and ended[first.name].startswith("running")
    again = fab(lab, "rollback", profile=new, code=1)
    assert f"no release before {first.name}" in again.stdout
    fab(lab, "stop", "--grace", "5", profile=new)


@pytest.mark.e2e
def test_a_killed_deploy_or_stop_never_leaves_the_lock_held(lab, server_script):
    slow = profile(lab, server_script, "stale", "h2", 8306, "slow", ready_after=600)
    stubborn = profile(lab, server_script, "stale", "h2", 8306, "stubborn", ignore_term=True)
    dep = deployment(lab, "h2", "stale")
    # kill -9 the client while deploy waits for readiness
    run = Running(lab, "deploy", profile=slow)
    wait_for(lambda: any("launched release" in l for l in run.lines), 60, "the launch")
    run.proc.kill()
    run.finish()
    t0 = time.monotonic()
    r = fab(lab, "deploy", profile=stubborn)  # stops the slow one first: the lock was free
    assert "locked" not in r.stdout
    # kill -9 the client in the middle of a stop's grace period
    run = Running(lab, "stop", "--grace", "120", profile=stubborn)
    current = dep / "current" / "server.log"
    wait_for(lambda: b"got TERM" in current.read_bytes(), 60, "the stop to send SIGTERM")
    run.proc.kill()
    run.finish()
    t1 = time.monotonic()
    r = fab(lab, "stop", "--grace", "1", profile=stubborn)
    assert "locked" not in r.stdout and "killed" in r.stdout
    assert time.monotonic() - t1 < 60 and t1 > t0


def test_rollback_never_goes_back_to_a_release_that_failed_to_start(lab):
    # r1 good, r2 fails at start (its deploy marks it), r3 good: rollback from r3 is to r1.
    from helpers import fab, server_record, vllm_profile
    host, name = "h2", "rb-skip-failed"
    good = vllm_profile(lab, name, host, 31021)
    fab(lab, "deploy", profile=good)
    r1 = server_record(lab, host, name)["release"]
    bad = vllm_profile(lab, name, host, 31021, {"STANDIN_FAIL": "oom"})
    fab(lab, "deploy", profile=bad, code=1)
    listing = json.loads(fab(lab, "releases", "--json", profile=bad).stdout)["releases"]
    r2 = listing[-1]
    assert r2["release"] != r1 and r2["ended"] == "failed to start (cuda-oom)", listing
    good = vllm_profile(lab, name, host, 31021, {"STANDIN_TAG": "r3"})
    fab(lab, "deploy", profile=good)
    try:
        r = fab(lab, "rollback", profile=good)
        assert f"to {r1}" in r.stdout, r.stdout
        assert server_record(lab, host, name)["release"] == r1
    finally:
        fab(lab, "stop", "--grace", "5", profile=good)
