"""Stopping a deployment on the host: TERM the group, wait, KILL, sweep stragglers.

`stop` is what `fab stop` runs; the same from inside the group (the supervisor ending what is
left of a crashed attempt) is tasks/base/host/stopping.py stop_own_group.

Stragglers are processes that left the server's process group (e.g. a worker that
called setsid) but still carry the launcher's `LLMFAB_RELEASE` environment marker.
The answer carries the release's gpu-baseline.json so the caller can wait until the
GPUs are back to what they held before the launch (tasks/gpu/memory.py does).
"""
import os
import signal
import time

from ...gpu.host import nvsmi, gpuprocs
from ...runtime.host import container
from ...supervise.host import supervisor_state
from ...runtime.host import runtimes
from ...base.host.layout import mark_stopped
from ...base.host.procfs import cmdline, group_members, pid_alive
from ...base.host.statefiles import expand, read_json
from ...base.host import identity
from ...base.host.stopping import (DEFAULT_GRACE_S, KILL_GPU_GRACE_S, KILL_WAIT_S, REAPER_WAIT_S, signal_pids,
                                  wait_gone)


def marked(ddir):
    """Live pids of this deployment, of any release (identity.py: its cgroup, its session, or
    the environment marker of an older release)."""
    return list(runtimes.members(ddir))


def ours(ddir, pgid):
    """(live pids of this deployment, its pgid or None): marked ones, plus the server's group.

    The group counts only while a member carries the marker: after a reboot or a long
    time the pgid in server.json may name some unrelated group.
    """
    pids = set(marked(ddir))
    if pgid:
        group = set(group_members(pgid))
        if group & pids:
            return pids | group, pgid
    return pids, None


def stop(ddir, grace, by=None):
    """TERM the group and every marked process, wait `grace` s, then KILL whatever is left.
    `by` (e.g. "fab stop") records the stop in the release first; None when the server is
    stopped because it failed (its failure stays its explanation)."""
    server = read_json(os.path.join(ddir, "server.json")) or {}
    if container.is_container(server):  # the engine stops its container (runtime/host/container.py)
        return container.stop(ddir, server, grace, by)
    targets, pgid = ours(ddir, server.get("pgid"))
    if not targets:
        return {"already_stopped": True, "server": server or None, "terminated": [], "killed": [],
                "survivors": []}
    if by:
        mark_stopped(ddir, server, by)
    names = {p: cmdline(p) for p in targets}
    t0 = time.monotonic()
    signal_pids(sorted(targets), pgid, signal.SIGTERM)
    wait_gone(sorted(targets), t0 + grace)
    # The sweep: what survived TERM, and anything of ours spawned meanwhile (a worker
    # that called setsid after the first scan, say) goes by KILL.
    now = ours(ddir, server.get("pgid") if pgid else None)[0]
    left = sorted(p for p in now | targets if pid_alive(p))
    for p in left:
        names.setdefault(p, cmdline(p))
    killed, survivors = [], []
    if left:
        # The launcher's reaper leads the group and writes exit.json once its server is
        # gone: kill the others first and give it a moment to record how the server ended.
        reaper = server.get("pgid") if server.get("pgid") in left else None
        killed = [p for p in left if p != reaper]
        signal_pids(killed, None, signal.SIGKILL)
        survivors = wait_gone(killed, time.monotonic() + KILL_WAIT_S)
        if reaper and wait_gone([reaper], time.monotonic() + REAPER_WAIT_S):
            signal_pids([reaper], None, signal.SIGKILL)
            killed.append(reaper)
            survivors += wait_gone([reaper], time.monotonic() + KILL_WAIT_S)
    return {
        "already_stopped": False,
        "server": server,
        "terminated": sorted(p for p in targets if p not in killed),
        "killed": killed,
        "survivors": survivors,
        "names": {str(k): v for k, v in names.items()},
        "seconds": round(time.monotonic() - t0, 3),
    }


def baseline(ddir, server):
    """The GPU readings recorded just before this server's launch (gpu-baseline.json), or None."""
    if not server or not server.get("release"):
        return None
    return read_json(os.path.join(ddir, "releases", server["release"], "gpu-baseline.json"))


