"""When the user does the unexpected: what deploy, rollback, stop and Ctrl-C leave on the hosts.

Real `fab` against the lab's real sshd hosts, with a tiny `engine = "command"` server that
starts in milliseconds. Its readiness is a gate file on the host: /health answers 503 until
the test creates it, so a deploy can be held in its wait for as long as a test needs (no
sleeps: every step waits on something the host shows). One test per class of surprise:

- every way a launch can fail leaves a failure record (releases, status, rollback read it);
- a plain deploy whose new release fails puts the previous one back (unless --no-restore);
- Ctrl-C at each step leaves each host on its old release, its new one, or stopped, and the
  last lines say which and how to restore it (docs/guarantees.md's table);
- secrets are read only by tasks that launch; stop and kill-gpu-procs are never refused by
  a deploy's lock; a recycled pid is not our server; read-only tasks create nothing.
"""
import json
import os
import signal
import time

import pytest

from helpers import HOST_PYTHON, Background, deployment, fab, flat, host_pid_alive, server_record, write_profile
from hostlab import wait_for

pytestmark = pytest.mark.e2e

# argv: PORT GATE [TERM_GATE]. /health and /v1/models answer 200 once GATE exists ("" = at
# once), 503 before. On SIGTERM it prints "got TERM" and, with TERM_GATE, exits only once that
# file exists: a stop is held in flight for as long as a test needs.
SERVER = """
import http.server, os, signal, sys, threading, time
port, gate = int(sys.argv[1]), sys.argv[2]
term_gate = sys.argv[3] if len(sys.argv) > 3 else ""
term = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: term.set())
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = not gate or os.path.exists(gate)
        body = b'{"object": "list", "data": [{"id": "tiny"}]}'
        self.send_response(200 if ok else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
print("serving on", port, flush=True)
term.wait()
print("got TERM", flush=True)
while term_gate and not os.path.exists(term_gate):
    time.sleep(0.05)
"""


def toml_list(items):
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def profile(lab, name, host, port, *, command=None, gate="", term_gate="", tag="", lines=(), env=(),
            python=None):
    """A command server on `host`: ready at once, or once /tmp/GATE exists on the host; with
    TERM_GATE, a SIGTERM ends it only once /tmp/TERM_GATE exists."""
    command = command or ([HOST_PYTHON, "-c", SERVER, str(port), f"/tmp/{gate}" if gate else ""]
                          + ([f"/tmp/{term_gate}"] if term_gate else []))
    body = ["[target]", f'hosts = ["{host}"]', f'name = "{name}"', "keep_releases = 20",
            "[server]", 'engine = "command"', f"command = {toml_list(command)}",
            f'python = "{python or HOST_PYTHON}"', 'host = "127.0.0.1"', f"port = {port}",
            "[server.env]", f'UNEXPECTED_TAG = "{tag}"', *env, "[ready]", "timeout = 60", "poll_interval = 0.2", *lines]
    return write_profile(lab, f"{name}{'-' + tag if tag else ''}", body)


def records(r):
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def listing(lab, prof):
    return records(fab(lab, "releases", "--json", profile=prof))[0]["releases"]


def status_json(lab, prof, code):
    return records(fab(lab, "status", "--json", profile=prof, code=code))[0]


def stop(lab, prof):
    lab.fab("stop", "--grace", "2", profile=prof, timeout=120)


# -- A: every way a launch can fail leaves a failure record --------------------------------

def orphan_script(lab, host):
    """A script that is there and executable (the preflight finds it) but whose #! interpreter
    is not: ENOENT at exec. Its path on the host."""
    orphan = lab.tmp(host) / "unexpected-orphan-script"
    orphan.write_text("#!/nonexistent/interpreter\n")
    orphan.chmod(0o755)
    return "/tmp/unexpected-orphan-script"


