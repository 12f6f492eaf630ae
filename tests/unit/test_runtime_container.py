"""The container runtimes (podman, docker): the profile's [container], the engine's `run` argv
(golden: the release's argv after the image, byte for byte), the env file, the restart policy."""
import json
import re

import pytest

from tasks.errors import ProfileError
from tasks.profile import load_profile
from tasks.release.launcher import render_launcher
from tasks.runtime import CONTAINER_RUNTIMES, RUNTIMES, host_python
from tasks.runtime import release_files as runtime_release_files
from tasks.runtime.container import container_spec
from tasks.runtime.host import container
from tasks.steps.argv import server_argv
from tasks.transport.agent_code import host_files
from test_launcher import ROOT, golden

PODMAN = ROOT / "configs" / "qwen3.6-27b-podman.toml"
RDIR = "/root/llmfab/qwen36-podman/releases/20261204T000000Z"


def podman_profile(**environ):
    return load_profile(PODMAN, environ=dict({"HF_TOKEN": "hf_x"}, **environ))


def test_the_runtimes_table_names_each_and_its_engine():
    assert list(RUNTIMES) == ["process", "systemd", "podman", "docker"]
    assert CONTAINER_RUNTIMES == ("podman", "docker")
    assert [RUNTIMES[r].host for r in CONTAINER_RUNTIMES] == ["runtime.host.container"] * 2
    assert [container_spec(podman_profile())["engine"]] == ["podman"]


def test_run_argv_golden_and_the_argv_after_the_image_is_the_releases():
    p = podman_profile()
    spec = container_spec(p)
    argv = server_argv(p)
    run = container.run_argv(spec, RDIR, argv, RDIR + "/container.env")
    golden("qwen3.6-27b-podman.run.json", json.dumps(run, indent=1) + "\n")
    assert run[run.index(spec["image"]) + 1:] == argv
    assert "--init" in run and "--network=host" in run and "--ipc=host" in run
    assert run[run.index("--restart") + 1] == "on-failure:5"
    assert ["--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=1"] == \
        run[run.index("--device"):run.index("--device") + 4]
    # no value of [server.env] on the engine's argv: they go through the env file
    assert not any(a in ("-e", "--env") for a in run) and not any("hf_x" in a for a in run)


def test_docker_differs_only_in_its_binary_and_gpu_flag(tmp_path):
    text = PODMAN.read_text().replace('runtime = "podman"', 'runtime = "docker"')
    path = tmp_path / "d.toml"
    path.write_text(text.replace('extends = "qwen3.6-27b-dflash.toml"',
                                 'extends = "%s"' % (ROOT / "configs" / "qwen3.6-27b-dflash.toml")))
    d = load_profile(path, environ={"HF_TOKEN": "x"})
    run = container.run_argv(container_spec(d), RDIR, server_argv(d), "/e")
    pod = container.run_argv(container_spec(podman_profile()), RDIR, server_argv(d), "/e")
    assert run[0] == "docker" and run[run.index("--gpus"):run.index("--gpus") + 2] == ["--gpus", "device=0,1"]

    def without_gpus(argv):
        gpu = [i for i, a in enumerate(argv) if a in ("--gpus", "--device")]
        return [a for i, a in enumerate(argv[1:], 1) if i not in gpu and i - 1 not in gpu]
    assert without_gpus(run) == without_gpus(pod)


def test_mounts_models_hf_cache_and_the_deployment_at_the_same_paths():
    spec = container_spec(podman_profile())
    dst = {m[1]: m for m in spec["mounts"]}
    assert dst["/root/models/Qwen3.6-27B"][2] is True and dst["/root/models/Qwen3.6-27B-DFlash"][2] is True
    assert dst["/root/.cache/huggingface"] == ["/root/.cache/huggingface", "/root/.cache/huggingface", False]
    run = container.run_argv(spec, RDIR, ["x"], "/e")
    assert "/root/llmfab/qwen36-podman:/root/llmfab/qwen36-podman" in run


def test_launcher_of_a_container_release_is_golden_and_runs_on_the_hosts_python():
    p = podman_profile()
    text = render_launcher(p)
    golden("qwen3.6-27b-podman.launch.py", text)
    compile(text, "launch.py", "exec")
    assert "hf_x" not in text
    # the container itself is runtime.json's (the host half starts it: runtimes.for_release)
    files = runtime_release_files(p)
    name, data, mode = files[0]
    spec = json.loads(data)
    # the hang watch beside the container runs from the release's own llmfab_host
    assert [n for n, _, _ in files[1:]] == ([f"llmfab_host/{n}" for n, _ in host_files()] if spec["hang"] else [])
    assert name == "runtime.json" and mode == 0o600 and "hf_x" not in data.decode()
    assert spec["runtime"] == "podman" and spec == json.loads(json.dumps(container_spec(p)))
    assert host_python(p) == "python3" and p.server.interpreter == "python3"


def test_env_file_refuses_a_line_break_naming_the_variable():
    assert container.env_file_text({"A": "1", "B": "x y=z"}) == "A=1\nB=x y=z\n"
    with pytest.raises(Exception, match="MULTI has a line break"):
        container.env_file_text({"MULTI": "a\nb"})


def test_exit_codes_of_the_init_read_as_signals():
    assert container.returncode(137) == -9 and container.returncode(143) == -15
    assert container.returncode(1) == 1 and container.returncode(0) == 0


@pytest.mark.parametrize("body, key, words", [
    ('[server]\nengine="vllm"\nmodel="/m"\nruntime="lxc"\n', "server.runtime", '"process" | "systemd"'),
    ('[server]\nengine="vllm"\nmodel="/m"\nruntime="podman"\n', "container.image", "required"),
    ('[server]\nengine="vllm"\nmodel="/m"\n[container]\nimage="x"\n', "container", 'runtime = "podman"'),
    ('[server]\nengine="vllm"\nmodel="/m"\nruntime="docker"\n[container]\nimage="x"\nmounts=["rel:/x"]\n',
     "container.mounts[0]", "SRC:DST"),
    ('[server]\nengine="vllm"\nmodel="/m"\nruntime="docker"\n[container]\nimage="x"\n'
     'engine_args=["-e", "K=V"]\n', "container.engine_args[0]", "secrets go in [server.env]"),
    ('[server]\nengine="vllm"\nmodel="/m"\nruntime="podman"\n[container]\nimage="x"\ngpus="all"\n',
     "container.gpus", '"cdi" | "gpus" | "none"'),
])
def test_bad_container_profiles_name_the_key(tmp_path, body, key, words):
    path = tmp_path / "p.toml"
    path.write_text(body)
    with pytest.raises(ProfileError) as e:
        load_profile(path, environ={})
    assert key in str(e.value) and words in str(e.value), str(e.value)
    assert re.search(re.escape(str(path)), str(e.value))
