"""The shape issue 12 gave the client: one error boundary, frozen options per task, one
view on [server.args], status gathered then rendered -- and the hardening that came with
it (secrets refused in args, dry-run JSON). Unit tests plus real `fab` processes
(no host is touched: --dry-run and bad input stop before any)."""
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tasks import options
from tasks.errors import ExitCode, UsageError
from tasks.profile import load_profile
from tasks.profile.serverargs import ServerArgs
from tasks.output import wrap_block
from tasks.status import Status, render, verdict

REPO = Path(__file__).resolve().parents[2]


def fab(*args, env=None, cwd=REPO):
    import os
    return subprocess.run([sys.executable, "-m", "fabric", *args], cwd=str(cwd), capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, **(env or {})))


def write(tmp_path, body, name="p.toml"):
    path = tmp_path / name
    path.write_text(body)
    return path


# -- one error boundary -----------------------------------------------------------------------

def test_exit_is_raised_only_at_the_boundary():
    # Task bodies raise llmfab errors; only the CLI layer turns them into invoke's Exit.
    allowed = {"cli.py", "executor.py"}
    offenders = []
    for path in (REPO / "tasks").rglob("*.py"):
        text = path.read_text()
        if path.name not in allowed and re.search(r"\bExit\(|import Exit\b", text):
            offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


def test_the_command_table_and_the_tasks_name_each_other():
    """tasks/cli.py COMMANDS is the one place a reader finds every task: each row's body and
    options record exist, each task `fab` shows has a row, and its summary is what `fab --list`
    shows; nothing outside the row says where a task's body lives."""
    import importlib
    from tasks import cli, ns
    assert sorted(cli.COMMANDS) == sorted(n.replace("_", "-") for n in ns.task_names)
    for name, info in cli.COMMANDS.items():
        assert callable(getattr(importlib.import_module("tasks." + info.module), info.function)), name
        assert issubclass(cli.options_class(info), options.Common), name
        assert ns[name].__doc__ == info.summary and info.summary.endswith("."), name
    text = (REPO / "tasks" / "cli.py").read_text()
    assert not re.search(r'_boundary\(c, "[\w-]+:', text)  # no "module:function" strings


@pytest.mark.parametrize("cls,flags,needle", [
    (options.DeployOptions, {"timeout": "soon"}, "--timeout expects a number of seconds"),
    (options.DeployOptions, {"timeout": "-1"}, "--timeout must be more than 0"),
    (options.StopOptions, {"grace": "nan"}, "--grace expects a finite number of seconds"),
    (options.BenchOptions, {"requests": "1.5"}, "--requests expects a positive integer"),
    (options.BenchOptions, {"compare": "a.json"}, "--compare expects two files"),
    (options.ReleasesOptions, {"keep": "0"}, "--keep expects a whole number >= 1"),
    (options.KillGpuProcsOptions, {"gpus": "0", "all": True}, "give --gpus or --all, not both"),
    (options.Common, {"parallel": "0"}, "--parallel expects a positive integer"),
])
def test_bad_option_values_are_usage_errors(cls, flags, needle):
    with pytest.raises(UsageError) as e:
        cls.from_flags(**flags)
    assert needle in e.value.message and e.value.code == ExitCode.BAD_INPUT


