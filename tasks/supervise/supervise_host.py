"""The supervisor's hands on the host: release files, stopping an attempt, GPU readings.

Copied into a release beside supervise.py. It mirrors tasks/hostside/procs.py (`stop`)
and tasks/gpuwait.py (the tolerance) for one release, in the reaper itself: the reaper
leads the server's process group, so it TERMs the group with the TERM blocked for
itself, then each marked process outside the group, once. tests/test_supervise_units.py
holds the copies to their originals. Standard library only, Python >= 3.9.
"""
import json
import os
import signal
import subprocess
import time

TOLERANCE_MIB = 256          # tasks/gpuwait.py: back = within max(256 MiB, 2 % of the baseline)
TOLERANCE_FRACTION = 0.02
KILL_WAIT_S = 5.0            # tasks/hostside/procs.py: after SIGKILL the kernel needs a moment
NVIDIA_SMI_TIMEOUT_S = 20


class Release:
    """The release directory this supervisor runs from (launch.py's directory)."""

    def __init__(self, here):
        self.here = here
        self.ddir = os.path.dirname(os.path.dirname(here))
        self.log_path = os.path.join(here, "server.log")
        self.marker = ("LLMFAB_RELEASE=" + here).encode()

    def read_json(self, name):
        try:
            with open(os.path.join(self.here, name)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def write_json(self, name, data, directory=None):
        path = os.path.join(directory or self.here, name)
        with open(path + ".tmp", "w") as f:
            json.dump(data, f)
            f.write("\n")
        os.replace(path + ".tmp", path)

    def append_jsonl(self, name, record):
        with open(os.path.join(self.here, name), "a") as f:
            f.write(json.dumps(record) + "\n")

    def record_server(self, pid, started_at, port):
        """server.json as launch.py writes it; the pgid (this reaper) stays the same."""
        self.write_json("server.json", {"pid": pid, "pgid": os.getpgid(0), "started_at": started_at,
                                        "release": os.path.basename(self.here), "port": port},
                        directory=self.ddir)

    def marked(self):
        """Live pids (but this one) whose environment carries this release's marker."""
        out = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                with open("/proc/%s/environ" % name, "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if self.marker in env and alive(int(name)):
                out.append(int(name))
        return out


def _stat(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid):
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def group_members(pgid):
    out = []
    for name in os.listdir("/proc"):
        fields = _stat(int(name)) if name.isdigit() else None
        if fields and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(name))
    return out


def _kill(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _term_group_once():
    """SIGTERM to this reaper's group, itself spared: blocked, then the pending one consumed."""
    me = os.getpid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        os.killpg(os.getpgid(0), signal.SIGTERM)
        signal.sigtimedwait({signal.SIGTERM}, 0)
    except (ProcessLookupError, PermissionError):
        pass
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    return me


def stop_attempt(rel, proc, grace, waiter):
    """What `fab stop` does, for what is left of one attempt: TERM once, grace, KILL, sweep.

    `waiter.sleep(s)` waits (and notices a stop request; the clean-up goes on regardless).
    Returns {"terminated": [...], "killed": [...]}; reaps `proc`."""
    me = os.getpid()
    group = set(group_members(me)) - {me}
    targets = group | set(rel.marked())
    if targets:
        if group:
            _term_group_once()
        _kill(sorted(set(rel.marked()) - set(group_members(me))), signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(alive(p) for p in targets) and time.monotonic() < deadline:
            proc.poll()
            waiter.sleep(0.05)
    # The sweep: survivors of TERM, and anything of ours that appeared meanwhile.
    left = sorted(p for p in (targets | set(rel.marked()) | set(group_members(me))) - {me} if alive(p))
    _kill(left, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while any(alive(p) for p in left) and time.monotonic() < deadline:
        proc.poll()
        waiter.sleep(0.05)
    try:
        proc.wait(KILL_WAIT_S)
    except subprocess.TimeoutExpired:  # stuck in the kernel; its returncode stays None
        pass
    return {"terminated": sorted(targets - set(left)), "killed": left}


def tolerance(mib):
    return max(TOLERANCE_MIB, int(TOLERANCE_FRACTION * (mib or 0)))


def gpu_limits(baseline):
    """({index: max used MiB}, nvidia-smi) from gpu-baseline.json; ({}, None): nothing to check."""
    if not baseline or not baseline.get("gpus"):
        return {}, None
    devices = baseline.get("devices")
    limits = {g["index"]: g["used_mib"] + tolerance(g["used_mib"]) for g in baseline["gpus"]
              if g.get("used_mib") is not None and (devices is None or g["index"] in devices)}
    return limits, baseline.get("nvidia_smi") or "nvidia-smi"


def gpus_over(nvidia_smi, limits):
    """[(index, used MiB)] of the GPUs above their limit now; None if nvidia-smi gave no reading."""
    try:
        out = subprocess.run([nvidia_smi, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    used = {}
    for line in out.stdout.decode("utf-8", "replace").splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 2 and cells[0].isdigit() and cells[1].isdigit():
            used[int(cells[0])] = int(cells[1])
    if out.returncode != 0 or not all(i in used for i in limits):
        return None
    return [(i, used[i]) for i in sorted(limits) if used[i] > limits[i]]
