"""runtime = "systemd": the unit file and its quoting (golden), [systemd] in the profile, runtime.json.

The quoting is systemd.syntax(7)'s: ExecStart= words double-quoted with C escapes, % as %% and
$ as $$; EnvironmentFile= values double-quoted with \\ " ` $ escaped. The lab test
(tests/lab/test_runtime_systemd.py) checks the same text against systemd 252 itself: the
server receives exactly the argv and the environment launch.py holds.
"""
import json
import os
from pathlib import Path

import pytest

from tasks.errors import ProfileError
from tasks.profile import load_profile
from tasks.runtime import RUNTIMES, release_files
from tasks.runtime.host import runtimes
from tasks.runtime.host.systemd_unit import env_line, exec_line, exec_word, path_value, unit_text
from tasks.base.host.hosterrors import HostError

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


@pytest.mark.parametrize("word, quoted", [
    ("/usr/bin/python3", '"/usr/bin/python3"'),
    ("a b", '"a b"'),
    ('say "hi"', '"say \\"hi\\""'),
    ("back\\slash", '"back\\\\slash"'),
    ("100%", '"100%%"'),
    ("%n", '"%%n"'),
    ("$HOME ${X}", '"$$HOME $${X}"'),
    ("", '""'),
    ("'single'", "\"'single'\""),
    ("-leading-dash", '"-leading-dash"'),
])
def test_exec_word_quotes_per_systemd_syntax(word, quoted):
    assert exec_word(word) == quoted


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\0b"])
def test_a_word_or_path_with_a_newline_is_refused_not_mangled(bad):
    with pytest.raises(HostError):
        exec_word(bad)
    with pytest.raises(HostError):
        path_value(bad)


def test_env_line_escapes_what_systemd_reads_inside_double_quotes():
    assert env_line("K", 'a "q" $HOME `x` \\ %n') == 'K="a \\"q\\" \\$HOME \\`x\\` \\\\ %n"\n'
    assert env_line("K", "") == 'K=""\n'


def test_unit_file_golden():
    spec = {"runtime": "systemd", "unit": "llmfab-demo.service", "enable": True, "restart": "on-failure",
            "backoff": 5.0, "max_restarts": 5, "window": 600.0, "memory_timeout": 120.0, "grace": 30.0}
    text = unit_text("/home/u/llmfab/demo", "/home/u/llmfab/demo/releases/20261204T120000Z", spec,
                     "/opt/venv/bin/python3")
    path = GOLDEN / "demo.systemd.service"
    if os.environ.get("LLMFAB_REGOLD"):
        path.write_text(text)
    assert text == path.read_text()
    assert exec_line(["/opt/venv/bin/python3", "-S"]) in text


def _profile(tmp_path, extra, runtime="systemd"):
    (tmp_path / "p.toml").write_text("\n".join([
        "[target]", 'name = "demo"', "[server]", 'engine = "command"', 'command = ["/bin/true"]',
        f'runtime = "{runtime}"'] + extra) + "\n")
    return load_profile(tmp_path / "p.toml", environ={})


def test_runtime_json_maps_supervise_onto_restart_and_start_limits(tmp_path):
    p = _profile(tmp_path, ["[supervise]", 'restart = "always"', "max_restarts = 3", "window = 60",
                            "backoff = 2", "[systemd]", "enable = true"])
    files = {name: data for name, data, _ in release_files(p)}
    spec = json.loads(files["runtime.json"])
    assert spec == {"runtime": "systemd", "unit": "llmfab-demo.service", "enable": True, "restart": "always",
                    "backoff": 2.0, "max_restarts": 3, "window": 60.0, "memory_timeout": 120.0, "grace": 30.0,
                    "hang": None}
    assert "llmfab_host/runtime/host/systemd_unit.py" not in files  # [supervise] already ships llmfab_host
    text = unit_text("/d", "/d/releases/r", spec, "/py")
    assert "Restart=always" in text and "RestartSec=2" in text and "StartLimitBurst=4" in text
    assert "StartLimitIntervalSec=60" in text and "ExecStartPost=" not in text


def test_hang_timeout_gives_the_unit_its_hang_watch(tmp_path):
    p = _profile(tmp_path, ["[supervise]", 'restart = "on-failure"', "hang_timeout = 20"])
    spec = json.loads({name: data for name, data, _ in release_files(p)}["runtime.json"])
    assert spec["hang"] == {"hang_timeout": 20.0, "port": 8000, "probe_host": "127.0.0.1", "health_path": "/health",
                            "metrics_path": None}
    text = unit_text("/d", "/d/releases/r", spec, "/py")
    assert 'ExecStartPost="/py" "-S" "-m" "llmfab_host.runtime.host.systemd_unit" "watch" "/d/releases/r"' in text


def test_a_systemd_release_carries_the_host_package_it_runs(tmp_path):
    files = {name for name, _, _ in release_files(_profile(tmp_path, []))}
    assert {"runtime.json", "llmfab_host/runtime/host/systemd_unit.py", "llmfab_host/__init__.py"} <= files


def test_the_process_runtime_adds_nothing(tmp_path):
    assert release_files(_profile(tmp_path, [], runtime="process")) == []


def test_systemd_table_without_runtime_systemd_is_an_error_naming_it(tmp_path):
    with pytest.raises(ProfileError) as e:
        _profile(tmp_path, ["[systemd]", "enable = true"], runtime="process")
    assert "systemd" in str(e.value) and 'runtime = "systemd"' in str(e.value)


@pytest.mark.parametrize("lines, key", [
    (["[systemd]", 'enable = "yes"'], "systemd.enable"),
    (["[systemd]", "enabled = true"], "systemd.enabled"),
])
def test_bad_systemd_keys_name_the_key(tmp_path, lines, key):
    with pytest.raises(ProfileError) as e:
        _profile(tmp_path, lines)
    assert key in str(e.value)


def test_an_unknown_runtime_names_the_key_and_the_choices(tmp_path):
    with pytest.raises(ProfileError) as e:
        _profile(tmp_path, [], runtime="k8s")
    assert "server.runtime" in str(e.value) and '"systemd"' in str(e.value) and '"podman"' in str(e.value)


def test_every_runtime_has_a_host_module_or_is_the_launcher():
    assert set(RUNTIMES) == {"process", "systemd", "podman", "docker"}
    for name, info in RUNTIMES.items():
        assert (info.host is None) == (name == "process")
        assert runtimes.HOST_MODULES.get(name) == info.host
