"""Failure explanations end to end: the real `fab deploy` against lab hosts, where the
stand-in vLLM (or a real script) fails the way the real engine does, with its real text.

Each: exit 1, the rule id in `--json`'s `fatal`, a fix with the numbers of the line, and
the human message `error: server failed: <cause>` then `fix: <fix>` and `source:` on indented
lines wrapped to the terminal.
"""
import json
import re
import subprocess
from pathlib import Path

from helpers import TARGET, fab, flat, write_profile

NOGUARD = Path(__file__).resolve().parents[1] / "servers" / "noguard_server.py"


def model(lab):
    return lab.model_dir("explain-qwen", architectures=TARGET["architectures"],
                         text_config=TARGET["text_config"])


def vllm(lab, name, host, port, args=(), env=(), model_path=None):
    lines = ["[target]", f'hosts = ["{host}"]', f'name = "{name}"',
             "[server]", 'engine = "vllm"', f'python = "{lab.ml_python}"',
             f'model = "{model_path or model(lab)}"',
             'host = "127.0.0.1"', f"port = {port}", "[server.args]", *args,
             "[server.env]", *[f'{k} = "{v}"' for k, v in env], "[ready]", "timeout = 60",
             "poll_interval = 0.2"]
    return write_profile(lab, name, lines)


def failed_deploy(lab, prof):
    """`fab deploy --json` that must fail: (its fatal object, its human text)."""
    r = fab(lab, "deploy", "--json", profile=prof, code=1)
    records = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(records) == 1 and records[0]["ok"] is False, r.stdout
    fatal = records[0]["fatal"]
    assert set(fatal) == {"rule", "line", "cause", "fix"}, fatal
    human = flat(r.stderr)
    assert f"error: server failed: {flat(fatal['cause'])} fix: {flat(fatal['fix'])} " \
           f"source: failure rule {fatal['rule']}" in human, r.stderr
    # wrapped to 80 columns (stderr is not a terminal here); the log lines under it are not
    firsts = [line for line in r.stderr.splitlines()
              if re.match(r"\[h\d\] (error: server failed|  fix: |  source: )", line)]
    assert len(firsts) == 3 and all(len(line) <= 80 for line in firsts), r.stderr
    return fatal, r.stderr


def test_max_model_len_above_the_models_gives_the_models_number_and_status_says_it_too(lab):
    prof = vllm(lab, "explain-maxlen", "h1", 31401, ["max-model-len = 300000"])
    fatal, _ = failed_deploy(lab, prof)
    assert fatal["rule"] == "max-model-len-too-long"
    assert "User-specified max_model_len (300000) is greater than the derived max_model_len " \
           "(max_position_embeddings=262144" in fatal["line"]
    assert "`max-model-len = 262144`" in fatal["fix"]
    st = fab(lab, "status", "--json", profile=prof, code=1)
    record = json.loads(st.stdout.splitlines()[0])
    assert record["running"] is False and record["fatal"]["rule"] == "max-model-len-too-long"
    assert "  fix: set `max-model-len = 262144`" in st.stderr, st.stderr  # the fix's first line


def test_kv_cache_too_small_gives_the_estimated_length_of_the_line(lab):
    prof = vllm(lab, "explain-kv", "h1", 31402, ["max-model-len = 65536"], [("STANDIN_KV_CACHE_GIB", "4")])
    fatal, human = failed_deploy(lab, prof)
    assert fatal["rule"] == "kv-cache-too-small"
    estimated = int(re.search(r"the estimated maximum model length is (\d+)\.", fatal["line"]).group(1))
    assert f"`max-model-len = {estimated}`" in fatal["fix"]
    assert "RuntimeError: Engine core initialization failed" in human  # the wrapper is shown, not blamed


def test_heads_not_divisible_gives_the_largest_tensor_parallel_size_that_fits(lab):
    prof = vllm(lab, "explain-tp", "h2", 31403, ["tensor-parallel-size = 5"])
    fatal, _ = failed_deploy(lab, prof)
    assert fatal["rule"] == "tp-heads-divisible"
    assert "Total number of attention heads (24) must be divisible by tensor parallel size (5)" in fatal["line"]
    assert "`tensor-parallel-size = 4`" in fatal["fix"]


def test_unknown_flag_names_it(lab):
    prof = vllm(lab, "explain-flag", "h2", 31406, ["enable-dflash-turbo = true"])
    fatal, _ = failed_deploy(lab, prof)
    assert fatal["rule"] == "unrecognized-arguments"
    assert fatal["line"].endswith("error: unrecognized arguments: --enable-dflash-turbo")
    assert "--enable-dflash-turbo" in fatal["fix"]


def test_gpu_taken_is_refused_before_the_launch_naming_the_pid_holding_it(lab):
    """The engine's own wording of this failure (rule gpu-memory-taken) is explained from
    recordings (tests/unit/test_explain.py, the H200 cases); here the preflight stops it first."""
    hog = subprocess.Popen(lab.ssh_argv(
        "h3", "%s -c 'import os, time; from llmfab_standin import nvidia_smi; "
              "nvidia_smi.register(0, 40000); print(os.getpid(), flush=True); time.sleep(300)'"
        % lab.ml_python), stdout=subprocess.PIPE, text=True)
    pid = None
    try:
        pid = int(hog.stdout.readline())
        prof = vllm(lab, "explain-gpu", "h3", 31404, ["gpu-memory-utilization = 0.9"])
        # Known before the launch (issue 36): the preflight compares the engine's ask with what is
        # free, names who holds the rest and the largest fraction that fits; nothing starts.
        r = lab.fab("deploy", profile=prof, timeout=180)
        out = " ".join(" ".join(line.split("] ", 1)[-1] for line in (r.stdout + r.stderr).splitlines()).split())
        assert r.returncode == 1 and "nothing was launched" in out, out
        assert "GPU 0: the engine will ask gpu-memory-utilization 0.9 x 81559 MiB = 73403 MiB" in out, out
        assert f"held by pid {pid} (" in out and "40000 MiB" in out and "at most 0.48" in out, out
    finally:
        if pid is not None:
            lab.exec("h3", ["kill", str(pid)])
        hog.kill()
        hog.wait()
        hog.stdout.close()


