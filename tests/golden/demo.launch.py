#!/usr/bin/env python3
"""llmfab launcher: deployment 'demo', profile demo.toml (sha256 <digest>).

Rerun by hand from anywhere:  <python> {this file}
It starts the server detached (own session and process group), appends its output
to server.log beside this file, records ../../server.json, and returns at once.
Standard library only; Python >= 3.9.
"""
import sys

# This launcher and its reaper (the supervisor) run isolated: `-I` (no PYTHONPATH, PYTHONHOME
# or other PYTHON* variable, no user site, not this directory on sys.path) and `-S` (no site
# start-up, no .pth code). Nothing the host's environment points Python at, and none of the
# profile's [server] files beside this file, can stand in for the standard library used here.
# The server gets the environment as it is (plus ENV below). Run otherwise (by hand), the
# interpreter restarts itself so.
if __name__ == "__main__" and not (sys.flags.isolated and sys.flags.no_site) and sys.executable:
    import posix  # built in: never found on a path
    posix.execv(sys.executable, [sys.executable, "-I", "-S", __file__] + sys.argv[1:])

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time

# The server's argv, exactly as the server receives it. No shell is involved.
ARGV = [
    'python3',
    'demo_server.py',
    '--port',
    '18000',
    '--host',
    '127.0.0.1',
    '--served-model-name',
    'demo-model',
    '--load-seconds',
    '2',
    '--num-speculative-tokens',
    '4',
    '--accept-rate',
    '0.62',
]

# Added to the host's environment. Secrets live in secrets.json (mode 0600) beside
# this file and are merged in at launch; their values never appear here.
ENV = {}
SECRET_NAMES = []

# The engine's cache directory (compiled graphs), relative to the deployment directory:
# one per engine version, shared by every release and restart of this deployment, so a
# redeploy starts warm. Empty when the profile sets it itself or the engine has none.
CACHE_ENV = {}

PORT = 18000

# Which deployment this is, for the cgroup its processes run in: llmfab/<KEY>/<release>.
NAME = 'demo'


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())


def _write_json(path, data):
    # A fresh name nobody could have planted (never through a link), then one rename.
    tmp = "%s.%d.%s.tmp" % (path, os.getpid(), os.urandom(4).hex())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
        f.write("\n")
    os.replace(tmp, path)


def _open_log(here):
    # Appended to, never through a link planted at its name.
    return os.open(os.path.join(here, "server.log"),
                   os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)


def _environment(here):
    env = dict(os.environ)
    env.update(ENV)
    # Inherited by every child, even one that leaves the process group: `fab stop`
    # finds this deployment's stragglers by it.
    env["LLMFAB_RELEASE"] = here
    deployment = os.path.dirname(os.path.dirname(here))
    for name, rel in CACHE_ENV.items():
        env[name] = os.path.join(deployment, rel)
        os.makedirs(env[name], exist_ok=True)
    if SECRET_NAMES:
        with open(os.path.join(here, "secrets.json")) as f:
            secrets = json.load(f)
        env.update({k: secrets[k] for k in SECRET_NAMES})
    return env


def _start_ticks():
    with open("/proc/self/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19])


def _key(deployment):
    """`<NAME>-<8 hex>`: the hex hashes the deployment directory's path and inode, so two hosts
    sharing /sys never share a cgroup (the same as tasks/base/host/identity.py deployment_key)."""
    st = os.stat(deployment)
    ident = "%s\0%d\0%d" % (deployment, st.st_dev, st.st_ino)
    digest = hashlib.sha256(ident.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return "%s-%s" % ((re.sub(r"[^A-Za-z0-9._-]+", "_", NAME).strip("._-") or "deployment")[:40], digest)


def _cgroup_mount():
    """The cgroup2 mount point, else a v1 hierarchy that only groups processes, or None."""
    v1 = None
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        parts, fs = left.split(), right.split()
        if len(parts) < 5 or len(fs) < 3:
            continue
        if fs[0] == "cgroup2":
            return parts[4].replace("\\040", " ")
        if fs[0] == "cgroup" and v1 is None and {"name=systemd", "pids"} & set(fs[2].split(",")):
            v1 = parts[4].replace("\\040", " ")
    return v1


def _identity(here):
    """Put this process (the reaper: the server and everything it starts follow) in a cgroup
    of the release's own, llmfab/<KEY>/<release>; where none can be made, the session it leads
    identifies them. identity.json says which (read by tasks/base/host/identity.py)."""
    record = {"identity": "session", "cgroup": None, "sid": os.getsid(0), "sid_start": _start_ticks()}
    mount = None if os.environ.get("LLMFAB_NO_CGROUP") or ENV.get("LLMFAB_NO_CGROUP") else _cgroup_mount()
    if mount:
        rel = "/llmfab/%s/%s" % (_key(os.path.dirname(os.path.dirname(here))), os.path.basename(here))
        try:
            os.makedirs(mount + rel, exist_ok=True)
            with open(mount + rel + "/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
            record.update(identity="cgroup", cgroup=rel)
        except OSError as e:
            record["cgroup_error"] = "%s: %s" % (mount + rel, e.strerror)
    _write_json(os.path.join(here, "identity.json"), record)


def _reaper(here, env, report_fd):
    """Child: lead a new session, start the server in it, record how it ended."""
    os.setsid()
    _identity(here)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    # A handler (not SIG_IGN, which exec would inherit): the reaper outlives a
    # SIGTERM of the group so it can record the server's exit status.
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGHUP, lambda *_: None)
    try:
        log_fd = _open_log(here)
    except OSError as e:
        os.write(report_fd, json.dumps({"error": "cannot write %s: %s" % (
            os.path.join(here, "server.log"), e.strerror)}).encode())
        os._exit(1)
    try:
        with os.fdopen(log_fd, "ab") as log:
            proc = subprocess.Popen(
                ARGV, cwd=here, env=env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, close_fds=True,
            )
    except OSError as e:  # exec failed (EACCES, ENOENT, E2BIG, ...): llmfab records why
        os.write(report_fd, json.dumps({"error": "cannot start %s: %s" % (ARGV[0], e.strerror),
                                         "errno": e.errno, "argv0": ARGV[0]}).encode())
        os._exit(1)
    os.write(report_fd, json.dumps({"pid": proc.pid}).encode())
    os.close(report_fd)
    while True:
        try:
            status = proc.wait()
            break
        except InterruptedError:
            continue
    _write_json(os.path.join(here, "exit.json"), {"returncode": status, "ended_at": _now()})
    os._exit(0)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    env = _environment(here)
    read_fd, write_fd = os.pipe()
    reaper = os.fork()
    if reaper == 0:
        os.close(read_fd)
        _reaper(here, env, write_fd)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as r:
        report = json.loads(r.read() or b'{"error": "launcher child died"}')
    if "error" in report:
        print(json.dumps(report))
        return 1
    identity = {}
    try:
        with open(os.path.join(here, "identity.json")) as f:
            identity = json.load(f)
    except (OSError, ValueError):
        pass
    record = {
        "pid": report["pid"],
        "pgid": reaper,
        "started_at": _now(),
        "release": os.path.basename(here),
        "port": PORT,
        "name": NAME,
        "identity": identity.get("identity"),
        "cgroup": identity.get("cgroup"),
    }
    _write_json(os.path.join(os.path.dirname(os.path.dirname(here)), "server.json"), record)
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
