"""Rolling deploys (issue 17): `fab deploy --rolling N` on six lab hosts, with the real `fab`,
sshd and the stand-in vLLM (tests/standins).

The fault is per host: the new release's profile sets STANDIN_FAIL_FILE=/tmp/standin-fail,
and only the hosts given that file (their own /tmp) fail to start; the old release's profile
does not set it, so a rollback there starts fine. Every stand-in appends start / ready /
stop / exit with the time to /tmp/standin-events.jsonl on its host (STANDIN_EVENTS_FILE):
"how many hosts were not ready at once" is read from the servers' own records.

Here: the rest; the tests that need no host are in tests/unit/test_rolling_batches.py."""
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import pytest
import helpers
from helpers import write_profile
from hostlab import REPO, HostLab, starttime, wait_for


HOSTS = [f"h{i}" for i in range(1, 7)]


PORTS = {"roll-bad": 18460, "roll-good": 18461, "roll-first": 18462, "roll-nowait": 18463,
         "roll-int": 18464, "roll-smoke": 18465, "roll-int2": 18466}  # one each: the deployments of earlier tests keep running


EVENTS = "standin-events.jsonl"


FAULT = "standin-fail"


@pytest.fixture(scope="module")
def lab():
    from conftest import require_lab
    require_lab()
    with HostLab(6) as the_lab:
        yield the_lab


def profile(lab, name, *, faulty, hosts=HOSTS, extra=()):
    """`faulty`: the release honours the per-host fault file (the new, bad release)."""
    lines = ["[target]", f"hosts = {json.dumps(hosts)}", f'name = "{name}"', *extra,
             "[server]", 'engine = "vllm"', f'python = "{lab.ml_python}"',
             f'model = "{lab.model_dir("roll-model")}"', 'host = "0.0.0.0"', f"port = {PORTS[name]}",
             "[server.args]", 'served-model-name = "roll-m"',
             "[server.env]", 'STANDIN_LOAD_SECONDS = "3"', f'STANDIN_EVENTS_FILE = "/tmp/{EVENTS}"']
    lines += [f'STANDIN_FAIL_FILE = "/tmp/{FAULT}"'] if faulty else []
    lines += ["[ready]", "timeout = 60", "poll_interval = 0.2"]
    return write_profile(lab, f"{name}-{'new' if faulty else 'old'}", lines)


def fab(lab, *args, profile, code=0):
    r = helpers.fab(lab, *args, profile=profile, code=code, timeout=400)
    # (the stand-in's own start-up failure prints a traceback into the log: that is quoted)
    assert "internal error" not in r.stdout + r.stderr and "<frozen runpy>" not in r.stderr, r.stderr
    return r


def server(lab, host, name):
    path = lab.home(host) / "llmfab" / name / "server.json"
    return json.loads(path.read_text()) if path.exists() else None


def serving(lab, host, name):
    """The host's /v1/models, from here (the root namespace reaches every host's address)."""
    with urllib.request.urlopen(f"http://{lab.ip(host)}:{PORTS[name]}/v1/models", timeout=5) as r:
        return [m["id"] for m in json.load(r)["data"]]


def events(lab, hosts, since, until=float("inf")):
    out = []
    for h in hosts:
        path = lab.tmp(h) / EVENTS
        for line in (path.read_text().splitlines() if path.exists() else ()):
            rec = json.loads(line)
            if since <= rec["t"] <= until:
                out.append(dict(rec, host=h))
    return sorted(out, key=lambda e: e["t"])


def most_not_ready(lab, hosts, since, until=float("inf")):
    """The largest number of hosts with no ready server at one moment after `since` (every
    host ready at `since`), from the stand-ins' own start/ready/stop/exit records."""
    ready = {h: {"before"} for h in hosts}  # pids serving; "before": whatever served at `since`
    worst = 0
    for e in events(lab, hosts, since, until):
        pids = ready[e["host"]]
        if e["event"] == "ready":
            pids.add(e["pid"])
        elif e["event"] in ("stop", "exit"):
            pids.discard(e["pid"])
            if e["event"] == "stop":
                pids.discard("before")  # the old server's pid is not in the window: it stopped
        worst = max(worst, sum(not p for p in ready.values()))
    return worst


def fresh(lab, name):
    """Every host on the old (good) release, no fault files; returns {host: server.json}."""
    for h in HOSTS:
        (lab.tmp(h) / FAULT).unlink(missing_ok=True)
    fab(lab, "deploy", profile=profile(lab, name, faulty=False))
    return {h: server(lab, h, name) for h in HOSTS}


