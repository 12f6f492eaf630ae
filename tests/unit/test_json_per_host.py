"""`--json` prints exactly one object per host, whatever happened to it: a host that cannot be
reached is `{"host", "ok": false, "error", "code"}`, a failed preflight carries its `checks`
and `findings`, and human text goes to stderr. Real `fab` processes; the unreachable host is
a name that resolves nowhere (`.invalid`, RFC 2606), so no SSH lab is needed."""
import json
import subprocess
import sys

import pytest
from hostlab import REPO

JSON_TASKS = ["status", "check", "releases", "bench", "deploy", "rollback", "stop",
              "kill-gpu-procs"]
NOWHERE = "nowhere.invalid"


def demo_profile(tmp_path, *extra):
    """The demo (engine = "command"), deployed under tmp_path instead of ~/llmfab."""
    path = tmp_path / "demo.toml"
    path.write_text("\n".join([f'extends = "{REPO / "configs" / "demo.toml"}"', "[target]",
                               f'workdir = "{tmp_path / "w"}"', 'name = "jsonhost"', *extra, ""]))
    return path


def fab(*args, profile):
    return subprocess.run([sys.executable, "-m", "fabric", *args, "--profile", str(profile)],
                          cwd=str(REPO), capture_output=True, text=True, timeout=120)


def objects(stdout):
    return [json.loads(line) for line in stdout.splitlines()]


@pytest.mark.parametrize("task", JSON_TASKS)
def test_an_unreachable_host_gets_its_object(tmp_path, task):
    r = fab("-H", NOWHERE, task, "--json", profile=demo_profile(tmp_path))
    assert r.returncode == 3, r.stdout + r.stderr
    [obj] = objects(r.stdout)
    assert list(obj)[:4] == ["host", "ok", "error", "code"], obj
    assert obj["host"] == NOWHERE and obj["ok"] is False and obj["code"] == 3
    assert NOWHERE in obj["error"] and "Traceback" not in r.stderr
    assert f"[{NOWHERE}] error: " in r.stderr  # the human line, on stderr


@pytest.mark.parametrize("task", [["status"], ["releases"], ["stop"],
                                  ["kill-gpu-procs", "--dry-run"]])  # never this machine's GPUs
def test_one_object_per_host_when_one_of_two_cannot_be_reached(tmp_path, task):
    r = fab("-H", f"{NOWHERE},local", *task, "--json", profile=demo_profile(tmp_path))
    assert r.returncode == 3, r.stdout + r.stderr
    got = {o["host"]: o for o in objects(r.stdout)}
    assert sorted(got) == sorted([NOWHERE, "local"]) and len(r.stdout.splitlines()) == 2
    assert got[NOWHERE]["ok"] is False and "ok" in got["local"]


@pytest.mark.parametrize("task", ["check", "deploy"])
def test_a_failed_preflight_prints_its_object_with_its_findings(tmp_path, task):
    prof = demo_profile(tmp_path, "[server]", 'model = "/nonexistent/llmfab-model"')
    r = fab(task, "--json", profile=prof)
    assert r.returncode == 1, r.stdout + r.stderr
    [obj] = objects(r.stdout)
    assert obj["host"] == "local" and obj["ok"] is False and obj["code"] == 1
    assert "preflight failed" in obj["error"] and "findings" in obj
    assert any(c["status"] == "FAIL" and "/nonexistent/llmfab-model" in c["message"]
               for c in obj["checks"]), obj
    assert not (tmp_path / "w" / "jsonhost" / "current").exists()  # nothing launched