def test_options_are_frozen_and_typed():
    opts = options.DeployOptions.from_flags(profile="p.toml", timeout="90", parallel="4")
    assert (opts.timeout, opts.parallel, opts.no_wait) == (90.0, 4, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.no_wait = True
    bench = options.BenchOptions.from_flags(requests="8", compare="a.json, b.json")
    assert (bench.requests, bench.concurrency, bench.compare) == (8, 4, ("a.json", "b.json"))


def test_bad_flag_through_the_cli_is_one_line_and_exit_2():
    r = fab("deploy", "--timeout", "soon", "--dry-run")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "error: --timeout expects a number of seconds (got 'soon')"


# -- secrets never on argv ----------------------------------------------------------------------

def test_from_env_under_server_args_is_refused_naming_the_key_and_where_it_goes(tmp_path):
    prof = write(tmp_path, '[target]\nname = "x"\n[server]\nengine = "vllm"\nmodel = "/m"\n'
                           '[server.args]\napi-key = { from_env = "MYKEY" }\n')
    r = fab("deploy", "--dry-run", "--profile", str(prof), env={"MYKEY": "s3cret"})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "server.args.api-key" in r.stderr and str(prof) in r.stderr
    assert '[server.env] VLLM_API_KEY = { from_env = "MYKEY" }' in r.stderr
    assert "s3cret" not in r.stdout + r.stderr and r.stdout == ""


def test_from_env_inside_another_arg_names_an_environment_variable(tmp_path):
    prof = write(tmp_path, '[target]\nname = "x"\n[server]\nengine = "vllm"\nmodel = "/m"\n'
                           '[server.args]\nhf-token = { from_env = "HF" }\n')
    r = fab("deploy", "--dry-run", "--profile", str(prof), env={"HF": "t"})
    assert r.returncode == 2 and "server.args.hf-token" in r.stderr
    assert '[server.env] as an environment variable the server reads (e.g. HF_TOKEN = ' \
           '{ from_env = "HF" })' in r.stderr


# -- deploy --dry-run --json --------------------------------------------------------------------

def test_dry_run_json_is_one_object_per_host_with_argv_launcher_and_files(tmp_path):
    prof = write(tmp_path, '[target]\nname = "dry"\nhosts = ["a", "b"]\n[server]\nengine = "vllm"\n'
                           'model = "/models/m"\n[server.args]\nspeculative-config = { method = "ngram" }\n'
                           '[server.env]\nHF_TOKEN = { from_env = "TOK" }\n')
    r = fab("deploy", "--dry-run", "--json", "--profile", str(prof), env={"TOK": "hush"})
    assert r.returncode == 0, r.stderr
    objs = [json.loads(line) for line in r.stdout.splitlines()]
    assert [o["host"] for o in objs] == ["a", "b"]
    one = objs[0]
    profile = load_profile(prof, environ={"TOK": "hush"})
    from tasks.steps.argv import server_argv
    from tasks.release.launcher import render_launcher
    assert one["argv"] == server_argv(profile) and one["launcher"] == render_launcher(profile)
    assert one["dry_run"] is True and one["secrets"] == ["HF_TOKEN"]
    names = [f["name"] for f in one["files"]]
    assert names == ["launch.py", "argv.json", "profile.toml", "secrets.json"]
    assert "sha256" not in one["files"][3] and "hush" not in r.stdout + r.stderr


def test_dry_run_of_a_child_profile_sends_its_own_speculative_config_whole(tmp_path):
    # Issue 22, as found: an n-gram child over an EAGLE3 base, seen with `deploy --dry-run`.
    write(tmp_path, '[target]\nname = "b"\n[server]\nengine = "vllm"\nmodel = "/models/m"\n'
                    '[server.args]\nspeculative-config = { method = "eagle3", model = '
                    '"/models/eagle3", num_speculative_tokens = 3 }\n', name="base.toml")
    prof = write(tmp_path, 'extends = "base.toml"\n[server.args]\nspeculative-config = { method = '
                           '"ngram", num_speculative_tokens = 4, prompt_lookup_max = 4 }\n')
    r = fab("deploy", "--dry-run", "--json", "--profile", str(prof))
    assert r.returncode == 0, r.stderr
    argv = json.loads(r.stdout.splitlines()[0])["argv"]
    spec = argv[argv.index("--speculative-config") + 1]
    assert spec == '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4}'


# -- one view on [server.args] ----------------------------------------------------------------

def test_server_args_fold_dotted_keys_and_find_model_paths_either_way():
    from tasks.profile.types import JsonTable
    dotted = ServerArgs.parse((("speculative_config.model", "/d"), ("speculative-config.method", "eagle"),
                               ("max_model_len", 4096)))
    whole = ServerArgs.parse((("speculative-config", JsonTable('{"model":"/d","method":"eagle"}')),
                              ("max-model-len", 4096)))
    for args in (dotted, whole):
        assert args.get("speculative-config").table == {"model": "/d", "method": "eagle"}
        assert (args.speculative.model, args.speculative.method) == ("/d", "eagle")
        assert args.value("max_model_len") == 4096 and args.has("max-model-len")
        assert [p for _, p in args.model_paths()] == ["/d"]
    assert dotted.model_paths()[0][0] == "server.args.speculative_config.model"
    assert dotted.speculative.key_of("model") == "server.args.speculative_config.model"
    assert not whole.has("api-key") and whole.get("api-key") is None and whole.api_key is None


# -- status: gathered, then rendered ---------------------------------------------------------

def record(**kw):
    base = {"host": "h1", "running": True, "pid": 7, "release": "20260101T000000Z", "port": 8000,
            "health": 200, "served_name": "m", "gpus": [{"index": 0, "used_mib": 10, "total_mib": 80}],
            "spec": None, "generation_tokens_per_s": None, "uptime_s": 3725, "exit": None,
            "fatal": None, "deployed": True}
    base.update(kw)
    return base


def test_status_renders_a_running_server_and_its_verdict_without_a_host():
    st = Status(record(), metric_lines=["no speculative decoding"])
    assert render(st) == ["running: release 20260101T000000Z, pid 7, up 1h02m, port 8000, health 200, "
                          "model m", "  GPU 0: 10 / 80 MiB", "  no speculative decoding"]
    assert verdict(st).code == 0 and verdict(Status(record(health=503))).code == ExitCode.FAILED


def test_status_renders_a_dead_server_with_why():
    st = Status(record(running=False, exit={"returncode": 0, "ended_at": "2026-01-01T00:00:09+00:00"},
                       gpus=None), why="engine died: EngineDeadError")
    assert wrap_block(render(st)[0], 1000) == [
        "not running: release 20260101T000000Z exited with status 0 at 2026-01-01T00:00:09+00:00",
        "  why: engine died: EngineDeadError"]
    assert verdict(st).summary == "not running"
    gone = Status(record(running=False, deployed=False, gpus=None))
    assert render(gone) == ["not deployed"] and verdict(gone).summary == "not deployed"


# -- one runner, one transport, one exit (issue 37 item 5) -----------------------------------

def _client_modules():
    """The modules that run on this machine: tasks/ less the host/ packages, which run on the
    hosts (the launcher and the agent end their own processes there)."""
    return [p for p in (REPO / "tasks").rglob("*.py") if "host" not in p.relative_to(REPO).parts
            and p.name not in ("launcher.py", "agent_bootstrap.py")]


def test_every_ctrl_c_and_closed_pipe_path_leaves_through_interrupts_leave():
    offenders = [str(p.relative_to(REPO)) for p in _client_modules()
                 if p.name != "interrupts.py" and "os._exit(" in p.read_text()]
    assert offenders == []
    text = (REPO / "tasks" / "interrupts.py").read_text()
    assert text.count("os._exit(") == 1 and "def leave(" in text


def test_ssh_sessions_are_opened_only_in_the_transport():
    offenders = [str(p.relative_to(REPO)) for p in _client_modules()
                 if "transport" not in p.relative_to(REPO).parts
                 and re.search(r"open_session\(|get_transport\(|\.exec_command\(", p.read_text())]
    assert offenders == []


def test_fab_pull_starts_its_threads_through_the_fleet_runner():
    # Its hosts, copies and key removal run on tasks/fleet/fanout.py; hub.py and local.py keep
    # pools of this machine's own work (downloads, hashing), which touch no host.
    for name in ("pull.py", "copies.py", "send.py", "schedule.py"):
        text = (REPO / "tasks" / "weights" / name).read_text()
        assert not re.search(r"ThreadPoolExecutor|threading\.Thread\(|KeyboardInterrupt", text), name
