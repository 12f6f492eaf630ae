#!/usr/bin/python3 -S
"""Stand-in for `nvidia-smi` on test hosts (no GPU here), and the fake "driver" behind it.

The lab installs this file as an executable `nvidia-smi` in each test host's /usr/local/bin.
It answers exactly the queries llmfab uses, in nvidia-smi's formats:

    nvidia-smi -L
    nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits] [-i 0,1]
    nvidia-smi --query-compute-apps=FIELDS --format=csv[,noheader][,nounits] [-i ...]

The "driver" state lives in $FAKEGPU_DIR (default /tmp/fakegpu, per host in the lab):

    gpus.json        [{"index", "uuid", "name", "memory_total_mib", "baseline_used_mib"}]
                     absent = no driver: nvidia-smi fails like on a machine without one
    procs/*.json     one registration per (process, GPU), written by `register()`
    hostproc/        (only in PID-namespaced hosts) the root namespace's /proc, so a
                     registration can record the host PID, the one real nvidia-smi reports

Memory used = baseline + the registrations whose process is still alive (PID and start
time match); dead ones are ignored, like the driver freeing a dead context's memory.

Return codes follow nvidia-smi(1): 2 for an invalid argument or field, 6 for an -i that
matches no GPU, 9 when the driver is not loaded.
Standard library only (it runs with the system python3 on the hosts).

It costs about what the real one does, since benchmarks/ count it in llmfab's host CPU:
the real nvidia-smi took 20 ms of CPU per query on an H200 host (driver 580). Hence
`python3 -S` (no site start-up), and a query reads the driver's JSON files with the C
scanner behind the json module (`_loads`): importing json (re, enum) alone would cost 14 ms
of this machine's ~30. Writers (the lab, registrations) import json as usual.
"""
import os
import stat
import sys
import time

DEFAULT_DIR = "/tmp/fakegpu"
DEFAULT_GPU_NAME = "NVIDIA H100 80GB HBM3"
DEFAULT_TOTAL_MIB = 81559
DEFAULT_BASELINE_MIB = 4
DRIVER_VERSION = "570.133.20"

NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.\n")
BAD_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"

# field -> (header name, unit shown in the header, unit appended to values)
GPU_FIELDS = {
    "index": ("index", None),
    "uuid": ("uuid", None),
    "gpu_uuid": ("uuid", None),
    "name": ("name", None),
    "gpu_name": ("name", None),
    "memory.used": ("memory.used [MiB]", "MiB"),
    "memory.total": ("memory.total [MiB]", "MiB"),
    "memory.free": ("memory.free [MiB]", "MiB"),
    "memory.reserved": ("memory.reserved [MiB]", "MiB"),
    "utilization.gpu": ("utilization.gpu [%]", "%"),
    "utilization.memory": ("utilization.memory [%]", "%"),
    "driver_version": ("driver_version", None),
    "count": ("count", None),
    "pci.bus_id": ("pci.bus_id", None),
    "temperature.gpu": ("temperature.gpu", None),
    "power.draw": ("power.draw [W]", "W"),
    "persistence_mode": ("persistence_mode", None),
    "compute_mode": ("compute_mode", None),
}
APP_FIELDS = {
    "pid": ("pid", None),
    "process_name": ("process_name", None),
    "name": ("process_name", None),
    "used_memory": ("used_gpu_memory [MiB]", "MiB"),
    "used_gpu_memory": ("used_gpu_memory [MiB]", "MiB"),
    "gpu_uuid": ("gpu_uuid", None),
    "gpu_name": ("gpu_name", None),
    "gpu_bus_id": ("gpu_bus_id", None),
    "gpu_serial": ("gpu_serial", None),
}


class _Context:
    """What json's C scanner reads from a decoder: json.loads' defaults."""
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}.__getitem__


_scan = []


