"""Human output: a finding is a headline, then its fix and source on indented lines wrapped to
the terminal (80 columns when the output is not one); --json is untouched by any of it."""
import io

from tasks import output
from tasks.doctor.findings import finding_block
from tasks.failures.explain import Explanation
from tasks.failures.failed_server import ServerFailed
from tasks.output import report_error
from tasks.steps.preflight import print_checks
from tasks.output import Block, Reporter, wrap_block

FINDING = {
    "rule": "vllm-dflash-swa-ignored", "severity": "FAIL", "evidence": "version",
    "message": "/root/models/Qwen3.6-27B-DFlash/config.json: layer_types has 4 sliding_attention "
               "layer(s) (sliding_window 2048), which vLLM 0.24.0 ignores: every drafter layer "
               "runs full attention, and acceptance collapses (a Qwen3.6-27B deployment with "
               "z-lab's DFlash drafter on vLLM 0.20.1 measured ~1.1%)",
    "fix": 'upgrade vLLM to 0.26.0 or later and run it with the V2 model runner '
           '(VLLM_USE_V2_MODEL_RUNNER = "1" in [server.env])',
    "source": "vllm-project/vllm issue #40898; qwen3_dflash.py 0.20.0-0.24.0 (layer_types unread)",
}


class Tty(io.StringIO):
    def isatty(self):
        return False


def printed(width, emit):
    out = Tty()
    rep = Reporter(hosts=["h1"], stream=out)
    rep.columns = width
    emit(rep)
    return out.getvalue().splitlines()


def test_a_block_wraps_to_the_width_with_notes_indented_under_their_text():
    lines = wrap_block(Block("WARN some-rule " + "word " * 30, (("fix", "do " * 30), ("source", "x"))),
                       40)
    assert all(len(line) <= 40 for line in lines), lines
    assert lines[0].startswith("WARN some-rule word")
    assert lines[1].startswith("  word")                      # the headline goes on, hung
    fix = [i for i, line in enumerate(lines) if line.startswith("  fix: ")]
    assert len(fix) == 1 and lines[fix[0] + 1].startswith("       do")  # under the fix's text
    assert lines[-1] == "  source: x"


def test_paths_flags_and_urls_are_never_split():
    long_path = "/root/models/" + "a" * 70 + "/config.json"
    lines = wrap_block(Block(f"FAIL rule {long_path} has --max-model-len", (("fix", "set it"),)), 40)
    assert long_path in lines[1] and any("--max-model-len" in line for line in lines)


def test_a_preflight_finding_prints_as_headline_fix_and_source_within_80_columns():
    check = {"check": FINDING["rule"], "status": "FAIL", "message": "the old one-line text",
             "finding": FINDING}
    ok = {"check": "port", "status": "OK", "message": "0.0.0.0:8000 is free"}
    lines = printed(80, lambda rep: print_checks(rep, "h1", [ok, check]))
    assert lines[0] == "[h1] OK   port     0.0.0.0:8000 is free"
    assert lines[1].startswith("[h1] FAIL vllm-dflash-swa-ignored /root/models/")
    assert all(len(line) <= 80 for line in lines), lines
    text = [line[len("[h1] "):] for line in lines[1:]]
    fix = next(i for i, t in enumerate(text) if t.startswith("     fix: upgrade vLLM to 0.26.0"))
    source = next(i for i, t in enumerate(text) if t.startswith("     source: vllm-project/vllm"))
    assert 1 < fix < source  # headline (on several lines), then fix, then source
    joined = " ".join(t.strip() for t in text)
    assert '[check] accept = ["vllm-dflash-swa-ignored"]' in joined  # a FAIL says how to accept it
    assert FINDING["message"] in joined and FINDING["source"] in joined


def test_a_long_check_wraps_under_its_message_and_a_failed_preflight_lists_it_wrapped_too():
    import pytest
    from tasks.errors import PreflightFailed
    from tasks.steps.preflight import run_preflight
    message = ("the server listens on 0.0.0.0:8000 with no API key: anyone who can reach port "
               "8000 can use it. Either set a key from your environment, or bind [server] host = "
               '"127.0.0.1" and reach it through an SSH tunnel (ssh -L 8000:127.0.0.1:8000 HOST)')
    exposure = {"check": "exposure", "status": "WARN", "message": message}
    lines = printed(80, lambda rep: print_checks(rep, "h1", [exposure]))
    assert lines[0].startswith("[h1] WARN exposure the server listens on")
    assert all(line.startswith("[h1]" + " " * 15) for line in lines[1:]) and len(lines) > 2
    assert all(len(line) <= 80 for line in lines)

    class FakeHost:
        name = "h1"

        def call(self, op, **kw):
            return {"checks": [{"check": "disk", "status": "FAIL", "message": message}]}

    def run(rep):
        with pytest.raises(PreflightFailed) as e:
            run_preflight(FakeHost(), rep, {})
        report_error(rep, "h1", e.value)
    out = printed(80, run)
    assert any(line.startswith("[h1] error: preflight failed (1 check(s))") for line in out)
    assert all(len(line) <= 80 for line in out), out


def test_a_wide_terminal_gets_each_part_on_one_line():
    lines = printed(1000, lambda rep: rep.line("h1", finding_block(FINDING)))
    assert len(lines) == 3
    assert lines[1].startswith("[h1]      fix: ") and lines[2].startswith("[h1]      source: ")


def test_a_failed_server_prints_cause_then_fix_and_source_wrapped_then_the_log_verbatim():
    log = "demo_server.py: error: unrecognized arguments: --max-model-len 4096 " + "x" * 60
    ex = Explanation("unrecognized-arguments", log, "the engine does not know --max-model-len 4096",
                     "remove or rename --max-model-len 4096 in [server.args]: this engine version "
                     "has no such flag (the host's `--help` lists the flags it has)", [log],
                     "CPython 3.x Lib/argparse.py parse_args")
    lines = printed(80, lambda rep: report_error(rep, "h1", ServerFailed(ex)))
    assert lines[0] == "[h1] error: server failed: the engine does not know --max-model-len 4096"
    assert lines[1].startswith("[h1]   fix: remove or rename") and lines[2].startswith("[h1]        ")
    assert "[h1]   source: failure rule unrecognized-arguments, worded as in CPython 3.x" in lines
    assert lines[-1] == f"[h1]   {log}"  # a log line is shown as it was, however long
    assert all(len(line) <= 80 for line in lines[:-1]), lines


def test_the_width_is_columns_else_the_terminal_else_80(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert output.columns(io.StringIO()) == 80
    monkeypatch.setenv("COLUMNS", "132")
    assert output.columns(io.StringIO()) == 132
