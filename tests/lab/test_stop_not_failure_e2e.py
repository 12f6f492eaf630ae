"""On a lab host, the stand-in's stop prints the real engine's shutdown lines, and llmfab reads no failure in them."""
import json
from pathlib import Path
from helpers import fab, server_record, vllm_profile


def test_stand_in_stop_prints_the_real_shutdown_lines_and_is_no_failure(lab):
    """The stand-in vLLM prints the real engine's SIGTERM shutdown (EngineDeadError included);
    through `fab stop`, status reads it as a stop, as with the real engine."""
    host, name = "h1", "stop-not-failure"
    prof = vllm_profile(lab, name, host, 31041)
    fab(lab, "deploy", profile=prof)
    server = server_record(lab, host, name)
    fab(lab, "stop", profile=prof)
    rel = Path(lab.home(host)) / "llmfab" / name / "releases" / server["release"]
    log = (rel / "server.log").read_text()
    assert "[shutdown] API server: shutdown triggered" in log
    assert "EngineDeadError: EngineCore encountered an issue" in log
    assert json.loads((rel / "stopped.json").read_text())["by"] == "fab stop"
    st = json.loads(fab(lab, "status", "--json", profile=prof, code=1).stdout.splitlines()[0])
    assert st["fatal"] is None and st["exit"]["stopped"]["by"] == "fab stop"
    human = fab(lab, "status", profile=prof, code=1).stdout
    assert "was stopped by fab stop" in human and "why:" not in human
