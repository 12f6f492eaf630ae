"""Logs, releases, rollback and the deploy lock (issue 3).

Unit tests cover the pure parts (line assembly, UTF-8 across chunk boundaries, the
host's backwards tail, prune, the releases table); the e2e tests run the real `fab`
against real sshd hosts (tests/lab.py) with a tiny `engine = "command"` server.
"""
import base64
import io
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from lab import REPO, wait_for

from tasks.releases import describe_end, previous_release, rows, stamp_time, table_lines
from tasks.hostside import logs as hlogs
from tasks.hostside import releases as hreleases
from tasks.options import TailLogOptions
from tasks.log_lines import LineAssembler, is_fatal, utf8_boundary
from tasks.errors import UsageError

SAMPLE = ("plain line\nünïcödé — 日本語 🚀\nbad \xff\xfe bytes\n".encode("utf-8", "surrogateescape")
          .replace(b"\xc3\xbf\xc3\xbe", b"\xff\xfe") + b"no newline yet")


def reference_lines(data):
    *lines, rest = data.split(b"\n")
    return [l.decode("utf-8", "replace") for l in lines], rest


# -- LineAssembler -----------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(20))
def test_assembler_any_chunking_gives_the_same_lines(seed):
    rnd = random.Random(seed)
    lines, rest = reference_lines(SAMPLE)
    asm, got, i = LineAssembler(), [], 0
    while i < len(SAMPLE):
        n = rnd.randint(1, 7)
        got += asm.feed(SAMPLE[i:i + n])
        i += n
    assert got == lines
    assert asm.flush() == rest.decode()
    assert asm.flush() is None


def test_assembler_every_split_point_of_a_multibyte_character():
    data = "€𝄞é\n".encode()
    for cut in range(1, len(data)):
        asm = LineAssembler()
        assert asm.feed(data[:cut]) == []
        assert asm.feed(data[cut:]) == ["€𝄞é"]


def test_assembler_invalid_utf8_becomes_replacement_chars_and_crlf_is_trimmed():
    asm = LineAssembler()
    assert asm.feed(b"a\xffb\r\nc\xe2\x82\n") == ["a\ufffdb", "c\ufffd"]


def test_assembler_long_partial_line_is_cut_at_a_character_boundary():
    asm = LineAssembler(max_partial=10)
    out = asm.feed("aaaaaaaaa€€".encode())  # the first € straddles byte 10
    assert out == ["aaaaaaaaa"]
    assert asm.feed(b"\n") == ["€€"]
    assert "\ufffd" not in "".join(out)


@pytest.mark.parametrize("text,limit,cut", [
    ("abcdef", 4, 4), ("ab€", 3, 2), ("ab€", 4, 2), ("ab€", 5, 5), ("a𝄞", 2, 1), ("a𝄞", 5, 5),
])
def test_utf8_boundary(text, limit, cut):
    assert utf8_boundary(text.encode(), limit) == cut


def test_is_fatal_uses_logscan_patterns():
    assert is_fatal("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate")
    assert is_fatal("OSError: [Errno 98] Address already in use")
    assert not is_fatal("INFO Loading weights took 3.2 s")


class _Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("stream,multi", [(_Tty(), False), (io.StringIO(), True)])
def test_fatal_lines_are_red_on_a_terminal_only_and_hosts_prefix_with_several(stream, multi):
    from tasks.tail_log import Printer
    from tasks.output import Reporter
    printer = Printer(Reporter(["h1", "h2"], stream=stream), "h1", multi, threading.Event())
    printer.show(["INFO fine", "RuntimeError: Engine core initialization failed. See root cause"])
    out = stream.getvalue().splitlines()
    if multi:
        assert out == ["[h1] INFO fine", "[h1] RuntimeError: Engine core initialization failed. See root cause"]
    else:
        assert out == ["INFO fine", "\x1b[31mRuntimeError: Engine core initialization failed. See root cause\x1b[0m"]


def test_tail_log_options_validate_locally():
    opts = TailLogOptions.from_flags(lines="7", grep="a|b", release=None)
    assert opts.lines == 7 and opts.regex.pattern == "a|b"
    for bad in ({"grep": "("}, {"lines": "-1"}, {"lines": "x"}, {"release": "../x"},
                {"release": "a/b"}, {"release": ".."}):
        with pytest.raises(UsageError):
            TailLogOptions.from_flags(**dict({"lines": 5}, **bad))


# -- host side: backwards tail, offsets, reads ------------------------------------------