def _loads(text):
    """json.loads(text), without importing json (see the note at the top)."""
    if not _scan:
        try:
            from _json import make_scanner
        except ImportError:  # a Python without the C accelerator
            import json
            return json.loads(text)
        _scan.append(make_scanner(_Context()))
    text = text.strip()
    try:
        obj, end = _scan[0](text, 0)
    except StopIteration as e:
        raise ValueError("invalid JSON at character %s" % e.value) from None
    if end != len(text):
        raise ValueError("extra data after JSON at character %d" % end)
    return obj


def _load(f):
    return _loads(f.read())


def fakegpu_dir():
    return os.environ.get("FAKEGPU_DIR", DEFAULT_DIR)


# ---------------------------------------------------------------------------------------
# the "driver"


def write_gpus(directory, count=2, *, name=DEFAULT_GPU_NAME, total_mib=DEFAULT_TOTAL_MIB,
               baseline_mib=DEFAULT_BASELINE_MIB, uuid_seed="0", fields=None):
    """Create `directory`/gpus.json describing `count` GPUs (what the lab does per host).

    `fields` forces --query-gpu values on every GPU, e.g. {"utilization.gpu": "[N/A]"},
    as some drivers, MIG and containers report them.
    """
    os.makedirs(os.path.join(directory, "procs"), exist_ok=True)
    os.chmod(os.path.join(directory, "procs"), 0o1777)
    import hashlib  # here: every nvidia-smi run would pay for it (see the note at the top)
    gpus = []
    for i in range(count):
        h = hashlib.sha1(("%s/%d" % (uuid_seed, i)).encode()).hexdigest()
        gpus.append({"index": i, "uuid": "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16],
                                                                  h[16:20], h[20:32]),
                     "name": name, "memory_total_mib": total_mib,
                     "baseline_used_mib": baseline_mib,
                     "pci_bus_id": "00000000:%02X:00.0" % (0x18 + 8 * i),
                     "fields": dict(fields or {})})
    path = os.path.join(directory, "gpus.json")
    import json
    with open(path + ".tmp", "w") as f:
        json.dump(gpus, f, indent=1)
    os.replace(path + ".tmp", path)
    return gpus


def load_gpus(directory=None):
    """The GPU list, or None when there is no driver (no gpus.json)."""
    try:
        with open(os.path.join(directory or fakegpu_dir(), "gpus.json")) as f:
            return _load(f)
    except FileNotFoundError:
        return None


