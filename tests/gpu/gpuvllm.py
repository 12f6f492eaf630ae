"""What the real-vLLM GPU suite (test_gpu_vllm_*.py) shares: its settings, `fab`, the host's
nvidia-smi and processes, and the profiles it deploys.

    LLMFAB_GPU_HOST          the GPU host as ssh knows it (ssh_config alias), or "local"
    LLMFAB_GPU_SSH_CONFIG    ssh config handed to `fab -S` and used for the suite's own checks
    LLMFAB_GPU_VLLM_PYTHON   a Python on the host that imports vLLM and CUDA PyTorch by itself
                             (e.g. a venv over the host's torch with vLLM's tree on a .pth)
    LLMFAB_GPU_TORCH_PYTHON  a Python with CUDA PyTorch but without vLLM ...
    LLMFAB_GPU_VLLM_SITE     ... and the vLLM tree that [server.env] PYTHONPATH gives it
    LLMFAB_GPU_NOTORCH_PYTHON a Python that sees vLLM but not torch (the engine check's lie)
    LLMFAB_GPU_MODEL         a (tiny) model directory on the host
    LLMFAB_GPU_DRAFTER       another model with the same tokenizer, other random weights
    LLMFAB_GPU_VLLM_VERSION  the vLLM version the host has (default 0.26.0)
    LLMFAB_GPU_OUT           a directory here: every fab run's output and the figures
                             measured (figures.json) are written there as they come
    LLMFAB_GPU_WORKDIR       target.workdir on the host (default /var/tmp/llmfab-gpu)
"""
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOST = os.environ.get("LLMFAB_GPU_HOST", "")
SSH_CONFIG = os.environ.get("LLMFAB_GPU_SSH_CONFIG")
VLLM_PY = os.environ.get("LLMFAB_GPU_VLLM_PYTHON", "")
TORCH_PY = os.environ.get("LLMFAB_GPU_TORCH_PYTHON", "")
VLLM_SITE = os.environ.get("LLMFAB_GPU_VLLM_SITE", "")
NOTORCH_PY = os.environ.get("LLMFAB_GPU_NOTORCH_PYTHON", "")
MODEL = os.environ.get("LLMFAB_GPU_MODEL", "")
DRAFTER = os.environ.get("LLMFAB_GPU_DRAFTER", "")
VERSION = os.environ.get("LLMFAB_GPU_VLLM_VERSION", "0.26.0")
OUT = Path(os.environ.get("LLMFAB_GPU_OUT", "/tmp/llmfab-gpu-out"))
WORKDIR = os.environ.get("LLMFAB_GPU_WORKDIR", "/var/tmp/llmfab-gpu")
TOLERANCE_MIB = 256  # what "back to baseline" allows (tasks/gpu/host/nvsmi.py)
# What every start needs on a host without flashinfer (vLLM's sampler probes for it and
# EngineCore dies in flashinfer_sampler_supported otherwise), offline.
ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
ARGS = {"served-model-name": "tiny", "max-model-len": 1024, "gpu-memory-utilization": 0.3}


