"""GPU facts on the host: nvidia-smi queries and their parsers (pure, fixture-tested).

nvidia-smi prints `--format=csv,noheader,nounits` rows as cells joined by ", ", never
quoted. Cells can read `[N/A]`, `[Not Supported]`, `[Not Found]` or be empty: numbers
then parse to None. A name may itself hold commas (process paths do): the cells
around it have fixed positions, so the name is whatever lies between them. Lines
that do not parse (a header, "No devices were found") are skipped.
"""
import os
import subprocess
import time

from ...base.host.hostenv import which
from ...base.host.statefiles import expand, write_json
from ...base.host.layout import NVIDIA_SMI  # shared with the profile's default

GPU_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu")
APP_FIELDS = ("pid", "process_name", "used_memory", "gpu_uuid")
RUN_TIMEOUT_S = 20  # nvidia-smi can hang for seconds on a wedged driver; never forever


def gpu_query(nvidia_smi=NVIDIA_SMI):
    return [nvidia_smi, "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits"]


def app_query(nvidia_smi=NVIDIA_SMI):
    return [nvidia_smi, "--query-compute-apps=" + ",".join(APP_FIELDS), "--format=csv,noheader,nounits"]


def _num(text):
    parts = (text or "").split()
    try:
        return int(float(parts[0]))  # "143771" or, with units, "143771 MiB"
    except (IndexError, ValueError):
        return None  # [N/A], [Not Supported], ""


def _text(cell):
    cell = cell.strip()
    return None if cell.startswith("[") and cell.endswith("]") else cell  # [N/A], [Not Found]


def split_row(line, width, name_at):
    """Cells of one CSV row; the cell at `name_at` absorbs any extra commas. None if short."""
    raw = line.rstrip("\r\n").split(",")
    if len(raw) < width:
        return None
    extra = len(raw) - width
    name = ",".join(raw[name_at:name_at + extra + 1])
    cells = raw[:name_at] + [name] + raw[name_at + extra + 1:]
    return [c.strip() for c in cells]


def parse_gpus(text):
    """[{index, uuid, name, used_mib, total_mib, util_pct}] from a --query-gpu CSV."""
    out = []
    for line in (text or "").splitlines():
        cells = split_row(line, len(GPU_FIELDS), 2)
        if cells is None:
            continue
        idx, uuid, name, used, total, util = cells
        if not idx.isdigit():
            continue
        out.append({"index": int(idx), "uuid": uuid, "name": name, "used_mib": _num(used),
                    "total_mib": _num(total), "util_pct": _num(util)})
    return out


def parse_apps(text, gpus=()):
    """[{pid, name, used_mib, gpu_uuid, gpu, source}] from a --query-compute-apps CSV.

    `gpu` is the index joined on uuid (None when the uuid is not among `gpus`).
    """
    by_uuid = {g["uuid"]: g["index"] for g in gpus}
    out = []
    for line in (text or "").splitlines():
        cells = split_row(line, len(APP_FIELDS), 1)
        if cells is None or not cells[0].isdigit():
            continue
        pid, name, used, uuid = cells
        out.append({"pid": int(pid), "name": _text(name), "used_mib": _num(used),
                    "gpu_uuid": uuid, "gpu": by_uuid.get(uuid), "source": "nvidia-smi"})
    return out


