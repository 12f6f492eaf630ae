"""The one harness of llmfab's benchmarks (`python benchmarks/run.py NAME`): lab hosts, side-by-side
runs, repeats, medians and Markdown tables.

Every timed run is a whole process, timed from spawn to exit, after an untimed
clean-up (the previous run's servers killed by pid). Around each run it also
reads, per host, what sshd logged (connections, remote commands) and the CPU
that host spent on the run (a cgroup per host holding its sshd, so every process
a session starts is counted), and the client tool's CPU, so the tables show
where the time goes on a 2-core machine that also plays every host. Runs of
several tools are interleaved (`side_by_side`: each repetition runs every tool
once, the order rotating) so a load swing hits all of them alike; medians are
tasks/measure/repeats.py's, the one median of repeated runs in llmfab.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _path in (REPO, REPO / "tests"):  # llmfab's tasks/, and tests/hostlab.py's lab
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from hostlab import proc_stat, starttime as _start_time, wait_for  # noqa: E402
from tasks.measure.repeats import median  # noqa: E402

PY = sys.executable
HOST_PY = "/usr/bin/python3"  # every case launches with it (the lab's `python3` is a pyenv shim)
PID_DIR = "llmfab-bench-pids"  # in each host's home; see tiny_server.py
LAUNCH_PORT = 18990
READY_PORT = 18991


def log(text):
    print(text, flush=True)


def compile_trees(trees):
    """Bytecode for each llmfab tree under test, as an install leaves it (pip compiles what it
    installs; an editable checkout compiles on its first run). This machine sets
    PYTHONDONTWRITEBYTECODE, under which a checkout would compile its modules on every
    run while the Fabric and Ansible it is compared with run from compiled site-packages."""
    for tree in trees:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(tree) / "tasks")], check=True)


# -- statistics and tables (pure: tests/unit/test_benchmarks_harness.py) ------------------
# sshd at LogLevel VERBOSE (the lab's) logs one "Accepted publickey" per authenticated
# connection and one "Starting session:" per channel that runs something: "command"
# (exec: everything is run through the user's shell, which sources ~/.bashrc), "subsystem
# 'sftp'" (also started through the shell) or "shell" (an interactive login).
ACCEPTED = "Accepted publickey for "
STARTING = "Starting session: "


def count_sshd(text):
    """{"connections", "commands", "exec", "subsystem", "shell"} counted in sshd log text.

    "commands" is every session that made sshd start a program through the user's shell:
    exec requests, subsystems (sftp) and shells.
    """
    counts = {"connections": 0, "exec": 0, "subsystem": 0, "shell": 0}
    for line in text.splitlines():
        if line.startswith(ACCEPTED):
            counts["connections"] += 1
            continue
        at = line.find(STARTING)
        if at < 0:
            continue
        kind = line[at + len(STARTING):].split(" ", 1)[0]
        if kind == "command":
            counts["exec"] += 1
        elif kind in ("subsystem", "shell"):
            counts[kind] += 1
    counts["commands"] = counts["exec"] + counts["subsystem"] + counts["shell"]
    return counts


def spread(samples):
    """(median, min, max) of the numbers that are not None, or None when there are none."""
    xs = [x for x in samples if x is not None]
    return (median(xs, 6), min(xs), max(xs)) if xs else None


def fmt_s(value):
    return "%.2f" % value if value is not None else "n/a"


def fmt_spread(samples, digits=2, unit=""):
    """'median (min-max)', or 'n/a' for no samples."""
    sp = spread(samples)
    if not sp:
        return "n/a"
    return "%.*f%s (%.*f-%.*f)" % (digits, sp[0], unit, digits, sp[1], digits, sp[2])


def ratio(a, b):
    """a / b as '1.23x', or 'n/a' when either is missing."""
    if a is None or b is None or b == 0:
        return "n/a"
    return "%.2fx" % (a / b)


def md_table(headers, rows):
    """A GitHub Markdown table; cells are str()-ed and '|' escaped."""
    def cell(v):
        return str(v).replace("|", "\\|")
    out = ["| " + " | ".join(cell(h) for h in headers) + " |",
           "| " + " | ".join("---" for _ in headers) + " |"]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(out)


def side_by_side(plan, reps, run_one, warmup=1, errors=(), log=log, max_failures=2):
    """plan: [(key, [tool, ...])]; run_one(key, tool) -> a dict (at least {"wall"}). Interleaved:
    each repetition runs every (key, tool) once, the tool order rotating, after `warmup`
    unrecorded repetitions. Each run is tagged with its repetition ("rep"), so runs of one
    repetition can be paired. A run raising one of `errors` is logged and skipped; a tool is
    dropped after `max_failures`. Returns ({(key, tool): [run, ...]}, {(key, tool): [error]})."""
    results = {(key, t): [] for key, tools in plan for t in tools}
    failed = {}
    for rep in range(-warmup, reps):
        for key, tools in plan:
            k = rep % len(tools)
            for tool in tools[k:] + tools[:k]:
                if len(failed.get((key, tool), ())) >= max_failures:
                    continue
                try:
                    run = run_one(key, tool)
                except errors as e:
                    failed.setdefault((key, tool), []).append(str(e).strip())
                    log("  %s at %s FAILED (rep %d): %s" % (tool, key, rep, str(e)[-3000:]))
                    continue
                run["rep"] = rep
                if rep >= 0:
                    results[(key, tool)].append(run)
                log("  rep %2d  %-4s %-14s %6.2f s%s" % (rep, key, tool, run["wall"],
                                                        "  (warm-up)" if rep < 0 else ""))
    return results, failed


def paired_ratios(results, a, b):
    """Each repetition's run of `a` over the run of `b` beside it (where both ran)."""
    other = {r["rep"]: r["wall"] for r in results[b]}
    return [r["wall"] / other[r["rep"]] for r in results[a] if r["rep"] in other]


