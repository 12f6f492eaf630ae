"""One model over several nodes: the Ray cluster under the server (profile `[cluster]`).

The deploy host is the Ray head; `cluster.workers` are hosts as the user wrote them
(ssh aliases), each reached over its own SSH connection and agent, like any host.

deploy: after the preflight, the release push and the stop of a running server, and
before the new server launches (tasks/deploy.py `deploy_head`, `before_launch`): every node's earlier
Ray of this deployment is stopped; the head starts (`ray start --head --port
<ray_port> --block`, detached, tasks/fleet/host/ray_node.py); then each worker joins with
`--address <head_address or the head's address>:<ray_port>`, VLLM_HOST_IP set to the
worker's own address toward the head, and the profile's [server.env] (secrets
included) in the Ray node's environment, since Ray starts vLLM's workers from there;
then llmfab waits until Ray's GCS lists every node alive with every GPU. The server
then launches on the head with VLLM_HOST_IP and RAY_ADDRESS set (and, for vLLM,
`--distributed-executor-backend ray`, tasks/steps/argv.py). If bring-up fails, the Ray
nodes that did start are left running for inspection; `fab stop` stops them.

GPUs per node (Ray's --num-gpus): the gpu.devices count, else the CUDA_VISIBLE_DEVICES
count of [server.env], else what the node's nvidia-smi lists (without nvidia-smi, Ray
detects them itself). Nodes are assumed alike, as vLLM assumes.

stop: after the server, Ray on every node (workers, then the head). status: the
head's view (nodes alive, GPUs); a node missing makes the deployment unhealthy.
Workers are handled all at once (a cluster is a handful of nodes), not by --parallel.
"""

import threading
import time
from dataclasses import replace

from ..errors import ExitCode, HostUnreachable, OperationFailed, UsageError
from ..output import processes
from .fanout import HostResult, run_all, worst
from ..profile.types import Profile, Secret
from ..transport.agent import AgentError
from ..base.host.stopping import DEFAULT_GRACE_S

RAY_START_WAIT_S = 180.0   # one `ray start` (a loaded node can take a minute)
CLUSTER_WAIT_S = 300.0     # until every node and GPU is listed
STALE_GRACE_S = 15.0       # stopping an earlier Ray before a new one


def check_hosts(hosts, profile: Profile):
    """A cluster profile has exactly one deploy host (the head), not among the workers."""
    if len(hosts) != 1:
        raise UsageError(f"{profile.path}: [cluster] deploys one model from ONE head host; got "
                         f"{len(hosts)} ({', '.join(hosts)}): name only the head (-H or target.hosts); "
                         "the other nodes go in cluster.workers")
    if hosts[0] in profile.cluster.workers:
        raise UsageError(f"{profile.path}: cluster.workers lists the head {hosts[0]!r} itself")


def node_env(profile: Profile):
    """[server.env] with secret values: the environment of every Ray node."""
    return {k: (v.value if isinstance(v, Secret) else v) for k, v in profile.server.env}


def server_profile(profile: Profile, head_ip):
    """The profile the head's server launches with: VLLM_HOST_IP and RAY_ADDRESS added."""
    env = [(k, v) for k, v in profile.server.env if k != "VLLM_HOST_IP"]
    env.append(("VLLM_HOST_IP", head_ip))
    if not any(k == "RAY_ADDRESS" for k, _ in env):
        env.append(("RAY_ADDRESS", f"{head_ip}:{profile.cluster.ray_port}"))
    return replace(profile, server=replace(profile.server, env=tuple(env)))


def call(host, op, **kw):
    """host.call, with a Ray node's log excerpt as the error's detail lines."""
    try:
        return host.call(op, **kw)
    except AgentError as e:
        if e.kind in ("ray_failed", "no_ray"):
            raise OperationFailed(e.message, details=e.data.get("log") or ()) from None
        raise


def _worker_kwargs(head):
    return dict(config=head.config, python=head.python, connect_timeout=head.connect_timeout,
                accept_new_host_keys=head.accept_new_host_keys)