def figure(name, value):
    """Keep one measured figure in OUT/figures.json (read back for RESULTS.md)."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "figures.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = value
    path.write_text(json.dumps(data, indent=1, sort_keys=True))
    print(f"FIGURE {name} = {json.dumps(value)}", flush=True)


def _log(text):
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "fab.log", "a") as f:
        f.write(text)
    print(text, end="", flush=True)


def fab(profile, *args, code=0, timeout=900, hosts=True):
    """Run `fab ARGS --profile PROFILE` as a user would; returns (result, wall seconds)."""
    argv = [sys.executable, "-m", "fabric"] + (["-S", SSH_CONFIG] if SSH_CONFIG and HOST != "local" else [])
    argv += [str(a) for a in args] + ["--profile", str(profile)]
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - t0
    _log(f"\n$ fab {' '.join(map(str, args))} --profile {Path(profile).name}   "
         f"-> exit {r.returncode} after {wall:.2f} s ({time.strftime('%H:%M:%S')})\n{r.stdout}{r.stderr}")
    assert code is None or r.returncode == code, \
        f"fab {' '.join(map(str, args))}: exit {r.returncode}, expected {code}\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
    return r, wall


def json_line(r):
    return json.loads([line for line in r.stdout.splitlines() if line.startswith("{")][-1])


class Host:
    """The suite's own look at the host (not through llmfab): over SSH, or here for "local"."""

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

    def gpu(self, label):
        """(used MiB of GPU 0, {pid: MiB} of its compute processes), printed."""
        gpus = self.run(["nvidia-smi", "--query-gpu=index,memory.used,memory.total",
                         "--format=csv,noheader,nounits"])
        apps = self.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                         "--format=csv,noheader,nounits"])
        _log(f"--- nvidia-smi, {label} ({time.strftime('%H:%M:%S')}) ---\n{gpus.rstrip()}\n"
             f"{apps.rstrip() or '(no compute processes)'}\n")
        used = int(gpus.splitlines()[0].split(", ")[1])
        procs = {int(a[0]): int(a[2]) for a in (line.split(", ") for line in apps.splitlines())
                 if a and a[0].strip().isdigit() and a[2].strip().isdigit()}
        return used, procs

    def procs(self):
        """{pid: (ppid, command line)} of every process on the host."""
        out = self.run(["ps", "-eo", "pid=,ppid=,args="])
        res = {}
        for line in out.splitlines():
            parts = line.split(None, 2)
            if len(parts) >= 2:
                res[int(parts[0])] = (int(parts[1]), parts[2] if len(parts) > 2 else "")
        return res

    def vllm_procs(self):
        return {p: c for p, (_pp, c) in self.procs().items() if c.startswith("VLLM::")}

    def alive(self, pid):
        stat = self.run(["cat", f"/proc/{pid}/stat"], check=False)
        return bool(stat) and stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")

    def port_free(self, port):
        out = self.run(["cat", "/proc/net/tcp", "/proc/net/tcp6"], check=False)
        hexport = ":%04X" % port
        return not any(line.split()[1].endswith(hexport) and line.split()[3] == "0A"
                       for line in out.splitlines()[1:] if len(line.split()) > 3)

    def wait(self, what, cond, timeout, every=0.2):
        t0 = time.monotonic()
        while True:
            v = cond()
            if v:
                return time.monotonic() - t0
            assert time.monotonic() - t0 < timeout, f"{what}: not within {timeout} s"
            time.sleep(every)

    def get(self, port, path):
        code = ("import sys, urllib.request; "
                "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=30).read().decode())")
        return self.run(["python3", "-c", code, f"http://127.0.0.1:{port}{path}"])

    def post(self, port, path, body):
        code = ("import sys, urllib.request; r = urllib.request.Request(sys.argv[1], sys.argv[2].encode(), "
                "{'Content-Type': 'application/json'}); "
                "sys.stdout.write(urllib.request.urlopen(r, timeout=120).read().decode())")
        return json.loads(self.run(["python3", "-c", code, f"http://127.0.0.1:{port}{path}", json.dumps(body)]))


def idle_host(label):
    """The suite's Host, asserting GPU 0 idle first; its used MiB kept as `baseline`."""
    h = Host()
    used, procs = h.gpu(f"before the {label}")
    assert not procs, f"GPU 0 is in use by {procs}: the suite needs an idle GPU"
    h.baseline = used
    return h


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    return json.dumps(v)


def profile(path, name, port, python=None, args=None, env=None, extra=""):
    """Write a vLLM profile for the GPU host and return its path."""
    a = dict(ARGS, **(args or {}))
    e = dict(ENV, **(env or {}))
    lines = ["[target]", f"hosts = [{json.dumps(HOST)}]", f"name = {json.dumps(name)}",
             f"workdir = {json.dumps(WORKDIR)}",
             "[server]", 'engine = "vllm"', f"python = {json.dumps(python or VLLM_PY)}",
             f"model = {json.dumps(MODEL)}", 'host = "127.0.0.1"', f"port = {port}",
             "[server.args]"] + [f"{k} = {toml_value(v)}" for k, v in a.items() if v is not None]
    lines += ["[server.env]"] + [f"{k} = {json.dumps(v)}" for k, v in e.items() if v is not None]
    lines += ["[ready]", "timeout = 400", "poll_interval = 0.5", "[gpu]", "devices = [0]", extra, ""]
    path = Path(path)
    path.write_text("\n".join(lines))
    return path


LEFT = re.compile(r"(\w[\w ]*?)\s+(\d+(?:\.\d+)?)s, ~(\d+)s left")


def estimates(text):
    """[(elapsed, predicted seconds left)] from deploy's progress lines."""
    return [(float(m.group(2)), float(m.group(3))) for m in LEFT.finditer(text)]
