"""Supervision without a lab: the [supervise] schema, the rendered launcher and the files a
supervised release carries (the host agent's own modules, complete), the supervisor's
fatal-line and hang logic against a real HTTP server (configs/demo_server.py's), and the
status lines."""
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tasks.failures import logscan
from tasks.supervise import status_view
from tasks.deploy import release_files
from tasks.errors import ProfileError
from tasks.supervise.host import hangwatch
from tasks.release.launcher import SUPERVISOR_FILES, render_launcher, supervisor_rules
from tasks.transport.agent_code import host_files
from tasks.profile import load_profile
from tasks.status import Status, render

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "configs"))
import demo_server  # noqa: E402

DEMO = REPO / "configs" / "demo.toml"


def profile(tmp_path, body):
    p = tmp_path / "p.toml"
    p.write_text(f'extends = "{DEMO}"\n' + body)
    return load_profile(p)


# -- the profile -------------------------------------------------------------------------

def test_supervision_is_off_by_default_and_on_in_the_real_model_configs():
    assert not load_profile(DEMO).supervise.on
    for name in ("qwen3.6-27b.toml", "qwen3.6-27b-dflash.toml", "qwen3.6-27b-mtp.toml", "sglang-eagle3.toml"):
        s = load_profile(REPO / "configs" / name, environ={}).supervise
        assert s.on and s.restart == "on-failure" and s.hang_timeout > 0, name


@pytest.mark.parametrize("body,needle", [
    ('restart = "sometimes"', 'supervise.restart: "no" | "on-failure" | "always"'),
    ("restart = true", "supervise.restart"),
    ("max_restarts = -1", "supervise.max_restarts"),
    ("backoff = -2", "supervise.backoff: a number of seconds >= 0"),
    ("backoff = 10\nbackoff_max = 5", "supervise.backoff_max: a number of seconds >= 10"),
    ("hang_timeout = inf", "supervise.hang_timeout"),
    ("window = 0", "supervise.window: a number of seconds >= 1"),
    ("retries = 3", "supervise.retries: unknown key"),
])
def test_bad_supervise_values_name_the_key(tmp_path, body, needle):
    with pytest.raises(ProfileError) as e:
        profile(tmp_path, "[supervise]\n" + body + "\n")
    assert needle in str(e.value) and "p.toml" in str(e.value)


# -- launch.py and the release ----------------------------------------------------------

def test_supervised_launcher_runs_the_supervisor_and_ships_its_files(tmp_path):
    p = profile(tmp_path, '[supervise]\nrestart = "always"\nbackoff = 1\nhang_timeout = 7\n')
    text = render_launcher(p)
    compile(text, "launch.py", "exec")
    assert "import llmfab_host.supervise.host.supervisor as supervisor\n" in text
    assert "'hang_timeout': 7.0," in text and "'restart': 'always'," in text
    names = [n for n, _, _ in release_files(p)]
    assert {"supervise_rules.json", "llmfab_host/supervise/host/supervisor.py"} <= set(names)
    plain = load_profile(DEMO)
    assert "supervise" not in render_launcher(plain)
    assert not {n.split("/")[0] for n, _, _ in release_files(plain)} & set(SUPERVISOR_FILES)


def test_the_supervisor_runs_from_the_release_alone(tmp_path):
    """The release's llmfab_host/ is the agent's own package (what it may import is checked in
    tests/unit/test_lint.py): launch.py's reaper imports it by path from the release alone, with
    the standard library only (python -I -S: no checkout, no release directory on sys.path)."""
    shipped = {n for n, _, _ in release_files(profile(tmp_path, '[supervise]\nrestart = "always"\n'))}
    assert {f"llmfab_host/{n}" for n, _ in host_files()} <= shipped
    p = profile(tmp_path, '[supervise]\nrestart = "always"\n')
    release = tmp_path / "release"
    for name, data, _mode in release_files(p):
        (release / name).parent.mkdir(parents=True, exist_ok=True)
        (release / name).write_bytes(data)
    code = ("import runpy, sys; sup = runpy.run_path(sys.argv[1], run_name='launch')['_supervisor'](sys.argv[2]); "
            "print(sup.run.__module__, sup.__file__, sys.argv[2] in sys.path)")
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(release / "launch.py"), str(release)],
                       capture_output=True, text=True, cwd=str(tmp_path), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["llmfab_host.supervise.host.supervisor",
                                str(release / "llmfab_host/supervise/host/supervisor.py"), "False"]


# -- the copies the supervisor carries equal their originals -------------------------------

@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    path = tmp_path_factory.mktemp("rules") / "supervise_rules.json"
    path.write_bytes(supervisor_rules())
    return hangwatch.load_rules(str(path))


FAILURES = sorted((REPO / "tests" / "fixtures" / "failures").glob("*.log")) \
    + sorted((REPO / "tests" / "fixtures" / "failures" / "real").glob("*.log")) \
    + sorted((REPO / "tests" / "fixtures" / "real-vllm-cpu").glob("*.log"))  # recorded from the real engine


@pytest.mark.parametrize("log", FAILURES, ids=[f"{f.parent.name}/{f.stem}" for f in FAILURES])
def test_the_host_picks_the_same_line_and_rule_as_the_explainer(rules, log):
    """Every recorded failure log: hangwatch (on the host, the same scanner over the rules
    as data) names the line and rule tasks/failures/logscan.py names: the table survives
    its trip as supervise_rules.json."""
    scanner = logscan.LogScanner()
    scanner.feed(log.read_text(errors="replace"), final=True)
    line, rule = hangwatch.fatal_line(str(log), 0, rules)
    if scanner.fatal is None:
        assert rule is None
    else:
        assert (line, rule) == (scanner.fatal.line.strip()[:500], scanner.fatal.rule.id)