def launch_failures(lab, host):
    """(kind, command, python, what the failure names) for each way a launch can fail."""
    noexec = lab.tmp(host) / "unexpected-noexec.py"
    noexec.write_text("print('never runs')\n")
    noexec.chmod(0o644)
    dies = lab.tmp(host) / "unexpected-dying-python"
    # runs the agent and the preflight as python3, but dies by SIGKILL running launch.py
    # (launch.py runs as `python -I -S launch.py`: look at every argument)
    dies.write_text('#!/bin/sh\nfor a in "$@"; do case "$a" in */launch.py) kill -9 $$;; esac; done\n'
                    f'exec {HOST_PYTHON} "$@"\n')
    dies.chmod(0o755)
    big = ["x" * 120_000] * 20  # 2.4 MB of argv: more than the kernel's ARG_MAX (2 MB at 8 MB stack)
    return [
        ("eacces", ["/tmp/unexpected-noexec.py"], None, "permission denied"),
        ("enoent", [orphan_script(lab, host)], None, "does not exist"),
        ("e2big", [HOST_PYTHON, "-c", "pass"] + big, None, "too long"),
        ("launcher-dies", None, "/tmp/unexpected-dying-python", "SIGKILL"),
        ("engine-exits", [HOST_PYTHON, "-c", "import sys; print('bad config'); sys.exit(3)"], None,
         "exited with status 3"),
    ]


def test_every_way_a_launch_fails_is_recorded_and_rollback_never_picks_it(lab):
    host, name, port = "h1", "unexp-launch", 31501
    good = profile(lab, name, host, port, tag="good")
    fab(lab, "deploy", profile=good)
    first = server_record(lab, host, name)["release"]
    try:
        for kind, command, python, why in launch_failures(lab, host):
            bad = profile(lab, name, host, port, command=command, python=python, tag=kind)
            r = fab(lab, "deploy", "--no-restore", profile=bad, code=1)
            assert why in flat(r.stdout).lower() or why in flat(r.stdout), (kind, r.stdout)
            rel = listing(lab, bad)[-1]
            assert rel["release"] != first and rel["ended"].startswith("failed to start"), (kind, rel)
            assert rel["failed"]["cause"], (kind, rel)
            st = status_json(lab, bad, 1)
            assert st["state"] == "failed" and st["fatal"]["rule"] and st["fatal"]["cause"], (kind, st)
            human = flat(fab(lab, "status", profile=bad, code=1).stdout)
            assert f"last deploy failed: {st['fatal']['cause']}" in human, (kind, human)
            assert "not deployed" not in human
            # rollback from a failed release: to the newest earlier one that started
            r = fab(lab, "rollback", profile=bad)
            assert f"to {first}" in r.stdout, (kind, r.stdout)
            assert server_record(lab, host, name)["release"] == first
        # a good release after all the failed ones: rollback skips every failed one
        fab(lab, "deploy", profile=profile(lab, name, host, port, tag="third"))
        r = fab(lab, "rollback", profile=good)
        assert f"to {first}" in r.stdout, r.stdout
        assert server_record(lab, host, name)["release"] == first
    finally:
        stop(lab, good)


def test_rollback_with_no_earlier_release_that_started_exits_1_changing_nothing(lab):
    host, name, port = "h2", "unexp-nothing-earlier", 31502
    bad = profile(lab, name, host, port, command=[orphan_script(lab, host)], tag="bad")
    fab(lab, "deploy", profile=bad, code=1)
    good = profile(lab, name, host, port, tag="good")
    fab(lab, "deploy", profile=good)
    try:
        before = server_record(lab, host, name)
        r = fab(lab, "rollback", profile=good, code=1)
        assert "nothing was changed" in r.stdout, r.stdout
        assert server_record(lab, host, name) == before and host_pid_alive(lab, host, before["pid"])
    finally:
        stop(lab, good)


def test_a_command_server_on_another_port_fails_in_seconds_naming_both_ports(lab):
    """`[server] port` 31512, the command binds 31612: the wait sees the server's process tree
    answer /health on 31612 while nothing listens on 31512, and fails long before [ready]
    timeout (60 s) naming both ports and the key; the release is recorded failed, stopped."""
    host, name, port, other = "h2", "unexp-wrong-port", 31512, 31612
    prof = profile(lab, name, host, port, command=[HOST_PYTHON, "-c", SERVER, str(other), ""])
    t0 = time.monotonic()
    try:
        r = fab(lab, "deploy", profile=prof, code=1)
        took = time.monotonic() - t0
        out = flat(r.stdout)
        assert f"answers on port {other}, but [server] port is {port}" in out, out
        assert f"set [server] port = {other}" in out and took < 30, (took, out)
        st = status_json(lab, prof, 1)
        assert st["state"] == "failed" and st["fatal"]["rule"] == "wrong-port", st
        assert listing(lab, prof)[-1]["ended"].startswith("failed to start")
        probe = f"import socket; socket.create_connection(('127.0.0.1', {other}), 2)"
        assert lab.exec(host, [HOST_PYTHON, "-c", probe], capture_output=True).returncode != 0  # stopped
    finally:
        stop(lab, prof)