def _raise_worst(results, what):
    bad = [r for r in results if r.code]
    if bad:
        cls = HostUnreachable if worst(r.code for r in bad) == ExitCode.UNREACHABLE else OperationFailed
        raise cls(f"{what}: " + "; ".join(f"{r.host}: {r.summary}" for r in bad))


def stop_node(host, ddir, reporter, grace, quiet=False):
    res = call(host, "ray_stop", deploy_dir=ddir, grace=grace, timeout=grace + 60)
    if res.get("survivors"):
        raise OperationFailed(f"{len(res['survivors'])} Ray {'process' if len(res['survivors']) == 1 else 'processes'} survived SIGKILL: "
                              + ", ".join(map(str, res["survivors"])))
    if res["stopped"]:
        reporter.line(host.name, f"ray {'(an earlier one) ' if quiet else ''}stopped: "
                                 f"{processes(len(res['pids']))} in {res['seconds']:.1f} s")
    elif not quiet:
        reporter.line(host.name, "ray: not running here")
    return res


def bring_up(head, profile: Profile, reporter, *, ddir, head_ip):
    """Stop earlier Ray everywhere, start the head, join the workers, wait for all GPUs."""
    c = profile.cluster
    t0 = time.monotonic()
    address = f"{c.head_address or head_ip}:{c.ray_port}"
    common = dict(deploy_dir=ddir, env=node_env(profile), num_gpus=profile.gpu_count,
                  nvidia_smi=profile.gpu.nvidia_smi, wait=RAY_START_WAIT_S, timeout=RAY_START_WAIT_S + 30)
    stale = {w: threading.Event() for w in c.workers}
    head_up, shared = threading.Event(), {"failed": [], "head": None}
    from ..steps.lock import take_lock

    def worker(w):
        try:  # phase 1, alongside the head's: no Ray of an earlier cluster may rejoin
            w.start()
            take_lock(w, ddir, "deploy")
            stop_node(w, ddir, reporter, STALE_GRACE_S, quiet=True)
        except BaseException:
            shared["failed"].append(w.name)
            raise
        finally:
            stale[w.name].set()
        head_up.wait()
        if shared["head"] is None:  # the head or another worker failed: that is the story
            return HostResult(w.name, ExitCode.OK, "not started")
        rec = call(w, "ray_start", role="worker", address=address, port=c.ray_port, **common)
        h = shared["head"]
        if (rec["ray"], rec["python"]) != (h["ray"], h["python"]):
            raise OperationFailed(f"Ray {rec['ray']} on Python {rec['python']} here, but Ray {h['ray']} on "
                                  f"Python {h['python']} on the head: Ray needs the same on every node")
        reporter.line(w.name, f"ray worker joined {address} as {rec['node_ip']} "
                              f"({rec['num_gpus']} GPU) in {rec['seconds']:.1f} s")
        return HostResult(w.name, ExitCode.OK, "joined", {"ray": rec})

    results = []
    fan = threading.Thread(target=lambda: results.extend(run_all(
        list(c.workers), worker, parallel=len(c.workers), reporter=reporter,
        host_kwargs=_worker_kwargs(head))), name="ray-workers", daemon=True)
    fan.start()
    interrupted = False
    try:
        stop_node(head, ddir, reporter, STALE_GRACE_S, quiet=True)
        for e in stale.values():
            e.wait()
        if not shared["failed"]:
            rec = shared["head"] = call(head, "ray_start", role="head", node_ip=head_ip, port=c.ray_port,
                                         **common)
            reporter.line(head.name, f"ray head up at {address} ({rec['num_gpus']} GPU, Ray {rec['ray']}) "
                                     f"in {rec['seconds']:.1f} s; log {rec['log']}")
    except KeyboardInterrupt:
        interrupted = True  # no join: a worker may sit in a `ray start` for minutes
        raise
    finally:
        head_up.set()
        if not interrupted:
            fan.join()
    _raise_worst(results, "Ray workers did not join" if shared["head"] else "Ray cluster not started")
    nodes = 1 + len(c.workers)
    gpus = sum(int(r.data["ray"]["num_gpus"] or 0) for r in results) + int(rec["num_gpus"] or 0)
    reporter.line(head.name, f"ray: waiting for {nodes} nodes and {gpus} GPUs")
    view = call(head, "ray_cluster", deploy_dir=ddir, address=f"{head_ip}:{c.ray_port}", nodes=nodes,
                 gpus=gpus, wait=CLUSTER_WAIT_S, timeout=CLUSTER_WAIT_S + 120)
    alive = [n for n in view["nodes"] if n["alive"]]
    seen = sum(n["gpus"] for n in alive)
    if len(alive) < nodes or seen < gpus:
        raise OperationFailed(f"the Ray cluster shows {len(alive)} of {nodes} nodes and {seen:g} of {gpus} "
                              f"GPUs after {CLUSTER_WAIT_S:.0f} s; Ray stays up for a look (`fab stop` "
                              "stops it)", details=[_node_line(n) for n in view["nodes"]])
    _check_parallel_sizes(profile, int(seen))
    took = time.monotonic() - t0
    reporter.line(head.name, f"ray cluster ready in {took:.1f} s: {nodes} nodes, {seen:g} GPUs")
    return {"nodes": nodes, "gpus": seen, "address": address, "seconds": round(took, 3)}


