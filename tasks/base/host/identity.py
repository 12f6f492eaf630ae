"""Which processes are a deployment's own, on a box that several deployments share.

A process's environment is no proof: vLLM and SGLang rename their workers with setproctitle,
which writes the new title over the argv+environ block, so /proc/PID/environ of a
VLLM::EngineCore no longer holds the LLMFAB_RELEASE marker its launcher gave it. What the
kernel keeps instead, in order of strength (the launcher, tasks/release/launcher.py, records
which one a release has in <release>/identity.json; `fab status --json` shows it):

- "cgroup": each release runs in a cgroup of its own, <cgroup2 or a v1 hierarchy>/llmfab/
  <KEY>/<release>. Membership is inherited by every child (forked, spawned, renamed,
  reparented to init, setsid'ed) and cannot be left without privilege: membership is identity,
  and a stop empties the cgroup. KEY is `<[target] name>-<8 hex>`: the name for people, the
  hex a hash of the deployment directory's path and inode (two hosts that share /sys, as
  containers on one machine do, never share a KEY).
- "session": where no cgroup can be made (no write access to any hierarchy), the release's
  reaper leads a session: a process of that session (its id and the reaper's start time
  recorded) that started after the reaper is the release's. A worker that calls setsid leaves
  it; the environment marker then still finds it unless it was renamed too.
- the environment marker (LLMFAB_RELEASE=<ddir>/releases/<R>), for releases launched before
  this module, and as a third net.

Another deployment's process is named from the same marks: its cgroup path names the
deployment (KEY) and release; else its session leader's command line is `<python>
<ddir>/releases/<R>/launch.py`. Standard library only (shipped to hosts, Python 3.9+).
"""
import hashlib
import os
import re

from .layout import MARKER
from .procfs import PROC, pids, proc_read, stat_fields
from .statefiles import expand, read_json

TOP = "llmfab"                      # <hierarchy>/llmfab/<KEY>/<release>
IDENTITY_FILE = "identity.json"     # in each release: {identity, cgroup, sid, sid_start}
KEY_NAME = re.compile(r"[^A-Za-z0-9._-]+")
LAUNCHER = re.compile(r"(?:^|\s)(/\S*)/releases/([^/\s]+)/launch\.py(?:\s|$)")


