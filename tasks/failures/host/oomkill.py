"""Did the kernel's OOM killer end a process? Read from the kernel log (host side).

Linux mm/oom_kill.c logs each kill as `Killed process PID (COMM) total-vm:...kB,
anon-rss:...kB, ...` (2.6-4.x), prefixed by `Out of memory: ` or `Memory cgroup out
of memory: ` since 4.19 (`"%s: Killed process %d (%s) total-vm:%lukB, anon-rss:%lukB,
file-rss:%lukB, shmem-rss:%lukB, UID:%u pgtables:%lukB oom_score_adj:%hd"`). `dmesg`
needs root where kernel.dmesg_restrict is set: then nothing is known (None).
"""
import re
import subprocess

from ...base.host.hosterrors import error_words

KILLED = re.compile(r"(?:(?P<why>Out of memory|Memory cgroup out of memory): )?Killed process "
                    r"(?P<pid>\d+) \((?P<comm>[^)]*)\) total-vm:(?P<vm>\d+)kB, anon-rss:(?P<rss>\d+)kB")


def parse(text, pids):
    """The last kernel line that reports an OOM kill of one of `pids`, without its timestamp."""
    wanted = {int(p) for p in pids}
    found = None
    for line in text.splitlines():
        m = KILLED.search(line)
        if m and int(m.group("pid")) in wanted:
            found = line[m.start():].strip()
    return found


def op_kernel_oom(pids=()):
    """The kernel's last OOM-killer line (dmesg) naming one of `pids` (any, none given)."""
    try:
        proc = subprocess.run(["dmesg"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"line": None, "error": "dmesg: %s" % (error_words(e) if isinstance(e, OSError) else "timed out")}
    if proc.returncode != 0:
        return {"line": None, "error": proc.stderr.decode("utf-8", "replace").strip()[-300:]}
    return {"line": parse(proc.stdout.decode("utf-8", "replace"), pids or ()), "error": None}