# -- D: secrets are read only by tasks that launch ---------------------------------------

def test_only_tasks_that_launch_need_the_secrets(lab):
    host, name, port = "h3", "unexp-secret", 31503
    env = ['API_TOKEN = { from_env = "UNEXPECTED_TOKEN" }']
    prof = profile(lab, name, host, port, env=env)
    fab(lab, "deploy", profile=prof, env={"UNEXPECTED_TOKEN": "s3cret"})
    unset = {k: v for k, v in os.environ.items() if k != "UNEXPECTED_TOKEN"}
    try:
        assert "UNEXPECTED_TOKEN" not in os.environ
        fab(lab, "status", profile=prof)
        fab(lab, "releases", profile=prof)
        fab(lab, "tail-log", profile=prof)
        r = fab(lab, "check", profile=prof)
        assert "WARN" in r.stdout and "UNEXPECTED_TOKEN" in r.stdout, r.stdout
        r = fab(lab, "deploy", profile=prof, code=2)
        assert "UNEXPECTED_TOKEN" in r.stdout + r.stderr
        r = fab(lab, "stop", "--grace", "2", profile=prof)
        assert "stopped release" in r.stdout, r.stdout
    finally:
        del unset
        stop(lab, prof)


# -- F: one reader of "is this our process"; read-only tasks create nothing ------------------

def test_status_does_not_trust_a_pid_that_stop_rejects(lab):
    host, name, port = "h3", "unexp-recycled", 31504
    prof = profile(lab, name, host, port)
    fab(lab, "deploy", profile=prof)
    fab(lab, "stop", "--grace", "2", profile=prof)
    # the kernel gives the server's pid to someone else: here, an unrelated sleeper's pid
    stranger = lab.exec(host, ["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 & echo $!"],
                        capture_output=True, text=True, check=True).stdout.strip()
    path = deployment(lab, host, name) / "server.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps(dict(record, pid=int(stranger))))
    try:
        st = status_json(lab, prof, 1)
        assert st["running"] is False, st
        r = fab(lab, "stop", profile=prof)
        assert "nothing to stop" in r.stdout, r.stdout
        assert host_pid_alive(lab, host, int(stranger))
        rel = listing(lab, prof)[-1]
        assert rel["running"] is False, rel
    finally:
        lab.exec(host, ["kill", "-9", stranger])


DAMAGE = {"truncated": b'{"pid": 12', "a list": b"[1]", "not UTF-8": b"\xff\xfe", "empty": b""}


def test_a_damaged_state_file_is_named_never_read_as_absent(lab):
    """server.json (and every state file llmfab writes: exit.json, supervisor.json, ...) that
    is there but not the JSON object llmfab wrote is an error naming the file, for every task
    that reads it: never "not deployed" while the server runs (a truncated file did that),
    never a traceback (a list did that: AttributeError). Moved aside, stop ends the server by
    its identity."""
    host, name, port = "h3", "unexp-damaged", 31506
    prof = profile(lab, name, host, port)
    fab(lab, "deploy", profile=prof)
    path = deployment(lab, host, name) / "server.json"
    good = path.read_bytes()
    pid = json.loads(good)["pid"]
    try:
        for what, data in DAMAGE.items():
            path.write_bytes(data)
            # every task that reads it, for one kind of damage; status for the others
            for task in ("status", "stop", "deploy", "releases", "rollback") if what == "truncated" else ("status",):
                r = lab.fab(task, profile=prof, timeout=120)
                out = flat(r.stdout + r.stderr)
                assert r.returncode == 1, (what, task, out)
                assert f"{path.name} is damaged" in out and "move it aside" in out, (what, task, out)
                assert "Traceback" not in out and "Error:" not in out, (what, task, out)
                assert host_pid_alive(lab, host, pid), (what, task)
            assert path.read_bytes() == data  # nothing was changed
        path.rename(path.with_name("server.json.damaged"))
        r = fab(lab, "stop", "--grace", "2", profile=prof)
        assert "stopped this deployment's processes (no server.json names a release)" in flat(r.stdout), r.stdout
        wait_for(lambda: not host_pid_alive(lab, host, pid), 10, "the server to be stopped")
    finally:
        if path.with_name("server.json.damaged").exists():
            path.with_name("server.json.damaged").unlink()
        if not path.exists():
            path.write_bytes(good)
        stop(lab, prof)


