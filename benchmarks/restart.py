"""Supervised restarts measured: kill -9 of the server -> new server ready (issue 15).

    python benchmarks/run.py restart --torch PY [--host H] [-S SSH_CONFIG] [--mib N] [--kills 3]
    python benchmarks/run.py restart --standin PY --nvidia-smi PATH   # no GPU: the stand-in vLLM

Deploys a server with `[supervise] restart = "on-failure", backoff = backoff_max = 1` (tests/gpu/
torch_standin.py under PyTorch: an API process and a setsid'd engine child holding --mib MiB
of real GPU memory each; or the stand-in vLLM with stand-in GPU memory), then `--kills`
times: SIGKILL the server's process (the engine child survives, holding its memory), and
samples nvidia-smi every ~0.1 s until the supervisor's new server answers /health 200.
Per kill it prints the memory at the kill, when it was back to the baseline, when the new
process allocated, and the restart latency (kill -> ready). It runs where the server runs
(it reads server.json and signals the pid directly); fab reaches the host as given.
At the end it measures the supervisor's own CPU while idle (utime+stime over --idle s).
Writes everything as JSON to --out too.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from harness import REPO
TOLERANCE_MIB = 256


def sh(argv, timeout=600):
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"{argv} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r.stdout + r.stderr


class Sampler(threading.Thread):
    """nvidia-smi readings of one GPU, time-stamped: (t, used MiB, [compute-app pids])."""

    def __init__(self, smi, index):
        super().__init__(daemon=True)
        self.smi, self.index, self.rows, self.stop = smi, str(index), [], threading.Event()

    def read(self):
        used = subprocess.run([self.smi, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True).stdout
        apps = subprocess.run([self.smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True).stdout
        mib = next(int(m) for i, m in (l.split(", ") for l in used.splitlines()) if i == self.index)
        return time.time(), mib, sorted(int(l.split(",")[0]) for l in apps.splitlines() if l.strip())

    def run(self):
        while not self.stop.is_set():
            self.rows.append(self.read())
            self.stop.wait(0.1)


def health(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return r.status
    except Exception:
        return None


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="run.py restart", description=__doc__.splitlines()[0])
    ap.add_argument("--torch", help="a Python with CUDA PyTorch: serve tests/gpu/torch_standin.py")
    ap.add_argument("--standin", help="the stand-in engine venv's python (no GPU)")
    ap.add_argument("--nvidia-smi", default="nvidia-smi")
    ap.add_argument("--host", default="local")
    ap.add_argument("-S", "--ssh-config", default=None)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--mib", type=int, default=8192)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--port", type=int, default=30611)
    ap.add_argument("--workdir", default="/tmp/llmfab-restart-bench")
    ap.add_argument("--idle", type=float, default=20.0)
    ap.add_argument("--hang-timeout", type=float, default=0.0, help="[supervise] hang_timeout (0: off)")
    ap.add_argument("--out", default=None)
    o = ap.parse_args(argv)
    os.makedirs(o.workdir, exist_ok=True)
    prof = Path(o.workdir) / "restart.toml"
    if o.torch:
        server = ['engine = "command"', f'python = "{o.torch}"',
                  f'command = ["{o.torch}", "torch_standin.py", "--port", "{o.port}", "--mib", "{o.mib}"]',
                  f'files = ["{REPO / "tests/gpu/torch_standin.py"}"]']
    else:
        model = Path(o.workdir) / "model"
        model.mkdir(exist_ok=True)
        (model / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"]}')
        server = ['engine = "vllm"', f'python = "{o.standin}"', f'model = "{model}"']
    prof.write_text("\n".join(
        ["[target]", f'hosts = ["{o.host}"]', 'name = "restart-bench"', f'workdir = "{o.workdir}"',
         "[server]", *server, 'host = "127.0.0.1"', f"port = {o.port}",
         "[server.env]", f'CUDA_VISIBLE_DEVICES = "{o.device}"', 'PYTHONUNBUFFERED = "1"',
         f'STANDIN_GPU_MIB = "{o.mib}"', "[ready]", "timeout = 600", "poll_interval = 0.2",
         "[gpu]", f"devices = [{o.device}]", f'nvidia_smi = "{o.nvidia_smi}"',
         "[supervise]", 'restart = "on-failure"', "backoff = 1", "backoff_max = 1", "max_restarts = 10",
         f"hang_timeout = {o.hang_timeout}", ""]))
    fab = [sys.executable, "-m", "fabric"] + (["-S", o.ssh_config] if o.ssh_config else [])
    ddir = Path(o.workdir) / "restart-bench"
    sampler = Sampler(o.nvidia_smi, o.device)
    baseline = sampler.read()[1]
    print(f"GPU {o.device} before the deploy: {baseline} MiB", flush=True)
    print(sh(fab + ["deploy", "--profile", str(prof)]).strip().splitlines()[-1], flush=True)
    sampler.start()
    results = []
    for n in range(o.kills):
        server = json.loads((ddir / "server.json").read_text())
        at_kill = sampler.read()
        t_kill = time.time()
        os.kill(server["pid"], signal.SIGKILL)
        while True:
            now = json.loads((ddir / "server.json").read_text())
            if now["pid"] != server["pid"] and health(o.port) == 200:
                t_ready = time.time()
                break
            if time.time() - t_kill > 300:
                raise SystemExit("no restart within 300 s")
            time.sleep(0.02)
        rows = [r for r in sampler.rows if r[0] >= t_kill]
        back = next((r for r in rows if r[1] <= baseline + TOLERANCE_MIB), None)
        alloc = next((r for r in rows if back and r[0] > back[0] and r[1] > baseline + TOLERANCE_MIB), None)
        res = {"kill": n + 1, "killed_pid": server["pid"], "new_pid": now["pid"],
               "mib_at_kill": at_kill[1], "apps_at_kill": at_kill[2],
               "back_after_s": round(back[0] - t_kill, 3) if back else None, "mib_back": back and back[1],
               "alloc_after_s": round(alloc[0] - t_kill, 3) if alloc else None,
               "mib_alloc": alloc and alloc[1], "ready_after_s": round(t_ready - t_kill, 3),
               "no_overlap": bool(back and alloc and back[0] < alloc[0])}
        results.append(res)
        print(json.dumps(res), flush=True)
    release = ddir / "current"
    records = [json.loads(l) for l in (release / "restarts.jsonl").read_text().splitlines()]
    markers = [l for l in (release / "server.log").read_text().splitlines() if l.startswith("--- llmfab:")]
    reaper = json.loads((ddir / "server.json").read_text())["pgid"]
    c0, t0 = cpu_seconds(reaper), time.time()
    time.sleep(o.idle)  # what is measured is the supervisor doing nothing for this long
    idle = {"cpu_s": round(cpu_seconds(reaper) - c0, 4), "over_s": round(time.time() - t0, 1)}
    idle["cpu_pct"] = round(100 * idle["cpu_s"] / idle["over_s"], 4)
    print("supervisor idle CPU:", json.dumps(idle), flush=True)
    status = subprocess.run(fab + ["status", "--json", "--profile", str(prof)], cwd=REPO,
                            capture_output=True, text=True).stdout
    print(sh(fab + ["stop", "--profile", str(prof)]).strip(), flush=True)
    sampler.stop.set()
    sampler.join()
    out = {"baseline_mib": baseline, "kills": results, "restarts_jsonl": records, "markers": markers,
           "idle": idle, "status": status.strip(), "samples": sampler.rows}
    if o.out:
        Path(o.out).write_text(json.dumps(out, indent=1))
    lat = sorted(r["ready_after_s"] for r in results)
    print(f"restart latency (kill -> new server ready, backoff 1 s): median {lat[len(lat) // 2]:.2f} s, "
          f"min {lat[0]:.2f} s, max {lat[-1]:.2f} s over {len(lat)} kills; all without overlap: "
          f"{all(r['no_overlap'] for r in results)}")
    return 0 if all(r["no_overlap"] for r in results) else 1