def op_stop(deploy_dir, grace=DEFAULT_GRACE_S, by="fab stop", nvidia_smi=None, devices=None):
    """Stop the deployment (its runtime's stop, or TERM its group, the grace, KILL, and sweep
    marked stragglers); `nvidia_smi` given: the GPUs' readings after it, in `gpus`."""
    ddir = expand(deploy_dir)
    server = read_json(os.path.join(ddir, "server.json"))
    runtime = runtimes.for_server(server)  # a systemd unit or a container (tasks/runtime/host/)
    if runtime is not None:
        return _stop_runtime(runtime, ddir, server, float(grace), by, nvidia_smi, devices)
    # The supervisor first: once it says "off" it restarts nothing, not even from a backoff.
    supervised = supervisor_state.end(ddir, server)
    base = baseline(ddir, server)
    before, held, others, trusted = None, None, None, False
    if base and base.get("gpus") and ours(ddir, (server or {}).get("pgid"))[0]:
        # what this deployment's own processes hold, per GPU, before they go: the stop is
        # over when they hold nothing, whatever another deployment on the GPU does meanwhile
        smi, devices = base.get("nvidia_smi") or nvsmi.NVIDIA_SMI, base.get("devices")
        found = gpuprocs.survey(smi, devices)
        before = found["gpus"]  # for the "8123 -> 3 MiB" lines
        every = gpuprocs.holders(ddir, smi, devices, survey_result=found)
        held = [h for h in every if h["ours"]]
        others = [h for h in every if not h["ours"]]
        trusted = not found["foreign"] and not found["error"]
    out = stop(ddir, float(grace), by)
    identity.empty_cgroups(ddir)
    out["supervisor_was"] = supervised
    out["baseline"] = base
    out["gpus_before"] = before
    out["held"] = held
    out["held_others"] = others
    out["trusted"] = trusted
    if nvidia_smi:
        out["gpus"] = nvsmi.select(nvsmi.read_gpus(nvidia_smi), devices)
    return out


def _stop_runtime(runtime, ddir, server, grace, by, nvidia_smi, devices):
    """op_stop for a server its runtime runs: the runtime stops it (systemctl stop, podman stop)
    with the grace, and the answer carries the same GPU readings as a process's stop."""
    base = baseline(ddir, server)
    before = None
    if base and base.get("gpus") and runtime.pids(ddir, server):
        before = nvsmi.read_gpus(base.get("nvidia_smi") or nvsmi.NVIDIA_SMI)
    out = runtime.stop(ddir, server, grace, by)
    out.update(supervisor_was=None, baseline=base, gpus_before=before)
    if nvidia_smi:
        out["gpus"] = nvsmi.select(nvsmi.read_gpus(nvidia_smi), devices)
    return out


def _signal_one(pid, start, sig):
    """'sent', 'gone' or 'denied'. A pid whose start time changed is a new process: 'gone'."""
    info = gpuprocs.proc_info(pid)
    if info is None or not pid_alive(pid) or (start is not None and info["start"] != start):
        return "gone"
    try:
        os.kill(pid, sig)
        return "sent"
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        return "denied"


def releases_of(pids):
    """The release directories these processes belong to (identity.py), where known."""
    table = identity.Table()
    out = set()
    for pid in pids:
        own = table.owner(pid)
        if own and own["ddir"]:
            out.add(os.path.join(own["ddir"], "releases", own["release"]))
    return out


def mark_killed(pids, by):
    """Record in each llmfab release that one of `pids` serves that it is stopped on purpose
    (`by`), as `fab stop` does: a deploy waiting for it says so, status never calls it failed."""
    for rdir in releases_of(pids):
        ddir = os.path.dirname(os.path.dirname(rdir))
        server = read_json(os.path.join(ddir, "server.json")) or {}
        if server.get("release") == os.path.basename(rdir):
            mark_stopped(ddir, server, by)


def stop_containers(pids, grace):
    """A container's processes go by its engine's stop: a signal of ours would read as a crash,
    which the engine's restart policy answers with a new server (runtime/host/container.py)."""
    seen = set()
    for pid in pids:
        # a container's process sees the container's filesystem, not ours: its marker names the
        # deployment, and the container's own process list must hold it (identity.py same_fs)
        found = identity._marker_release(pid)
        if not found or found in seen:
            continue
        seen.add(found)
        ddir, rel = found
        server = read_json(os.path.join(ddir, "server.json")) or {}
        if container.is_container(server) and server.get("release") == rel \
                and pid in set(container.pids(ddir, server) or ()):
            container.stop(ddir, server, grace, None)


def kill(targets, grace, by="fab kill-gpu-procs"):
    """SIGTERM each {pid, start}, wait up to grace s, SIGKILL the rest, wait for them to go."""
    t0 = time.monotonic()
    names = {str(t["pid"]): cmdline(t["pid"]) for t in targets}
    mark_killed([t["pid"] for t in targets], by)
    stop_containers([t["pid"] for t in targets], grace)
    sent, gone, denied = [], [], []
    for t in targets:
        res = _signal_one(t["pid"], t.get("start"), signal.SIGTERM)
        {"sent": sent, "gone": gone, "denied": denied}[res].append(t)
    alive = [t for t in sent if t["pid"] in wait_gone([x["pid"] for x in sent], t0 + grace)]
    killed = [t["pid"] for t in alive if _signal_one(t["pid"], t.get("start"), signal.SIGKILL) == "sent"]
    survivors = wait_gone(killed, time.monotonic() + KILL_WAIT_S)
    return {"terminated": [t["pid"] for t in sent if t["pid"] not in killed], "killed": killed,
            "survivors": survivors, "gone": [t["pid"] for t in gone],
            "denied": [t["pid"] for t in denied], "names": names,
            "seconds": round(time.monotonic() - t0, 3)}


def op_kill_procs(targets, grace=KILL_GPU_GRACE_S):
    return kill(targets, float(grace))
