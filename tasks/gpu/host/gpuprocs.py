"""Who uses the GPUs, from two sources (host side). procs.kill frees them.

- nvidia-smi: pid, name and MiB per GPU. In a container (LXC, docker) it reports the
  outer PID namespace's numbers: they do not exist here, or are other processes.
  Such entries are reported as `foreign` and never signalled.
- proc-fd: processes holding an fd on a per-GPU node /dev/nvidia<N>. /dev/nvidiactl
  and /dev/nvidia-uvm are opened by every CUDA user and say nothing about which GPU,
  so they are ignored. This source has no MiB.

A process nvidia-smi lists under a local PID keeps nvidia-smi's GPUs (a CUDA process
may open the nodes of GPUs it does not use); one only /proc sees gets its nodes' GPUs,
and is a target only where nvidia-smi's list cannot be trusted (see `_trusted`).
Never touched: nvidia-persistenced, DCGM (nv-hostengine, dcgm-exporter), the fabric
manager, nvidia-smi, display servers, this agent and its ancestors.
"""
import os
import re

from . import nvsmi
from ...base.host.hosterrors import Damaged
from ...base.host.identity import Table
from ...base.host.procfs import PROC, cmdline, fd_targets, pids, proc_read, read_bytes, stat_fields
from ...base.host.statefiles import read_json
from ...runtime.host.runtimes import members, server_alive

GPU_NODE = re.compile(r"^/dev/nvidia(\d+)$")
PROTECTED = ("nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "dcgmi", "nv-fabricmanager",
             "nvidia-fabricmanager", "nvidia-smi", "Xorg", "Xwayland")


def minor_to_index(gpus, proc_root=PROC):
    """{device minor: nvidia-smi index} from /proc/driver/nvidia; minor == index where absent."""
    by_uuid = {g["uuid"]: g["index"] for g in gpus or ()}
    out = {}
    base = os.path.join(proc_root, "driver", "nvidia", "gpus")
    try:
        buses = os.listdir(base)
    except OSError:
        buses = []
    for bus in buses:
        info = (read_bytes(os.path.join(base, bus, "information")) or b"").decode("utf-8", "replace")
        minor = re.search(r"^Device Minor:\s*(\d+)", info, re.M)
        uuid = re.search(r"^GPU UUID:\s*(\S+)", info, re.M)
        if minor and uuid and uuid.group(1) in by_uuid:
            out[int(minor.group(1))] = by_uuid[uuid.group(1)]
    return out


def scan_fds(proc_root=PROC):
    """{pid: set of minors N of the /dev/nvidia<N> nodes it holds open}, this PID namespace."""
    out = {}
    for pid in pids(proc_root):
        minors = {int(m.group(1)) for m in map(GPU_NODE.match, fd_targets(pid, proc_root)) if m}
        if minors:
            out[pid] = minors
    return out


def proc_info(pid, proc_root=PROC):
    """{pid, start, pgid, user, command, comm} or None when the pid does not exist here."""
    fields = stat_fields(pid, proc_root)
    if fields is None:
        return None
    try:
        start, pgid = int(fields[19]), int(fields[2])
    except (IndexError, ValueError):
        start = pgid = None
    uid = None
    for line in (proc_read(pid, "status", proc_root) or b"").decode("utf-8", "replace").splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[1])
    command = cmdline(pid, proc_root)
    comm = (proc_read(pid, "comm", proc_root) or b"").decode("utf-8", "replace").strip()
    return {"pid": pid, "start": start, "pgid": pgid, "user": _user(uid), "command": command or "[%s]" % comm,
            "comm": comm}


def _user(uid):
    if uid is None:
        return "?"
    try:
        import pwd
        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def protected_reason(info, me=None, proc_root=PROC):
    """Why this process must never be signalled, or None."""
    if info["pid"] in _ancestry(me or os.getpid(), proc_root):
        return "llmfab's own agent"
    argv0 = os.path.basename(info["command"].split(" ", 1)[0]) if info["command"] else ""
    for name in PROTECTED:
        if argv0 == name or info["comm"] == name[:15]:
            return "system service %s" % name
    return None


