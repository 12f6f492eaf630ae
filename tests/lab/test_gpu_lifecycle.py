"""End to end: `fab stop`, `fab kill-gpu-procs`, `fab status` over real SSH on lab hosts.

h1 shares this machine's PID namespace; h2 has its own (like an LXC container), so its
stand-in nvidia-smi reports root-namespace PIDs that do not exist there and the /proc
fd source must find the processes. The stand-in vLLM holds fake GPU memory
(STANDIN_GPU_MIB per GPU: a quarter in the server, the rest in its engine child) and
keeps /dev/nvidia<N> open; the memory is freed when the process dies, as with a driver.
"""
import functools
import json

import pytest

import helpers
from helpers import write_profile
from hostlab import HostLab, alive

pytestmark = pytest.mark.e2e

MIB = 2048
BASELINE = 4  # the stand-in driver's idle reading per GPU


@pytest.fixture(scope="module")
def lab():
    with HostLab(2, pidns=(2,)) as lab:
        yield lab


def profile(lab, name, host, port, **env):
    lines = ["[target]", f'hosts = ["{host}"]', f'name = "{name}"', "[server]", 'engine = "vllm"',
             f'python = "{lab.ml_python}"', f'model = "{lab.model_dir("m")}"', f"port = {port}",
             "[server.args]", 'served-model-name = "m"', "tensor-parallel-size = 2", "[server.env]", f'STANDIN_GPU_MIB = "{MIB}"']
    lines += [f'{k} = "{v}"' for k, v in env.items()]
    lines += ["[ready]", "timeout = 60", "poll_interval = 0.2"]
    return write_profile(lab, name, lines)


fab = functools.partial(helpers.fab, timeout=180)


def gpu_used(lab, host):
    """{index: used MiB} read on the host by its nvidia-smi."""
    r = lab.exec(host, ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                 capture_output=True, text=True, check=True)
    return {int(i): int(m) for i, m in (line.split(", ") for line in r.stdout.splitlines())}


def gpu_pids(lab, host):
    r = lab.exec(host, ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                 capture_output=True, text=True, check=True)
    return sorted({int(p) for p in r.stdout.split()})


def test_stop_sweeps_a_setsid_worker_waits_for_memory_and_is_idempotent(lab):
    prof = profile(lab, "sweep", "h1", 8101, STANDIN_WORKER_SETSID="1")
    fab(lab, "deploy", profile=prof)
    st = json.loads(fab(lab, "status", "--json", profile=prof).stdout)
    assert st["running"] and st["health"] == 200 and st["served_name"] == "m" and st["uptime_s"] >= 0
    assert [g["used_mib"] for g in st["gpus"]] == [BASELINE + MIB] * 2
    first = gpu_pids(lab, "h1")
    assert st["pid"] in first and len(first) == 2  # the server and its engine child (own session)

    # A redeploy stops the running release by the same path, GPU check included.
    r = fab(lab, "deploy", profile=prof)
    assert "GPU memory of this deployment freed" in r.stdout
    assert not any(alive(p) for p in first)

    second = gpu_pids(lab, "h1")
    r = fab(lab, "stop", "--grace", "10", profile=prof)
    assert "GPU memory of this deployment freed" in r.stdout
    assert f"GPU 0: {BASELINE + MIB} -> {BASELINE} MiB" in r.stdout
    assert not any(alive(p) for p in second)
    assert gpu_used(lab, "h1") == {0: BASELINE, 1: BASELINE}
    again = fab(lab, "stop", profile=prof)
    assert "nothing to stop" in again.stdout
    down = json.loads(fab(lab, "status", "--json", profile=prof, code=1).stdout)
    assert down["running"] is False and down["gpus"][0]["used_mib"] == BASELINE


def test_stop_kills_a_server_that_ignores_sigterm(lab):
    prof = profile(lab, "stubborn", "h1", 8102, STANDIN_IGNORE_TERM="1")
    fab(lab, "deploy", profile=prof)
    pids = gpu_pids(lab, "h1")
    assert len(pids) == 2
    r = fab(lab, "stop", "--grace", "1", profile=prof)
    assert "killed by SIGKILL" in r.stdout
    for pid in pids:
        assert f"SIGKILL pid {pid}" in r.stdout
        assert not alive(pid)
    assert gpu_used(lab, "h1") == {0: BASELINE, 1: BASELINE}
    # The launcher's reaper outlived its server long enough to record how it ended.
    st = fab(lab, "status", profile=prof, code=1).stdout
    assert "was stopped by fab stop" in st and "(killed by SIGKILL)" in st and "why:" not in st


def test_kill_gpu_procs_in_a_pid_namespace_goes_through_proc(lab):
    prof = profile(lab, "contained", "h2", 8103, STANDIN_IGNORE_TERM="1")
    fab(lab, "deploy", profile=prof)
    outer = gpu_pids(lab, "h2")  # root-namespace PIDs: what nvidia-smi reports in a container
    assert len(outer) == 2 and all(alive(p) for p in outer)

    dry = fab(lab, "kill-gpu-procs", "--dry-run", "--json", profile=prof)
    plan = json.loads(dry.stdout)
    assert sorted(f["pid"] for f in plan["foreign"]) == sorted(outer * 2)  # each holds both GPUs
    found = [p for p in plan["processes"] if not p["spared"]]
    assert len(found) == 2 and all(p["source"] == "proc-fd" for p in found)
    assert all([g["index"] for g in p["gpus"]] == [0, 1] for p in found)
    assert "not processes of this PID namespace" in dry.stderr and "nothing was signalled" in dry.stderr
    assert all(alive(p) for p in outer) and gpu_used(lab, "h2") == {0: BASELINE + MIB, 1: BASELINE + MIB}

    r = fab(lab, "kill-gpu-procs", "--gpus", "0,1", "--grace", "1", "--json", profile=prof)
    done = json.loads(r.stdout)
    assert sorted(k["how"] for k in done["killed"]) == ["SIGKILL", "SIGKILL"]
    assert done["freed_mib"] == {"0": MIB, "1": MIB}
    assert not any(alive(p) for p in outer)
    assert gpu_used(lab, "h2") == {0: BASELINE, 1: BASELINE}
    nothing = fab(lab, "kill-gpu-procs", profile=prof)
    assert "nothing to kill" in nothing.stdout
    fab(lab, "stop", profile=prof)  # the deployment's reaper is left; stop tidies up, exit 0


@pytest.mark.parametrize("args", [("--gpus", "0,x"), ("--gpus=-1",), ("--gpus", "1,1"),
                                  ("--gpus", "0", "--all")])
def test_bad_gpu_selection_exits_2_before_any_host(lab, args):
    prof = profile(lab, "nohost", "unreachable", 8104)
    r = fab(lab, "kill-gpu-procs", *args, profile=prof, code=2)
    assert "--gpus" in r.stderr and "unreachable" not in r.stdout + r.stderr
