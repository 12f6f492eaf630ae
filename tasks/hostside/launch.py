"""Running a release's launch.py (no shell), pointing `current` at it, pruning.

launch.py runs as its own process, `PYTHON launch.py` with the profile's interpreter, as a
user would rerun it by hand: stdin /dev/null, stdout and stderr read here, no descriptor of
the agent's inherited (the deploy lock and the SSH channel stay with the agent). It forks
the reaper that leads the server's session and returns at once, printing the server record
as its last line of output.
"""
import json
import os
import subprocess

from .common import HostError, expand
from .releases import point_current, prune

LAUNCH_TIMEOUT_S = 60


def op_launch(req):
    """Run the release's launch.py (no shell), point `current` at it, prune old releases."""
    ddir = expand(req["deploy_dir"])
    release = req["release"]
    rpath = os.path.join(ddir, "releases", release)
    launcher = os.path.join(rpath, "launch.py")
    if not os.path.isfile(launcher):
        raise HostError("%s is missing" % launcher)
    point_current(ddir, release)
    python = req.get("python") or "python3"
    code, out, err = run_launcher(python, launcher)
    lines = out.decode("utf-8", "replace").strip().splitlines()
    try:
        record = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise HostError("launch.py failed (exit %d): %s" % (
            code, (err or out).decode("utf-8", "replace").strip()[-2000:]))
    if "error" in record:
        raise HostError(record["error"], kind="launch_failed")
    removed = prune(ddir, int(req.get("keep", 5)))
    return {"server": record, "pruned": removed}


def run_launcher(python, launcher):
    """(exit code, stdout, stderr) of `python launcher`. close_fds (subprocess's default)
    keeps the agent's descriptors out of it and of the server it starts."""
    try:
        proc = subprocess.run([python, launcher], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise HostError("launch.py did not return within %g s" % LAUNCH_TIMEOUT_S)
    except OSError as e:
        raise HostError("cannot run %s %s: %s" % (python, launcher, e.strerror or e))
    return proc.returncode, proc.stdout, proc.stderr