def test_a_read_only_workdir_fails_the_preflight_in_words(lab):
    """target.workdir on a read-only file system: check FAILs naming it (it once said all OK),
    and deploy stops there, nothing launched (it once ended in `OSError: [Errno 30]`)."""
    host = "h2"
    (lab.home(host) / "rofs").mkdir(exist_ok=True)
    lab.exec(host, ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", "/root/rofs"], check=True)
    try:
        prof = write_profile(lab, "unexp-rofs", [
            "[target]", f'hosts = ["{host}"]', 'name = "unexp-rofs"', 'workdir = "/root/rofs/llmfab"',
            "[server]", 'engine = "command"', f"command = {toml_list([HOST_PYTHON, '-c', SERVER, '31507', ''])}",
            f'python = "{HOST_PYTHON}"', 'host = "127.0.0.1"', "port = 31507"])
        r = lab.fab("check", profile=prof, timeout=120)
        text = flat(r.stdout + r.stderr)
        assert r.returncode == 1 and ("FAIL disk /root/rofs/llmfab/unexp-rofs (the deployment's directory under "
                                      "target.workdir): /root/rofs is on a read-only file system" in text), text
        r = lab.fab("deploy", profile=prof, timeout=120)
        text = flat(r.stdout + r.stderr)
        assert r.returncode == 1 and ("cannot take the deployment's lock /root/rofs/llmfab/unexp-rofs/.lock: "
                                      "/root/rofs is on a read-only file system" in text), text
        for r in (lab.fab("check", profile=prof, timeout=120), r):
            assert "Errno" not in r.stdout + r.stderr and "Traceback" not in r.stdout + r.stderr
    finally:
        lab.exec(host, ["umount", "/root/rofs"], check=True)


def tree(root):
    """Every path under root, but the agent's code cache (~/.cache/llmfab: every task has it)."""
    out = set()
    for base, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".cache"]
        out.update(os.path.join(base, n) for n in dirs + files)
    return out


def test_read_only_tasks_create_nothing_on_a_host_with_no_deployment(lab):
    host, name, port = "h2", "unexp-readonly", 31505
    prof = profile(lab, name, host, port)
    home = lab.home(host)
    before = tree(home)
    for task, code in (("status", 1), ("releases", 0), ("tail-log", 1), ("check", 0),
                       ("bench", 1), ("targets", 0), ("stop", 0), ("rollback", 1),
                       ("releases --keep 2", 0)):
        r = lab.fab(*task.split(), profile=prof, timeout=120)
        assert r.returncode == code, (task, r.stdout, r.stderr)
        made = sorted(tree(home) - before)
        assert not made, (task, made)
    assert not deployment(lab, host, name).exists()


# -- B: a plain deploy whose new release fails puts the previous one back -------------------

def test_a_failed_plain_deploy_puts_the_stopped_release_back(lab):
    host, name, port = "h2", "unexp-restore", 31506
    good = profile(lab, name, host, port, tag="good")
    fab(lab, "deploy", profile=good)
    first = server_record(lab, host, name)
    try:
        for kind, command in (("cannot-exec", [orphan_script(lab, host)]),
                              ("exits", [HOST_PYTHON, "-c", "import sys; sys.exit(3)"])):
            bad = profile(lab, name, host, port, command=command, tag=kind)
            r = fab(lab, "deploy", "--json", profile=bad, code=1)
            out = flat(r.stderr)
            assert "server failed:" in out and f"put back release {first['release']}" in out, (kind, out)
            rec = json.loads(r.stdout)  # the failed release's record, then what was put back
            assert rec["ok"] is False and rec["release"] != first["release"], rec
            assert set(rec["fatal"]) == {"rule", "line", "cause", "fix"}, rec
            now = server_record(lab, host, name)
            assert rec["restored"] == {"release": first["release"], "pid": now["pid"]}, rec
            assert now["release"] == first["release"] and now["pid"] != first["pid"], (kind, now)
            assert host_pid_alive(lab, host, now["pid"]), kind
            st = status_json(lab, bad, 0)
            assert st["state"] == "running" and st["last_failed"]["release"] != first["release"], st
    finally:
        stop(lab, good)