def _run(argv):
    """(stdout text, None) or (None, why it failed)."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, "%s did not answer within %d s" % (argv[0], RUN_TIMEOUT_S)
    except OSError as e:
        return None, "%s: %s" % (argv[0], e.strerror or e)
    if proc.returncode != 0:
        text = (proc.stderr or proc.stdout).decode("utf-8", "replace").strip()
        return None, "%s exited with status %d: %s" % (argv[0], proc.returncode, text[-500:])
    return proc.stdout.decode("utf-8", "replace"), None


def available(nvidia_smi=NVIDIA_SMI):
    return which(nvidia_smi) is not None


# The agent's latest reading per nvidia-smi path: (time.monotonic(), gpus, error).
_LAST = {}


def query_gpus(nvidia_smi=NVIDIA_SMI):
    """(gpus, None) or (None, why nvidia-smi cannot be read here)."""
    if not available(nvidia_smi):
        result = None, "%s not found on PATH" % nvidia_smi
    else:
        text, err = _run(gpu_query(nvidia_smi))
        result = (None, err) if text is None else (parse_gpus(text), None)
    _LAST[nvidia_smi] = (time.monotonic(),) + result
    return result


def read_gpus(nvidia_smi=NVIDIA_SMI):
    """[{index, uuid, name, used_mib, total_mib, util_pct}] or None when there is no nvidia-smi."""
    return query_gpus(nvidia_smi)[0]


_LAST_APPS = {}  # the agent's latest process list per nvidia-smi path: (time.monotonic(), apps)


def query_apps(nvidia_smi=NVIDIA_SMI, gpus=()):
    """(apps, None) or ([], why the process list could not be read)."""
    text, err = _run(app_query(nvidia_smi))
    apps = parse_apps(text or "", gpus)
    _LAST_APPS[nvidia_smi] = (time.monotonic(), apps if err is None else None)
    return apps, err


def select(gpus, devices):
    if gpus is None:
        return None
    if devices is None:
        return gpus
    return [g for g in gpus if g["index"] in devices]


# "Back" after a stop: a GPU is back to a reading once it is within max(TOLERANCE_MIB,
# TOLERANCE_FRACTION of that reading) of it. The driver keeps some bookkeeping, and other
# tenants of a shared GPU move a little. `fab stop`, `fab kill-gpu-procs` (tasks/gpu/memory.py)
# and the supervisor before a restart all use these.
TOLERANCE_MIB = 256
TOLERANCE_FRACTION = 0.02


def tolerance(mib):
    return max(TOLERANCE_MIB, int(TOLERANCE_FRACTION * (mib or 0)))


def baseline_limits(baseline):
    """{index: most used MiB that counts as back} for the deployment's GPUs in a
    gpu-baseline.json; {} when it holds no reading."""
    devices = (baseline or {}).get("devices")
    return {g["index"]: g["used_mib"] + tolerance(g["used_mib"]) for g in (baseline or {}).get("gpus") or ()
            if g.get("used_mib") is not None and (devices is None or g["index"] in devices)}


def unlisted(gpus, apps):
    """{index: MiB a GPU uses beyond what nvidia-smi lists per process}: the driver's own, and a
    dead process's memory while the driver still frees it. Another process's memory is listed,
    so a neighbour that grows or starts does not move it; a stop waits for it to come back."""
    listed = {}
    for a in apps or ():
        listed[a["gpu"]] = listed.get(a["gpu"], 0) + (a.get("used_mib") or a.get("mib") or 0)
    return {g["index"]: g["used_mib"] - listed.get(g["index"], 0) for g in gpus or ()
            if g.get("used_mib") is not None}


def unlisted_over(now, limits):
    """[(index, unlisted MiB)] above their limit ({index: before + tolerance})."""
    return [(i, now[i]) for i in sorted(limits) if i in now and now[i] > limits[i]]


def unlisted_now(nvidia_smi, limits):
    """unlisted_over of a fresh reading; None if nvidia-smi gave none."""
    gpus, err = query_gpus(nvidia_smi)
    if gpus is None:
        return None
    return unlisted_over(unlisted(gpus, query_apps(nvidia_smi, gpus)[0]), limits)


def gpus_over(nvidia_smi, limits):
    """[(index, used MiB)] of the GPUs above their limit now; None if nvidia-smi gave no
    reading of every one of them."""
    used = {g["index"]: g["used_mib"] for g in read_gpus(nvidia_smi) or () if g["used_mib"] is not None}
    if not all(i in used for i in limits):
        return None
    return [(i, used[i]) for i in sorted(limits) if used[i] > limits[i]]


def op_gpus(nvidia_smi=NVIDIA_SMI, devices=None):
    return {"gpus": select(read_gpus(nvidia_smi), devices)}


def op_gpu_baseline(deploy_dir, release, nvidia_smi=NVIDIA_SMI, devices=None, reuse_s=None):
    """Record every GPU's used memory in <release>/gpu-baseline.json just before a launch.

    `fab stop` later waits until the deployment's devices are back to these readings.
    `reuse_s`: a reading this agent took at most that many seconds ago is used instead of
    running nvidia-smi again (deploy passes it when nothing was stopped since preflight).
    """
    last = _LAST.get(nvidia_smi)
    reused = bool(reuse_s and last and time.monotonic() - last[0] <= reuse_s)
    if reused:
        gpus, err = last[1], last[2]
    else:
        gpus, err = query_gpus(nvidia_smi)
    record = {"taken_at": time.time(), "nvidia_smi": nvidia_smi, "devices": devices,
              "gpus": gpus, "error": err}
    if gpus is not None:  # per GPU, what no listed process accounts for (the supervisor's wait)
        seen = _LAST_APPS.get(nvidia_smi)
        apps = seen[1] if reused and seen and seen[1] is not None and seen[0] >= last[0] - 1.0 \
            else query_apps(nvidia_smi, gpus)[0]
        record["unlisted"] = {str(k): v for k, v in unlisted(gpus, apps).items()}
    path = os.path.join(expand(deploy_dir), "releases", release, "gpu-baseline.json")
    write_json(path, record, 0o600)
    return record

