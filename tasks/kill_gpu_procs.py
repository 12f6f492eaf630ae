"""`fab kill-gpu-procs`: free GPUs from whatever holds them, and prove the memory came back.

Selects `--gpus 0,1`, else `--all`, else the profile's devices (gpu.devices, else
server.env CUDA_VISIBLE_DEVICES, else every GPU). On each host: list every process
using them (nvidia-smi and /proc/*/fd, tasks/gpu/host/gpuprocs.py), SIGTERM them (but a
live server of another llmfab deployment: "left alone: another deployment NAME", unless
`--all`),
SIGKILL what is left after `--grace` (default 10 s), then wait until each GPU dropped
by what its killed processes held (tasks/gpu/memory.py). `--dry-run` lists and signals
nothing. Nothing to kill is success (exit 0).
"""

from .fleet.runner import load, run_task
from .steps.preflight import deploy_dir
from .errors import ExitCode, LlmfabError, OperationFailed
from .fleet.fanout import HostResult
from .gpu.memory import gpu_lines, wait_freed
from .gpu.host.nvsmi import tolerance
from .output import processes, table_lines


def selection(opts, profile):
    """The GPU indexes to free: --all (None: every GPU), --gpus, else the profile's."""
    if opts.all:
        return None
    if opts.gpus is not None:
        return list(opts.gpus)
    return profile.devices


def process_rows(procs):
    """One row per (process, GPU): pid, user, GPU, MiB, source, command."""
    rows = []
    for p in procs:
        note = f" [left alone: {p['spared']}]" if p["spared"] else ""
        own = p.get("owner")
        if not p["spared"] and own and not own["ours"]:
            note = f" [{'' if own['live'] else 'orphan of '}another deployment {own['deployment']}, " \
                   f"release {own['release']}]"
        for g in p["gpus"]:
            mib = "?" if g["used_mib"] is None else g["used_mib"]
            rows.append([p["pid"], p["user"], g["index"], mib, p["source"], p["command"][:100] + note])
    return rows


def kill_gpu_procs(c, opts):
    """Body of `fab kill-gpu-procs` (see the module docstring)."""
    profile = load(c, opts.profile)
    devices = selection(opts, profile)
    grace = opts.grace
    json_mode = opts.json
    nvidia_smi = profile.gpu.nvidia_smi

    def op(host, reporter):
        name = host.name
        host.start()
        # whose each process is: a live server of another deployment is left alone unless --all
        s = host.call("gpu_procs", nvidia_smi=nvidia_smi, devices=devices, deploy_dir=deploy_dir(profile),
                      neighbours=bool(opts.all), timeout=60)
        record = {"dry_run": bool(opts.dry_run), "devices": devices,
                  "gpus_before": s["gpus"], "processes": s["procs"], "foreign": s["foreign"],
                  "killed": [], "gpus_after": None, "freed_mib": None}
        try:
            res = _free(host, reporter, s, record, devices, grace, nvidia_smi)
        except LlmfabError as e:  # its --json object: {host, ok: false, error, code, ...record}
            e.json_extra = dict(record, **e.json_extra)
            raise
        if json_mode:
            reporter.emit_json(dict({"host": name, "ok": True}, **record))
        return res

    run_task(c, profile, op, opts, title="kill-gpu-procs", json_mode=json_mode)


def _free(host, reporter, s, record, devices, grace, nvidia_smi):
    name = host.name
    if s["gpus"] is None:
        reporter.line(name, f"cannot read GPU memory ({s['error']}); using /proc/*/fd alone")
    elif devices is not None:
        missing = sorted(set(devices) - {g["index"] for g in s["gpus"]})
        if missing:
            raise OperationFailed(f"GPU(s) {missing} not present on this host "
                                  f"(it has {[g['index'] for g in s['gpus']] or 'none'})")
    if s["note"]:
        reporter.line(name, s["note"])
    targets = [p for p in s["procs"] if not p["spared"]]
    if s["procs"]:
        reporter.lines(name, table_lines(["pid", "user", "GPU", "MiB", "source", "command"],
                                   process_rows(s["procs"])))
    if record["dry_run"]:
        reporter.line(name, f"dry run: {processes(len(targets))} would get SIGTERM, then SIGKILL "
                            f"after {grace:g} s; nothing was signalled")
        return HostResult(name, ExitCode.OK, f"dry run: {len(targets)} to kill")
    if not targets:
        reporter.line(name, "nothing to kill: no process of this host holds the selected GPUs")
        return HostResult(name, ExitCode.OK, "nothing to kill")
    res = host.call("kill_procs", targets=[{"pid": p["pid"], "start": p["start"]} for p in targets],
                    grace=grace, timeout=grace + 60)
    how = {p: "SIGTERM" for p in res["terminated"]}
    how.update({p: "SIGKILL" for p in res["killed"]})
    how.update({p: "already gone" for p in res["gone"]})
    how.update({p: "not permitted" for p in res["denied"]})
    record["killed"] = [{"pid": p["pid"], "how": how.get(p["pid"], "?"), "command": p["command"]}
                        for p in targets]
    if res["denied"] or res["survivors"]:
        bad = res["denied"] + res["survivors"]
        raise OperationFailed(f"could not kill pid(s) {bad}: "
                              + ("not permitted (run as their owner or root); " if res["denied"] else "")
                              + ("survived SIGKILL" if res["survivors"] else ""),
                              details=[f"pid {p}: {res['names'].get(str(p), '')}" for p in bad])
    limits = _limits(s["gpus"], targets)
    after = wait_freed(host, nvidia_smi=nvidia_smi, limits=limits) if limits else []
    record["gpus_after"] = after
    before = {g["index"]: g["used_mib"] for g in s["gpus"] or ()}
    record["freed_mib"] = {str(g["index"]): before[g["index"]] - g["used_mib"] for g in after
                           if before.get(g["index"]) is not None and g["used_mib"] is not None}
    reporter.lines(name, table_lines(["pid", "signal", "GPU", "MiB", "command"], [
        [p["pid"], how.get(p["pid"], "?"), ",".join(str(g["index"]) for g in p["gpus"]),
         sum(g["used_mib"] or 0 for g in p["gpus"]) if any(g["used_mib"] is not None for g in p["gpus"])
         else "?", p["command"][:100]] for p in targets]))
    for line in gpu_lines(s["gpus"], after):
        reporter.line(name, line)
    freed = sum(v for v in record["freed_mib"].values() if v > 0)
    killed = len(res["killed"])
    reporter.line(name, f"{processes(len(targets))} gone ({killed} needed SIGKILL) in {res['seconds']:.1f} s; "
                        f"{freed} MiB came back")
    return HostResult(name, ExitCode.OK, f"killed {len(targets)}, freed {freed} MiB")


def _limits(gpus, targets):
    """Per GPU: its reading before, less what the killed processes held there, plus tolerance."""
    out = {}
    for g in gpus or ():
        if g["used_mib"] is None:
            continue
        held = sum(x["used_mib"] or 0 for p in targets for x in p["gpus"] if x["index"] == g["index"])
        out[g["index"]] = max(0, g["used_mib"] - held) + tolerance(g["used_mib"] - held)
    return out