# -- E: stop is never refused by a deploy's lock ----------------------------------------------

def test_stop_ends_a_deploy_waiting_for_readiness_which_says_so_and_exits_1(lab):
    host, name, port = "h3", "unexp-preempt", 31507
    good = profile(lab, name, host, port, tag="good")
    fab(lab, "deploy", profile=good)
    first = server_record(lab, host, name)["release"]
    (lab.tmp(host) / "unexp-preempt-gate").unlink(missing_ok=True)
    slow = profile(lab, name, host, port, gate="unexp-preempt-gate", tag="slow")
    run = Background(lab, "deploy", profile=slow)
    try:
        run.wait_line("launched release")
        lock = deployment(lab, host, name) / ".lock"
        wait_for(lambda: json.loads(lock.read_text() or "{}").get("phase") == "waiting", 30,
                 "the deploy to be waiting for readiness")
        t0 = time.monotonic()
        r = fab(lab, "stop", "--grace", "2", profile=slow)
        assert time.monotonic() - t0 < 30
        assert "locked" not in r.stdout and "stopped release" in r.stdout, r.stdout
        assert "that waited for readiness" in r.stdout, r.stdout
        assert run.finish(60) == 1, run.text
        text = flat(run.text)
        assert "was stopped by fab stop" in text and "while this deploy waited" in text, text
        assert "putting back" not in text and "Traceback" not in text, text
        rel = listing(lab, slow)[-1]
        assert rel["release"] != first and rel["ended"].startswith("stopped by fab stop"), rel
        assert not rel["failed"], rel
        st = status_json(lab, slow, 1)
        assert st["running"] is False and st["state"] == "stopped", st
    finally:
        run.close()
        stop(lab, good)


# -- C: Ctrl-C at each step leaves each host on its old release, its new one, or stopped ----

def interrupted(run):
    """SIGINT to a running fab; its exit status and its last line (where the host is)."""
    run.proc.send_signal(signal.SIGINT)
    code = run.finish(60)
    lines = [line for line in run.out if line.strip()]
    return code, flat(lines[-1]) if lines else ""


def sigint_while_changing(run, gate):
    """Ctrl-C while a stop is held in flight; once fab says it waits for it, let the stop end."""
    run.proc.send_signal(signal.SIGINT)
    wait_for(lambda: any("waiting for the step in flight" in line for line in run.err), 30,
             f"fab to wait for the stop in flight ({run.text[-500:]})")
    gate.write_text("")


def restore_command(line):
    """The `fab ...` a last line names, as argv."""
    cmd = line.split("`")[1].split()
    assert cmd[0] == "fab", line
    return cmd[1:-2], cmd[-1]  # task and flags, the profile


def test_ctrl_c_while_deploy_stops_the_old_release_leaves_it_stopped_and_says_how_to_restore(lab):
    host, name, port = "h1", "unexp-sigint-stop", 31508
    gate = lab.tmp(host) / "unexp-sigint-stop-term"
    gate.unlink(missing_ok=True)
    old = profile(lab, name, host, port, term_gate=gate.name, tag="old")
    fab(lab, "deploy", profile=old)
    first = server_record(lab, host, name)
    new = profile(lab, name, host, port, tag="new")
    run = Background(lab, "deploy", profile=new)
    try:
        log = deployment(lab, host, name) / "releases" / first["release"] / "server.log"
        wait_for(lambda: b"got TERM" in log.read_bytes(), 60, "the deploy to be stopping the old release")
        sigint_while_changing(run, gate)  # the stop in flight ends: the client waited for it
        code = run.finish(60)
        lines = [line for line in run.out if line.strip()]
        last = flat(lines[-1])
        assert code == 130, run.text
        assert f"stopped: release {first['release']} was stopped and" in last, run.text
        assert "was not launched" in last and "Traceback" not in run.text
        assert not host_pid_alive(lab, host, first["pid"])
        assert server_record(lab, host, name)["release"] == first["release"]  # nothing new launched
        task, prof = restore_command(last)
        assert task == ["rollback", "--release", first["release"]], last
        fab(lab, *task, profile=prof)
        now = server_record(lab, host, name)
        assert now["release"] == first["release"] and host_pid_alive(lab, host, now["pid"])
        # nothing is left locked: a deploy goes ahead at once
        gate.write_text("")
        fab(lab, "deploy", profile=new)
    finally:
        run.close()
        gate.write_text("")
        stop(lab, new)


