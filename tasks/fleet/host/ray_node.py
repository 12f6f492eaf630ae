"""One node of a deployment's Ray cluster (host side): start, stop, address, cluster view.

    <workdir>/<name>/ray/ray.json   pid, pgid, role, node_ip, address, num_gpus, started_at, argv
    <workdir>/<name>/ray/ray.log    `ray start --block` output, appended per start

Ray is started like the server: an argv (the profile's Python running
`ray.scripts.scripts start ... --block`), no shell, in a new session (its own process
group, no SIGHUP when the SSH session ends), stdin from /dev/null, output to ray.log.
`--block` keeps that process as the node's supervisor: Ray's daemons are its children
and die with it. Every process carries LLMFAB_RAY=<ray dir> so a stop also finds those
that left the group (Ray's idle workers take their own). Stdlib only; Python >= 3.9.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

from ...gpu.host import nvsmi
from ...base.host.stopping import DEFAULT_GRACE_S
from ...base.host.safefile import open_append
from ...base.host.hosterrors import HostError
from ...base.host.hostenv import site_packages
from ...base.host.procfs import cmdline, group_members, kill_each, pid_alive, pids_marked
from ...base.host.statefiles import expand, read_json, utc_iso, write_json

MARKER = "LLMFAB_RAY"
STARTED = b"Ray runtime started"
KILL_WAIT_S = 5.0
# Ray >= 2.5x drains a node for 30 s on SIGTERM (for Ray Serve); the server is already gone.
DEFAULT_ENV = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", "RAY_USAGE_STATS_ENABLED": "0"}

# Run by the profile's Python on the head: the cluster as Ray's GCS sees it.
PROBE = r'''
import json, sys, time
address, nodes, gpus, wait = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
import ray
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
deadline = time.monotonic() + wait
while True:
    seen = [{"ip": n["NodeManagerAddress"], "alive": bool(n["Alive"]),
             "gpus": float(n.get("Resources", {}).get("GPU", 0)),
             "head": "node:__internal_head__" in n.get("Resources", {})} for n in ray.nodes()]
    alive = [n for n in seen if n["alive"]]
    if (len(alive) >= nodes and sum(n["gpus"] for n in alive) >= gpus) or time.monotonic() >= deadline:
        break
    time.sleep(0.5)
print(json.dumps({"nodes": seen, "ray": ray.__version__}))
ray.shutdown()
'''


# The ports `ray start` hands its worker processes unless told otherwise (Ray 2.x
# ray/scripts/scripts.py: --min-worker-port 10002, --max-worker-port 19999); we pass neither.
# A server port in this range can be taken by a worker before the server binds it.
RAY_WORKER_PORTS = (10002, 19999)

def _dir(deploy_dir):
    return os.path.join(expand(deploy_dir), "ray")


def marked(rdir):
    """Live pids (seeing this filesystem) whose environment has LLMFAB_RAY=rdir."""
    want = ("%s=%s" % (MARKER, rdir)).encode()
    return pids_marked(lambda item: item == want)


def ours(rdir, record):
    """Live pids of this node's Ray: marked ones, plus its group while a member is marked."""
    pids = set(marked(rdir))
    pgid = (record or {}).get("pgid")
    if pgid:
        group = set(group_members(pgid))
        if group & pids:
            pids |= group
    return pids