def _ancestry(pid, proc_root=PROC):
    out = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            pid = int(stat_fields(pid, proc_root)[1])
        except (TypeError, IndexError, ValueError):
            break
    return out


def _same_process(smi_name, info):
    """Does the local process look like the one nvidia-smi named? (Loose: names vary.)"""
    if not smi_name:
        return True
    base = os.path.basename(smi_name.split(" ", 1)[0])
    return bool(base) and (base in info["command"] or base[:15] == info["comm"]
                           or bool(info["comm"]) and info["comm"] in smi_name)


UNACCOUNTED_MIB = 1024  # a GPU using this much with no process listed: nvidia-smi cannot see them


def _trusted(gpus, apps_local, foreign, smi_error):
    """GPU indexes whose nvidia-smi process list accounts for its users.

    Not trusted: nvidia-smi failed; it lists PIDs that are not ours (a container); or it
    lists no process of ours for a GPU that has memory in use (docker shows an empty list).
    There /proc decides who gets signalled; elsewhere a process that only holds a device
    node (no memory per nvidia-smi: another namespace-less tenant, a desktop) is left alone.
    """
    if gpus is None or smi_error:
        return set()
    bad = {f["gpu"] for f in foreign}
    listed = {a["gpu"] for a in apps_local}
    bad |= {g["index"] for g in gpus if g["index"] not in listed and (g["used_mib"] or 0) >= UNACCOUNTED_MIB}
    return {g["index"] for g in gpus} - bad


def survey(nvidia_smi=nvsmi.NVIDIA_SMI, devices=None, proc_root=PROC, me=None):
    """Every process using the selected GPUs, merged from both sources; see the module doc.

    Each process: {pid, start, user, command, comm, source, gpus: [{index, used_mib}],
    spared: why it must not be signalled, or None}.
    """
    gpus, smi_error = nvsmi.query_gpus(nvidia_smi)
    apps, app_error = nvsmi.query_apps(nvidia_smi, gpus or []) if gpus is not None else ([], None)
    minors = minor_to_index(gpus, proc_root)
    wanted = None if devices is None else set(devices)
    procs, foreign, local_apps = {}, [], []

    def entry(info, source):
        rec = procs.setdefault(info["pid"], dict(info, sources=[], gpus={},
                                                 spared=protected_reason(info, me, proc_root)))
        if source not in rec["sources"]:
            rec["sources"].append(source)
        return rec

    for app in apps:
        info = proc_info(app["pid"], proc_root)
        if info is not None and _same_process(app["name"], info):
            local_apps.append(dict(app, info=info))
        elif wanted is None or app["gpu"] in wanted:
            foreign.append(dict(app, local=info["command"] if info else None))
    for app in local_apps:
        if wanted is None or app["gpu"] in wanted:
            entry(app["info"], "nvidia-smi")["gpus"][app["gpu"]] = app["used_mib"]
    trusted = _trusted(gpus, local_apps, foreign, smi_error or app_error)
    smi_pids = {a["pid"] for a in local_apps}  # nvidia-smi's GPUs are the truth for these
    for pid, nodes in scan_fds(proc_root).items():
        if pid in procs:
            entry(procs[pid], "proc-fd")
            continue
        indexes = {minors.get(m, m) for m in nodes}
        indexes = indexes if wanted is None else indexes & wanted
        info = proc_info(pid, proc_root) if indexes and pid not in smi_pids else None
        if info is None:
            continue
        rec = entry(info, "proc-fd")
        rec["gpus"].update({i: None for i in indexes})
        if rec["spared"] is None and indexes <= trusted:
            rec["spared"] = "holds the device node but nvidia-smi shows no memory of it"
    out = []
    for rec in sorted(procs.values(), key=lambda r: r["pid"]):
        rec["source"] = "+".join(rec.pop("sources"))
        rec["gpus"] = [{"index": i, "used_mib": m} for i, m in sorted(rec["gpus"].items(),
                                                                     key=lambda kv: (kv[0] is None, kv[0] or 0))]
        out.append(rec)
    return {"gpus": nvsmi.select(gpus, devices), "error": smi_error or app_error, "procs": out,
            "foreign": foreign, "note": _note(foreign, out)}