class RunFailed(RuntimeError):
    pass


class CpuGroups:
    """CPU accounting by cgroup v1 cpuacct: one group per lab host (its sshd listener moved
    in, so every process a session starts is counted, detached ones too) and one for the
    client tool. `usage(name)` is in seconds. Unavailable (e.g. no writable cpuacct
    hierarchy): `ok` is False and usage() returns None."""

    ROOT = Path("/sys/fs/cgroup/cpuacct")

    def __init__(self, prefix):
        self.prefix = prefix
        self.made = []
        self.ok = (self.ROOT / "cpuacct.usage").exists() and os.access(self.ROOT, os.W_OK)

    def path(self, name):
        return self.ROOT / ("%s-%s" % (self.prefix, name))

    def make(self, name):
        if not self.ok:
            return
        try:
            p = self.path(name)
            if not p.exists():
                p.mkdir()
                self.made.append(p)
        except OSError:
            self.ok = False

    def add(self, name, pid):
        self.make(name)
        if self.ok:
            (self.path(name) / "cgroup.procs").write_text(str(pid))

    def usage(self, name):
        if not self.ok:
            return None
        return int((self.path(name) / "cpuacct.usage").read_text()) / 1e9

    def remove_all(self):
        """After the lab is gone (groups must be empty to go)."""
        for p in self.made:
            try:
                p.rmdir()
            except OSError:
                pass


