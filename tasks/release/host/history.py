"""The releases kept on the host: listing, pruning, relaunching an old one (host side).

Used by `fab releases` and `fab rollback`. A relaunch runs the release's own
launch.py (its argv, its env, its secrets.json) exactly as deploy first ran it;
the server appends to the same server.log, which is never truncated.
Standard library only; Python >= 3.9.
"""
import hashlib
import os

from . import launch, release_dirs
from ...base.host.hosterrors import HostError
from ...base.host.layout import EXIT_FILE, FAILED_FILE, STOP_FILE, current_release, read_exit, releases_sorted
from ...base.host.statefiles import expand, read_json
from ...runtime.host.runtimes import server_alive
from ...steps.host.logs import resolve

PROFILE_MAX_BYTES = 1 << 20


def _sha256(path):
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 16), b""):
                h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def op_release_list(deploy_dir):
    """Every release, oldest first: stamp, profile sha256, log size, exit record, running?"""
    ddir = expand(deploy_dir)
    current = current_release(ddir)
    server = read_json(os.path.join(ddir, "server.json")) or {}
    alive = server_alive(ddir, server)
    out = []
    for name in releases_sorted(ddir):
        rdir = os.path.join(ddir, "releases", name)
        is_server = server.get("release") == name
        out.append({
            "release": name,
            "current": name == current,
            "profile_sha256": _sha256(os.path.join(rdir, "profile.toml")),
            "log_bytes": _size(os.path.join(rdir, "server.log")),
            "has_launcher": os.path.isfile(os.path.join(rdir, "launch.py")),
            "exit": read_exit(rdir, server.get("pid") if is_server else None),
            "start_failed": read_json(os.path.join(rdir, FAILED_FILE)),
            "startup": read_json(os.path.join(rdir, "startup.json")),  # startup/host/phases.py
            "started_at": server.get("started_at") if is_server else None,
            "running": is_server and alive,
            "pid": server.get("pid") if is_server else None,
        })
    return {"deploy_dir": ddir, "current": current, "releases": out}


def op_release_profile(deploy_dir, release):
    """The release's saved profile.toml (secrets redacted at deploy) as text, or None."""
    ddir = expand(deploy_dir)
    release, log = resolve(ddir, release)
    path = os.path.join(os.path.dirname(log), "profile.toml")
    try:
        with open(path, "rb") as f:
            text = f.read(PROFILE_MAX_BYTES).decode("utf-8", "replace")
    except OSError:
        text = None
    return {"release": release, "profile_toml": text}


def op_prune(deploy_dir, keep):
    """Keep the newest `keep` releases; never the current one or the one before it."""
    ddir = expand(deploy_dir)
    keep = int(keep)
    if keep < 1:
        raise HostError("keep must be at least 1", kind="usage")
    return {"pruned": release_dirs.prune(ddir, keep)}


def op_relaunch(deploy_dir, release, python=launch.PYTHON):
    """Run an existing release's launch.py again and point `current` at it; never prunes.

    Refuses while this deployment's server still runs (stop it first). A previous
    exit.json is kept as exit.prev.json so the new run's end is recorded afresh (and the
    stop record of the last run, stopped.json, as stopped.prev.json).
    """
    ddir = expand(deploy_dir)
    release, log = resolve(ddir, release)
    rdir = os.path.dirname(log)
    server = read_json(os.path.join(ddir, "server.json")) or {}
    if server_alive(ddir, server):
        raise HostError("release %s is still running (pid %s); stop it first"
                        % (server.get("release"), server["pid"]), kind="running")
    if not os.path.isfile(os.path.join(rdir, "launch.py")):
        raise HostError("%s/launch.py is missing: this release cannot be relaunched" % rdir,
                        kind="launch_failed")
    for name in (EXIT_FILE, STOP_FILE):
        if os.path.exists(os.path.join(rdir, name)):
            os.replace(os.path.join(rdir, name), os.path.join(rdir, name.replace(".json", ".prev.json")))
    offset = _size(log) or 0  # this run's lines start here: the log is appended to
    out = launch.op_launch(ddir, release, python=python, keep=1 << 30)
    out["log_offset"] = offset
    return out

