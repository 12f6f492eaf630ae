"""The endpoint (issue 39) on the H200 with the real vLLM 0.26.0, side by side in one run.

Run on the GPU machine itself (it is both the controller and the host, reached over the gpu
kit's SSH as `gpu-local`), after vllm-kit's `install` and sshd-up.sh:

    python3 benchmarks/h200_endpoint.py --out DIR [--haproxy /tmp/hap/haproxy-run]

Four tiny-model members (the kit's target twice, its drafter twice; each an ordinary profile:
vLLM, sleep mode, a byte budget for the KV cache, gpu-memory-utilization 0.2, eager) behind
one HAProxy endpoint; member 2 parks itself after 15 s idle. Measured with real `fab`:
  1. deploy of the endpoint: the plan, four starts, the router; every model answers through it
  2. router overhead: streamed completions at concurrency 1 and 32, direct to two members
     against through the endpoint, rounds alternating (benchmarks/endpoint_routers.py's client)
  3. parking: `fab sleep` of member 1, the GPU memory a sleeping server keeps, then a request
     for its model through the endpoint: time to its first token (the wake is its extra
     latency); three cycles; member 2 parked by its idle time, then woken the same way
  4. `fab status` of the box (what a person sees), `fab stop` of member 3 leaving the others
     serving, `fab stop` of the endpoint giving the GPU back
Writes DIR/h200_endpoint.json (every figure) and DIR/*.txt (what fab printed).
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import endpoint_routers as er  # noqa: E402  (its streamed client and load runner)

MODELS = Path("/var/tmp/vk/models")
KIT = "/tmp/gpu-kit/ssh_config"
PORT, ADMIN = 8300, 8309
MEMBERS = [("ep-m0", "tiny-0", "target", 8301), ("ep-m1", "tiny-1", "target", 8302),
           ("ep-m2", "tiny-2", "drafter", 8303), ("ep-m3", "tiny-3", "drafter", 8304)]
ENV = {"PYTHONPATH": "/tmp/vllm-site", "VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1",
       "VLLM_NO_USAGE_STATS": "1", "VLLM_SERVER_DEV_MODE": "1"}
RESULTS = {}


def fab(out, name, *args, code=0):
    argv = [sys.executable, "-m", "fabric", "-S", KIT, "-H", "gpu-local", *map(str, args)]
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900)
    wall = round(time.monotonic() - t0, 2)
    with open(out / f"{name}.txt", "a") as f:
        f.write(f"$ fab {' '.join(map(str, args))}  -> exit {r.returncode} after {wall} s\n{r.stdout}{r.stderr}\n")
    print(f"fab {' '.join(map(str, args[:2]))}: exit {r.returncode} in {wall} s", flush=True)
    if code is not None and r.returncode != code:
        raise SystemExit(f"fab {args}: exit {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r, wall


def gpu():
    """(used MiB of GPU 0, {pid: MiB})."""
    used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                          capture_output=True, text=True).stdout.split()[0]
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True).stdout
    return int(used), {int(p): int(m) for p, m in (line.split(", ") for line in apps.splitlines() if ", " in line)}


def figure(name, value):
    RESULTS[name] = value
    print(f"FIGURE {name} = {json.dumps(value)}", flush=True)


def write_profiles(work, haproxy, n=4):
    paths = []
    for name, served, model, port in MEMBERS[:n]:
        lines = ["[target]", 'hosts = ["gpu-local"]', f'name = "{name}"',
                 "[server]", 'engine = "vllm"', 'python = "/opt/torch/.venv/bin/python3"',
                 f'model = "{MODELS / model}"', 'host = "127.0.0.1"', f"port = {port}",
                 "[server.args]", f'served-model-name = "{served}"', "enable-sleep-mode = true",
                 "enforce-eager = true", "max-model-len = 1024", "gpu-memory-utilization = 0.2",
                 "kv-cache-memory-bytes = 2000000000", "[server.env]"]
        lines += [f'{k} = "{v}"' for k, v in ENV.items()]
        lines += ["[gpu]", "devices = [0]", "[ready]", "timeout = 400", "poll_interval = 0.5", ""]
        p = work / f"{name}.toml"
        p.write_text("\n".join(lines))
        paths.append(p)
    ep = work / "ep.toml"
    ep.write_text("\n".join([
        "[endpoint]", 'name = "h200ep"', f"port = {PORT}",
        f"admin_port = {ADMIN}", f"members = {json.dumps([str(p) for p in paths])}", f'haproxy = "{haproxy}"',
        "[endpoint.idle]", "ep-m2 = 15", ""]))
    return paths, ep


def first_token(port, model):
    ttft, total, tokens, intact, status = er.one_request(port, model)
    return {"status": status, "ttft_s": None if ttft is None else round(ttft, 3), "total_s": round(total, 3),
            "tokens": tokens, "intact": intact}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--haproxy", default="haproxy")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only-overhead", action="store_true",
                    help="members 0 and 1 only: deploy, router overhead, stop")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = out / "profiles"
    work.mkdir(exist_ok=True)
    members, ep = write_profiles(work, a.haproxy, 2 if a.only_overhead else 4)
    base, _ = gpu()
    figure("baseline_mib", base)
    try:
        run(out, members, ep, base, a.rounds, a.only_overhead)
    finally:
        fab(out, "stop", "stop", "--profile", ep, code=None)
        figure("after_stop", {"gpu_used_mib": gpu()[0], "baseline_mib": base})
        (out / "h200_endpoint.json").write_text(json.dumps(RESULTS, indent=1, sort_keys=True))


def run(out, members, ep, base, rounds, only_overhead=False):
    r, wall = fab(out, "deploy", "deploy", "--profile", ep)
    used, apps = gpu()
    figure("deploy", {"wall_s": wall, "gpu_used_mib": used, "apps_mib": apps,
                      "plan": [ln for ln in r.stdout.splitlines() if "MiB" in ln and ("GPU 0" in ln or "ep-m" in ln
                                                                                     or "peak" in ln)][:12]})
    figure("answers", {served: first_token(PORT, served) for _, served, _, _ in MEMBERS[:len(members)]})
    figure("models_listed", [m["id"] for m in json.loads(
        subprocess.run(["curl", "-s", f"http://127.0.0.1:{PORT}/v1/models"], capture_output=True,
                       text=True).stdout)["data"]])
    figure("unknown_model", er.unknown_model(PORT))

    overhead(rounds)
    if only_overhead:
        return

    # 3. parking: fab sleep, what a sleeping server keeps, a request wakes it
    cycles = []
    for i in range(3):
        r, wall = fab(out, "sleep", "sleep", "--profile", ep, "--member", "ep-m1")
        used, apps = gpu()
        t = first_token(PORT, "tiny-1")
        cycles.append({"fab_sleep_s": wall, "sleep_line": r.stdout.strip().splitlines()[-1:],
                       "gpu_used_asleep_mib": used, "apps_asleep_mib": apps,
                       "wake_request": t, "gpu_used_after_wake_mib": gpu()[0]})
    figure("park_and_wake_by_request", cycles)
    fab(out, "status", "status", "--profile", ep)
    # member 2: parked by its idle time (15 s), then woken by a request
    deadline, asleep = time.monotonic() + 90, False
    while time.monotonic() < deadline and not asleep:
        r, _ = fab(out, "status-idle", "status", "--profile", ep, code=None)
        asleep = "ep-m2 (tiny-2): asleep" in r.stdout
        if not asleep:
            time.sleep(3)
    figure("idle_parked", {"asleep_within_90_s": asleep, "gpu_used_mib": gpu()[0]})
    figure("idle_wake_request", first_token(PORT, "tiny-2"))
    r, wall = fab(out, "wake", "wake", "--profile", ep)
    fab(out, "status", "status", "--profile", ep, code=None)

    # 4. one member stopped, the others still serve
    r, wall = fab(out, "stop-m3", "stop", "--profile", members[3])
    figure("stop_one", {"wall_s": wall, "gpu_used_mib": gpu()[0],
                        "after": {served: first_token(PORT, served)["status"] for _, served, _, _ in MEMBERS}})


def overhead(rounds):
    """Router overhead: tiny-0 and tiny-1 direct against through the endpoint, rounds
    alternating which goes first."""
    er.MODELS = {"tiny-0": 8301, "tiny-1": 8302}
    loads = {"direct": [], "endpoint": []}
    for i in range(rounds):
        for how in (["direct", "endpoint"] if i % 2 == 0 else ["endpoint", "direct"]):
            port_for = (lambda m: er.MODELS[m]) if how == "direct" else (lambda m: PORT)
            loads[how].append({"c1": er.run_load(port_for, 1, 20), "c32": er.run_load(port_for, 32, 128)})
    figure("router_overhead", loads)


if __name__ == "__main__":
    main()