class Bench:
    def __init__(self, lab, work, seed=8):
        self.lab = lab
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.cfg = str(lab.ssh_config)
        self.rng = random.Random(seed)
        self.nonce = 0
        self.before_tree = None  # a checkout of llmfab to compare with (--before-tree)
        self.cpu = CpuGroups("llmfab-bench-%d" % lab.slot)
        for h in lab.hosts:
            self.cpu.add(h, lab.sshd_pid(h))
        self.cpu.make("client")
        shutil.copy2(HERE / "tiny_server.py", lab.root / "tiny_server.py")
        for h in lab.hosts:  # the ssh one-liner's pre-placed x.py (as in the issue)
            shutil.copy2(HERE / "tiny_server.py", lab.home(h) / "x.py")
        self.launch_profile = self._write_profile("bench.toml", [
            "[target]", 'name = "bench"',
            "[server]", 'engine = "command"', 'python = "%s"' % HOST_PY,
            "command = %s" % json.dumps([HOST_PY, str(lab.root / "tiny_server.py")]),
            'host = "127.0.0.1"', "port = %d" % LAUNCH_PORT,
            "[ready]", 'models_path = ""'])

    def bashrc(self, on):
        """Give every lab host root's ~/.bashrc (as copied by the lab) or none at all: the
        remote shell of every command sources it (`pyenv init` here, ~0.15 s of CPU)."""
        for h in self.lab.hosts:
            rc, off = self.lab.home(h) / ".bashrc", self.lab.home(h) / ".bashrc.bench-off"
            if on and off.exists():
                off.rename(rc)
            elif not on and rc.exists():
                rc.rename(off)

    def _write_profile(self, name, lines):
        path = self.work / name
        path.write_text("\n".join(lines) + "\n")
        return path

    # -- around every run ----------------------------------------------------------------
    def fresh_launcher(self):
        """tiny_server.py plus a nonce line: a new file each run, so no tool can skip the copy."""
        self.nonce += 1
        path = self.work / "launchers" / ("x-%d.py" % self.nonce)
        path.parent.mkdir(exist_ok=True)
        path.write_text((HERE / "tiny_server.py").read_text() + "# run %d\n" % self.nonce)
        return path

    def cleanup(self, hosts):
        """Kill every tiny server still recorded on `hosts` (by pid, start time checked)."""
        victims = []
        for h in hosts:
            pid_dir = self.lab.home(h) / PID_DIR
            for rec in pid_dir.glob("[0-9]*") if pid_dir.is_dir() else ():
                pid = int(rec.name)
                try:
                    start = int(rec.read_text() or -1)
                except (OSError, ValueError):
                    start = -1
                if _start_time(pid) == start:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        victims.append((pid, start))
                    except ProcessLookupError:
                        pass
                rec.unlink(missing_ok=True)
        wait_for(lambda: all(_start_time(p) != s or _zombie(p) for p, s in victims), 20,
                 "killed tiny servers to go")

    def launched_on(self, hosts):
        return [h for h in hosts if any((self.lab.home(h) / PID_DIR).glob("[0-9]*"))]

    def snapshot(self, hosts):
        return {h: (self.lab._hosts[h].log.stat().st_size, self.cpu.usage(h)) for h in hosts}

    def settle(self, hosts, before, timeout=30):
        """After a run: wait until its sessions are gone, then per-host sshd counts and CPU."""
        wait_for(lambda: not any(self.lab.session_sshd_pids(h) for h in hosts), timeout,
                 "ssh sessions to close")
        out = {}
        for h in hosts:
            offset, cpu = before[h]
            with open(self.lab._hosts[h].log, "rb") as f:
                f.seek(offset)
                text = f.read().decode("utf-8", "replace")
            now = self.cpu.usage(h)
            out[h] = dict(count_sshd(text), host_cpu=None if cpu is None or now is None else now - cpu)
        return out

    def timed(self, argv, hosts, env=None, expect_launch=True, after=None, cwd=REPO):
        """Run argv once (clean-up first, untimed): {"wall", "client_cpu", "per_host": {...}}."""
        self.cleanup(hosts)
        before = self.snapshot(hosts)
        c0 = self.cpu.usage("client")
        join = (lambda: self.cpu.add("client", os.getpid())) if self.cpu.ok else None
        t0 = time.perf_counter()
        r = subprocess.run([str(a) for a in argv], cwd=str(cwd), env=env, capture_output=True,
                           text=True, errors="replace", timeout=300, preexec_fn=join)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            errors = [l for l in r.stdout.splitlines() if "error" in l.lower()][:10]
            raise RunFailed("%s exited %d:\n%s\n%s\n%s" % (" ".join(map(str, argv[:4])), r.returncode,
                                                           "\n".join(errors), r.stdout[-2000:], r.stderr[-2000:]))
        if after:
            after()
        if expect_launch:
            wait_for(lambda: len(self.launched_on(hosts)) == len(hosts), 30,
                     "the launched server on every host")
        per_host = self.settle(hosts, before)
        c1 = self.cpu.usage("client")
        client = None if c0 is None or c1 is None else c1 - c0
        return {"wall": wall, "client_cpu": client, "per_host": per_host}


def _zombie(pid):
    stat = proc_stat(pid)
    return stat is None or stat[1][0] in ("Z", "X")


class LineClock:
    """Popen whose stdout lines are time-stamped (time.time()) as they arrive."""

    def __init__(self, argv, env=None, cwd=None):
        self.lines = []
        self.proc = subprocess.Popen([str(a) for a in argv], cwd=str(cwd or REPO), env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for raw in self.proc.stdout:
            self.lines.append((time.time(), raw.decode("utf-8", "replace").rstrip("\n")))

    def wait(self, timeout=180):
        code = self.proc.wait(timeout)
        exited = time.time()
        self._reader.join(10)
        return code, exited

    def first(self, needle):
        return next((t for t, line in self.lines if needle in line), None)
