"""The test lab: real OpenSSH servers on "hosts" made of Linux namespaces (needs root).

    with HostLab(3) as lab:
        subprocess.run(["ssh", "-F", lab.ssh_config, "h1", "hostname"])
        lab.fab("status", profile=p)

Each host is a network namespace on a per-lab bridge (the root namespace reaches every
host's IP on port 22, and hosts reach each other) running a real `/usr/sbin/sshd -D -e`
with its own config and ed25519 host key. sshd runs in a private mount namespace where a
per-host directory is mounted over /root (HOME), another over /tmp, and one holding the
stand-in `nvidia-smi` over /usr/local/bin, so every host looks like its own machine; with
`pidns=(i, ...)` those hosts also get their own PID namespace (like an LXC container).
The lab's files live in /var/tmp/llmfab-lab-<slot>/, outside the per-host mounts.

Extra ssh_config hosts: `unknownkey` (a real sshd whose key is NOT in known_hosts),
`unreachable` (an address on the lab's subnet where nothing answers) and `silent` (a TCP
listener that accepts and never speaks: for connect timeouts).

Several labs run at once (concurrent test suites): each takes a slot under
/run/llmfab-lab/ (O_EXCL file naming its owner pid); slots of dead owners are reclaimed
with whatever they left behind (processes, namespaces, bridge, files).
"""
import atexit
import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN_DIR = Path("/run/llmfab-lab")
MAX_SLOTS = 200
NET = "10.213"
SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
SYSTEM_PYTHON = "/usr/bin/python3"
DEV_NODES_LOG = RUN_DIR / "dev-nodes-created"
# Dot-directories of the real /root overlaid (copy-on-write, per host) into every host's
# HOME, so the copied ~/.bashrc (pyenv init, cargo env) works there as on the real box
# instead of printing errors, and nothing a test does there changes the real ones.
SHARED_HOME_DIRS = (".pyenv", ".cargo", ".rustup")
REQUIRED_TOOLS = ("ip", "nsenter", "unshare", "mount", "ssh-keygen", SSHD, "ssh")



def _load(name, path):
    """Import a file of this directory by path (works whether or not `tests` is a package)."""
    import importlib.util
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_HERE = Path(__file__).resolve().parent
_fakegpu = _load("llmfab_lab_nvidia_smi", _HERE / "standins" / "nvidia_smi.py")

_HOLDER = r'''
import json, os, signal, socket, subprocess, sys
cfg = json.loads(sys.argv[1])
def mount(*args):
    subprocess.run(("mount",) + args, check=True)
for src, dst, upper, work in cfg["overlays"]:
    # the real ~/.pyenv etc. as each host's own writable copy (writes stay per host)
    mount("-t", "overlay", "overlay", "-o",
          "lowerdir=%s,upperdir=%s,workdir=%s" % (src, upper, work), dst)
mount("--rbind", cfg["home"], "/root")
mount("--bind", cfg["tmp"], "/tmp")
mount("--bind", cfg["bin"], "/usr/local/bin")
if cfg["pidns"]:
    # Keep the root namespace's /proc reachable for the fake driver (real nvidia-smi
    # reports host PIDs), then give the namespace its own /proc.
    mount("--bind", "/proc", "/tmp/fakegpu/hostproc")
    mount("-t", "proc", "proc", "/proc")
socket.sethostname(cfg["hostname"])
signal.signal(signal.SIGTERM, lambda s, f: os._exit(0))
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
sys.stdout.write("ready\n")
sys.stdout.flush()
os.close(1)
os.open("/dev/null", os.O_WRONLY)
while True:  # PID 1 of a PID namespace must reap orphans
    signal.sigtimedwait({signal.SIGCHLD}, 60)
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
'''


def _systemdhost():
    return _load("llmfab_lab_systemdhost", _HERE / "systemdhost.py")


def _standins():
    return _load("llmfab_lab_standins", _HERE / "standins" / "__init__.py")


class LabUnavailable(RuntimeError):
    """This machine cannot run the lab (not root, a tool missing)."""