def _check_parallel_sizes(profile, gpus):
    """vLLM waits forever for a placement group larger than the cluster: say it now."""
    if profile.server.engine != "vllm":
        return
    def size(name):
        v = profile.server.flags.value(name)
        return v if isinstance(v, int) and not isinstance(v, bool) else 1
    tp, pp = size("tensor-parallel-size"), size("pipeline-parallel-size")
    if tp * pp > gpus:
        raise OperationFailed(f"tensor-parallel-size {tp} x pipeline-parallel-size {pp} = {tp * pp} GPUs, "
                              f"but the Ray cluster has {gpus}: add workers or lower the sizes")


def _node_line(n):
    return f"node {n['ip']}{' (head)' if n['head'] else ''}: {'alive' if n['alive'] else 'DEAD'}, {n['gpus']:g} GPU"


def stop_cluster(head, profile: Profile, reporter, *, ddir, grace):
    """After the server: Ray on every worker, then on the head. Returns nodes stopped."""
    from ..steps.lock import take_lock
    grace = DEFAULT_GRACE_S if grace is None else grace

    def worker(w):
        w.start()
        take_lock(w, ddir, "stop")
        res = stop_node(w, ddir, reporter, grace)
        return HostResult(w.name, ExitCode.OK, "stopped" if res["stopped"] else "not running")

    workers = list(profile.cluster.workers)
    results = run_all(workers, worker, parallel=len(workers), reporter=reporter,
                      host_kwargs=_worker_kwargs(head))
    res = stop_node(head, ddir, reporter, grace)
    _raise_worst(results, "Ray not stopped on every worker")
    return sum(r.summary == "stopped" for r in results) + bool(res["stopped"])


def cluster_status(head, profile: Profile, ddir):
    """(record, lines, healthy) of the Ray cluster as the head sees it."""
    c = profile.cluster
    rec = call(head, "ray_cluster", deploy_dir=ddir, timeout=120)  # address: the head's ray.json
    expected = 1 + len(c.workers)
    if not rec["running"]:
        return ({"running": False, "nodes": [], "expected_nodes": expected},
                ["cluster: Ray is not running on this head"], False)
    alive = [n for n in rec["nodes"] if n["alive"]]
    gpus = sum(n["gpus"] for n in alive)
    record = {"running": True, "expected_nodes": expected, "alive_nodes": len(alive), "gpus": gpus,
              "nodes": rec["nodes"]}
    lines = [f"cluster: {len(alive)}/{expected} Ray nodes alive, {gpus:g} GPUs (Ray {rec.get('ray')})"]
    lines += ["  " + _node_line(n) for n in rec["nodes"]]
    return record, lines, len(alive) >= expected