def _starttime(proc_root, pid):
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot), or None."""
    try:
        with open("%s/%d/stat" % (proc_root, pid), "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = data[data.rindex(b")") + 2:].split()
    state = fields[0]
    if state in (b"Z", b"X"):
        return None
    return int(fields[19])


def _host_proc(directory):
    """The /proc that shows host (root namespace) PIDs: hostproc/ if the lab mounted one."""
    hp = os.path.join(directory, "hostproc")
    return hp if os.path.isdir(os.path.join(hp, "self")) else "/proc"


def _self_ids(directory):
    """(host pid, own-namespace pid, start time) of the calling process."""
    own = os.getpid()
    proc = _host_proc(directory)
    if proc == "/proc":
        host_pid = own
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    host_pid = int(line.split()[1])
    else:
        host_pid = int(os.readlink(os.path.join(proc, "self")))
    return host_pid, own, _starttime("/proc", own)


def _process_name():
    try:
        with open("/proc/self/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0")[0]
        return os.fsdecode(argv0) or sys.executable
    except OSError:
        return sys.executable


def register(gpu_index, mib, *, directory=None, name=None):
    """Record that the calling process holds `mib` MiB on GPU `gpu_index`.

    Returns the registration's path (remove it with `unregister`). The record outlives the
    process on purpose: the reader ignores it once the process is gone, like the driver.
    """
    directory = directory or fakegpu_dir()
    gpus = load_gpus(directory)
    if gpus is None:
        raise RuntimeError("no fake GPU driver at %s (gpus.json missing)" % directory)
    if not any(g["index"] == gpu_index for g in gpus):
        raise ValueError("no GPU %r at %s" % (gpu_index, directory))
    host_pid, own_pid, start = _self_ids(directory)
    record = {"host_pid": host_pid, "pid": own_pid, "starttime": start, "gpu": gpu_index,
              "mib": int(mib), "name": name or _process_name(), "registered_at": time.time()}
    procs = os.path.join(directory, "procs")
    os.makedirs(procs, exist_ok=True)
    path = os.path.join(procs, "%d-%d.json" % (host_pid, gpu_index))
    import json
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)
    return path


def unregister(path):
    if teardown_seconds(os.path.dirname(os.path.dirname(path))) > 0:
        return _mark_gone(path, "released_at")  # the "driver" frees it a while later
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def live_registrations(directory=None):
    """Registrations whose process is alive, as dicts (see `register`)."""
    directory = directory or fakegpu_dir()
    proc = _host_proc(directory)
    procs = os.path.join(directory, "procs")
    out = []
    try:
        names = sorted(os.listdir(procs))
    except FileNotFoundError:
        return out
    for entry in names:
        if not entry.endswith(".json"):
            continue
        try:
            with open(os.path.join(procs, entry)) as f:
                rec = _load(f)
        except (OSError, ValueError):
            continue
        if rec.get("starttime") is not None and "released_at" not in rec and \
                _starttime(proc, rec["host_pid"]) == rec["starttime"]:
            out.append(rec)
    return out


# ---------------------------------------------------------------------------------------
# Driver teardown lag and a record of readings (supervision tests, issue 15)
#
#   teardown_s       a number of seconds: memory of a process that died (or released it)
#                    stays in use that long after the reader first sees it gone, as a real
#                    driver takes a moment to tear a CUDA context down. Absent: freed at once.
#                    Only processes registered after the file was written linger.
#   readings.jsonl   if it exists, every --query-gpu appends {t, used: {index: MiB},
#                    pids: [live holders], lingering: [dead holders still counted]}.


def teardown_seconds(directory, since=False):
    """The lag in seconds (0: none); with since=True, (lag, when it was set): only holders
    registered after that linger, so earlier processes' leftovers are freed as before."""
    path = os.path.join(directory, "teardown_s")
    try:
        with open(path) as f:
            lag, at = float(f.read().strip() or 0), os.stat(path).st_mtime
    except (OSError, ValueError):
        lag, at = 0.0, None
    return (lag, at) if since else lag


def read_registration(path):
    try:
        with open(path) as f:
            return _load(f)
    except (OSError, ValueError):
        return None


def _mark_gone(path, key):
    try:
        with open(path) as f:
            rec = _load(f)
    except (OSError, ValueError):
        return None
    rec.setdefault(key, time.time())
    import json
    with open(path + ".tmp", "w") as f:
        json.dump(rec, f)
    os.replace(path + ".tmp", path)
    return rec


def lingering_registrations(directory, live=None):
    """Registrations of dead (or released) holders still within the teardown lag."""
    lag, since = teardown_seconds(directory, since=True)
    if lag <= 0:
        return []
    live = live_registrations(directory) if live is None else live
    procs = os.path.join(directory, "procs")
    live_paths = {"%d-%d.json" % (r["host_pid"], r["gpu"]) for r in live}
    out = []
    for entry in sorted(os.listdir(procs)) if os.path.isdir(procs) else ():
        if not entry.endswith(".json") or entry in live_paths:
            continue
        rec = read_registration(os.path.join(procs, entry))
        if not rec or rec.get("registered_at", 0) < since:
            continue
        rec = _mark_gone(os.path.join(procs, entry), "gone_at")
        if rec and time.time() - min(rec.get("released_at", rec["gone_at"]), rec["gone_at"]) < lag:
            out.append(rec)
    return out


def record_reading(directory, rows):
    path = os.path.join(directory, "readings.jsonl")
    if not os.path.exists(path):
        return
    lingering = lingering_registrations(directory)
    line = {"t": time.time(), "used": {str(g["index"]): used for g, used, _ in rows},
            "pids": sorted({r["host_pid"] for _, _, regs in rows for r in regs}),
            "lingering": sorted({r["host_pid"] for r in lingering})}
    import json
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def usage(directory=None):
    """[(gpu dict, used MiB, [registrations])] for every GPU, or None without a driver."""
    directory = directory or fakegpu_dir()
    gpus = load_gpus(directory)
    if gpus is None:
        return None
    regs = live_registrations(directory)
    lingering = lingering_registrations(directory, regs)
    out = []
    for g in gpus:
        mine = [r for r in regs if r["gpu"] == g["index"]]
        used = g.get("baseline_used_mib", 0) + sum(r["mib"] for r in mine + lingering if r["gpu"] == g["index"])
        out.append((g, min(used, g["memory_total_mib"]), mine))
    return out


