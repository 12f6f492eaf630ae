"""Stopping a deployment on one host, as `fab stop` and a redeploy both do.

The host agent TERMs the server's process group and every process carrying the
release marker, waits `grace` seconds, KILLs what is left and sweeps stragglers
(tasks/steps/host/procs.py). Then this side waits until the deployment's own processes hold no
GPU memory (per process, as nvidia-smi lists them: another deployment on the same GPU
changes nothing), or fails naming them. Where nvidia-smi cannot say whose memory it is (a
container that sees other pids), it waits instead until the deployment's GPUs hold no more
than just before the launch (gpu-baseline.json), within tasks/gpu/host/nvsmi.py's
tolerance. A deployment that is not running is reported as such and is not an error.
"""
import time

from ..errors import OperationFailed
from ..output import processes
from ..gpu.memory import FREE_TIMEOUT_S, gpu_lines, other_holder_lines, wait_freed, wait_own_freed
from ..gpu.host.nvsmi import NVIDIA_SMI, baseline_limits, tolerance, unlisted
from ..base.host.stopping import DEFAULT_GRACE_S


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
    release = (res["server"] or {}).get("release")
    what = f"release {release}" if release else "this deployment's processes (no server.json names a release)"
    reporter.line(name, f"stopped {what}: "
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
    smi = base.get("nvidia_smi") or NVIDIA_SMI
    if res.get("held") is None or not res.get("trusted"):
        # nvidia-smi cannot say whose memory it is here (a container sees other pids): the
        # devices back to their pre-launch readings, as the only proof there is
        limits = baseline_limits(base)
        after = wait_freed(host, nvidia_smi=smi, limits=limits, timeout=memory_timeout,
                           what="GPU memory of the stopped deployment")
        res["memory_s"] = round(time.monotonic() - t0, 3)
        res["gpus_after"] = after
        reporter.line(name, f"GPU memory back to its pre-launch baseline {res['memory_s']:.1f} s after "
                            "the stop began")
        for line in gpu_lines(res.get("gpus_before"), after, base["gpus"]):
            reporter.line(name, "  " + line)
        return res
    stopped = {int(p) for p in res.get("names") or ()} | {h["pid"] for h in res["held"]}
    before = unlisted(res.get("gpus_before"), res["held"] + (res.get("held_others") or []))
    found = wait_own_freed(host, ddir, nvidia_smi=smi, devices=base.get("devices"), pids=stopped,
                           unlisted_limits={i: m + tolerance(m) for i, m in before.items()},
                           timeout=memory_timeout)
    res["memory_s"] = round(time.monotonic() - t0, 3)
    res["gpus_after"] = found["gpus"]
    freed = sum(h["mib"] for h in res["held"])
    reporter.line(name, f"GPU memory of this deployment freed ({freed} MiB) {res['memory_s']:.1f} s after "
                        "the stop began")
    for line in gpu_lines(res.get("gpus_before"), found["gpus"]):
        reporter.line(name, "  " + line)
    before = {(h["pid"], h["gpu"]) for h in res.get("held_others") or ()}
    for line in other_holder_lines(found["holders"], before):
        reporter.line(name, "  " + line)
    return res
