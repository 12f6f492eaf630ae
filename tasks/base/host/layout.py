"""A deployment directory's layout on a host, and the records in it every capability reads:

    <workdir>/<name>/server.json                  the running server's record
    <workdir>/<name>/current -> releases/<stamp>  the release that runs (or ran last)
    <workdir>/<name>/releases/<UTC stamp>/        launch.py argv.json profile.toml server.log,
                                                  exit.json, stopped.json, start-failed.json

and the marker in the environment of every process a launcher starts. Standard library only
(ships to hosts)."""
import os

from .statefiles import read_json, utc_iso, write_json


# A release's end as the reaper (or the supervisor) records it, and the stop that caused it:
# whoever stops a server on purpose (`fab stop`, a redeploy, a rollback) writes STOP_FILE
# into its release first, so what the server prints while it shuts down (vLLM 0.32 can log
# `EngineDeadError` on SIGTERM) is never read as a failure. Keyed by the server's pid: a
# later run of the same release (rollback relaunches it) is not covered by an old stop.
EXIT_FILE, STOP_FILE = "exit.json", "stopped.json"


def read_stop(rdir, pid=None):
    """The stop record (STOP_FILE) of the run of `pid` (default: any), or None."""
    stop = read_json(os.path.join(rdir, STOP_FILE))
    return stop if stop and (pid is None or stop.get("pid") in (None, pid)) else None


def read_exit(rdir, pid=None):
    """exit.json of the release directory `rdir` (None while it runs or if it never ran), with
    `stopped` = the stop record when the run of `pid` (default: any) was stopped on purpose."""
    ex = read_json(os.path.join(rdir, EXIT_FILE))
    if ex is None:
        return None
    stop = read_stop(rdir, pid)
    if stop:
        ex["stopped"] = stop
    return ex


# In the environment of every process a launcher starts (launch.py): which release it serves.
MARKER = b"LLMFAB_RELEASE="


def release_marker(ddir, release=None):
    """The marker item's prefix for the releases under ddir (or that one release)."""
    path = os.path.join(ddir, "releases", release) if release else os.path.join(ddir, "releases")
    return MARKER + path.encode()


def mark_stopped(ddir, server, by):
    """Record in the release that its server is being stopped on purpose, by `by` (STOP_FILE):
    however it then exits, and whatever it prints meanwhile, it did not fail."""
    rdir = os.path.join(ddir, "releases", server.get("release") or "")
    if server.get("release") and os.path.isdir(rdir):
        write_json(os.path.join(rdir, STOP_FILE), {"by": by, "pid": server.get("pid"), "at": utc_iso()})


def current_release(ddir):
    try:
        return os.path.basename(os.readlink(os.path.join(ddir, "current")))
    except OSError:
        return None


def point_current(ddir, release):
    tmp = os.path.join(ddir, ".current.tmp")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(os.path.join("releases", release), tmp)
    os.replace(tmp, os.path.join(ddir, "current"))


def releases_sorted(ddir):
    try:
        names = [n for n in os.listdir(os.path.join(ddir, "releases")) if not n.startswith(".")]
    except FileNotFoundError:
        return []

    def key(n):
        base, _, suffix = n.partition("-")
        return (base, int(suffix) if suffix.isdigit() else 0)
    return sorted(names, key=key)


KEEP_RELEASES = 5  # releases a host keeps after a deploy ([target] keep_releases' default)
PYTHON = "python3"  # the host's interpreter where the profile names none (server.python)
NVIDIA_SMI = "nvidia-smi"  # its path or name where the profile gives none ([gpu] nvidia_smi)


FAILED_FILE = "start-failed.json"
