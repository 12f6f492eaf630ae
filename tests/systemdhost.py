"""A lab host whose PID 1 is systemd: the lab's Debian rootfs booted by systemd-nspawn.

`HostLab(n, systemd=(2,))` makes h2 such a host (tests/hostlab.py): the same network namespace,
address, host key and ssh_config entry as any lab host, but instead of the lab's sshd the
namespace runs

    systemd-nspawn -b -D ROOT -M NAME --register=no --keep-unit --console=passive

with sshd inside (Debian's ssh.service, the lab's key and address in sshd_config.d/). ROOT is
an overlay of the shared rootfs (built by .ci/run: /opt/llmfab-lab/rootfs-bookworm) with a
per-host upper directory kept on disk, so a "reboot" (`poweroff`, then `boot`) keeps what was
written, as a disk does (nspawn's --volatile=overlay would forget it at power-off). The lab's
root directory (stand-in engine venv, models, the stand-in nvidia-smi) is bound at the same
path, the host's stand-in nvidia-smi bin over /usr/local/bin and its fakegpu state in /tmp.
Each container gets its own cgroup first (two nspawns at the hierarchy root would share
/payload), named for the lab's slot.
"""
import glob
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

ROOTFS = Path(os.environ.get("LLMFAB_LAB_ROOTFS", "/opt/llmfab-lab/rootfs-bookworm"))
ROOTFS_STAMP = ".llmfab-rootfs-1"  # .ci/run's: the rootfs was built completely
CGROUP_ROOTS = ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified")
BOOT_TIMEOUT_S = 60
POWEROFF_TIMEOUT_S = 30


def missing():
    """Why a systemd host cannot be made here ("" when it can)."""
    if not shutil.which("systemd-nspawn"):
        return "systemd-nspawn is missing (apt-get install systemd-container; .ci/run does)"
    if not (ROOTFS / ROOTFS_STAMP).exists():
        return "the lab rootfs %s is missing or half-built (.ci/run builds it)" % ROOTFS
    return ""


class SystemdHost:
    """The nspawn container of one lab host (`host`: hostlab's _Host)."""

    def __init__(self, lab, host):
        self.lab, self.host = lab, host
        self.machine = "lf%d%s" % (lab.slot, host.alias)
        self.root = host.dir / "root"
        self.upper, self.work = host.dir / "upper", host.dir / "work"
        self.cgroups = [os.path.join(r, "llmfab-lab-%d-%s" % (lab.slot, host.alias)) for r in CGROUP_ROOTS
                        if os.path.isdir(r)]
        self.proc = None

    # -- the disk -------------------------------------------------------------------------
    def prepare(self):
        for d in (self.root, self.upper, self.work):
            d.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", "lowerdir=%s,upperdir=%s,workdir=%s" % (
            ROOTFS, self.upper, self.work), str(self.root)], check=True)
        for name in (".bashrc", ".profile"):  # the real /root's, for hosts that overlay ~/.pyenv etc.
            (self.host.home / name).unlink(missing_ok=True)
        etc = self.root / "etc"
        (etc / "hostname").write_text(self.host.alias + "\n")
        key = etc / "ssh" / "lab_host_ed25519_key"
        shutil.copy2(self.host.etc / "ssh_host_ed25519_key", key)
        key.chmod(0o600)
        (etc / "ssh" / "lab_authorized_keys").write_text(Path(str(self.lab.client_key) + ".pub").read_text())
        (etc / "ssh" / "sshd_config.d" / "llmfab-lab.conf").write_text("\n".join([
            "# llmfab test lab host %s (slot %d), systemd-nspawn" % (self.host.alias, self.lab.slot),
            "ListenAddress %s:22" % self.host.ip,
            "HostKey /etc/ssh/lab_host_ed25519_key",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "AuthorizedKeysFile /etc/ssh/lab_authorized_keys .ssh/authorized_keys",
            "MaxStartups 100",
            "MaxSessions 100",
            "UseDNS no",
            "PrintMotd no",
            "",
        ]))
        # Only what a server host needs: no getty on a console nobody reads, no network
        # configuration (the namespace's address is set from outside).
        for unit in ("getty@tty1.service", "console-getty.service", "systemd-networkd.service"):
            mask = etc / "systemd" / "system" / unit
            if not mask.exists():
                mask.symlink_to("/dev/null")

    # -- power ----------------------------------------------------------------------------
    def boot(self):
        """Start the container and wait until its sshd answers."""
        for cg in self.cgroups:
            os.makedirs(cg, exist_ok=True)
        cgroups = list(self.cgroups)

        def into_cgroup():
            for cg in cgroups:
                with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                    f.write("0")
        lab_root = str(self.lab.root)
        argv = ["nsenter", "--net=/run/netns/" + self.host.netns, "--",
                "systemd-nspawn", "-q", "-b", "-D", str(self.root), "-M", self.machine,
                "--register=no", "--keep-unit", "--console=passive",
                "--bind=%s" % lab_root, "--bind=%s:/usr/local/bin" % self.host.bin,
                # nspawn mounts a tmpfs on /tmp: the fake GPUs' state goes over it
                "--bind=%s:/tmp/fakegpu" % (self.host.tmp / "fakegpu"), "--bind=%s:/root" % self.host.home]
        argv += ["--bind=%s" % d for d in sorted(glob.glob("/dev/nvidia*"))]  # the stand-in's device nodes
        log = open(self.host.dir / "nspawn.log", "ab")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     preexec_fn=into_cgroup, start_new_session=True)
        log.close()
        self.host.sshd = self.proc
        self.host.sshd_pid = self.proc.pid
        self.host.holder_pid = None
        self.lab._wait_ssh_port(self.host)
        self.host.holder_pid = self.leader()

    def leader(self):
        """The container's PID 1 (systemd) as the root namespace sees it."""
        deadline = time.monotonic() + 10
        while not _children(self.proc.pid):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("%s has no init (nspawn log: %s)" % (
                    self.machine, (self.host.dir / "nspawn.log").read_text(errors="replace")[-2000:]))
            time.sleep(0.05)
        return _children(self.proc.pid)[0]

    def poweroff(self, timeout=POWEROFF_TIMEOUT_S):
        """A clean shutdown, as `poweroff` on the box: systemd stops every unit, then nspawn exits."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.leader(), signal.SIGRTMIN + 4)  # systemd's "poweroff" signal
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def close(self):
        self.poweroff(timeout=10)
        self.kill()
        subprocess.run(["umount", "-l", str(self.root)], stderr=subprocess.DEVNULL)
        for cg in self.cgroups:
            _remove_cgroup(cg)

    def exec(self, argv, **kw):
        """Run argv inside the running container (its namespaces), as root."""
        leader = self.leader()
        return subprocess.run(["nsenter", "-t", str(leader), "-m", "-u", "-i", "-n", "-p", "--"] + list(argv),
                              capture_output=True, text=True, **kw)


def _children(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _remove_cgroup(path, deadline=None):
    deadline = deadline or time.monotonic() + 5
    for here, dirs, _ in sorted(os.walk(path, topdown=False), key=lambda t: -len(t[0])):
        while True:
            try:
                os.rmdir(here)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
