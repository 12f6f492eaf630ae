"""GPU facts: nvidia-smi parsers from recorded outputs, the /proc fd source, merging, killing.

Fixtures in tests/fixtures/nvidia-smi/ are nvidia-smi outputs as recorded (H200, 8x H100
running vLLM TP=4, a container whose nvidia-smi shows the outer namespace's PIDs, fields
reading [N/A]/[Not Supported], names with commas). The survey tests replay them through
a real executable and read a /proc-shaped tree built here; the kill tests use real
processes.
"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.gpu.host import nvsmi, gpuprocs
from tasks.steps.host import procs

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"


def fixture(name):
    return (FIX / name).read_text()


# -- parsers -------------------------------------------------------------------------------

GPUS = [  # fixture, [(index, name, used, total, util)]
    ("gpus_h200_idle.txt", [(0, "NVIDIA H200", 0, 143771, 0)]),
    ("gpus_h200_torch.txt", [(0, "NVIDIA H200", 5274, 143771, 0)]),
    ("gpus_na.txt", [(0, "NVIDIA A100-SXM4-80GB", 12034, 81920, None),
                     (1, "NVIDIA A100-SXM4-80GB", None, None, None),
                     (2, "GRID A100D-40C", None, 40960, 0)]),
    ("gpus_name_with_comma.txt", [(0, "NVIDIA RTX 6000 Ada Generation, Lab Rev. B", 1210, 49140, 3)]),
    ("gpus_with_header_crlf.txt", [(0, "NVIDIA H200", 0, 143771, 0)]),  # header skipped, units read
    ("gpus_empty.txt", []),
    ("gpus_no_devices.txt", []),
]


@pytest.mark.parametrize("name,expected", GPUS, ids=[g[0] for g in GPUS])
def test_parse_gpus(name, expected):
    got = nvsmi.parse_gpus(fixture(name))
    assert [(g["index"], g["name"], g["used_mib"], g["total_mib"], g["util_pct"]) for g in got] == expected
    assert all(g["uuid"].startswith("GPU-") for g in got)


def test_parse_gpus_h100x8():
    got = nvsmi.parse_gpus(fixture("gpus_h100x8_vllm_tp4.txt"))
    assert [g["index"] for g in got] == list(range(8))
    assert [g["used_mib"] for g in got] == [72301, 72299, 72299, 72301, 1, 1, 40433, 1]
    assert {g["total_mib"] for g in got} == {81559}


APPS = [  # apps fixture, gpus fixture, [(pid, name, MiB, gpu index)]
    ("apps_h100x8_vllm_tp4.txt", "gpus_h100x8_vllm_tp4.txt",
     [(3412907, "VLLM::Worker_TP0", 71698, 0), (3412908, "VLLM::Worker_TP1", 71696, 1),
      (3412909, "VLLM::Worker_TP2", 71696, 2), (3412910, "VLLM::Worker_TP3", 71698, 3),
      (3398004, "/home/ana/venv/bin/python3", 39830, 6)]),
    ("apps_h200_torch.txt", "gpus_h200_torch.txt",
     [(48211, "/opt/torch/.venv/bin/python3", 2590, 0), (48230, "/opt/torch/.venv/bin/python3", 2590, 0)]),
    ("apps_odd_names.txt", "gpus_name_with_comma.txt",
     [(77120, "/srv/models,old/run server.py", 20480, 0), (77121, None, None, 0)]),
    ("apps_container_foreign.txt", "gpus_container.txt", [(1283556, None, 40210, 0), (1283601, None, 1318, 0)]),
    ("apps_none.txt", "gpus_h200_idle.txt", []),
    ("apps_h200_torch.txt", "gpus_empty.txt",  # uuid unknown: no index, still listed
     [(48211, "/opt/torch/.venv/bin/python3", 2590, None), (48230, "/opt/torch/.venv/bin/python3", 2590, None)]),
]


@pytest.mark.parametrize("apps,gpus,expected", APPS, ids=[f"{a[0]}+{a[1]}" for a in APPS])
def test_parse_apps(apps, gpus, expected):
    got = nvsmi.parse_apps(fixture(apps), nvsmi.parse_gpus(fixture(gpus)))
    assert [(a["pid"], a["name"], a["used_mib"], a["gpu"]) for a in got] == expected
    assert all(a["source"] == "nvidia-smi" for a in got)


@pytest.mark.parametrize("text", ["", "\n\n", "garbage", "1, 2", "x, y, z, w, v, u", "[N/A], a, b, c, d, e"])
def test_parsers_never_raise(text):
    assert nvsmi.parse_gpus(text) == []
    assert nvsmi.parse_apps(text) == []


def test_query_reports_why_nvidia_smi_failed(tmp_path):
    assert nvsmi.query_gpus(str(tmp_path / "nope")) == (None, f"{tmp_path / 'nope'} not found on PATH")
    broken = fake_smi(tmp_path, "gpus_empty.txt", "apps_none.txt", rc=9,
                      say="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    gpus, err = nvsmi.query_gpus(broken)
    assert gpus is None and "status 9" in err and "couldn't communicate" in err


# -- the /proc source, on a /proc-shaped tree ------------------------------------------------

def fake_smi(tmp_path, gpus, apps, rc=0, say=""):
    """An executable nvidia-smi that replays two recorded outputs."""
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n"
                    f"if [ {rc} -ne 0 ]; then echo {json.dumps(say)}; exit {rc}; fi\n"
                    'case "$1" in --query-gpu=*) cat ' + json.dumps(str(FIX / gpus)) + " ;;\n"
                    "*) cat " + json.dumps(str(FIX / apps)) + " ;; esac\n")
    path.chmod(0o755)
    return str(path)


def proc(root, pid, cmd, *, fds=(), uid=0, ppid=1, start=1000, comm=None):
    d = root / str(pid)
    (d / "fd").mkdir(parents=True)
    comm = comm or os.path.basename(cmd[0])[:15]
    (d / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 "
                            f"{start} 0 0\n")
    (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (d / "cmdline").write_bytes(b"\0".join(c.encode() for c in cmd) + b"\0")
    (d / "comm").write_text(comm + "\n")
    for n, target in enumerate(fds, start=3):
        os.symlink(target, d / "fd" / str(n))


def test_scan_fds_counts_per_gpu_nodes_only(tmp_path):
    proc(tmp_path, 10, ["python3"], fds=["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1", "/dev/null"])
    proc(tmp_path, 11, ["python3"], fds=["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"])
    proc(tmp_path, 12, ["bash"], fds=["/dev/pts/0", "socket:[1234]"])
    proc(tmp_path, 13, ["torchrun"], fds=["/dev/nvidia0", "/dev/nvidia3", "/dev/nvidia-caps/nvidia-cap1"])
    (tmp_path / "self").mkdir()  # not a pid
    assert gpuprocs.scan_fds(str(tmp_path)) == {10: {1}, 13: {0, 3}}


def test_minor_to_index_reads_the_driver(tmp_path):
    gpus = nvsmi.parse_gpus(fixture("gpus_h100x8_vllm_tp4.txt"))
    for minor, g in ((7, gpus[0]), (0, gpus[1])):  # minors need not follow nvidia-smi's order
        d = tmp_path / "driver" / "nvidia" / "gpus" / f"0000:{minor:02x}:00.0"
        d.mkdir(parents=True)
        (d / "information").write_text(f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\n"
                                       f"GPU UUID: \t {g['uuid']}\nDevice Minor: \t {minor}\n")
    assert gpuprocs.minor_to_index(gpus, str(tmp_path)) == {7: 0, 0: 1}
    assert gpuprocs.minor_to_index(gpus, str(tmp_path / "none")) == {}


def test_survey_in_a_container_uses_proc(tmp_path):
    """nvidia-smi names PIDs of the outer namespace: they are left alone, /proc finds ours."""
    root = tmp_path / "proc"
    proc(root, 1, ["/sbin/init"])
    proc(root, 77, ["/usr/bin/nvidia-persistenced", "--user", "nvidia"], fds=["/dev/nvidiactl", "/dev/nvidia0"])
    proc(root, 4242, ["/venv/bin/python3", "-m", "vllm.entrypoints.openai.api_server"], uid=0,
         fds=["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"])
    s = gpuprocs.survey(fake_smi(tmp_path, "gpus_container.txt", "apps_container_foreign.txt"),
                        None, proc_root=str(root), me=999999)
    assert [f["pid"] for f in s["foreign"]] == [1283556, 1283601]
    assert [(p["pid"], p["source"], p["gpus"], p["user"]) for p in s["procs"]] == [
        (77, "proc-fd", [{"index": 0, "used_mib": None}], "root"),
        (4242, "proc-fd", [{"index": 0, "used_mib": None}], "root")]
    assert s["procs"][0]["spared"] == "system service nvidia-persistenced"
    assert s["procs"][1]["spared"] is None
    assert "1283556" in s["note"] and "/proc/*/fd" in s["note"]
    assert s["gpus"][0]["used_mib"] == 41891


def test_survey_bare_metal_trusts_nvidia_smi_gpus(tmp_path):
    """A worker that opened every GPU node still counts only where nvidia-smi saw memory."""
    root = tmp_path / "proc"
    every = [f"/dev/nvidia{i}" for i in range(8)]
    for i, pid in enumerate((3412907, 3412908, 3412909, 3412910)):
        proc(root, pid, [f"VLLM::Worker_TP{i}"], fds=["/dev/nvidiactl"] + every, uid=1000)
    proc(root, 3398004, ["/home/ana/venv/bin/python3", "train.py"], fds=["/dev/nvidia6"], uid=1000)
    proc(root, 5000, ["python3", "notebook.py"], fds=["/dev/nvidia5"], uid=1000)  # a context, no memory yet
    smi = fake_smi(tmp_path, "gpus_h100x8_vllm_tp4.txt", "apps_h100x8_vllm_tp4.txt")
    s = gpuprocs.survey(smi, [0, 1], proc_root=str(root), me=999999)
    assert [(p["pid"], p["source"], p["gpus"]) for p in s["procs"]] == [
        (3412907, "nvidia-smi+proc-fd", [{"index": 0, "used_mib": 71698}]),
        (3412908, "nvidia-smi+proc-fd", [{"index": 1, "used_mib": 71696}])]
    assert [g["index"] for g in s["gpus"]] == [0, 1] and s["foreign"] == [] and s["note"] is None
    s = gpuprocs.survey(smi, [5, 6], proc_root=str(root), me=999999)
    assert [(p["pid"], p["source"], p["gpus"], p["command"]) for p in s["procs"]] == [
        (5000, "proc-fd", [{"index": 5, "used_mib": None}], "python3 notebook.py"),
        (3398004, "nvidia-smi+proc-fd", [{"index": 6, "used_mib": 39830}], "/home/ana/venv/bin/python3 train.py")]
    # nvidia-smi accounts for GPU 5 (1 MiB, nobody listed): a bare node holder is not a target
    assert s["procs"][0]["spared"] == "holds the device node but nvidia-smi shows no memory of it"
    assert s["procs"][1]["spared"] is None


def test_survey_docker_empty_list_uses_proc(tmp_path):
    """docker: memory in use, nobody listed. /proc's holders are the targets."""
    root = tmp_path / "proc"
    proc(root, 31, ["python3", "serve.py"], fds=["/dev/nvidia0"])
    s = gpuprocs.survey(fake_smi(tmp_path, "gpus_container.txt", "apps_none.txt"), None,
                        proc_root=str(root), me=999999)
    assert [(p["pid"], p["source"], p["spared"]) for p in s["procs"]] == [(31, "proc-fd", None)]
    assert s["foreign"] == [] and s["note"] is None


