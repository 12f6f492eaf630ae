"""Words that hold (issue 38): what llmfab says about a flag, a file or a sweep is what it does.
Each test failed on the code before its fix."""
import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.errors import ProfileError, UsageError

ROOT = Path(__file__).resolve().parents[2]


def test_an_slo_key_spelled_twice_is_one_key_given_twice():
    from tasks.tune.slo import parse_slo
    with pytest.raises(UsageError, match=r"--slo ttft_p90 is given twice"):
        parse_slo("ttft_p90<=5,ttft_p90.0<=6")
    assert [b.key for b in parse_slo("ttft_p99.9<=5,tpot_p50<=4")] == ["ttft_p99.9", "tpot_p50"]


def test_a_dry_runs_json_object_has_ok_as_every_object_does():
    from tasks.deploy import dry_run_record
    from tasks.profile import load_profile
    rec = dry_run_record(load_profile(ROOT / "configs" / "demo.toml"), "local")
    assert list(rec)[:2] == ["host", "ok"] and rec["ok"] is True


def test_a_directory_given_as_the_profile_is_said_to_be_one(tmp_path):
    from tasks.profile import resolve_profile_path
    with pytest.raises(ProfileError, match="is a directory, not a profile"):
        resolve_profile_path(str(tmp_path))


def test_a_profile_opened_through_a_link_names_the_link_whose_neighbours_it_read(tmp_path):
    from tasks.profile import load_profile
    real, beside = tmp_path / "real", tmp_path / "links"
    real.mkdir()
    beside.mkdir()
    body = '[target]\nname = "{}"\n[server]\nengine = "command"\ncommand = ["x"]\nport = 18001\n'
    (real / "base.toml").write_text(body.format("from-real"))
    (beside / "base.toml").write_text(body.format("from-links"))
    (real / "child.toml").write_text('extends = "base.toml"\n')
    os.symlink(real / "child.toml", beside / "child.toml")
    p = load_profile(beside / "child.toml")
    assert p.target.name == "from-links"               # extends: beside the link
    assert p.path == beside / "child.toml"             # and the link is the file it names


def test_the_dflash_config_says_what_extends_does_with_its_table():
    text = (ROOT / "configs" / "qwen3.6-27b-dflash.toml").read_text()
    assert "deep-merge" not in text and "replaces the base's whole" in text


@pytest.mark.parametrize("program,argv,said", [
    ("fab", ["tail-log", "-l", "abc"], "tail-log has no flag -l any more"),
    ("llmfab", ["tail-log", "-l", "5"], "tail-log has no flag -l any more"),
    ("fab", ["deploy", "-d"], "deploy has no flag -d any more"),
])
def test_a_removed_short_flag_after_the_task_says_what_it_is_now(program, argv, said):
    cmd = [sys.executable, "-m", "fabric"] if program == "fab" else \
        [sys.executable, "-c", "from tasks.program import main; main()"]
    r = subprocess.run(cmd + argv, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert said in r.stderr and "write --" in r.stderr, r.stderr


def test_a_resumed_sweep_refuses_a_profile_whose_content_changed(tmp_path):
    from tasks.tune.task import _check_resume
    plan = {"profile": "/p.toml", "profile_digest": {"/p.toml": "aaa"}}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    _check_resume(tmp_path, plan)  # the same: fine
    with pytest.raises(UsageError, match=r"/p.toml changed since that sweep began"):
        _check_resume(tmp_path, dict(plan, profile_digest={"/p.toml": "bbb"}))


def test_ctrl_c_of_a_tune_at_the_terminal_stops_it_in_words_and_puts_back(tmp_path):
    """The terminal's Ctrl-C reaches the whole foreground process group: llmfab and, before
    the fix, its local agent too, which died ("host given up: exit -2: Traceback") while the
    note named a results.jsonl never written."""
    import shutil
    import signal
    import socket
    import threading
    (tmp_path / "configs").mkdir()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    (tmp_path / "configs" / "demo.toml").write_text(
        (ROOT / "configs" / "demo.toml").read_text().replace("18000", str(port)))
    shutil.copy(ROOT / "configs" / "demo_server.py", tmp_path / "configs")
    env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=str(ROOT), COLUMNS="200")
    llmfab = [sys.executable, "-c", "from tasks.program import main; main()"]
    assert subprocess.run(llmfab + ["deploy"], cwd=tmp_path, env=env, capture_output=True,
                          timeout=120).returncode == 0
    p = subprocess.Popen(llmfab + ["tune", "--vary", "server.args.num-speculative-tokens=2,4",
                                   "--concurrency", "1", "--requests", "8"],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    lines, benching = [], threading.Event()

    def read():
        for line in p.stdout:
            lines.append(line)
            if "bench concurrency" in line:
                benching.set()
    t = threading.Thread(target=read, daemon=True)
    t.start()
    try:
        assert benching.wait(60), "".join(lines)
        os.killpg(p.pid, signal.SIGINT)  # as a terminal's Ctrl-C does: the whole group
        assert p.wait(60) == 130, "".join(lines)
        t.join(10)
    finally:
        if p.poll() is None:
            p.kill()
        subprocess.run(llmfab + ["stop"], cwd=tmp_path, env=env, capture_output=True, timeout=120)
    out = "".join(lines)
    assert "exit -" not in out and "Traceback" not in out and "given up" not in out, out
    assert "runs again, as before" in out, out
    said = re.search(r"interrupted: (what was measured is in (\S+)|nothing was measured yet)", out)
    assert said, out
    if said.group(2):
        assert Path(said.group(2)).is_file(), out
