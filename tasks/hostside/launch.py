"""Running a release's launch.py (no shell), pointing `current` at it, pruning.
"""
import json
import os
import subprocess

from .common import HostError, expand
from .releases import point_current, prune


def op_launch(req):
    """Run the release's launch.py (no shell), point `current` at it, prune old releases."""
    ddir = expand(req["deploy_dir"])
    release = req["release"]
    rpath = os.path.join(ddir, "releases", release)
    launcher = os.path.join(rpath, "launch.py")
    if not os.path.isfile(launcher):
        raise HostError("%s is missing" % launcher)
    point_current(ddir, release)
    proc = subprocess.run(
        [req.get("python") or "python3", launcher], stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60,
    )
    lines = proc.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        record = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise HostError("launch.py failed (exit %d): %s" % (
            proc.returncode, (proc.stderr or proc.stdout).decode("utf-8", "replace").strip()[-2000:]))
    if "error" in record:
        raise HostError(record["error"], kind="launch_failed")
    removed = prune(ddir, int(req.get("keep", 5)))
    return {"server": record, "pruned": removed}


OPS = {
    "launch": op_launch,
}