@pytest.mark.parametrize("block", [1, 3, 16, 64 * 1024])
def test_last_lines_matches_a_forward_reading(monkeypatch, block):
    monkeypatch.setattr(hlogs, "BLOCK", block)
    rnd = random.Random(block)
    body = b"".join(b"%d %s\n" % (i, b"x" * rnd.randint(0, 40)) for i in range(200)) + b"part"
    f = io.BytesIO(body)
    end = hlogs.line_end(f, len(body))
    assert end == len(body) - 4
    lines = body[:end].split(b"\n")[:-1]
    for n in (0, 1, 5, 199, 200, 500):
        data, clipped = hlogs.last_lines(f, end, n)
        assert data == b"".join(l + b"\n" for l in lines[len(lines) - min(n, 200):]) and not clipped
    odd = lambda l: int(l.split(b" ")[0]) % 2 == 1  # noqa: E731
    data, _ = hlogs.last_lines(f, end, 3, odd)
    assert data.split(b"\n")[:-1] == [l for l in lines if odd(l)][-3:]


def test_last_lines_clips_at_max_bytes(monkeypatch):
    monkeypatch.setattr(hlogs, "BLOCK", 8)
    body = b"".join(b"%03d\n" % i for i in range(100))
    data, clipped = hlogs.last_lines(io.BytesIO(body), len(body), 50, max_bytes=20)
    assert clipped and len(data) <= 20 + 4 and data.endswith(b"099\n")
    big = b"y" * 100 + b"\n"
    data, clipped = hlogs.last_lines(io.BytesIO(big), len(big), 5, max_bytes=30)
    assert clipped and data == b"y" * 29 + b"\n"


def _deployment(tmp_path, names, current):
    ddir = tmp_path / "dep"
    for n in names:
        (ddir / "releases" / n).mkdir(parents=True)
        (ddir / "releases" / n / "launch.py").write_text("")
    if current:
        os.symlink(f"releases/{current}", ddir / "current")
    return str(ddir)


def test_log_tail_and_read_from_offsets(tmp_path):
    ddir = _deployment(tmp_path, ["20250101T000000Z"], "20250101T000000Z")
    log = os.path.join(ddir, "releases", "20250101T000000Z", "server.log")
    with open(log, "wb") as f:
        f.write(b"one\ntwo\nthr")
    r = hlogs.op_log_tail({"deploy_dir": ddir, "lines": 1})
    assert base64.b64decode(r["data"]) == b"two\n" and base64.b64decode(r["partial"]) == b"thr"
    assert r["end"] == 8 and r["release"] == "20250101T000000Z"
    r = hlogs.op_log_read({"deploy_dir": ddir, "release": r["release"], "offset": 8, "wait": 0})
    assert base64.b64decode(r["data"]) == b"thr" and r["offset"] == 11
    r2 = hlogs.op_log_read({"deploy_dir": ddir, "release": r["release"], "offset": 11, "wait": 0.1})
    assert r2["data"] == "" and r2["offset"] == 11
    r3 = hlogs.op_log_read({"deploy_dir": ddir, "release": r["release"], "offset": 99})
    assert r3["truncated"] and base64.b64decode(r3["data"]) == b"one\ntwo\nthr"
    with pytest.raises(hlogs.HostError) as e:
        hlogs.op_log_tail({"deploy_dir": ddir, "release": "20990101T000000Z"})
    assert e.value.kind == "no_release" and e.value.data["available"] == ["20250101T000000Z"]
    with pytest.raises(hlogs.HostError) as e:
        hlogs.op_log_tail({"deploy_dir": ddir, "grep": "("})
    assert e.value.kind == "bad_grep"


NAMES = ["20250101T000000Z", "20250101T000000Z-2", "20250102T000000Z", "20250103T000000Z",
         "20250104T000000Z", "20250105T000000Z"]


@pytest.mark.parametrize("current", [NAMES[0], NAMES[1], NAMES[3], NAMES[5]])
@pytest.mark.parametrize("keep", [1, 2, 3])
def test_prune_never_removes_current_or_the_one_before(tmp_path, current, keep):
    ddir = _deployment(tmp_path, NAMES, current)
    removed = hreleases.prune(ddir, keep)
    left = hreleases.releases_sorted(ddir)
    idx = NAMES.index(current)
    protected = {current, NAMES[max(idx - 1, 0)]}
    assert protected <= set(left)
    assert len(left) == max(keep, len(protected))
    assert removed == [n for n in NAMES if n not in protected][:len(removed)]  # oldest first
    assert sorted(removed + left) == sorted(NAMES)


