"""[server.env] and the speculative config, read once (tasks/profile/serverenv.py,
tasks/profile/serverargs.py): every reader gets the value the engine itself would read."""
from pathlib import Path

import pytest

from tasks.doctor.host_request import doctor_request
from tasks.errors import ProfileError
from tasks.failures.explain import Readings, explain
from tasks.failures.logscan import LogScanner
from tasks.kill_gpu_procs import selection
from tasks.options import KillGpuProcsOptions
from tasks.profile import load_profile

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "failures"


def profile(tmp_path, *lines):
    path = tmp_path / "p.toml"
    path.write_text("\n".join(lines) + "\n")
    return load_profile(path, environ={})


def spec_profile(tmp_path, env_line="", drafter="/models/drafter", k="3"):
    # A drafter named by hub id goes with a target named so (nothing to read on the host).
    target = "/models/target" if drafter.startswith("/") else "Qwen/Qwen3-8B"
    return profile(tmp_path, "[server]", 'engine = "vllm"', f'model = "{target}"',
                   "[server.args]",
                   f'speculative-config = {{ method = "eagle3", model = "{drafter}", '
                   f"num_speculative_tokens = {k} }}",
                   "[server.env]", env_line)


# vLLM reads the variable with bool(int(value)) (vllm/envs.py, 0.26 to 0.32): "2" and " 1 " are on.
@pytest.mark.parametrize("toml,on", [('"1"', True), ("true", True), ('"2"', True), ('" 1 "', True),
                                     ('"0"', False), ("false", False)])
def test_the_v2_runner_variable_reads_as_vllm_reads_it_everywhere(tmp_path, toml, on):
    p = spec_profile(tmp_path, f"VLLM_USE_V2_MODEL_RUNNER = {toml}")
    assert p.server.models["v2_runner"] is on
    assert doctor_request(p)["v2_env"] == ("1" if on else "0")


@pytest.mark.parametrize("toml", ['"true"', '"yes"', '"on"', '""'])
def test_a_v2_runner_value_vllm_cannot_read_is_refused(tmp_path, toml):
    # It was off for the preflight's model check and on for the doctor; vLLM stops with ValueError.
    with pytest.raises(ProfileError) as e:
        spec_profile(tmp_path, f"VLLM_USE_V2_MODEL_RUNNER = {toml}")
    assert "server.env.VLLM_USE_V2_MODEL_RUNNER" in str(e.value) and "int()" in str(e.value)


def test_an_unset_v2_runner_variable_is_the_versions_default(tmp_path):
    p = spec_profile(tmp_path)
    assert p.server.models["v2_runner"] is False and doctor_request(p)["v2_env"] is None


# vLLM's SpeculativeConfig is a pydantic dataclass: num_speculative_tokens "3" or 3.0 is 3 (seen in
# vLLM 0.32.0), for a drafter named by hub id as for one in a directory.
@pytest.mark.parametrize("drafter", ["/models/drafter", "org/drafter-eagle3"])
@pytest.mark.parametrize("k", ["3", '"3"', "3.0", '"3.0"', '" 3 "'])
def test_the_draft_length_reads_as_vllm_reads_it(tmp_path, drafter, k):
    p = spec_profile(tmp_path, drafter=drafter, k=k)
    got = doctor_request(p)["k"]
    assert got == {"value": 3, "key": "server.args.speculative-config.num_speculative_tokens", "over": 0}


@pytest.mark.parametrize("k", ['"three"', "3.5", '"3.5"'])
def test_a_draft_length_vllm_refuses_is_not_guessed(tmp_path, k):
    assert doctor_request(spec_profile(tmp_path, k=k, drafter="org/drafter-eagle3"))["k"] is None


def _gpu_profile(tmp_path, cvd, devices=None):
    lines = ["[server]", 'engine = "vllm"', 'model = "/m"', "[server.env]",
             f'CUDA_VISIBLE_DEVICES = "{cvd}"']
    return profile(tmp_path, *lines, *(["[gpu]", f"devices = {devices}"] if devices else []))


def _gpu_in_fix(p, cuda):
    text = (FIXTURES / "gpu-memory-taken.log").read_text().replace("cuda:0", f"cuda:{cuda}")
    scanner = LogScanner()
    scanner.feed(text, final=True)
    fix = explain(scanner, Readings(profile=p)).fix
    return int(fix.split("kill-gpu-procs --gpus ", 1)[1].split()[0])


@pytest.mark.parametrize("cvd,devices,gpus", [
    ("3,1", None, [3, 1]),
    ("0,1", "[2, 3]", [2, 3]),       # [gpu] devices (nvidia-smi's indexes) wins, for every reader
])
def test_every_reader_of_the_gpus_agrees(tmp_path, cvd, devices, gpus):
    p = _gpu_profile(tmp_path, cvd, devices)
    assert selection(KillGpuProcsOptions.from_flags(), p) == gpus
    assert [_gpu_in_fix(p, n) for n in range(len(gpus))] == gpus
    assert p.gpu_count == len(gpus)


def test_gpus_named_by_uuid_are_counted_not_guessed(tmp_path):
    p = _gpu_profile(tmp_path, "GPU-5f2c,GPU-9a01")
    assert p.devices is None and p.gpu_count == 2 and _gpu_in_fix(p, 1) == 1