# ---------------------------------------------------------------------------------------
# /dev/nvidia<N> on a machine without the driver


def ensure_dev_nodes(count, *, created_log):
    """Make /dev/nvidia0..count-1 exist where no NVIDIA driver is loaded.

    The nodes are char devices 1:3 (what /dev/null is), so opening them is harmless;
    a /proc/*/fd scan then finds them like real ones. Every node created is appended to
    `created_log` so only those get removed (`remove_dev_nodes`). Returns the created paths.
    """
    if os.path.exists("/proc/driver/nvidia"):
        return []
    made = []
    for i in range(count):
        path = "/dev/nvidia%d" % i
        if os.path.exists(path):
            continue
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except FileExistsError:
            continue
        os.chmod(path, 0o666)
        made.append(path)
    if made:
        with open(created_log, "a") as f:
            f.write("".join(p + "\n" for p in made))
    return made


def remove_dev_nodes(created_log):
    """Remove the nodes `ensure_dev_nodes` listed in `created_log` (only if still 1:3)."""
    try:
        with open(created_log) as f:
            paths = [line.strip() for line in f if line.strip()]
    except FileNotFoundError:
        return
    for path in paths:
        try:
            st = os.stat(path)
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3):
                os.unlink(path)
        except FileNotFoundError:
            pass
    os.unlink(created_log)


# ---------------------------------------------------------------------------------------
# the command line


class _Usage(Exception):
    def __init__(self, text, code=2):
        super().__init__(text)
        self.text, self.code = text, code


def _parse(argv):
    opts = {"list": False, "query_gpu": None, "query_apps": None, "format": None, "ids": None,
            "help": False}
    i = 0

    def value(flag, arg):
        nonlocal i
        if "=" in arg:
            return arg.split("=", 1)[1]
        i += 1
        if i >= len(argv):
            raise _Usage(BAD_ARGS)
        return argv[i]

    while i < len(argv):
        arg = argv[i]
        if arg in ("-L", "--list-gpus"):
            opts["list"] = True
        elif arg in ("-h", "--help"):
            opts["help"] = True
        elif arg.startswith("--query-gpu"):
            opts["query_gpu"] = value(arg, arg)
        elif arg.startswith("--query-compute-apps"):
            opts["query_apps"] = value(arg, arg)
        elif arg.startswith("--format"):
            opts["format"] = value(arg, arg)
        elif arg.startswith("--id") or arg == "-i":
            opts["ids"] = value(arg, arg)
        elif arg.startswith("-i") and len(arg) > 2:
            opts["ids"] = arg[2:]
        else:
            raise _Usage(BAD_ARGS)
        i += 1
    if opts["query_gpu"] is not None and opts["query_apps"] is not None:
        raise _Usage(BAD_ARGS)
    query = opts["query_gpu"] is not None or opts["query_apps"] is not None
    if query and not opts["format"]:
        raise _Usage('"--format=" switch is missing. Please run \'nvidia-smi -h\' for help.\n')
    if opts["format"] is not None:
        parts = [p.strip() for p in opts["format"].split(",")]
        if "csv" not in parts or any(p not in ("csv", "noheader", "nounits") for p in parts):
            raise _Usage('Invalid format specified. Please run \'nvidia-smi -h\' for help.\n')
        opts["header"] = "noheader" not in parts
        opts["units"] = "nounits" not in parts
    return opts