def test_prune_keeps_newest_n(tmp_path):
    ddir = _deployment(tmp_path, NAMES, NAMES[-1])
    assert hreleases.prune(ddir, 3) == NAMES[:3]
    assert hreleases.releases_sorted(ddir) == NAMES[3:]


# -- releases table and rollback choice --------------------------------------------------

def test_describe_end():
    assert describe_end({"running": True, "pid": 7}) == "running (pid 7)"
    assert describe_end({"exit": {"returncode": 0}}) == "exited 0"
    assert describe_end({"exit": {"returncode": 3}}) == "exited 3"
    assert describe_end({"exit": {"returncode": -15}}) == "killed by SIGTERM"
    assert describe_end({"exit": {"returncode": -9}}) == "killed by SIGKILL"
    assert describe_end({"exit": {"returncode": 1, "stopped": {"by": "fab stop", "pid": 7}}}) \
        == "stopped by fab stop: exited 1"  # however it exited while stopping: not a failure
    assert describe_end({"log_bytes": None}) == "never started"
    assert describe_end({"log_bytes": 10}) == "gone (no exit record)"


def test_previous_release_skips_releases_that_never_ran():
    rel = [{"release": "a", "log_bytes": 5}, {"release": "b", "log_bytes": None},
           {"release": "c", "log_bytes": 1}, {"release": "d", "log_bytes": 1}]
    assert previous_release(rel, "c") == "a"
    assert previous_release(rel, "d") == "c"
    assert previous_release(rel, "a") is None
    assert previous_release(rel, None) is None


def test_rows_and_table():
    listing = {"releases": [
        {"release": "20250101T120000Z", "current": False, "profile_sha256": "ab" * 32,
         "log_bytes": 2048, "exit": {"returncode": -15, "ended_at": "x"}},
        {"release": "20250102T120000Z-2", "current": True, "profile_sha256": None,
         "log_bytes": 5, "running": True, "pid": 9, "started_at": "2025-01-02T12:00:05+00:00"}]}
    recs = rows(listing)
    assert recs[0]["profile_sha"] == "ab" * 6 and recs[0]["started_at"] == stamp_time("20250101T120000Z")
    assert recs[1]["started_at"] == "2025-01-02T12:00:05+00:00" and recs[1]["ended"] == "running (pid 9)"
    lines = table_lines(recs)
    assert lines[1].startswith("   20250101T120000Z") and "killed by SIGTERM" in lines[1]
    assert lines[2].startswith("*  20250102T120000Z-2") and "2025-01-02 12:00:05Z" in lines[2]
    assert "2.0 KiB" in lines[1]


def test_saved_profile_gives_the_old_releases_readiness_settings(tmp_path):
    from tasks.releases import saved_profile
    from tasks.profile import load_profile
    (tmp_path / "helper.sh").write_text("#!/bin/sh\n")
    path = tmp_path / "old.toml"
    path.write_text("[target]\nname = \"d\"\n[server]\nengine = \"vllm\"\nmodel = \"/m\"\n"
                    "port = 9123\nfiles = [\"helper.sh\"]\n[server.args]\nserved-model-name = \"old\"\n"
                    "[server.env]\nTOKEN = { from_env = \"LLMFAB_TEST_TOKEN\" }\n"
                    "[ready]\nhealth_path = \"/ping\"\ntimeout = 77\n")
    old = load_profile(path, environ={"LLMFAB_TEST_TOKEN": "s3cret"})
    (tmp_path / "helper.sh").unlink()  # the local copy may be gone by rollback time
    back = saved_profile(old.resolved_toml, fallback=None)
    assert back is not None and "s3cret" not in old.resolved_toml
    assert (back.server.port, back.served_name, back.ready.health_path, back.ready.timeout) == \
        (9123, "old", "/ping", 77)
    assert saved_profile("not = [toml", fallback="F") == "F" and saved_profile(None, "F") == "F"


# -- end to end, against real sshd hosts (tests/lab.py) ----------------------------------
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


def test_previous_release_skips_one_that_failed_to_start():
    rels = [{"release": "r1", "log_bytes": 10}, {"release": "r2", "log_bytes": 10,
             "start_failed": {"rule": "cuda-oom"}}, {"release": "r3", "log_bytes": 10}]
    assert previous_release(rels, "r3") == "r1"
    assert describe_end(rels[1]) == "failed to start (cuda-oom)"


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