def missing_prerequisites():
    """Why the lab cannot run here, as a list of strings (empty: it can)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not running as root (namespaces, mounts and sshd need root)")
    for tool in REQUIRED_TOOLS:
        if not (os.path.exists(tool) if tool.startswith("/") else shutil.which(tool)):
            problems.append("missing %s" % tool)
    if not os.path.exists(SFTP_SERVER):
        problems.append("missing %s (package openssh-server)" % SFTP_SERVER)
    return problems


def wait_for(condition, timeout, what, interval=0.05):
    """Poll `condition()` until it returns a truthy value; raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError("timed out after %.0fs waiting for %s" % (timeout, what))
        time.sleep(interval)


def _run(argv, **kw):
    kw.setdefault("check", True)
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    try:
        return subprocess.run(argv, **kw)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError("%s failed (%d): %s" % (shlex.join(argv), exc.returncode,
                                                   (exc.stderr or "").strip())) from None


def proc_stat(pid):
    """(comm, [state, ppid, pgrp, ...]) from /proc/<pid>/stat, or None if the pid is gone.
    The lab's (and the benchmarks') own reading, independent of the code under test."""
    try:
        with open("/proc/%s/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    close = data.rindex(b")")
    return data[data.index(b"(") + 1:close].decode(errors="replace"), data[close + 2:].decode().split()


def alive(pid):
    """Alive in the PID namespace the lab runs in; a zombie counts as dead."""
    stat = proc_stat(pid)
    return stat is not None and stat[1][0] not in ("Z", "X")


def starttime(pid):
    """The start time of pid in clock ticks since boot (None if gone): tells a reused pid apart."""
    stat = proc_stat(pid)
    return None if stat is None else int(stat[1][19])


def _proc_table():
    """{pid: (ppid, comm)} for every process."""
    table = {}
    for entry in os.listdir("/proc"):
        stat = proc_stat(entry) if entry.isdigit() else None
        if stat is not None:
            table[int(entry)] = (int(stat[1][1]), stat[0])
    return table


def _descendants(pid, table=None):
    table = _proc_table() if table is None else table
    children = {}
    for p, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(p)
    out, todo = [], list(children.get(pid, ()))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def _pids_in_netns(ns_path):
    try:
        st = os.stat(ns_path)
    except FileNotFoundError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                s = os.stat("/proc/%s/ns/net" % entry)
            except OSError:
                continue
            if (s.st_ino, s.st_dev) == (st.st_ino, st.st_dev):
                pids.append(int(entry))
    return pids


def _kill_netns_processes(ns_path, timeout=15, spare=()):
    def gone():
        pids = [p for p in _pids_in_netns(ns_path) if p != os.getpid() and p not in spare]
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        return not pids
    wait_for(gone, timeout, "processes in %s to die" % ns_path)


@contextlib.contextmanager
def _run_dir_lock():
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    with open(RUN_DIR / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _slot_owner_alive(path):
    try:
        owner = json.loads(path.read_text())
        return starttime(owner["pid"]) == owner["start"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _slot_root(slot, path=None):
    try:
        return Path(json.loads(path.read_text())["root"]) if path else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _netns_names(prefix):
    out = _run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0].startswith(prefix)]


def _destroy_slot_network(slot):
    for ns in _netns_names("lf%dh" % slot):
        _kill_netns_processes("/run/netns/" + ns)
        _run(["ip", "netns", "del", ns], check=False)
    if os.path.exists("/sys/class/net/lf%dbr" % slot):
        _run(["ip", "link", "del", "lf%dbr" % slot], check=False)


def _reclaim(slot, path):
    root = _slot_root(slot, path) or Path("/var/tmp/llmfab-lab-%d" % slot)
    _destroy_slot_network(slot)
    if root.name.startswith("llmfab-lab-") or (root / ".llmfab-lab").exists():
        shutil.rmtree(root, ignore_errors=True)
    path.unlink(missing_ok=True)


def reclaim_dead_slots(locked=False):
    """Clean up after labs whose owning process died (killed test runs). Returns slots."""
    if not locked:
        with _run_dir_lock():
            return reclaim_dead_slots(locked=True)
    done = []
    for path in sorted(RUN_DIR.glob("slot-*")):
        slot = int(path.name.split("-", 1)[1])
        if not _slot_owner_alive(path):
            _reclaim(slot, path)
            done.append(slot)
    return done


def _other_live_slots(mine):
    return [p for p in RUN_DIR.glob("slot-*") if p.name != "slot-%d" % mine and _slot_owner_alive(p)]