def test_a_command_script_without_the_main_guard_under_spawn_is_spawn_main_guard(lab):
    prof = write_profile(lab, "explain-spawn", [
        "[target]", 'hosts = ["h2"]', 'name = "explain-spawn"',
        "[server]", 'engine = "command"', 'command = ["python3", "noguard_server.py"]',
        f'files = ["{NOGUARD}"]', 'host = "127.0.0.1"', "port = 31405",
        "[server.args]", "port = 31405", "[ready]", 'models_path = ""', "timeout = 60",
        "poll_interval = 0.2"])
    fatal, human = failed_deploy(lab, prof)
    assert fatal["rule"] == "spawn-main-guard"
    assert "An attempt has been made to start a new process before the" in fatal["line"]
    assert 'if __name__ == "__main__":' in fatal["fix"] and "`noguard_server.py`" in fatal["fix"]
    assert "_check_not_importing_main" in human  # the explaining lines: CPython's own traceback


def test_a_rollback_to_a_release_that_cannot_start_says_why_in_its_json(lab):
    # r1 started fine with max-model-len 300000 while the model allowed 400000; then the
    # model's config.json changed (262144, as the real Qwen3.6-27B has): rolling back to r1
    # now fails the way vLLM fails, and says so. (A release that failed at its own deploy is
    # never picked by rollback: test_logs_releases.py covers that.)
    import copy
    wide = copy.deepcopy(TARGET["text_config"])
    wide["max_position_embeddings"] = 400000
    model_dir = lab.model_dir("explain-rollback-qwen", architectures=TARGET["architectures"],
                              text_config=wide)
    r1 = vllm(lab, "explain-rollback", "h1", 31407, ["max-model-len = 300000"], model_path=model_dir)
    fab(lab, "deploy", profile=r1)
    good = vllm(lab, "explain-rollback", "h1", 31407, model_path=model_dir)
    fab(lab, "deploy", profile=good)
    lab.model_dir("explain-rollback-qwen", architectures=TARGET["architectures"],
                  text_config=TARGET["text_config"])
    try:
        r = fab(lab, "rollback", "--json", profile=good, code=1)
    finally:  # the session's hosts are shared: leave nothing running (and holding stand-in GPU)
        fab(lab, "stop", "--grace", "5", profile=good)
    record = json.loads(r.stdout.splitlines()[0])
    assert record["ok"] is False and record["fatal"]["rule"] == "max-model-len-too-long", r.stdout
    assert "`max-model-len = 262144`" in record["fatal"]["fix"]
    assert "error: server failed: max-model-len 300000 is more than the model's" in r.stderr, r.stderr


def test_a_server_that_dies_of_an_unknown_exception_is_exited_with_that_exception(lab):
    prof = write_profile(lab, "explain-exited", [
        "[target]", 'hosts = ["h3"]', 'name = "explain-exited"',
        "[server]", 'engine = "command"',
        "command = [\"python3\", \"-c\", \"import sys; print('loading', flush=True); "
        "{}['chat_template_kwargs']\"]",
        'host = "127.0.0.1"', "port = 31408", "[ready]", 'models_path = ""', "timeout = 60",
        "poll_interval = 0.2"])
    fatal, human = failed_deploy(lab, prof)
    assert fatal["rule"] == "exited" and fatal["line"] is None
    assert fatal["cause"] == "KeyError: 'chat_template_kwargs'"
    assert "fab tail-log --profile" in fatal["fix"]
    assert "loading" in human  # the last lines of its log


def test_sglang_without_room_for_its_kv_cache_gives_the_next_mem_fraction(lab):
    prof = write_profile(lab, "explain-sglang", [
        "[target]", 'hosts = ["h3"]', 'name = "explain-sglang"',
        "[server]", 'engine = "sglang"', f'python = "{lab.ml_python}"', f'model = "{model(lab)}"',
        'host = "127.0.0.1"', "port = 31410", "[server.args]", "mem-fraction-static = 0.6",
        "[server.env]", 'STANDIN_FAIL = "engine_init"', "[ready]", "timeout = 60", "poll_interval = 0.2"])
    fatal, _ = failed_deploy(lab, prof)
    assert fatal["rule"] == "no-kv-cache-memory"
    assert fatal["line"].endswith("Current value: mem_fraction_static=0.6")
    assert "`mem-fraction-static` in [server.args] (now 0.6; try 0.65)" in fatal["fix"]


def test_port_taken_names_the_port_and_how_to_find_its_holder(lab):
    prof = vllm(lab, "explain-port", "h1", 31411, env=[("STANDIN_FAIL", "port_in_use")])
    fatal, _ = failed_deploy(lab, prof)
    assert fatal["rule"] == "port-in-use" and fatal["line"].endswith("OSError: [Errno 98] Address already in use")
    assert "port 31411 is already taken" in fatal["cause"]
    assert "`ss -ltnp 'sport = :31411'`" in fatal["fix"] and "`server.port`" in fatal["fix"]
