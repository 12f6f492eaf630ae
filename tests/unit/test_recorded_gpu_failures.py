"""The real CUDA vLLM's start-up failures on an H200, as llmfab explains them.

Each log in tests/fixtures/failures/gpu-h200/ was recorded from vLLM 0.26.0 (torch
2.11.0+cu130) on an NVIDIA H200 by record.py there, byte for byte (cases.json holds how each ran:
command, environment, exit status, seconds, free GPU memory, the memory hog). CI has no GPU:
these recordings are how it keeps llmfab's rules true to the GPU engine's words. Pure: a profile
that launches the recorded command, and llmfab's explanation of the log."""
import json
from pathlib import Path

import pytest

from failurecases import explain_log
from tasks.failures.rules import BY_ID

GPU = Path(__file__).resolve().parents[1] / "fixtures" / "failures" / "gpu-h200"
CASES = json.loads((GPU / "cases.json").read_text())
SEEN = "seen in vLLM 0.26.0 on an H200"


@pytest.mark.parametrize("case", CASES, ids=[c["file"] for c in CASES])
def test_a_recorded_gpu_failure_gives_its_rule_cause_and_fix(case, tmp_path):
    text = (GPU / case["file"]).read_text()
    ex, _ = explain_log(text, case["recorded"], tmp_path)
    assert ex.rule == case["rule"], (case["file"], ex)
    for want in case["cause"]:
        assert want in ex.cause, (want, ex.cause)
    for want in case["fix"]:
        assert want in ex.fix, (want, ex.fix)
    assert ex.line and ex.line in text
    assert "None" not in ex.cause + ex.fix and "?" not in ex.cause, ex


def test_the_rules_only_this_gpu_showed_name_it_as_their_source():
    for case in CASES:
        ex_rule = BY_ID[case["rule"]]
        if case["rule"] in ("flashinfer-missing", "not-enough-gpus"):
            assert all(SEEN in p.source for p in ex_rule.patterns), case["rule"]


def test_the_recordings_are_real_gpu_runs():
    assert len(CASES) >= 5
    for case in CASES:
        rec = case["recorded"]
        assert rec["engine"] == "vllm 0.26.0" and rec["gpu"] == "NVIDIA H200", rec
        assert rec["command"][1:3] == ["-m", "vllm.entrypoints.openai.api_server"], rec["command"]
        assert isinstance(rec["returncode"], int) and rec["returncode"] != 0 and rec["seconds"] > 0
        text = (GPU / case["file"]).read_text()
        assert "vLLM API server version 0.26.0" in text or "version 0.26.0" in text, case["file"]
    hogged = [c for c in CASES if c["recorded"].get("hog")]
    assert hogged and all(c["recorded"]["gpu_free_mib_before"] < 30000 for c in hogged)