def test_hang_detection_reads_the_metric_names_status_reads():
    from tasks.measure import metrics
    assert hangwatch.BUSY == metrics.RUNNING + metrics.WAITING
    assert hangwatch.GENERATED is metrics.GENERATED


# -- the fatal line of one attempt ---------------------------------------------------------

def test_fatal_line_reads_only_this_attempts_part_of_the_log(tmp_path, rules):
    log = tmp_path / "server.log"
    old = "RuntimeError: Engine core initialization failed. See root cause above.\n"
    log.write_text(old)
    offset = len(old)
    with log.open("a") as f:
        f.write("INFO loading\n(EngineCore_DP0 pid=9) ERROR 12-01 03:00:00 [core.py:708] "
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 GiB.\n")
    line, rule = hangwatch.fatal_line(str(log), offset, rules)
    assert rule == "cuda-oom" and line.endswith("Tried to allocate 1.95 GiB.")
    with log.open("a") as f:
        f.write("--- llmfab: restart 1 ---\n")
    offset = log.stat().st_size
    with log.open("a") as f:
        f.write('Traceback (most recent call last):\n  File "x.py", line 1\nKeyError: \'model\'\n')
    assert hangwatch.fatal_line(str(log), offset, rules) == ("KeyError: 'model'", None)
    assert hangwatch.fatal_line(str(log), log.stat().st_size, rules) == (None, None)


# -- hang detection against a real HTTP server ----------------------------------------------

@pytest.fixture
def demo():
    m = demo_server.Metrics("m")
    state = demo_server.ServerState(demo_server.Engine(m, tokens_per_s=400), ["m"], access_log=False)
    sock = demo_server.bind_socket("127.0.0.1", 0)
    server = demo_server.start_http(state, sock)
    yield state, sock.getsockname()[1]
    server.shutdown()


def watch(port, timeout):
    return hangwatch.HangWatch({"hang_timeout": timeout, "probe_host": "127.0.0.1", "port": port,
                                      "health_path": "/health", "metrics_path": "/metrics"})


def probe_for(w, seconds):
    """Probe as the supervisor does for `seconds`; the first hang verdict, or None."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(w.next_probe_in())
        why = w.probe()
        if why:
            return why
    return None


def test_idle_and_busy_progressing_are_not_hung(demo):
    state, port = demo
    w = watch(port, 0.6)
    assert probe_for(w, 1.5) is None  # idle, nothing waiting
    load = [threading.Thread(target=lambda: list(state.engine.generate(5, 600))) for _ in range(3)]
    for t in load:
        t.start()
    assert probe_for(w, 1.2) is None  # busy, tokens moving
    for t in load:
        t.join()


def test_health_gone_bad_after_ready_is_hung_within_the_timeout_plus_one_probe(demo):
    state, port = demo
    w = watch(port, 0.6)
    assert probe_for(w, 0.5) is None and w.ready
    state.healthy = False
    t0 = time.monotonic()
    why = probe_for(w, 3)
    assert why and "no /health 200" in why
    assert time.monotonic() - t0 <= 0.6 + w.interval + w.probe_timeout


def test_requests_waiting_without_tokens_is_hung_though_health_is_200(demo):
    state, port = demo
    w = watch(port, 0.6)
    assert probe_for(w, 0.4) is None
    state.engine.metrics.add(running=2)  # two requests in the engine; the counter stands still
    why = probe_for(w, 3)
    assert why and "requests waiting and no token generated" in why


def test_never_ready_is_not_a_hang(tmp_path):
    w = watch(1, 0.2)  # nothing listens on port 1
    assert probe_for(w, 0.8) is None and not w.ready


# -- what status says ---------------------------------------------------------------------

def test_status_lines_for_backoff_and_gave_up():
    last = {"exit": 1, "signal": None, "rule": None, "line": "torch.OutOfMemoryError: CUDA out of memory",
            "ended_at": "2026-12-01T03:00:00+00:00"}
    backoff = status_view.record({"restart": "on-failure", "restarts": 1, "state": "backoff",
                                  "last": last, "next_attempt_in_s": 12.0})
    assert status_view.lines(backoff)[0] == "supervisor: restart on-failure, 1 restart, backoff, next attempt in 12 s"
    gave = dict(backoff, state="gave-up", next_attempt_in_s=None, restarts=5)
    why = status_view.gave_up_why(gave, "crash loop: 5 restarts within 600 s (max_restarts = 5)")
    assert why.startswith("the supervisor gave up: crash loop") and "fatal line: torch.OutOfMemoryError" in why
    record = {"host": "h", "running": False, "deployed": True, "release": "R", "exit": None, "gpus": None,
              "supervisor": gave}
    text = render(Status(record, why=why, supervisor_lines=status_view.lines(gave, "crash loop")))
    assert any("gave up: crash loop" in line for line in text)
    assert status_view.record(None) == {"restart": "no", "restarts": 0, "state": "off", "last": None,
                                        "next_attempt_in_s": None}


def test_a_rule_pattern_this_python_cannot_compile_is_left_out_not_fatal():
    from tasks.failures.host import records
    table = [{"id": "a", "priority": 1, "wrapper": "", "patterns": [{"regex": "(?P<x", "after": None},
                                                                    {"regex": "boom", "after": None}]},
             {"id": "b", "priority": 5, "wrapper": "", "patterns": [{"regex": "x", "after": "(?P<y"}]}]
    rules = records.from_data(table)
    assert [(r.id, [p.regex for p in r.patterns]) for r in rules] == [("a", ["boom"])]
