"""GPU memory that really came back: which devices, how much is enough, who still holds it.

After `fab stop` the deployment's devices must fall back to the readings recorded just
before its launch (gpu-baseline.json); after `fab kill-gpu-procs` each GPU must drop by
the memory its killed processes held. "Back" allows a tolerance (tasks/gpu/host/nvsmi.py
`tolerance`, the same the supervisor uses on the host). The wait polls
the host (one nvidia-smi reading per tick, every POLL_S) with tenacity for at most
FREE_TIMEOUT_S, then fails naming every process still on those GPUs.
"""
from ..errors import OperationFailed

FREE_TIMEOUT_S = 30.0
POLL_S = 0.25


class NotFreedYet(Exception):
    def __init__(self, over):
        super().__init__("GPU memory not back yet")
        self.over = over


def describe(proc):
    """One line naming a process found on a GPU, with its source."""
    where = ", ".join(f"GPU {g['index']}" + (f" {g['used_mib']} MiB" if g["used_mib"] is not None else "")
                      for g in proc["gpus"])
    extra = f", {proc['spared']}, left alone" if proc.get("spared") else ""
    return (f"pid {proc['pid']} ({proc['user']}, {where}, via {proc['source']}{extra}): "
            f"{proc['command'][:160]}")


def describe_foreign(app):
    mib = f", {app['used_mib']} MiB" if app.get("used_mib") is not None else ""
    return f"pid {app['pid']} (GPU {app['gpu']}{mib}, via nvidia-smi; not a process of this PID namespace)"


def holders(survey):
    return [describe(p) for p in survey["procs"]] + [describe_foreign(f) for f in survey["foreign"]]


def _poll(tick, timeout, sleep=None):
    """tick() every POLL_S until it returns (its answer) or `timeout` s pass (NotFreedYet)."""
    from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed
    kw = {"sleep": sleep} if sleep is not None else {}
    for attempt in Retrying(retry=retry_if_exception_type(NotFreedYet), stop=stop_after_delay(timeout),
                            wait=wait_fixed(POLL_S), reraise=True, **kw):
        with attempt:
            return tick()


def wait_freed(host, *, nvidia_smi, limits, timeout=FREE_TIMEOUT_S, sleep=None, what="GPU memory"):
    """Poll until every GPU in limits ({index: max used MiB}) is at or under its limit.

    Each tick is one nvidia-smi reading (the `gpus` op); callers have already seen their
    processes die. Returns the last readings; raises OperationFailed naming every process
    still on those GPUs (one full survey, both sources) when time runs out.
    """
    devices = sorted(limits)

    def tick():
        gpus = host.call("gpus", nvidia_smi=nvidia_smi, devices=devices, timeout=60)["gpus"] or []
        over = [g for g in gpus if g["index"] in limits and g["used_mib"] is not None
                and g["used_mib"] > limits[g["index"]]]
        if over:
            raise NotFreedYet(over)
        return gpus

    try:
        return _poll(tick, timeout, sleep)
    except NotFreedYet as e:
        survey = host.call("gpu_procs", nvidia_smi=nvidia_smi, devices=devices, timeout=60)
        raise OperationFailed(
            f"{what} not freed after {timeout:.0f} s: "
            + "; ".join(f"GPU {g['index']} uses {g['used_mib']} MiB (limit {limits[g['index']]} MiB)"
                        for g in e.over)
            + ". Processes still on these GPUs are listed below; free them with `fab kill-gpu-procs`",
            details=holders(survey) or ["no process visible from this host holds them"]) from None


def wait_own_freed(host, ddir, *, nvidia_smi, devices, pids, unlisted_limits, timeout=FREE_TIMEOUT_S,
                   sleep=None):
    """Poll until no process of deployment `ddir` (and none of `pids`, the ones just stopped)
    holds memory on the GPUs, per nvidia-smi's process list (the `gpu_holders` op), and no GPU
    uses more unlisted memory (nvsmi.unlisted: a dead process the driver still frees) than
    `unlisted_limits` allows. Another deployment's memory changes nothing. Returns the last
    answer {holders, gpus}; raises OperationFailed naming what still holds."""
    from .host.nvsmi import unlisted, unlisted_over

    def tick():
        found = host.call("gpu_holders", deploy_dir=ddir, nvidia_smi=nvidia_smi, devices=devices, timeout=60)
        left = [h for h in found["holders"] if h["ours"] or h["pid"] in pids]
        over = unlisted_over(unlisted(found["gpus"], found["holders"]), unlisted_limits)
        if left or over:
            raise NotFreedYet(left + [{"gpu": i, "unlisted": m} for i, m in over])
        return found

    try:
        return _poll(tick, timeout, sleep)
    except NotFreedYet as e:
        raise OperationFailed(
            f"GPU memory of the stopped deployment not freed after {timeout:.0f} s: "
            + "; ".join(f"pid {h['pid']} ({h['name']}) still holds {h['mib']} MiB on GPU {h['gpu']}"
                        if "pid" in h else
                        f"GPU {h['gpu']} holds {h['unlisted']} MiB that no process is listed for "
                        f"(limit {unlisted_limits[h['gpu']]} MiB)" for h in e.over)
            + "; free it with `fab kill-gpu-procs`") from None


def holder_words(h):
    """Whose a GPU holder is: `another deployment NAME, release R`, or `not an llmfab deployment`."""
    if h.get("deployment"):
        return f"another deployment {h['deployment']}, release {h['release']}"
    return "not an llmfab deployment"


def other_holder_lines(holders, seen_before=None):
    """One line per holder of the GPUs that is not this deployment's; one nobody owns that was
    not there before (seen_before: {(pid, gpu)}, None: not known) is a warning, never a failure."""
    out = []
    for h in holders:
        if h["ours"]:
            continue
        text = f"GPU {h['gpu']}: pid {h['pid']} ({h['name']}) holds {h['mib']} MiB: {holder_words(h)}"
        if seen_before is not None and not h.get("deployment") and (h["pid"], h["gpu"]) not in seen_before:
            text = "WARN " + text + " (appeared during the stop)"
        out.append(text)
    return out


def gpu_lines(before, after, baseline=None):
    """Per GPU: 'GPU 0: 8123 -> 3 MiB (baseline 0 MiB)' from readings keyed by index."""
    out = []
    base = {g["index"]: g for g in baseline or ()}
    for g in after or ():
        b = next((x for x in before or () if x["index"] == g["index"]), None)
        text = f"GPU {g['index']}: {b['used_mib'] if b else '?'} -> {g['used_mib']} MiB"
        if g["index"] in base:
            text += f" (baseline {base[g['index']]['used_mib']} MiB)"
        out.append(text)
    return out
