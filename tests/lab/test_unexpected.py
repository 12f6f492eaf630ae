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
import stat
import time

import pytest

from helpers import HOST_PYTHON, Background, deployment, fab, flat, host_pid_alive, server_record, write_profile
from lab import wait_for

pytestmark = pytest.mark.e2e

# argv: PORT GATE. /health and /v1/models answer 200 once GATE exists ("" = at once), 503 before.
SERVER = """
import http.server, os, sys
port, gate = int(sys.argv[1]), sys.argv[2]
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
print("serving on", port, flush=True)
srv.serve_forever()
"""


def toml_list(items):
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def profile(lab, name, host, port, *, command=None, gate="", tag="", lines=(), env=(), python=None):
    """A command server on `host`: ready at once, or once /tmp/GATE exists on the host."""
    command = command or [HOST_PYTHON, "-c", SERVER, str(port), f"/tmp/{gate}" if gate else ""]
    body = ["[target]", f'hosts = ["{host}"]', f'name = "{name}"', "keep_releases = 20",
            "[server]", 'engine = "command"', f"command = {toml_list(command + ([tag] if tag else []))}",
            f'python = "{python or HOST_PYTHON}"', 'host = "127.0.0.1"', f"port = {port}",
            "[server.env]", *env, "[ready]", "timeout = 60", "poll_interval = 0.2", *lines]
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
    dies.write_text('#!/bin/sh\ncase "$1" in */launch.py) kill -9 $$;; esac\n'
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