def test_survey_treats_a_reused_pid_as_foreign(tmp_path):
    root = tmp_path / "proc"
    proc(root, 48211, ["/bin/bash"])  # same number as the torch process nvidia-smi names
    proc(root, 48230, ["/opt/torch/.venv/bin/python3", "server.py"], fds=["/dev/nvidia0"])
    s = gpuprocs.survey(fake_smi(tmp_path, "gpus_h200_torch.txt", "apps_h200_torch.txt"), None,
                        proc_root=str(root), me=999999)
    assert [f["pid"] for f in s["foreign"]] == [48211]
    assert [(p["pid"], p["source"]) for p in s["procs"]] == [(48230, "nvidia-smi+proc-fd")]


def test_agent_and_its_ancestors_are_protected(tmp_path):
    root = tmp_path / "proc"
    proc(root, 100, ["sshd: root@notty"], ppid=1)
    proc(root, 200, ["python3", "-c", "agent"], ppid=100, fds=["/dev/nvidia0"])
    proc(root, 300, ["python3", "other.py"], ppid=1, fds=["/dev/nvidia0"])
    info = gpuprocs.proc_info(200, str(root))
    assert gpuprocs.protected_reason(info, me=200, proc_root=str(root)) == "llmfab's own agent"
    assert gpuprocs.protected_reason(gpuprocs.proc_info(100, str(root)), me=200, proc_root=str(root))
    assert gpuprocs.protected_reason(gpuprocs.proc_info(300, str(root)), me=200, proc_root=str(root)) is None
    for pid, name in enumerate(("nv-hostengine", "dcgm-exporter", "nvidia-persistenced"), start=400):
        proc(root, pid, [f"/usr/bin/{name}"])
        assert gpuprocs.protected_reason(gpuprocs.proc_info(pid, str(root)), me=200,
                                         proc_root=str(root)) == f"system service {name}"


