"""GPU facts on the host: nvidia-smi queries and their parsers (pure, fixture-tested).

Fields can read `[N/A]`, `[Not Supported]` or be empty: such values parse to None.
"""
import shutil
import subprocess

GPU_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu")
APP_FIELDS = ("pid", "process_name", "used_memory", "gpu_uuid")


def gpu_query(nvidia_smi="nvidia-smi"):
    return [nvidia_smi, "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits"]


def app_query(nvidia_smi="nvidia-smi"):
    return [nvidia_smi, "--query-compute-apps=" + ",".join(APP_FIELDS), "--format=csv,noheader,nounits"]


def _num(text):
    text = text.strip()
    try:
        return int(float(text))
    except ValueError:
        return None  # [N/A], [Not Supported], ""


def _rows(text, width):
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) > width:  # a name with commas: keep the edges, join the middle
            cells = cells[:2] + [",".join(cells[2:len(cells) - width + 3])] + cells[len(cells) - width + 3:]
        if len(cells) == width:
            yield cells


def parse_gpus(text):
    out = []
    for idx, uuid, name, used, total, util in _rows(text, len(GPU_FIELDS)):
        index = _num(idx)
        if index is None:
            continue
        out.append({"index": index, "uuid": uuid, "name": name, "used_mib": _num(used),
                    "total_mib": _num(total), "util_pct": _num(util)})
    return out


def parse_apps(text, gpus=()):
    by_uuid = {g["uuid"]: g["index"] for g in gpus}
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 4:
            continue
        pid, used, uuid = _num(cells[0]), _num(cells[-2]), cells[-1]
        if pid is None:
            continue
        out.append({"pid": pid, "name": ",".join(cells[1:-2]), "used_mib": used,
                    "gpu_uuid": uuid, "gpu": by_uuid.get(uuid), "source": "nvidia-smi"})
    return out


def _run(argv):
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    if proc.returncode != 0:
        return None, (proc.stderr or proc.stdout).decode("utf-8", "replace").strip()
    return proc.stdout.decode("utf-8", "replace"), None


def available(nvidia_smi="nvidia-smi"):
    return shutil.which(nvidia_smi) is not None


def read_gpus(nvidia_smi="nvidia-smi"):
    """[{index, uuid, name, used_mib, total_mib, util_pct}] or None when there is no nvidia-smi."""
    if not available(nvidia_smi):
        return None
    text, err = _run(gpu_query(nvidia_smi))
    if text is None:
        return None
    return parse_gpus(text)


def read_apps(nvidia_smi="nvidia-smi", gpus=None):
    if gpus is None:
        gpus = read_gpus(nvidia_smi) or []
    text, err = _run(app_query(nvidia_smi))
    return parse_apps(text or "", gpus)


def select(gpus, devices):
    if gpus is None:
        return None
    if devices is None:
        return gpus
    return [g for g in gpus if g["index"] in devices]


def op_gpus(req):
    return {"gpus": select(read_gpus(req.get("nvidia_smi") or "nvidia-smi"), req.get("devices"))}


OPS = {"gpus": op_gpus}
