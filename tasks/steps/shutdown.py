"""Stopping a deployment on one host, as `fab stop` and a redeploy both do.

The host agent TERMs the server's process group and every process carrying the
release marker, waits `grace` seconds, KILLs what is left and sweeps stragglers
(tasks/steps/host/procs.py). Then this side waits until the deployment's GPUs hold no
more than just before the launch (gpu-baseline.json in the release), within
tasks/gpu/host/nvsmi.py's tolerance, or fails naming the processes still there. A deployment
that is not running is reported as such and is not an error.
"""
import time

from ..errors import OperationFailed
from ..output import processes
from ..gpu.memory import FREE_TIMEOUT_S, gpu_lines, wait_freed
from ..gpu.host.nvsmi import baseline_limits
from .host.procs import DEFAULT_GRACE_S


def stop_deployment(host, ddir, reporter, grace=DEFAULT_GRACE_S, memory_timeout=FREE_TIMEOUT_S,
                    by="fab stop", spot=None):
    """Stop and verify; returns the host's stop record plus `memory_s` (None when unchecked).
    `by` is recorded in the release: a server stopped on purpose never reads as failed.
    `spot` (tasks/interrupts.py): where a Ctrl-C leaves this host; the stop itself is never
    cut short by one (the GPU memory wait after it is)."""
    from ..interrupts import changing
    grace = DEFAULT_GRACE_S if grace is None else grace
    t0 = time.monotonic()
    with changing():
        if spot is not None:
            spot.step = "stopping"
        res = host.call("stop", deploy_dir=ddir, grace=grace, by=by, timeout=grace + 60)
        if spot is not None:
            spot.step = "stopped"
    res["memory_s"] = None
    name = host.name
    if res.get("supervisor_was"):  # ended before anything was signalled: no restart follows
        reporter.line(name, f"supervisor ended first (it was {res['supervisor_was']}); nothing restarts")
    if res["already_stopped"]:
        return res
    killed = res["killed"]
    reporter.line(name, f"stopped release {(res['server'] or {}).get('release')}: "
                        f"{processes(len(res['terminated']))} ended on SIGTERM"
                        + (f", {len(killed)} killed by SIGKILL" if killed else "")
                        + f" in {res['seconds']:.1f} s")
    for pid in killed:
        reporter.line(name, f"  SIGKILL pid {pid}: {res['names'].get(str(pid), '')[:160]}")
    if res.get("survivors"):
        raise OperationFailed(
            f"pids {res['survivors']} survive SIGKILL (stuck in the kernel, e.g. uninterruptible I/O)",
            details=[f"pid {p}: {res['names'].get(str(p), '')}" for p in res["survivors"]])
    base = res.get("baseline")
    if not base or not base.get("gpus"):
        why = (base or {}).get("error") or "no gpu-baseline.json in the release"
        reporter.line(name, f"GPU memory not checked ({why})")
        return res
    limits = baseline_limits(base)
    after = wait_freed(host, nvidia_smi=base.get("nvidia_smi") or "nvidia-smi", limits=limits,
                       timeout=memory_timeout, what="GPU memory of the stopped deployment")
    res["memory_s"] = round(time.monotonic() - t0, 3)
    res["gpus_after"] = after
    reporter.line(name, f"GPU memory back to its pre-launch baseline {res['memory_s']:.1f} s after "
                        "the stop began")
    for line in gpu_lines(res.get("gpus_before"), after, base["gpus"]):
        reporter.line(name, "  " + line)
    return res