# -- killing real processes ---------------------------------------------------------------

CHILD = """
import signal, sys, time
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
while True:
    time.sleep(60)
"""


def spawn(mode):
    p = subprocess.Popen([sys.executable, "-c", CHILD, mode], stdout=subprocess.PIPE)
    assert p.stdout.readline() == b"ready\n"
    return p


def target(p):
    return {"pid": p.pid, "start": gpuprocs.proc_info(p.pid)["start"]}


def test_kill_terms_then_kills(tmp_path):
    polite, stubborn = spawn("obey"), spawn("ignore")
    try:
        res = procs.kill([target(polite), target(stubborn)], grace=0.5)
        assert res["terminated"] == [polite.pid] and res["killed"] == [stubborn.pid]
        assert res["survivors"] == [] and res["denied"] == []
        assert polite.wait(5) == -signal.SIGTERM and stubborn.wait(5) == -signal.SIGKILL
        assert "ignore" in res["names"][str(stubborn.pid)]
    finally:
        for p in (polite, stubborn):
            p.kill()
            p.wait()


def test_kill_leaves_a_recycled_pid_alone():
    p = spawn("obey")
    try:
        res = procs.kill([{"pid": p.pid, "start": target(p)["start"] - 1}], grace=0.1)
        assert res["gone"] == [p.pid] and res["terminated"] == [] and p.poll() is None
    finally:
        p.kill()
        p.wait()


def test_live_survey_of_this_machine_sees_no_gpu_here(tmp_path):
    """The real /proc scan runs here without error (this machine has no GPU device nodes)."""
    s = gpuprocs.survey(str(tmp_path / "no-nvidia-smi"), None)
    assert s["gpus"] is None and "not found" in s["error"]
    assert all(isinstance(p["pid"], int) for p in s["procs"])