def _note(foreign, procs):
    if not foreign:
        return None
    pids = ", ".join(str(p) for p in sorted({f["pid"] for f in foreign})[:8])
    return ("nvidia-smi lists pid(s) %s that are not processes of this PID namespace (a container?): "
            "they are left alone; %s" % (pids, "processes found through /proc/*/fd are used instead"
                                         if any("proc-fd" in p["source"] for p in procs)
                                         else "no process here holds a GPU device node"))


def op_gpu_procs(nvidia_smi=nvsmi.NVIDIA_SMI, devices=None, deploy_dir=None, neighbours=False):
    """survey(), each process marked with whose it is when `deploy_dir` (the profile's
    deployment) is given: `owner` {deployment, release, ours, live}; a live server of another
    deployment is `spared` unless `neighbours` (kill-gpu-procs --all)."""
    found = survey(nvidia_smi, devices)
    if deploy_dir:
        mark_owners(found["procs"], deploy_dir, spare_neighbours=not neighbours)
    return found


def mark_owners(procs, ddir, spare_neighbours=True, proc_root=PROC):
    """Set each process's `owner`; spare what a live server of another deployment runs."""
    table = Table(proc_root)
    live = {}
    for p in procs:
        own = table.owner(p["pid"])
        if own is None:
            p["owner"] = None
            continue
        ours = table.is_of(p["pid"], ddir) is not None
        other = own["ddir"]
        if other and other not in live:
            try:
                live[other] = server_alive(other, read_json(os.path.join(other, "server.json")))
            except Damaged:  # another deployment's damage is its own: its processes count as live
                live[other] = True
        alive = bool(other and live[other])
        p["owner"] = {"deployment": own["name"], "release": own["release"], "ours": ours, "live": alive}
        if not ours and alive and spare_neighbours and p["spared"] is None:
            p["spared"] = "another deployment %s, release %s" % (own["name"], own["release"])


def _name(p):
    """VLLM::EngineCore rather than its 15-character comm when the command line says it whole."""
    first = (p["command"] or "").split(" ")[0]
    return first if p["comm"] and first.startswith(p["comm"]) else (p["comm"] or first)


def holders(ddir, nvidia_smi=nvsmi.NVIDIA_SMI, devices=None, proc_root=PROC, survey_result=None):
    """Who holds memory on the selected GPUs: [{pid, name, gpu, mib, ours, deployment,
    release, how}], one per process and GPU. `ours`: the process is deployment `ddir`'s
    (tasks/base/host/identity.py: its cgroup, session or marker); `deployment` names the
    llmfab deployment it belongs to (this one or another; None: not an llmfab deployment),
    `release` its release."""
    table = Table(proc_root)
    found = survey_result or survey(nvidia_smi, devices, proc_root)
    own = members(ddir, table=table)
    out = []
    for p in found["procs"]:
        owner = table.owner(p["pid"])
        mine = own.get(p["pid"])
        if mine is not None and owner is None:  # e.g. an orphan whose session leader is gone
            owner = {"name": None, "release": mine, "how": "session"}
        for g in p["gpus"]:
            if g["used_mib"]:
                out.append({"pid": p["pid"], "name": _name(p), "gpu": g["index"], "mib": g["used_mib"],
                            "ours": mine is not None, "deployment": owner["name"] if owner else None,
                            "release": mine or (owner["release"] if owner else None),
                            "how": owner["how"] if owner else None})
    return out


def op_gpu_holders(deploy_dir, nvidia_smi=nvsmi.NVIDIA_SMI, devices=None):
    """holders(), the selected GPUs' readings, and whether nvidia-smi's process list accounts
    for their users here (`trusted`: false in a container that sees other pids)."""
    found = survey(nvidia_smi, devices)
    return {"holders": holders(deploy_dir, nvidia_smi, devices, survey_result=found),
            "gpus": found["gpus"], "trusted": not found["foreign"] and not found["error"]}
