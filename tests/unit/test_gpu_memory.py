"""Client side of the GPU lifecycle: --gpus parsing, device selection, limits, the memory wait.

The memory wait runs against the real host agent on this machine (the `local` host), with
an nvidia-smi that replays recorded outputs (tests/fixtures/nvidia-smi).
"""
import sys
from pathlib import Path

import pytest
from tasks.errors import UsageError
from tasks.profile import load_profile
from tasks.options import KillGpuProcsOptions

from tasks import kill_gpu_procs
from tasks.gpu import memory
from tasks.errors import OperationFailed
from tasks.transport.agent import Host

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"


@pytest.mark.parametrize("text,expected", [("0", [0]), ("0,1", [0, 1]), (" 3 , 7 ", [3, 7])])
def test_gpu_list(text, expected):
    assert list(KillGpuProcsOptions.from_flags(gpus=text).gpus) == expected


@pytest.mark.parametrize("text", ["", "0,", "x", "-1", "0,0", "1.5", "0;1"])
def test_bad_gpu_list_is_exit_2(text):
    with pytest.raises(UsageError) as e:
        KillGpuProcsOptions.from_flags(gpus=text)
    assert e.value.code == 2 and "--gpus" in e.value.message


def profile_with(tmp_path, devices=None, env=()):
    """A real profile: [gpu] devices and [server.env] as given."""
    lines = ['[server]', 'engine = "vllm"', 'model = "/m"', '[server.env]']
    lines += [f'{k} = "{v}"' for k, v in dict(env).items()]
    if devices is not None:
        lines += ['[gpu]', f'devices = {list(devices)}']
    path = tmp_path / "p.toml"
    path.write_text("\n".join(lines) + "\n")
    return load_profile(path, environ={})


@pytest.mark.parametrize("devices,env,expected", [
    ((2, 3), {"CUDA_VISIBLE_DEVICES": "0"}, [2, 3]),    # gpu.devices wins
    (None, {"CUDA_VISIBLE_DEVICES": "1,0"}, [1, 0]),
    (None, {"CUDA_VISIBLE_DEVICES": "GPU-5f2c"}, None),  # a UUID: all GPUs, not a guess
    (None, {}, None),
])
def test_profile_devices(tmp_path, devices, env, expected):
    assert profile_with(tmp_path, devices, env).devices == expected


def test_selection_flags(tmp_path):
    prof = profile_with(tmp_path, (1,))
    opts = KillGpuProcsOptions.from_flags
    assert kill_gpu_procs.selection(opts(), prof) == [1]
    assert kill_gpu_procs.selection(opts(all=True), prof) is None
    assert kill_gpu_procs.selection(opts(gpus="0,2"), prof) == [0, 2]
    with pytest.raises(UsageError):
        opts(gpus="0", all=True)


def test_tolerance_and_limits():
    from tasks.gpu.host.nvsmi import baseline_limits, tolerance
    assert tolerance(0) == 256 and tolerance(100_000) == 2000
    base = {"gpus": [{"index": 0, "used_mib": 4}, {"index": 1, "used_mib": 30000},
                     {"index": 2, "used_mib": None}], "devices": [1, 2]}
    assert baseline_limits(base) == {1: 30600} and baseline_limits(None) == {}
    gpus = [{"index": 0, "used_mib": 5274}, {"index": 1, "used_mib": None}]
    targets = [{"gpus": [{"index": 0, "used_mib": 2590}]}, {"gpus": [{"index": 0, "used_mib": None}]}]
    assert kill_gpu_procs._limits(gpus, targets) == {0: 2684 + 256}


@pytest.fixture
def local_host(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$1\" in --query-gpu=*) cat %s ;; *) cat %s ;; esac\n"
                   % (FIX / "gpus_container.txt", FIX / "apps_container_foreign.txt"))
    smi.chmod(0o755)
    host = Host("local", python=sys.executable)
    yield host, str(smi)
    host.close()


def test_wait_freed_returns_readings_once_under_the_limit(local_host):
    host, smi = local_host
    gpus = memory.wait_freed(host, nvidia_smi=smi, limits={0: 41891}, timeout=5)
    assert [(g["index"], g["used_mib"]) for g in gpus] == [(0, 41891)]


def test_wait_freed_names_the_holders_when_time_runs_out(local_host):
    host, smi = local_host
    with pytest.raises(OperationFailed) as e:
        memory.wait_freed(host, nvidia_smi=smi, limits={0: 256}, timeout=0.5, what="GPU memory of x")
    assert "GPU memory of x not freed after 0 s: GPU 0 uses 41891 MiB (limit 256 MiB)" in e.value.message
    # The container case: pids of another namespace (plus whatever holds /dev/nvidia0 here).
    assert {"pid 1283556 (GPU 0, 40210 MiB, via nvidia-smi; not a process of this PID namespace)",
            "pid 1283601 (GPU 0, 1318 MiB, via nvidia-smi; not a process of this PID namespace)"} \
        <= set(e.value.details)