def _select(rows, ids):
    if ids is None:
        return rows
    chosen = []
    for token in ids.split(","):
        token = token.strip()
        match = [r for r in rows if str(r[0]["index"]) == token or r[0]["uuid"] == token
                 or r[0].get("pci_bus_id") == token]
        if not match:
            raise _Usage("No devices were found\n", code=6)
        chosen.extend(m for m in match if m not in chosen)
    return chosen


def _fields(spec, table):
    names = [f.strip() for f in spec.split(",") if f.strip()]
    for name in names:
        if name not in table:
            raise _Usage('Field "%s" is not a valid field to query.\n\n' % name)
    if not names:
        raise _Usage(BAD_ARGS)
    return names


def _render(names, table, rows, opts):
    out = []
    if opts["header"]:
        out.append(", ".join(table[n][0] if opts["units"] else table[n][0].split(" [")[0]
                             for n in names))
    for row in rows:
        cells = []
        for n in names:
            v = row[n]
            unit = table[n][1]
            if opts["units"] and unit and v not in ("[N/A]", "[Not Supported]"):
                v = "%s %s" % (v, unit)
            cells.append(str(v))
        out.append(", ".join(cells))
    return "".join(line + "\n" for line in out)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        opts = _parse(argv)
    except _Usage as exc:
        sys.stdout.write(exc.text)
        return exc.code
    if opts["help"]:
        sys.stdout.write("NVIDIA System Management Interface -- stand-in for llmfab tests.\n"
                         "Supported: -L, --query-gpu=..., --query-compute-apps=..., "
                         "--format=csv[,noheader][,nounits], -i IDS\n")
        return 0
    rows = usage()
    if rows is None:
        sys.stdout.write(NO_DRIVER)
        return 9
    try:
        rows = _select(rows, opts["ids"])
        if opts["query_gpu"] is not None:
            record_reading(fakegpu_dir(), rows)
            names = _fields(opts["query_gpu"], GPU_FIELDS)
            table = []
            for g, used, regs in rows:
                total = g["memory_total_mib"]
                table.append({
                    "index": g["index"], "uuid": g["uuid"], "gpu_uuid": g["uuid"],
                    "name": g["name"], "gpu_name": g["name"], "memory.used": used,
                    "memory.total": total, "memory.free": total - used,
                    "memory.reserved": 0 if total < 1024 else 518,
                    "utilization.gpu": min(100, 31 * len(regs)),
                    "utilization.memory": min(100, 100 * used // total),
                    "driver_version": DRIVER_VERSION, "count": len(rows),
                    "pci.bus_id": g.get("pci_bus_id", "[N/A]"),
                    "temperature.gpu": 33 + 4 * min(len(regs), 8),
                    "power.draw": "%.2f" % (71.5 + 40 * min(len(regs), 8)),
                    "persistence_mode": "Enabled", "compute_mode": "Default"})
                table[-1].update(g.get("fields") or {})
            sys.stdout.write(_render(names, GPU_FIELDS, table, opts))
        elif opts["query_apps"] is not None:
            names = _fields(opts["query_apps"], APP_FIELDS)
            table = []
            for g, used, regs in rows:
                for r in regs:
                    table.append({
                        "pid": r["host_pid"], "process_name": r["name"], "name": r["name"],
                        "used_memory": r["mib"], "used_gpu_memory": r["mib"],
                        "gpu_uuid": g["uuid"], "gpu_name": g["name"],
                        "gpu_bus_id": g.get("pci_bus_id", "[N/A]"), "gpu_serial": "[N/A]"})
            sys.stdout.write(_render(names, APP_FIELDS, table, opts))
        elif opts["list"]:
            for g, used, regs in rows:
                sys.stdout.write("GPU %d: %s (UUID: %s)\n" % (g["index"], g["name"], g["uuid"]))
        else:
            # The full table view is not something llmfab parses; print a short summary.
            for g, used, regs in rows:
                sys.stdout.write("|  %d  %s  %5dMiB / %5dMiB |\n"
                                 % (g["index"], g["name"], used, g["memory_total_mib"]))
            if not any(regs for _, _, regs in rows):
                sys.stdout.write("No running processes found\n")
    except _Usage as exc:
        sys.stdout.write(exc.text)
        return exc.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