class _Host:
    def __init__(self, alias, index, slot, root, pidns):
        self.alias = alias
        self.index = index
        self.netns = "lf%dh%s" % (slot, index)
        self.veth = "lf%dv%s" % (slot, index)
        self.ip = "%s.%d.%d" % (NET, slot, 249 if index == "u" else 10 + index)
        self.dir = root / "hosts" / alias
        self.home = self.dir / "home"
        self.tmp = self.dir / "tmp"
        self.bin = self.dir / "bin"
        self.etc = self.dir / "etc"
        self.log = self.dir / "sshd.log"
        self.pidns = pidns
        self.holder = None       # Popen: unshare (pidns) or the holder itself
        self.holder_pid = None   # root-namespace pid of the namespace holder
        self.sshd = None         # Popen of the listener (or of nsenter around it)
        self.sshd_pid = None
        self.host_key_pub = None


class HostLab:
    """`n_hosts` SSH hosts (h1..hN) plus unknownkey/unreachable/silent. Needs root.

    pidns: 1-based host indices that also get their own PID namespace.
    root: where the lab's files go (default /var/tmp/llmfab-lab-<slot>; must not be under
          /tmp or /root, which are per-host inside the lab). Removed by close().
    gpus: fake GPUs per host (the stand-in nvidia-smi's gpus.json).
    sshd_env: environment every SSH session of every host gets (sshd's SetEnv), e.g. where
          podman's configuration is (tests/podmanlab.py).
    """

    def __init__(self, n_hosts, *, pidns=(), root=None, gpus=2, systemd=(), sshd_env=None):
        problems = missing_prerequisites() + ([_systemdhost().missing()] if systemd else [])
        problems = [p for p in problems if p]
        if problems:
            raise LabUnavailable("the SSH test lab cannot run here: " + "; ".join(problems))
        if not 1 <= n_hosts <= 200:
            raise ValueError("n_hosts must be 1..200, got %r" % (n_hosts,))
        if root is not None:
            real = os.path.realpath(root)
            if any(real == d or real.startswith(d + "/") for d in ("/tmp", "/root", "/usr/local/bin")):
                raise ValueError("lab root %s is under a directory each host replaces "
                                 "(/tmp, /root, /usr/local/bin); use e.g. /var/tmp/..." % root)
        self._owner = os.getpid()
        self._closed = False
        self._hosts = {}
        self._silent = None
        self._silent_conns = []
        self._ml_env = None
        self._gpus = gpus
        self._sshd_env = dict(sshd_env or {})
        self._systemd = {}  # alias -> systemdhost.SystemdHost (hosts whose PID 1 is systemd)
        self.slot = self._take_slot(root)
        atexit.register(self.close)
        try:
            self._start(n_hosts, set(pidns), set(systemd))
        except BaseException:
            self.close()
            raise

    # -- public API ---------------------------------------------------------------------
    @property
    def hosts(self):
        return [a for a in self._hosts if a != "unknownkey"]

    def ip(self, alias):
        if alias == "unreachable":
            return self.unreachable_ip
        if alias == "silent":
            return self.gateway
        return self._hosts[alias].ip

    def home(self, alias):
        """The host's /root as seen from here (files the host wrote under ~)."""
        return self._hosts[alias].home

    def tmp(self, alias):
        """The host's /tmp as seen from here."""
        return self._hosts[alias].tmp

    def fakegpu_dir(self, alias):
        return self._hosts[alias].tmp / "fakegpu"

    def set_gpus(self, alias, count=2, **kw):
        """Rewrite the host's fake GPUs: count, name=, total_mib=, baseline_mib=, and
        fields= (forced --query-gpu values, e.g. {"utilization.gpu": "[N/A]"})."""
        self._ensure_dev_nodes(count)
        return _fakegpu.write_gpus(str(self.fakegpu_dir(alias)), count,
                                   uuid_seed="%d-%s" % (self.slot, alias), **kw)

    def systemd(self, alias):
        """The systemd-nspawn container of a systemd host (tests/systemdhost.py): poweroff(),
        boot(), exec(argv)."""
        return self._systemd[alias]

    def sshd_pid(self, alias):
        return self._hosts[alias].sshd_pid

    def holder_pid(self, alias):
        """Root-namespace pid of the process holding the host's namespaces."""
        return self._hosts[alias].holder_pid

    def session_sshd_pids(self, alias):
        """Per-connection sshd processes (children of the listener)."""
        table = _proc_table()
        return sorted(p for p in _descendants(self._hosts[alias].sshd_pid, table)
                      if table[p][1] == "sshd")

    def kill_sessions(self, alias):
        """SIGKILL every per-connection sshd of `alias`: a dropped connection.

        Processes the sessions started (commands, servers) are not touched."""
        pids = self.session_sshd_pids(alias)
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        wait_for(lambda: not set(pids) & set(self.session_sshd_pids(alias)), 10,
                 "sessions of %s to die" % alias)
        return pids

    def restart_sshd(self, alias):
        """Stop the listener (existing sessions die too) and start it again."""
        host = self._hosts[alias]
        sessions = self.session_sshd_pids(alias)
        with contextlib.suppress(ProcessLookupError):
            os.kill(host.sshd_pid, signal.SIGTERM)
        for p in sessions:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        try:
            host.sshd.wait(10)
        except subprocess.TimeoutExpired:
            host.sshd.kill()
            host.sshd.wait()
        self._start_sshd(host)
        self._wait_ssh_port(host)

    def sshd_log(self, alias):
        return self._hosts[alias].log.read_text(errors="replace")

    def exec(self, alias, argv, **kw):
        """Run argv inside the host (its net, mount, uts and, if any, pid namespace), with
        cwd /root, via nsenter targeting the process that holds those namespaces (the same
        ones sshd runs in). Keyword arguments go to subprocess.run; returns CompletedProcess."""
        return subprocess.run(self._nsenter(self._hosts[alias]) + ["--wd=/root", "--"] + list(argv),
                              **kw)

    def ssh_argv(self, alias, *command):
        """`ssh -F <lab ssh_config> alias command...` (the real OpenSSH client)."""
        return ["ssh", "-F", str(self.ssh_config), alias] + list(command)

    def fab(self, *args, profile=None, env=None, timeout=300, cwd=None, input=None):
        """Run the real `fab` CLI here: `python -m fabric -S <lab ssh_config> ARGS
        [--profile PROFILE]` from the repo root (where fabfile.py is).

        `profile` is appended last, so it belongs to the last task named in `args`.
        `env` is added to a copy of os.environ. Returns CompletedProcess with text
        stdout/stderr (undecodable bytes kept as surrogates).
        """
        argv = [sys.executable, "-m", "fabric", "-S", str(self.ssh_config)] + [str(a) for a in args]
        if profile is not None:
            argv += ["--profile", str(profile)]
        full_env = dict(os.environ)
        full_env.update(env or {})
        return subprocess.run(argv, cwd=str(cwd or REPO), env=full_env, input=input,
                              capture_output=True, text=True, errors="surrogateescape",
                              timeout=timeout)

    @property
    def ml_env(self):
        """The stand-in engine venv (vllm 0.33.0, sglang 0.5.23), same path on every host.
        Built on first use; returns its directory (python: ml_env / "bin/python3")."""
        if self._ml_env is None:
            _standins().build_ml_env(self.root / "ml-env")
            self._ml_env = self.root / "ml-env"
        return self._ml_env

    @property
    def ml_python(self):
        return self.ml_env / "bin" / "python3"

    def model_dir(self, name, **config):
        """A fake model directory (config.json) at the same path on every host."""
        return _standins().fake_model_dir(self.root / "models" / name, **config)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Kill everything the lab started, remove its namespaces, bridge, files and slot."""
        if self._closed or os.getpid() != self._owner:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        if self._silent is not None:
            with contextlib.suppress(OSError):
                self._silent.close()
            for c in self._silent_conns:
                with contextlib.suppress(OSError):
                    c.close()
        errors = []
        for box in self._systemd.values():
            try:
                box.close()
            except Exception as exc:  # keep cleaning the rest
                errors.append(exc)
        for host in self._hosts.values():
            try:
                # Spare `unshare --fork` at first: it reaps the holder, then exits, and we
                # reap it, so no zombie is left to init.
                spare = {host.holder.pid} if host.pidns and host.holder else set()
                _kill_netns_processes("/run/netns/" + host.netns, spare=spare)
                if spare:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        host.holder.wait(5)
                    _kill_netns_processes("/run/netns/" + host.netns)
            except Exception as exc:  # keep cleaning the rest
                errors.append(exc)
            for proc in (host.sshd, host.holder):
                if proc is not None:
                    with contextlib.suppress(Exception):
                        proc.kill()
                        proc.wait(5)
        with _run_dir_lock():
            try:
                _destroy_slot_network(self.slot)
            except Exception as exc:
                errors.append(exc)
            if not _other_live_slots(self.slot):
                _fakegpu.remove_dev_nodes(str(DEV_NODES_LOG))
            shutil.rmtree(self.root, ignore_errors=True)
            (RUN_DIR / ("slot-%d" % self.slot)).unlink(missing_ok=True)
        if errors:
            raise errors[0]

    # -- start-up -----------------------------------------------------------------------
    def _take_slot(self, root):
        with _run_dir_lock():
            reclaim_dead_slots(locked=True)
            for slot in range(MAX_SLOTS):
                path = RUN_DIR / ("slot-%d" % slot)
                try:
                    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                except FileExistsError:
                    continue
                self.root = Path(root) if root else Path("/var/tmp/llmfab-lab-%d" % slot)
                with os.fdopen(fd, "w") as f:
                    json.dump({"pid": os.getpid(), "start": starttime(os.getpid()),
                               "root": str(self.root), "since": time.time()}, f)
                # Leftovers under this slot's names whose slot file is gone (a crash at the
                # wrong moment): the slot is ours now, so clear them.
                _destroy_slot_network(slot)
                if (self.root / ".llmfab-lab").exists():
                    shutil.rmtree(self.root, ignore_errors=True)
                if self.root.exists() and any(self.root.iterdir()):
                    path.unlink()
                    raise ValueError("lab root %s exists and is not empty" % self.root)
                return slot
        raise RuntimeError("no free lab slot under %s (%d in use)" % (RUN_DIR, MAX_SLOTS))

    def _start(self, n_hosts, pidns, systemd=()):
        self.gateway = "%s.%d.1" % (NET, self.slot)
        self.unreachable_ip = "%s.%d.250" % (NET, self.slot)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / ".llmfab-lab").write_text("slot %d, pid %d\n" % (self.slot, os.getpid()))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self.client_key = self.root / "client_ed25519"
        keygens = [subprocess.Popen(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                                     "llmfab-lab-%d" % self.slot, "-f", str(self.client_key)])]
        for i in range(1, n_hosts + 1):
            self._hosts["h%d" % i] = _Host("h%d" % i, i, self.slot, self.root, i in pidns)
        self._hosts["unknownkey"] = _Host("unknownkey", "u", self.slot, self.root, False)
        for host in self._hosts.values():
            for d in (host.home, host.tmp, host.bin, host.etc):
                d.mkdir(parents=True)
            keygens.append(subprocess.Popen(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.alias,
                 "-f", str(host.etc / "ssh_host_ed25519_key")]))
            self._prepare_host_files(host)
        self._make_network()
        for p in keygens:
            if p.wait() != 0:
                raise RuntimeError("ssh-keygen failed")
        for host in self._hosts.values():
            host.host_key_pub = (host.etc / "ssh_host_ed25519_key.pub").read_text().split()[:2]
            self._write_sshd_config(host)
        self._ensure_dev_nodes(self._gpus)
        plain = [h for h in self._hosts.values() if h.index not in systemd]
        for host in plain:
            self._start_holder(host)
        for host in plain:
            self._wait_holder(host)
            self._start_sshd(host)
        for host in self._hosts.values():
            if host.index in systemd:  # systemd-nspawn with sshd inside (tests/systemdhost.py)
                self._systemd[host.alias] = _systemdhost().SystemdHost(self, host)
                self._systemd[host.alias].prepare()
                self._systemd[host.alias].boot()
        for host in plain:
            self._wait_ssh_port(host)
        self._start_silent()
        self._write_client_files()

    def _prepare_host_files(self, host):
        for name in (".bashrc", ".profile"):
            src = Path("/root") / name
            if src.exists():
                shutil.copy2(src, host.home / name)
        for name in SHARED_HOME_DIRS:
            if (Path("/root") / name).is_dir():
                (host.home / name).mkdir()
                for sub in ("upper", "work"):
                    (host.dir / "overlay" / name / sub).mkdir(parents=True)
        host.home.chmod(0o700)
        host.tmp.chmod(0o1777)
        smi = host.bin / "nvidia-smi"
        smi.write_text(self._nvidia_smi_script())
        smi.chmod(0o755)
        fake = host.tmp / "fakegpu"
        _fakegpu.write_gpus(str(fake), self._gpus, uuid_seed="%d-%s" % (self.slot, host.alias))
        if host.pidns:
            (fake / "hostproc").mkdir()

    def _nvidia_smi_script(self):
        """Each host's /usr/local/bin/nvidia-smi: a few lines that import the stand-in from the
        lab's copy, compiled once here, so no run compiles its 600 lines again (a real
        nvidia-smi is a binary: benchmarks/ count its CPU in llmfab's host cost)."""
        shared = self.root / "standins"
        if not (shared / "nvidia_smi.py").exists():
            shared.mkdir(exist_ok=True)
            shutil.copy2(Path(_fakegpu.__file__), shared / "nvidia_smi.py")
            _run([SYSTEM_PYTHON, "-m", "py_compile", str(shared / "nvidia_smi.py")])
        return ("#!%s -S\n# The llmfab test lab's stand-in nvidia-smi: tests/standins/nvidia_smi.py\n"
                "import sys\nsys.path.insert(0, %r)\nfrom nvidia_smi import main\nsys.exit(main())\n"
                % (SYSTEM_PYTHON, str(shared)))

    def _ensure_dev_nodes(self, count):
        with _run_dir_lock():
            _fakegpu.ensure_dev_nodes(count, created_log=str(DEV_NODES_LOG))

    def _make_network(self):
        br = "lf%dbr" % self.slot
        batch = ["link add name %s type bridge" % br,
                 "addr add %s/24 dev %s" % (self.gateway, br),
                 "link set %s up" % br]
        for h in self._hosts.values():
            batch += ["netns add %s" % h.netns,
                      "link add %s type veth peer name eth0 netns %s" % (h.veth, h.netns),
                      "link set %s master %s up" % (h.veth, br)]
        _run(["ip", "-batch", "-"], input="\n".join(batch) + "\n")
        for h in self._hosts.values():
            _run(["ip", "-n", h.netns, "-batch", "-"], input=(
                "link set lo up\naddr add %s/24 dev eth0\nlink set eth0 up\n"
                "route add default via %s\n" % (h.ip, self.gateway)))

    def _write_sshd_config(self, host):
        (host.etc / "sshd_config").write_text("\n".join([
            "# llmfab test lab host %s (slot %d)" % (host.alias, self.slot),
            "ListenAddress %s:22" % host.ip,
            "HostKey %s" % (host.etc / "ssh_host_ed25519_key"),
            "PidFile %s" % (host.etc / "sshd.pid"),
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            # the second: what a test or task authorises on one host alone (fab pull)
            "AuthorizedKeysFile %s.pub .ssh/authorized_keys" % self.client_key,
            "LogLevel VERBOSE",
            "Subsystem sftp %s" % SFTP_SERVER,
            "MaxStartups 100",
            "MaxSessions 100",
            "UseDNS no",
            "PrintMotd no",
        ] + (["SetEnv " + " ".join("%s=%s" % kv for kv in sorted(self._sshd_env.items()))]
             if self._sshd_env else []) + [""]))  # one line: sshd keeps a keyword's first

    def _nsenter(self, host):
        argv = ["nsenter", "-t", str(host.holder_pid), "--net", "--mount", "--uts"]
        if host.pidns:
            argv.append("--pid")
        return argv

    def _start_holder(self, host):
        cfg = {"home": str(host.home), "tmp": str(host.tmp), "bin": str(host.bin),
               "hostname": host.alias, "pidns": host.pidns,
               "overlays": [[str(Path("/root") / n), str(host.home / n),
                             str(host.dir / "overlay" / n / "upper"),
                             str(host.dir / "overlay" / n / "work")]
                            for n in SHARED_HOME_DIRS if (host.home / n).is_dir()]}
        argv = ["nsenter", "--net=/run/netns/" + host.netns, "--", "unshare", "--mount",
                "--propagation", "private", "--uts"]
        if host.pidns:
            argv += ["--pid", "--fork"]
        argv += ["--", SYSTEM_PYTHON, "-c", _HOLDER, json.dumps(cfg)]
        host.holder = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=open(host.dir / "holder.log", "wb"),
                                       start_new_session=True)

    def _wait_holder(self, host):
        import select
        ready = select.select([host.holder.stdout], [], [], 30)[0]
        line = host.holder.stdout.readline() if ready else b""
        if line != b"ready\n":
            host.holder.kill()
            host.holder.wait(5)
            raise RuntimeError("namespace holder of %s failed: %s" % (
                host.alias, (host.dir / "holder.log").read_text(errors="replace")))
        host.holder.stdout.close()
        if host.pidns:  # unshare --fork: the holder is its only child
            host.holder_pid = wait_for(lambda: _descendants(host.holder.pid)[:1], 10,
                                       "the pid-namespace holder of %s" % host.alias)[0]
        else:
            host.holder_pid = host.holder.pid

    def _start_sshd(self, host):
        log = open(host.log, "ab")
        argv = self._nsenter(host) + ["--", SSHD, "-D", "-e", "-f", str(host.etc / "sshd_config")]
        host.sshd = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     start_new_session=True)
        log.close()
        if host.pidns:  # nsenter --pid forks: sshd is its child
            def child():
                kids = [p for p in _descendants(host.sshd.pid)]
                return kids[:1]
            host.sshd_pid = wait_for(child, 10, "sshd of %s to start" % host.alias)[0]
        else:
            host.sshd_pid = host.sshd.pid

    def _wait_ssh_port(self, host):
        def banner():
            if host.sshd.poll() is not None:
                raise RuntimeError("sshd of %s exited (%s):\n%s" % (
                    host.alias, host.sshd.returncode, host.log.read_text(errors="replace")))
            try:
                with socket.create_connection((host.ip, 22), timeout=2) as s:
                    return s.recv(64).startswith(b"SSH-2.0-")
            except OSError:
                return False
        wait_for(banner, 20, "sshd of %s on %s:22" % (host.alias, host.ip))

    def _start_silent(self):
        self._silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._silent.bind((self.gateway, 0))
        self._silent.listen(64)
        self.silent_port = self._silent.getsockname()[1]

        def accept_forever():
            while True:
                try:
                    conn, _ = self._silent.accept()
                except OSError:
                    return
                self._silent_conns.append(conn)  # held open, never answered

        threading.Thread(target=accept_forever, daemon=True, name="lab-silent").start()

    def _write_client_files(self):
        self.known_hosts = self.root / "known_hosts"
        self.ssh_config = self.root / "ssh_config"
        lines = []
        for alias in self.hosts:
            key = " ".join(self._hosts[alias].host_key_pub)
            lines += ["%s %s" % (alias, key), "%s %s" % (self._hosts[alias].ip, key)]
        self.known_hosts.write_text("\n".join(lines) + "\n")
        common = ["  User root", "  IdentityFile %s" % self.client_key, "  IdentitiesOnly yes",
                  "  UserKnownHostsFile %s" % self.known_hosts, "  GlobalKnownHostsFile /dev/null",
                  "  StrictHostKeyChecking yes", "  BatchMode yes"]
        blocks = []
        for alias, hostname, port in (
                [(a, self._hosts[a].ip, 22) for a in self.hosts]
                + [("unknownkey", self._hosts["unknownkey"].ip, 22),
                   ("unreachable", self.unreachable_ip, 22),
                   ("silent", self.gateway, self.silent_port)]):
            blocks.append("\n".join(["Host %s" % alias, "  HostName %s" % hostname,
                                     "  Port %d" % port] + common))
        self.ssh_config.write_text("# llmfab test lab, slot %d\n\n" % self.slot
                                   + "\n\n".join(blocks) + "\n")


def main():
    """`python tests/hostlab.py N [--pidns 2,3]`: start a lab, print where it is, wait for Ctrl-C."""
    import argparse
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("n", type=int, nargs="?", default=3)
    parser.add_argument("--pidns", default="")
    args = parser.parse_args()
    pidns = [int(x) for x in args.pidns.split(",") if x]
    started = time.monotonic()
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(143))  # so the lab cleans up
    with HostLab(args.n, pidns=pidns) as lab:
        print("lab slot %d ready in %.2fs: ssh -F %s h1" % (lab.slot, time.monotonic() - started,
                                                         lab.ssh_config), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                signal.pause()


if __name__ == "__main__":
    main()