def json_lines(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_a_bad_release_stops_at_the_first_failed_batch_and_puts_it_back(lab):
    before = fresh(lab, "roll-bad")
    for h in ("h3", "h4"):
        (lab.tmp(h) / FAULT).write_text("engine_init\n")
    t0 = time.time()
    r = fab(lab, "deploy", "--rolling", "2", "--json", profile=profile(lab, "roll-bad", faulty=True),
            code=1)
    got = json_lines(r.stdout)
    assert [o["host"] for o in got] == HOSTS, r.stdout
    rec = {o["host"]: o for o in got}
    now = {h: server(lab, h, "roll-bad") for h in HOSTS}
    for h in ("h1", "h2"):
        assert rec[h]["rolled"] == "new" and rec[h]["ok"] is True, rec[h]
        assert rec[h]["release"] == now[h]["release"] != before[h]["release"]
        assert serving(lab, h, "roll-bad") == ["roll-m"]
    for h in ("h3", "h4"):
        assert rec[h]["rolled"] == "back" and rec[h]["ok"] is False, rec[h]
        assert rec[h]["release"] == now[h]["release"] == before[h]["release"]
        assert now[h]["pid"] != before[h]["pid"]  # relaunched, as `fab rollback` does
        assert serving(lab, h, "roll-bad") == ["roll-m"]
        assert "server failed: one request of" in rec[h]["why"] and "rolled back" in rec[h]["why"]
        assert rec[h]["fatal"]["rule"] == "kv-cache-too-small", rec[h]  # why, as a plain deploy says
    for h in ("h5", "h6"):
        assert rec[h]["rolled"] == "untouched" and rec[h]["release"] == before[h]["release"], rec[h]
        assert now[h] == before[h]  # same pid, same start: never stopped
        assert starttime(now[h]["pid"]) is not None
        assert events(lab, [h], t0) == []  # no server started or stopped there
    # The summary (stderr with --json) says why per host.
    assert "the roll stopped at h3, h4 (batch 2 of 3)" in r.stderr, r.stderr
    summary = r.stderr[r.stderr.rindex("host "):]
    assert "untouched" in summary and "back" in summary
    # Again, still broken on h3-4: back to the release that RAN there, not to the failed one
    # that now lies between it and the newest.
    r = fab(lab, "deploy", "--rolling", "2", "--json", profile=profile(lab, "roll-bad", faulty=True),
            code=1)
    rec = {o["host"]: o for o in json_lines(r.stdout)}
    for h in ("h3", "h4"):
        assert rec[h]["rolled"] == "back" and rec[h]["release"] == before[h]["release"], rec[h]
        assert server(lab, h, "roll-bad")["release"] == before[h]["release"]
        assert serving(lab, h, "roll-bad") == ["roll-m"]
    assert [rec[h]["rolled"] for h in HOSTS] == ["new", "new", "back", "back", "untouched", "untouched"]


def test_a_good_roll_ends_all_on_new_with_never_more_than_two_hosts_down(lab):
    fresh(lab, "roll-good")
    # The yardstick first: a plain deploy (all at once) has all six down at one moment.
    t1 = time.time()
    fab(lab, "deploy", profile=profile(lab, "roll-good", faulty=False))
    t2 = time.time()
    assert most_not_ready(lab, HOSTS, t1, t2) == 6, events(lab, HOSTS, t1, t2)
    before = {h: server(lab, h, "roll-good") for h in HOSTS}
    t0 = time.time()
    r = fab(lab, "deploy", "--rolling", "2", "--smoke", "--json",
            profile=profile(lab, "roll-good", faulty=True))
    rec = {o["host"]: o for o in json_lines(r.stdout)}
    for h in HOSTS:
        now = server(lab, h, "roll-good")
        assert rec[h]["rolled"] == "new" and rec[h]["release"] == now["release"] != before[h]["release"]
    assert "answered a 1-token completion" in r.stderr
    # Each batch of two went down together, and never more than two at once.
    assert most_not_ready(lab, HOSTS, t0) == 2, events(lab, HOSTS, t0)
    # Batches in order: no host of batch k+1 stopped before every host of batch k was ready.
    ev = events(lab, HOSTS, t0)
    for k, (a, b) in enumerate([(HOSTS[0:2], HOSTS[2:4]), (HOSTS[2:4], HOSTS[4:6])]):
        last_ready = max(e["t"] for e in ev if e["host"] in a and e["event"] == "ready")
        first_stop = min(e["t"] for e in ev if e["host"] in b and e["event"] == "stop")
        assert last_ready < first_stop, (k, ev)


def test_a_host_with_no_earlier_release_is_stopped_and_later_ones_untouched(lab):
    for h in HOSTS:
        (lab.tmp(h) / FAULT).unlink(missing_ok=True)
    (lab.tmp("h1") / FAULT).write_text("oom\n")
    prof = profile(lab, "roll-first", faulty=True, hosts=["h1", "h2"], extra=["rolling = 1"])
    r = fab(lab, "deploy", "--json", profile=prof, code=1)
    rec = {o["host"]: o for o in json_lines(r.stdout)}
    assert rec["h1"]["rolled"] == "stopped" and rec["h1"]["release"] is None, rec
    assert rec["h2"]["rolled"] == "untouched" and rec["h2"]["release"] is None, rec
    assert not (lab.home("h2") / "llmfab" / "roll-first").exists()
    st = lab.fab("status", "-H", "h1", profile=prof)
    assert st.returncode == 1 and "not running" in st.stdout, st.stdout


def test_a_release_that_is_ready_but_cannot_complete_fails_the_smoke_and_goes_back(lab):
    # Readiness skips the model check and names a model the server does not serve: /health
    # says ready, the 1-token completion gets "model does not exist" (HTTP 404).
    for h in HOSTS:
        (lab.tmp(h) / FAULT).unlink(missing_ok=True)
    fab(lab, "deploy", "-H", "h1,h2", profile=profile(lab, "roll-smoke", faulty=False))
    before = {h: server(lab, h, "roll-smoke") for h in ("h1", "h2")}
    bad = profile(lab, "roll-smoke", faulty=True, extra=["rolling = 1"])
    bad.write_text(bad.read_text().replace("[ready]", '[ready]\nmodels_path = ""\nserved_name = "wrong"'))
    r = fab(lab, "deploy", "--smoke", "--json", "-H", "h1,h2", profile=bad, code=1)
    rec = {o["host"]: o for o in json_lines(r.stdout)}
    assert rec["h1"]["rolled"] == "back" and rec["h1"]["release"] == before["h1"]["release"], rec
    assert "smoke test failed" in rec["h1"]["why"] and "does not exist" in rec["h1"]["why"], rec
    assert serving(lab, "h1", "roll-smoke") == ["roll-m"]
    assert rec["h2"]["rolled"] == "untouched" and server(lab, "h2", "roll-smoke") == before["h2"]


def test_rolling_with_no_wait_is_bad_input_and_touches_nothing(lab):
    prof = profile(lab, "roll-nowait", faulty=False)
    r = fab(lab, "deploy", "--rolling", "2", "--no-wait", profile=prof, code=2)
    assert "--no-wait" in r.stdout + r.stderr
    assert not any((lab.home(h) / "llmfab" / "roll-nowait").exists() for h in HOSTS)


class Roll:
    """`fab deploy --rolling 2` in the background, its output gathered live."""

    def __init__(self, lab, name):
        argv = [sys.executable, "-m", "fabric", "-S", str(lab.ssh_config), "deploy", "--rolling", "2",
                "--profile", str(profile(lab, name, faulty=True))]
        self.proc = subprocess.Popen(argv, cwd=str(REPO), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.out = []
        self.reader = threading.Thread(target=lambda: self.out.extend(self.proc.stdout), daemon=True)
        self.reader.start()

    def wait_line(self, prefix):
        wait_for(lambda: any(line.startswith(prefix) for line in self.out), 120,
                 f"{prefix!r} in fab's output: {self.out[-5:]}")

    def finish(self):
        code = self.proc.wait(180)
        self.reader.join(10)
        return code, "".join(self.out)


def test_ctrl_c_stops_the_roll_after_the_batch_in_flight(lab):
    before = fresh(lab, "roll-int")
    roll = Roll(lab, "roll-int")
    roll.wait_line("[h1] launched release")
    roll.proc.send_signal(signal.SIGINT)
    code, text = roll.finish()
    assert code == 130, text
    assert "interrupted (Ctrl-C) after batch 1 of 3" in text, text
    for h in ("h1", "h2"):  # the batch in flight finished: ready on the new release
        now = server(lab, h, "roll-int")
        assert now["release"] != before[h]["release"] and serving(lab, h, "roll-int") == ["roll-m"]
    for h in HOSTS[2:]:
        assert server(lab, h, "roll-int") == before[h]
    assert "<frozen runpy>" not in text


def test_a_second_ctrl_c_leaves_at_once_naming_what_keeps_running(lab):
    before = fresh(lab, "roll-int2")
    roll = Roll(lab, "roll-int2")
    roll.wait_line("[h1] launched release")
    roll.wait_line("[h2] launched release")
    roll.proc.send_signal(signal.SIGINT)
    roll.wait_line("Ctrl-C: the roll stops when the batch in flight is done")
    roll.proc.send_signal(signal.SIGINT)
    code, text = roll.finish()
    assert code == 130, text
    for h in ("h1", "h2"):
        release = server(lab, h, "roll-int2")["release"]
        assert release != before[h]["release"]
        assert f"[{h}] interrupted: release {release} (pid " in text and "keeps running" in text, text
    assert "rolling: batch 2" not in text
    for h in HOSTS[2:]:
        assert server(lab, h, "roll-int2") == before[h]
