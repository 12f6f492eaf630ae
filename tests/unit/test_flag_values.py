"""Every flag of every task given a bad value: exit 2 with one line naming the flag and the value.

Run in-process through the installed program's parser (tasks/program.py), so every task and
flag that `fab --help` lists is tried; a flag whose default in tasks/cli.py is a number would
be converted by Invoke itself, whose error names neither the flag nor what it takes."""
import inspect

import pytest

from tasks import ns
from tasks.program import make_program

# A bad value for each flag that takes a constrained one (the file-path and free-text flags
# --profile, --prompts, --out, --resume, --profiles take any text; --grep any valid regex).
BAD = {
    "parallel": "abc", "timeout": "soon", "grace": "abc", "lines": "many", "keep": "abc",
    "rolling": "two", "gpus": "a,b", "requests": "x", "concurrency": "x", "max-tokens": "x",
    "repeat": "x", "seed": "x", "temperature": "hot", "random-input-len": "x",
    "input-len": "x", "max-load": "x", "slots": "x", "load": "x", "objective": "x",
    "slo": "x", "vary": "x", "compare": "x", "release": "../x", "grep": "(",
}


def flag_cases():
    for name in sorted(ns.task_names):
        params = inspect.signature(ns[name].body).parameters
        for param in list(params)[1:]:
            flag = param.replace("_", "-")
            if isinstance(params[param].default, bool):
                continue
            if flag in BAD:
                yield name, flag


def test_no_task_flag_has_a_value_default_that_invoke_would_convert():
    # Invoke converts a flag itself (int(), float()) when its default is a number; its error
    # names neither the flag nor the value. Defaults live in tasks/options.py instead.
    for name in ns.task_names:
        for param, p in list(inspect.signature(ns[name].body).parameters.items())[1:]:
            assert p.default is None or isinstance(p.default, bool), (name, param, p.default)


@pytest.mark.parametrize("task,flag", list(flag_cases()))
def test_a_bad_flag_value_is_exit_2_naming_the_flag_and_the_value(task, flag, capsys):
    value = BAD[flag]
    with pytest.raises(SystemExit) as e:
        make_program().run(["llmfab", task, f"--{flag}", value])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert f"--{flag}" in err and repr(value) in err, err


def test_a_short_flag_means_one_flag_in_every_task_and_none_is_a_core_flag():
    from fabric.main import program as fab  # `fab` (-c: collection) and `llmfab` (none)
    core = {name for program in (fab, make_program()) for arg in program.core_args() + fab.task_args()
            for name in arg.names if len(name) == 1}
    assert {"c", "d", "H", "i", "p", "S", "t"} <= core
    meaning = {}
    for name in ns.task_names:
        for arg in ns[name].get_arguments():
            long, shorts = arg.names[0], [n for n in arg.names[1:] if len(n) == 1]
            assert all(len(n) > 1 for n in arg.names[:1]) and len(shorts) <= 1, (name, arg.names)
            for short in shorts:
                assert short not in core, (name, long, short)
                assert meaning.setdefault(short, long) == long, (name, short, long, meaning[short])
    assert meaning == {"j": "json", "n": "dry-run", "v": "vary"}


@pytest.mark.parametrize("task", sorted(t for t in ns.task_names
                                        if "timeout" in inspect.signature(ns[t].body).parameters))
@pytest.mark.parametrize("value", ["0", "-5", "inf", "nan"])
def test_a_timeout_of_nothing_or_forever_is_refused(task, value, capsys):
    with pytest.raises(SystemExit) as e:
        make_program().run(["llmfab", task, "--timeout", value])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "--timeout" in err and repr(value) in err, err


def test_a_grace_of_zero_is_a_kill_at_once_but_forever_is_refused(capsys):
    from tasks.options import seconds
    assert seconds("grace", "0") == 0.0
    for value in ("inf", "-1", "nan"):
        with pytest.raises(Exception) as e:
            seconds("grace", value)
        assert "--grace" in str(e.value) and repr(value) in str(e.value), e.value


def test_help_shows_what_each_flag_takes_and_its_number_default():
    """`fab --help TASK` (a real fab) names each value flag's type, never Invoke's STRING for
    a flag whose default is None, and the defaults of number flags as tasks/options.py has them."""
    import subprocess
    import sys

    from hostlab import REPO
    from tasks.options import BenchOptions, Common, StopOptions

    def help_of(task):
        r = subprocess.run([sys.executable, "-m", "fabric", "--help", task], cwd=str(REPO),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return " ".join(r.stdout.split())

    deploy = help_of("deploy")
    assert f"--parallel=INT at most this many hosts at once (default {Common.parallel})" in deploy
    assert "--timeout=FLOAT seconds" in deploy and "--rolling=INT" in deploy
    assert "--profile=PATH" in deploy and "STRING" not in deploy, deploy
    assert f"--grace=FLOAT seconds between SIGTERM and SIGKILL (default {StopOptions.grace:g})" in help_of("stop")
    bench = help_of("bench")
    assert f"--concurrency=INT requests in flight at once (default {BenchOptions.concurrency})" in bench
    assert "--temperature=FLOAT" in bench and "STRING" not in bench, bench


def every_value_flag():
    for name in sorted(ns.task_names):
        params = inspect.signature(ns[name].body).parameters
        for param in list(params)[1:]:
            if not isinstance(params[param].default, bool):
                yield name, param.replace("_", "-")


@pytest.mark.parametrize("task,flag", list(every_value_flag()))
def test_an_empty_value_is_exit_2_naming_the_flag_never_the_default(task, flag, capsys):
    # `fab stop --profile "$P"` with P unset must not stop the default deployment.
    with pytest.raises(SystemExit) as e:
        make_program().run(["llmfab", task, f"--{flag}", ""])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2, err
    assert len(err.splitlines()) == 1 and f"--{flag} was given an empty value" in err, err


def test_an_empty_host_list_is_exit_2_never_the_profiles_hosts(capsys):
    with pytest.raises(SystemExit) as e:
        make_program().run(["llmfab", "-H", " , ", "status"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "-H/--hosts was given an empty value" in err, err