def deployment_key(ddir, name=None):
    """`<name>-<8 hex>` of a deployment directory; the hex alone when name is None."""
    path = expand(ddir)
    try:
        st = os.stat(path)
        ident = "%s\0%d\0%d" % (path, st.st_dev, st.st_ino)
    except OSError:
        ident = path
    digest = hashlib.sha256(ident.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    if name is None:
        return digest
    return "%s-%s" % ((KEY_NAME.sub("_", name).strip("._-") or "deployment")[:40], digest)


def hierarchy(mountinfo="/proc/self/mountinfo"):
    """The cgroup2 mount point, else a v1 hierarchy that only groups (name=systemd, pids), or None."""
    v1 = None
    try:
        with open(mountinfo) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        parts, fs = left.split(), right.split()
        if len(parts) < 5 or len(fs) < 3:
            continue
        mount = parts[4].replace("\\040", " ")
        if fs[0] == "cgroup2":
            return mount
        opts = fs[2].split(",")
        if fs[0] == "cgroup" and v1 is None and ("name=systemd" in opts or "pids" in opts):
            v1 = mount
    return v1


def cgroup_of(pid, mount, proc_root=PROC):
    """The path of pid's cgroup below `mount` ("/llmfab/KEY/R"), or None."""
    data = (proc_read(pid, "cgroup", proc_root) or b"").decode("utf-8", "replace")
    v2 = mount is not None and _is_v2(mount)
    for line in data.splitlines():
        num, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if v2 and num == "0" and controllers == "":
            return path
        if not v2 and ("name=systemd" in controllers.split(",") if mount.endswith("systemd")
                       else os.path.basename(mount) in controllers.split(",")):
            return path
    return None


_V2 = {}


def _is_v2(mount):
    if mount not in _V2:
        _V2[mount] = os.path.exists(os.path.join(mount, "cgroup.controllers"))
    return _V2[mount]


def cgroup_pids(path):
    """Pids in the cgroup directory `path` and below it (this PID namespace's numbers)."""
    out = []
    for root, _dirs, _files in os.walk(path):
        try:
            with open(os.path.join(root, "cgroup.procs")) as f:
                out += [int(x) for x in f.read().split() if x.strip().isdigit() and int(x) > 0]
        except OSError:
            continue
    return out


def _parse_key(cgpath):
    """(KEY, release) of a cgroup path "/.../llmfab/KEY/R[/...]", or None."""
    parts = [p for p in (cgpath or "").split("/") if p]
    if TOP in parts:
        i = parts.index(TOP)
        if len(parts) >= i + 3:
            return parts[i + 1], parts[i + 2]
    return None


def _mount_ns(pid, proc_root=PROC):
    try:
        return os.stat("%s/%s/ns/mnt" % (proc_root, pid)).st_ino
    except OSError:
        return None


def release_identity(ddir, release):
    return read_json(os.path.join(ddir, "releases", release, IDENTITY_FILE)) or {}


def _releases(ddir):
    try:
        return sorted(os.listdir(os.path.join(ddir, "releases")))
    except OSError:
        return []


def _start(fields):
    try:
        return int(fields[19])
    except (TypeError, IndexError, ValueError):
        return None


def _marker_release(pid, ddir_prefix=None, proc_root=PROC):
    """(ddir, release) from pid's LLMFAB_RELEASE marker, or None."""
    for item in (proc_read(pid, "environ", proc_root) or b"").split(b"\0"):
        if item.startswith(MARKER):
            path = item[len(MARKER):].decode("utf-8", "surrogateescape").rstrip("/")
            ddir, rel = os.path.dirname(os.path.dirname(path)), os.path.basename(path)
            if os.path.basename(os.path.dirname(path)) == "releases":
                return ddir, rel
    return None


class Table:
    """One reading of who is whose on this host: built once per question (a stop, a status),
    it walks /proc once. `owner(pid)` names any process; `members(ddir)` lists one deployment's."""

    def __init__(self, proc_root=PROC):
        self.proc_root = proc_root
        self.mount = hierarchy()
        self.stats = {}
        for pid in pids(proc_root):
            fields = stat_fields(pid, proc_root)
            if fields and fields[0] not in ("Z", "X"):
                self.stats[pid] = fields
        self._cg = {}
        self.mnt = _mount_ns("self", proc_root)

    def same_fs(self, pid):
        """Does pid see this agent's filesystem? A marker or launcher path means the deployment
        directory of its own mount namespace: the same path in another (a container, a lab
        host sharing the PID namespace) is another deployment."""
        return self.mnt is None or _mount_ns(pid, self.proc_root) == self.mnt

    def cgroup(self, pid):
        if pid not in self._cg:
            self._cg[pid] = cgroup_of(pid, self.mount, self.proc_root) if self.mount else None
        return self._cg[pid]

    def session(self, pid):
        f = self.stats.get(pid)
        return int(f[3]) if f else None

    def start(self, pid):
        return _start(self.stats.get(pid))

    def members(self, ddir, release=None, runtime=None):
        """{pid: release} of every live process of deployment `ddir` (of one release if given).
        `runtime`: {pid: release} of the processes a systemd unit or container runtime names
        (runtime/host/runtimes.py members, which asks it)."""
        ddir = expand(ddir)
        rels = [release] if release else _releases(ddir)
        out = {}
        me = os.getpid()
        by_sid = {}
        for rel in rels:
            ident = release_identity(ddir, rel)
            if ident.get("cgroup") and self.mount:
                for pid in cgroup_pids(os.path.join(self.mount, ident["cgroup"].lstrip("/"))):
                    if pid in self.stats:
                        out[pid] = rel
            if ident.get("sid"):
                by_sid[ident["sid"]] = (rel, ident.get("sid_start"))
        for pid, rel in (runtime or {}).items():  # a systemd unit's, a container's: its runtime knows them
            if pid in self.stats:
                out.setdefault(pid, rel)
        prefix = os.path.join(ddir, "releases") + "/"
        for pid in self.stats:
            if pid == me or pid in out:
                continue
            if not self.same_fs(pid):
                continue
            sid = self.session(pid)
            if sid in by_sid:
                rel, start = by_sid[sid]
                mine, leader = self.start(pid), self.start(sid)
                if (leader is None or leader == start) and mine is not None and start is not None \
                        and mine >= start:
                    out[pid] = rel
                    continue
            found = _marker_release(pid, prefix, self.proc_root)
            if found and found[0] == ddir and (release is None or found[1] == release):
                out[pid] = found[1]
        out.pop(me, None)
        return out

    def owner(self, pid):
        """{"key", "name", "release", "ddir", "how"} of the llmfab deployment pid belongs to, or None."""
        parsed = _parse_key(self.cgroup(pid))
        if parsed:
            key, rel = parsed
            name = key.rsplit("-", 1)[0] if "-" in key else key
            return {"key": key, "name": name, "release": rel, "ddir": self._cgroup_ddir(key, rel),
                    "how": "cgroup"}
        if not self.same_fs(pid):
            return None
        found = _marker_release(pid, None, self.proc_root)
        if found:
            return self._named(found[0], found[1], "marker")
        leader = self.session(pid)
        if leader and leader in self.stats:
            cmd = (proc_read(leader, "cmdline", self.proc_root) or b"").replace(b"\0", b" ")
            m = LAUNCHER.search(cmd.decode("utf-8", "surrogateescape"))
            if m:
                return self._named(m.group(1), m.group(2), "session")
        return None

    def _cgroup_ddir(self, key, rel):
        """The deployment directory of a release cgroup: its reaper's command line names
        launch.py (None when the reaper is gone, e.g. an orphaned engine)."""
        if not self.mount:
            return None
        for pid in cgroup_pids(os.path.join(self.mount, TOP, key, rel)):
            if not self.same_fs(pid):
                return None  # another host's deployment (its path is not ours to read)
            cmd = (proc_read(pid, "cmdline", self.proc_root) or b"").replace(b"\0", b" ")
            m = LAUNCHER.search(cmd.decode("utf-8", "surrogateescape"))
            if m and m.group(2) == rel:
                return m.group(1)
        return None

    def _named(self, ddir, rel, how):
        server = read_json(os.path.join(ddir, "server.json")) or {}
        name = server.get("name") or os.path.basename(ddir.rstrip("/"))
        return {"key": None, "name": name, "release": rel, "ddir": ddir, "how": how}

    def is_of(self, pid, ddir):
        """Does pid belong to deployment ddir (any release)? The release, or None."""
        own = self.owner(pid)
        if own is None:
            return None
        if own["key"] is not None:
            return own["release"] if own["key"].rsplit("-", 1)[-1] == deployment_key(ddir) else None
        return own["release"] if expand(own["ddir"]) == expand(ddir) else None


def identity_kind(ddir, release):
    """What identifies the release's processes: "cgroup", "session" or "marker" (older releases)."""
    return release_identity(ddir, release).get("identity") or "marker"


def empty_cgroups(ddir, keep=()):
    """Remove this deployment's empty release cgroups (all but the releases in `keep`)."""
    mount = hierarchy()
    if not mount:
        return
    for rel in _releases(expand(ddir)):
        cg = release_identity(expand(ddir), rel).get("cgroup")
        if cg and rel not in keep:
            path = os.path.join(mount, cg.lstrip("/"))
            try:
                os.rmdir(path)
            except OSError:
                pass


def kill_cgroup(ddir, release):
    """SIGKILL every process of the release's cgroup at once (cgroup.kill, Linux 5.14+);
    False when there is no such file (older kernels, v1): the caller signals each pid."""
    cg = release_identity(expand(ddir), release).get("cgroup")
    mount = hierarchy()
    if not (cg and mount):
        return False
    try:
        with open(os.path.join(mount, cg.lstrip("/"), "cgroup.kill"), "w") as f:
            f.write("1")
        return True
    except OSError:
        return False
