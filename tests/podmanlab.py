"""Rootful podman on the lab's hosts: a lab whose SSH sessions find podman configured for this
machine, and the lab image imported from the lab's Debian root filesystem.

    with podman_lab() as (lab, pod):
        ...  # [server] runtime = "podman", [container] image = pod.image

No registry is reachable here, so the image is the lab's debootstrapped Debian (python3 and
what the stand-in engines need, which run on the system python3) imported once per machine
into a read-only image store (IMAGE_STORE) that every lab's podman reads beside its own
storage. podman's defaults fail on these machines (crun cannot set RLIMIT_NOFILE, cgroups are
hybrid, no systemd): runc, cgroupfs, explicit ulimits and host networking work, set in a
containers.conf and storage.conf per lab, named to every SSH session by sshd's SetEnv
(CONTAINERS_CONF, CONTAINERS_STORAGE_CONF), as a box's own configuration would be.
"""
import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

LAB_DIR = Path("/opt/llmfab-lab")
ROOTFS = LAB_DIR / "rootfs-bookworm"
ROOTFS_LOCK = LAB_DIR / "rootfs.lock"
IMAGE_STORE = LAB_DIR / "podman-images"
IMAGE = "localhost/llmfab-lab-base"
INCLUDE = "systemd,systemd-sysv,dbus,openssh-server,python3,iproute2,procps"

CONTAINERS_CONF = """\
# llmfab test lab: what rootful podman needs on these machines (tests/podmanlab.py)
[containers]
netns = "host"
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "{root}/tmp"
"""
STORAGE_CONF = """\
[storage]
driver = "overlay"
graphroot = "{root}/storage"
runroot = "{root}/run"

[storage.options]
additionalimagestores = ["{images}"]
"""


def missing():
    """Why podman cannot run here (None: it can)."""
    for tool in ("podman", "runc", "catatonit", "debootstrap"):
        if shutil.which(tool) is None and not os.path.exists("/usr/libexec/podman/" + tool):
            return "%s is not installed (.ci/run installs podman runc catatonit debootstrap)" % tool
    return None


def _mirror():
    """The Debian mirror this machine's apt uses (never a host written here)."""
    for path in sorted(Path("/etc/apt").rglob("*.sources")) + [Path("/etc/apt/sources.list")]:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            words = line.split()
            if words[:1] == ["URIs:"] and len(words) > 1:
                return words[1]
            if words[:1] == ["deb"] and len(words) > 2:
                return words[2] if not words[1].startswith("[") else words[3]
    raise RuntimeError("no Debian mirror in this machine's apt sources")


def ensure_image():
    """The lab rootfs (debootstrap, once per machine) imported as IMAGE into IMAGE_STORE."""
    LAB_DIR.mkdir(parents=True, exist_ok=True)
    with open(ROOTFS_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (ROOTFS / "usr/bin/python3").exists():
            subprocess.run(["debootstrap", "--variant=minbase", "--include=" + INCLUDE,
                            "--cache-dir=" + str(LAB_DIR / "debcache"), "bookworm", str(ROOTFS), _mirror()],
                           check=True, capture_output=True)
        env = _podman_env(IMAGE_STORE.parent / "podman-images-conf", IMAGE_STORE, images=None)
        have = subprocess.run(["podman", "image", "exists", IMAGE], env=env)
        if have.returncode != 0:
            tar = subprocess.Popen(["tar", "-C", str(ROOTFS), "-cf", "-", "."], stdout=subprocess.PIPE)
            subprocess.run(["podman", "import", "-q", "-", IMAGE], stdin=tar.stdout, env=env, check=True,
                           capture_output=True)
            tar.wait()


def _podman_env(confdir, storage, images=IMAGE_STORE):
    confdir = Path(confdir)
    confdir.mkdir(parents=True, exist_ok=True)
    (confdir / "containers.conf").write_text(CONTAINERS_CONF.format(root=confdir))
    store = STORAGE_CONF.format(root=confdir, images=images)
    if images is None:
        store = store.replace("graphroot = \"%s/storage\"" % confdir, "graphroot = \"%s\"" % storage)
        store = store[:store.index("[storage.options]")]
    (confdir / "storage.conf").write_text(store)
    return dict(os.environ, CONTAINERS_CONF=str(confdir / "containers.conf"),
                CONTAINERS_STORAGE_CONF=str(confdir / "storage.conf"))


class Podman:
    """One lab's podman: its configuration and storage under `root`."""

    def __init__(self, root):
        self.root = Path(root)
        self.env = _podman_env(self.root, None)
        self.image = IMAGE
        self.sshd_env = {k: self.env[k] for k in ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF")}

    def run(self, lab, alias, *args, **kw):
        """`podman ARGS` inside lab host `alias` (its namespaces) with this configuration."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return lab.exec(alias, ["env"] + ["%s=%s" % kv for kv in self.sshd_env.items()] + ["podman"]
                        + list(args), **kw)

    def close(self):
        """What the lab's processes left: mounts under the storage, its containers' (empty)
        cgroups that cgroupfs leaves behind, then the files."""
        ids = [p.name for p in (self.root / "storage" / "overlay-containers").glob("*") if p.is_dir()]
        for cg in Path("/sys/fs/cgroup").glob("*/libpod_parent"):
            for cid in ids:
                for d in sorted(cg.glob("libpod-%s*" % cid), reverse=True):
                    with contextlib.suppress(OSError):
                        for sub in sorted(d.rglob("*"), reverse=True):
                            if sub.is_dir():
                                sub.rmdir()
                        d.rmdir()
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                  if line.split()[1].startswith(str(self.root))]
        for m in sorted(mounts, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def podman_lab(n_hosts=1, **kw):
    """A HostLab whose hosts run rootful podman, and its Podman."""
    from hostlab import HostLab
    ensure_image()
    pod = Podman(tempfile.mkdtemp(prefix="llmfab-podman-", dir="/var/tmp"))
    try:
        with HostLab(n_hosts, sshd_env=pod.sshd_env, **kw) as lab:
            yield lab, pod
    finally:
        pod.close()
