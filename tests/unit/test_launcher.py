"""Golden tests: the argv and launch.py llmfab renders are exactly what we reviewed.

Regenerate after an intended change with `LLMFAB_REGOLD=1 python -m pytest tests/unit/test_launcher.py`
and review the diff like code.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.steps.argv import render_args, server_argv
from tasks.release.launcher import render_argv_json, render_launcher, render_secrets
from tasks.profile.types import JsonTable
from tasks.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
CONFIGS = ["qwen3.6-27b-dflash.toml", "qwen3.6-27b-mtp.toml", "sglang-eagle3.toml", "demo.toml"]


def golden(name, text):
    # The profile digest covers absolute local paths (server.files), so it differs per
    # checkout; everything else in the launcher must match to the byte.
    text = re.sub(r"sha256 [0-9a-f]{12}", "sha256 <digest>", text)
    path = GOLDEN / name
    if os.environ.get("LLMFAB_REGOLD"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; review and regenerate (see module docstring)"


@pytest.mark.parametrize("config", CONFIGS)
def test_argv_golden(config):
    profile = load_profile(ROOT / "configs" / config)
    golden(config.replace(".toml", ".argv.json"), json.dumps(server_argv(profile), indent=1) + "\n")


@pytest.mark.parametrize("config", CONFIGS)
def test_launcher_golden(config):
    profile = load_profile(ROOT / "configs" / config)
    golden(config.replace(".toml", ".launch.py"), render_launcher(profile))


def test_dflash_speculative_config_is_one_compact_json_element():
    argv = server_argv(load_profile(ROOT / "configs" / "qwen3.6-27b-dflash.toml"))
    i = argv.index("--speculative-config")
    assert json.loads(argv[i + 1]) == {"method": "dflash", "model": "/root/models/Qwen3.6-27B-DFlash",
                                       "num_speculative_tokens": 15}
    assert " " not in argv[i + 1]


@pytest.mark.parametrize("args, expected", [
    ((("enable-prefix-caching", True),), ["--enable-prefix-caching"]),
    ((("enable-prefix-caching", False),), ["--no-enable-prefix-caching"]),
    ((("served-model-name", ("a", "b")),), ["--served-model-name", "a", "b"]),
    ((("tensor-parallel-size", 2),), ["--tensor-parallel-size", "2"]),
    ((("gpu-memory-utilization", 0.9),), ["--gpu-memory-utilization", "0.9"]),
    ((("x", JsonTable('{"a":1}')),), ["--x", '{"a":1}']),
    ((("chat-template", "--weird $(x) 'q'"),), ["--chat-template", "--weird $(x) 'q'"]),
    ((("n", ()),), ["--n"]),
])
def test_render_args_rules(args, expected):
    assert render_args(args) == expected


def test_launcher_is_valid_python_39_and_keeps_secrets_out(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMFAB_TEST_SECRET", "s3cr3t-value")
    prof = tmp_path / "p.toml"
    prof.write_text('[server]\nengine = "command"\ncommand = ["true"]\n'
                    '[server.env]\nTOKEN = { from_env = "LLMFAB_TEST_SECRET" }\nPLAIN = "x"\n')
    profile = load_profile(prof)
    text = render_launcher(profile)
    compile(text, "launch.py", "exec", flags=0, dont_inherit=True)
    assert "s3cr3t-value" not in text
    assert "TOKEN" in text and 'if __name__ == "__main__":' in text
    assert json.loads(render_secrets(profile)) == {"TOKEN": "s3cr3t-value"}
    assert b"s3cr3t-value" not in render_argv_json(profile)


def test_launcher_runs_by_hand_and_returns_at_once(tmp_path):
    """launch.py started by hand: returns, server detached in its own session, output to server.log."""
    prof = tmp_path / "p.toml"
    marker = tmp_path / "done"
    prof.write_text('[server]\nengine = "command"\n'
                    f'command = ["{sys.executable}", "-c", "import os,sys; print(os.getsid(0) == os.getpid() or os.getpgid(0)); '
                    f'open({str(marker)!r}, \'w\').write(str(os.getpgid(0)))"]\n')
    rel = tmp_path / "work" / "demo" / "releases" / "20260101T000000Z"
    rel.mkdir(parents=True)
    (rel / "launch.py").write_text(render_launcher(load_profile(prof)))
    out = subprocess.run([sys.executable, str(rel / "launch.py")], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout.strip().splitlines()[-1])
    server = json.loads((tmp_path / "work" / "demo" / "server.json").read_text())
    assert server == record and server["release"] == "20260101T000000Z"
    assert server["pgid"] != os.getpgid(0)
    # the reaper records how it ended
    import time
    deadline = time.monotonic() + 20
    while not (rel / "exit.json").exists():
        assert time.monotonic() < deadline, "exit.json never written"
        time.sleep(0.02)
    assert json.loads((rel / "exit.json").read_text())["returncode"] == 0
    assert int(marker.read_text()) == server["pgid"]