def route_ip(toward):
    """The local address this host uses to reach `toward` (no packet is sent)."""
    s = socket.socket(socket.AF_INET6 if ":" in toward else socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((toward, 9))
        return s.getsockname()[0]
    finally:
        s.close()


def op_ray_address(head_address=None):
    """The head's node address: `head_address` resolved here, else the address the SSH
    client reached this host at (SSH_CONNECTION), else the one on the default route."""
    given = head_address
    if given:
        try:
            return {"ip": socket.getaddrinfo(given, None, proto=socket.IPPROTO_TCP)[0][4][0]}
        except OSError as e:
            raise HostError("cluster.head_address %r does not resolve on the head: %s" % (given, e))
    parts = os.environ.get("SSH_CONNECTION", "").split()
    if len(parts) == 4 and not parts[2].startswith("127.") and parts[2] != "::1":
        return {"ip": parts[2]}
    try:
        return {"ip": route_ip("192.0.2.1")}  # TEST-NET-1: any routable address will do
    except OSError:
        return {"ip": socket.gethostbyname(socket.gethostname())}


def _count_gpus(num_gpus, nvidia_smi):
    """Ray's --num-gpus: the caller's count, else nvidia-smi's, else None (Ray detects)."""
    if num_gpus is not None:
        return int(num_gpus)
    gpus = nvsmi.read_gpus(nvidia_smi)
    return None if gpus is None else len(gpus)


def op_ray_start(deploy_dir, role, port, address=None, node_ip=None, env=None, num_gpus=None,
                 nvidia_smi=nvsmi.NVIDIA_SMI, wait=120):
    """Start this node (`role` head, on `port`, or worker, joining the head at `address`)
    detached with `env` added to its environment, and wait up to `wait` s for `Ray runtime
    started`. `node_ip`: its address (else the one routing to `address`)."""
    site_packages()
    import importlib.util
    if importlib.util.find_spec("ray") is None:
        raise HostError("Ray is not installed for %s on this host: install it there (pip install "
                        "ray, the same version on every node)" % sys.executable, kind="no_ray")
    from importlib import metadata
    rdir = _dir(deploy_dir)
    os.makedirs(rdir, mode=0o700, exist_ok=True)
    if ours(rdir, read_json(os.path.join(rdir, "ray.json"))):
        raise HostError("Ray of this deployment is already running here: stop it first")
    port = int(port)
    node_ip = node_ip or route_ip(address.rsplit(":", 1)[0].strip("[]"))
    added = env
    env = dict(os.environ)
    env.update(DEFAULT_ENV)
    env.update(added or {})
    env.update({"VLLM_HOST_IP": node_ip, MARKER: rdir})
    num_gpus = _count_gpus(num_gpus, nvidia_smi)
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block",
            "--node-ip-address", node_ip, "--disable-usage-stats"]
    argv += ["--head", "--port", str(port), "--include-dashboard", "false"] if role == "head" \
        else ["--address", address]
    argv += ["--num-gpus", str(num_gpus)] if num_gpus is not None else []
    log_path = os.path.join(rdir, "ray.log")
    now = utc_iso()
    with os.fdopen(open_append(log_path), "ab") as log:  # never through a planted link
        log.write(("=== llmfab %s: %s\n" % (now, json.dumps(argv))).encode())
        offset = log.tell()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, cwd=rdir, start_new_session=True)
    record = {"pid": proc.pid, "pgid": proc.pid, "role": role, "node_ip": node_ip,
              "address": address or "%s:%d" % (node_ip, port), "num_gpus": num_gpus,
              "started_at": now, "argv": argv, "log": log_path}
    write_json(os.path.join(rdir, "ray.json"), record)
    t0, deadline = time.monotonic(), time.monotonic() + float(wait)
    while True:
        with open(log_path, "rb") as f:
            f.seek(offset)
            text = f.read()
        if STARTED in text:
            break
        if proc.poll() is not None or time.monotonic() >= deadline:
            if proc.poll() is None:
                _stop(rdir, record, 2.0)
                why = "did not start within %.0f s" % (time.monotonic() - t0)
            else:
                why = "exited with status %s" % proc.returncode
            tail = text.decode("utf-8", "replace").strip().splitlines()[-25:]
            raise HostError("ray start (%s) %s; its log: %s" % (role, why, log_path),
                            kind="ray_failed", log=tail)
        time.sleep(0.2)
    record.update(seconds=round(time.monotonic() - t0, 3), python=sys.version.split()[0],
                  ray=metadata.version("ray"))
    return record


def _stop(rdir, record, grace):
    """TERM the supervisor (it shuts its daemons down), wait, then TERM/KILL what is left."""
    targets = ours(rdir, record)
    if not targets:
        return {"stopped": False, "pids": []}
    names = {p: cmdline(p) for p in targets}
    t0 = time.monotonic()
    leader = (record or {}).get("pid")
    first = [leader] if leader in targets else sorted(targets)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGTERM, 2.0), (signal.SIGKILL, KILL_WAIT_S)):
        kill_each(first, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(pid_alive(p) for p in targets):
            time.sleep(0.05)
        targets = {p for p in targets | ours(rdir, record) if pid_alive(p)}
        if not targets:
            break
        first = sorted(targets)
    return {"stopped": True, "pids": sorted(names), "names": {str(k): v for k, v in names.items()},
            "survivors": sorted(targets), "seconds": round(time.monotonic() - t0, 3)}


def op_ray_stop(deploy_dir, grace=DEFAULT_GRACE_S):
    rdir = _dir(deploy_dir)
    record = read_json(os.path.join(rdir, "ray.json"))
    out = _stop(rdir, record, float(grace))
    if record and record.get("role") == "head":
        # Ray's pointer for `ray.init(address="auto")`; stale once the head is gone.
        path = os.path.join("/tmp/ray", "ray_current_cluster")
        try:
            with open(path) as f:
                if f.read().strip() == record.get("address"):
                    os.unlink(path)
        except OSError:
            pass
    out["record"] = record
    return out


def op_ray_cluster(deploy_dir, address=None, nodes=0, gpus=0, wait=0):
    """The cluster as the head's GCS sees it: {running, nodes:[{ip, alive, gpus, head}]}, waiting
    up to `wait` s for `nodes` nodes with `gpus` GPUs; `address` (else ray.json's): the head's."""
    rdir = _dir(deploy_dir)
    record = read_json(os.path.join(rdir, "ray.json"))
    if not record or not pid_alive(record["pid"]):
        return {"running": False, "nodes": [], "record": record}
    address = address or record["address"]
    argv = [sys.executable, "-c", PROBE, address, str(nodes), str(gpus), str(wait)]
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=float(wait) + 90)
    except subprocess.TimeoutExpired:
        raise HostError("the Ray cluster at %s did not answer" % address, kind="ray_failed")
    try:
        out = json.loads(proc.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise HostError("cannot read the Ray cluster at %s: %s" % (
            address, proc.stderr.decode("utf-8", "replace").strip()[-1500:]), kind="ray_failed")
    out.update(running=True, record=record)
    return out

