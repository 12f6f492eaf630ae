"""The `gpu` suite: the real `fab` against a real NVIDIA GPU host, read by the real nvidia-smi.

Skipped (the reason is printed) when LLMFAB_GPU_HOST is not set; that is its only skip.
Once it is set, a host that cannot be reached or lacks PyTorch fails the suite.

    LLMFAB_GPU_HOST        the GPU host as ssh knows it (ssh_config alias or user@host),
                           or "local" for this very machine without SSH
    LLMFAB_GPU_SSH_CONFIG  ssh config file handed to `fab -S` (default: ~/.ssh/config)
    LLMFAB_GPU_PYTHON      a Python on the host with CUDA-enabled PyTorch (default python3)
    LLMFAB_GPU_DEVICE      the GPU index to use (default 0); it must be idle: the suite
                           refuses to start while anything runs on it, and frees it with
                           `fab kill-gpu-procs`
    LLMFAB_GPU_PORT        port of the stand-in server on the host (default 30517)
    LLMFAB_GPU_MIB         MiB each of the server's two processes allocates (default 2048)
    LLMFAB_GPU_WORKDIR     target.workdir on the host (default /tmp/llmfab-gpu-suite)
    LLMFAB_GPU_NVIDIA_SMI  nvidia-smi on the host, if not on the PATH of an SSH session there
    LLMFAB_GPU_ENV         NAME=VALUE pairs (space-separated) the GPU processes need and an
                           SSH session lacks, e.g. LD_LIBRARY_PATH=/usr/local/nvidia/lib64

Every nvidia-smi reading is printed (run pytest with -s to see them as they come).
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HOST = os.environ.get("LLMFAB_GPU_HOST", "")
SSH_CONFIG = os.environ.get("LLMFAB_GPU_SSH_CONFIG")
PY = os.environ.get("LLMFAB_GPU_PYTHON", "python3")
DEV = int(os.environ.get("LLMFAB_GPU_DEVICE", "0"))
PORT = int(os.environ.get("LLMFAB_GPU_PORT", "30517"))
MIB = int(os.environ.get("LLMFAB_GPU_MIB", "2048"))
WORKDIR = os.environ.get("LLMFAB_GPU_WORKDIR", "/tmp/llmfab-gpu-suite")
NVIDIA_SMI = os.environ.get("LLMFAB_GPU_NVIDIA_SMI", "nvidia-smi")
EXTRA_ENV = dict(pair.split("=", 1) for pair in os.environ.get("LLMFAB_GPU_ENV", "").split())
NAME = "llmfab-gpu-suite"
TOLERANCE_MIB = 256  # tasks/gpu/host/nvsmi.py TOLERANCE_MIB: what "back to baseline" allows
STOP_BAR_S = 5.0

SKIP_REASON = ("LLMFAB_GPU_HOST is not set: no GPU host to run the gpu suite against "
               "(see docs/gpus.md: set it to an SSH host with an NVIDIA GPU and PyTorch)")
if not HOST:
    print(f"\ntests/gpu/test_gpu_real.py: skipped: {SKIP_REASON}", file=sys.stderr)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HOST, reason=SKIP_REASON)]


class GpuHost:
    """Commands on the GPU host for the test's own checks: over SSH, or here for "local"."""

    def __init__(self):
        self.cxn = None
        if HOST != "local":
            from fabric import Config
            from tasks.transport.ssh import open_connection
            config = Config(runtime_ssh_path=SSH_CONFIG) if SSH_CONFIG else Config()
            self.cxn = open_connection(HOST, config)

    def run(self, argv, check=True):
        if self.cxn is None:
            r = subprocess.run(argv, capture_output=True, text=True)
            out, err, code = r.stdout, r.stderr, r.returncode
        else:
            r = self.cxn.run(shlex.join(argv), hide=True, warn=True, in_stream=False)
            out, err, code = r.stdout, r.stderr, r.exited
        assert code == 0 or not check, f"{argv} exited {code}: {out}{err}"
        return out

    def put(self, local, remote):
        self.run(["mkdir", "-p", os.path.dirname(remote)])
        if self.cxn is None:
            shutil.copyfile(local, remote)
        else:
            self.cxn.put(str(local), remote)

    def start_detached(self, argv, env, log):
        """Start argv in its own session, all three streams redirected, and return at once."""
        if self.cxn is None:
            with open(log, "ab") as out:
                subprocess.Popen(argv, env=dict(os.environ, **env), stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
            return
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        self.run(["sh", "-c", f"{assigns} setsid {shlex.join(argv)} >{shlex.quote(log)} 2>&1 </dev/null &"])

    def alive(self, pid):
        stat = self.run(["cat", f"/proc/{pid}/stat"], check=False)
        return bool(stat) and stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")

    def readings(self, label, table=False):
        """(used MiB of GPU DEV, {pid: MiB} on it), printed as nvidia-smi wrote them."""
        gpus = self.run([NVIDIA_SMI, "--query-gpu=index,uuid,name,memory.used,memory.total",
                         "--format=csv,noheader,nounits"])
        apps = self.run([NVIDIA_SMI, "--query-compute-apps=pid,process_name,used_memory,gpu_uuid",
                         "--format=csv,noheader,nounits"])
        print(f"--- nvidia-smi, {label} ({time.strftime('%H:%M:%S')}) ---\n{gpus.rstrip()}\n"
              f"{apps.rstrip() or '(no compute processes)'}", flush=True)
        if table:
            print(self.run([NVIDIA_SMI]).rstrip(), flush=True)
        row = next(r for r in (line.split(", ") for line in gpus.splitlines()) if int(r[0]) == DEV)
        procs = {int(a[0]): int(a[2]) if a[2].isdigit() else 0
                 for a in (line.split(", ") for line in apps.splitlines()) if a[-1] == row[1]}
        return int(row[3]), procs


def fab(*args, code=0, timeout=900):
    argv = [sys.executable, "-m", "fabric"] + (["-S", SSH_CONFIG] if SSH_CONFIG and HOST != "local" else [])
    argv += list(args) + ["--profile", str(Suite.profile)]
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - t0
    print(f"$ fab {' '.join(args)}   -> exit {r.returncode} after {wall:.2f} s\n{r.stdout}{r.stderr}", flush=True)
    assert code is None or r.returncode == code, f"fab {' '.join(args)}: exit {r.returncode}, expected {code}"
    return r, wall


class Suite:
    profile = None


def _toml(value):
    return json.dumps(value)  # a JSON string or array of strings is valid TOML


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    here = tmp_path_factory.mktemp("gpu-suite")
    shutil.copy(REPO / "tests" / "gpu" / "torch_standin.py", here / "torch_standin.py")
    command = [PY, "torch_standin.py", "--port", str(PORT), "--mib", str(MIB), "--served-name", "torch-standin"]
    Suite.profile = here / "gpu-suite.toml"
    Suite.profile.write_text("\n".join([
        "[target]", f"hosts = [{_toml(HOST)}]", f"name = {_toml(NAME)}", f"workdir = {_toml(WORKDIR)}",
        "[server]", 'engine = "command"', f"python = {_toml(PY)}", f"command = {_toml(command)}",
        'files = ["torch_standin.py"]', 'host = "127.0.0.1"', f"port = {PORT}",
        "[server.env]", f"CUDA_VISIBLE_DEVICES = {_toml(str(DEV))}", 'PYTHONUNBUFFERED = "1"']
        + [f"{k} = {_toml(v)}" for k, v in EXTRA_ENV.items()] + [
        "[ready]", 'served_name = "torch-standin"', "timeout = 600", "poll_interval = 0.5",
        "[gpu]", f"devices = [{DEV}]", f"nvidia_smi = {_toml(NVIDIA_SMI)}", ""]))
    h = GpuHost()
    used, procs = h.readings("before the suite")
    assert not procs, (f"GPU {DEV} of {HOST} is in use by pid(s) {sorted(procs)}: the gpu suite needs an "
                       "idle GPU (it frees it with kill-gpu-procs). Pick another with LLMFAB_GPU_DEVICE.")
    h.baseline = used
    h.hog_pid = None
    yield h
    fab("stop", "--grace", "5", code=None)  # whatever a failed test left running
    if h.hog_pid and h.alive(h.hog_pid):
        h.run(["kill", "-9", str(h.hog_pid)], check=False)


def test_deploy_status_stop_frees_gpu_memory(host):
    fab("deploy")
    used, procs = host.readings("deployed", table=True)
    big = sorted(p for p, mib in procs.items() if mib >= MIB)
    assert len(big) >= 2, f"expected the API process and its engine child with >= {MIB} MiB each, got {procs}"

    r, _ = fab("status", "--json")
    st = json.loads(r.stdout)
    assert st["running"] and st["health"] == 200 and st["served_name"] == "torch-standin"
    assert st["pid"] in big
    gpu = next(g for g in st["gpus"] if g["index"] == DEV)
    assert gpu["used_mib"] >= host.baseline + 2 * MIB, f"status reports {gpu}, allocated 2 x {MIB} MiB"
    fab("status")

    fab("kill-gpu-procs", "--dry-run")
    assert all(host.alive(p) for p in big), "a dry run signalled something"

    r, wall = fab("stop")
    m = re.search(r"GPU memory of this deployment freed \(\d+ MiB\) ([0-9.]+) s after the stop began", r.stdout)
    assert m, "stop did not confirm the GPU memory came back"
    used, procs = host.readings("after fab stop")
    print(f"stop: memory back {m.group(1)} s after the stop began (fab wall time {wall:.2f} s, "
          f"baseline {host.baseline} MiB, now {used} MiB)", flush=True)
    assert float(m.group(1)) <= STOP_BAR_S
    assert used <= host.baseline + TOLERANCE_MIB and not procs
    assert not any(host.alive(p) for p in big)
    r, _ = fab("stop")
    assert "nothing to stop" in r.stdout


def test_kill_gpu_procs_frees_a_process_that_ignores_sigterm(host):
    script = f"{WORKDIR}/hog/torch_standin.py"
    ready = f"{WORKDIR}/hog/ready"
    host.put(REPO / "tests" / "gpu" / "torch_standin.py", script)
    host.run(["rm", "-f", ready])
    host.start_detached([PY, script, "--hold", "--mib", str(MIB), "--ready-file", ready],
                        dict(EXTRA_ENV, CUDA_VISIBLE_DEVICES=str(DEV)), f"{WORKDIR}/hog/log")
    deadline = time.monotonic() + 300
    while not host.run(["cat", ready], check=False).strip():
        assert time.monotonic() < deadline, "the SIGTERM-ignoring holder never became ready: " + \
            host.run(["cat", f"{WORKDIR}/hog/log"], check=False)
        time.sleep(0.5)
    host.hog_pid = int(host.run(["cat", ready]).strip())
    used, procs = host.readings("SIGTERM-ignoring holder running")
    assert procs.get(host.hog_pid, 0) >= MIB

    r, _ = fab("kill-gpu-procs", "--dry-run", "--json")
    plan = json.loads(r.stdout)
    assert [p["pid"] for p in plan["processes"] if not p["spared"]] == [host.hog_pid]
    assert host.alive(host.hog_pid)

    r, _ = fab("kill-gpu-procs", "--grace", "2", "--json")
    done = json.loads(r.stdout)
    assert [(k["pid"], k["how"]) for k in done["killed"]] == [(host.hog_pid, "SIGKILL")]
    assert done["freed_mib"][str(DEV)] >= MIB
    used, procs = host.readings("after fab kill-gpu-procs")
    assert used <= host.baseline + TOLERANCE_MIB and not procs
    assert not host.alive(host.hog_pid)
    r, _ = fab("kill-gpu-procs")
    assert "nothing to kill" in r.stdout