def test_ctrl_c_during_the_wait_leaves_the_new_release_and_names_the_way_back(lab):
    host, name, port = "h2", "unexp-sigint-wait", 31509
    old = profile(lab, name, host, port, tag="old")
    fab(lab, "deploy", profile=old)
    first = server_record(lab, host, name)["release"]
    (lab.tmp(host) / "unexp-sigint-wait-gate").unlink(missing_ok=True)
    new = profile(lab, name, host, port, gate="unexp-sigint-wait-gate", tag="new")
    run = Background(lab, "deploy", profile=new)
    try:
        run.wait_line("launched release")
        code, last = interrupted(run)
        now = server_record(lab, host, name)
        assert code == 130 and now["release"] != first, run.text
        assert f"release {now['release']} (pid {now['pid']}) keeps running" in last, last
        assert host_pid_alive(lab, host, now["pid"])
        task, prof = restore_command(last)
        assert task == ["rollback", "--release", first], last
        fab(lab, *task, profile=prof)
        assert server_record(lab, host, name)["release"] == first
    finally:
        run.close()
        stop(lab, old)


def test_ctrl_c_while_stop_or_rollback_stops_says_stopped_and_how_to_restore(lab):
    host, name, port = "h3", "unexp-sigint-others", 31510
    gate = lab.tmp(host) / "unexp-sigint-others-term"
    a = profile(lab, name, host, port, term_gate=gate.name, tag="a")
    b = profile(lab, name, host, port, term_gate=gate.name, tag="b")
    gate.write_text("")
    fab(lab, "deploy", profile=a)
    fab(lab, "deploy", profile=b)
    try:
        for task in ("rollback", "stop"):
            gate.unlink(missing_ok=True)
            running = server_record(lab, host, name)
            run = Background(lab, task, profile=b)
            log = deployment(lab, host, name) / "releases" / running["release"] / "server.log"
            seen = log.read_bytes().count(b"got TERM")
            wait_for(lambda: log.read_bytes().count(b"got TERM") > seen, 60, f"{task} to be stopping")
            sigint_while_changing(run, gate)
            code = run.finish(60)
            last = flat([line for line in run.out if line.strip()][-1])
            assert code == 130, (task, run.text)
            assert f"stopped: release {running['release']} was stopped" in last, (task, last)
            assert not host_pid_alive(lab, host, running["pid"])
            cmd, prof = restore_command(last)
            assert cmd == ["rollback", "--release", running["release"]], last
            fab(lab, *cmd, profile=prof)
            assert server_record(lab, host, name)["release"] == running["release"]
    finally:
        gate.write_text("")
        stop(lab, b)


def test_ctrl_c_before_any_host_is_touched_exits_130(lab, tmp_path):
    # --prompts is a FIFO: fab blocks reading it in the task's body, before any host (where
    # Invoke itself would turn Ctrl-C into exit 1)
    fifo = tmp_path / "prompts.jsonl"
    os.mkfifo(fifo)
    run = Background(lab, "bench", "--prompts", str(fifo), profile=profile(lab, "unexp-early", "h1", 31511))
    try:
        def reader_waits():
            try:
                return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                return None
        fd = wait_for(reader_waits, 30, "fab to open --prompts")
        run.proc.send_signal(signal.SIGINT)
        code = run.finish(30)
        os.close(fd)
        assert code == 130, run.text
        assert "Traceback" not in run.text and "interrupted" in run.text, run.text
    finally:
        run.close()
