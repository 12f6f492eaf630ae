"""What runs now: server.json, whether its process is alive, how it ended.
"""
import os
import time

from . import supervision
from .common import expand, pid_alive, read_exit, read_json
from .releases import current_release


def op_state(req):
    """server.json, whether its process group is alive, and how the server ended if it did."""
    ddir = expand(req["deploy_dir"])
    server = read_json(os.path.join(ddir, "server.json"))
    current = current_release(ddir)
    out = {"deploy_dir": ddir, "exists": os.path.isdir(ddir), "server": server,
           "current": current, "alive": False, "exit": None}
    if server:
        out["alive"] = pid_alive(server["pid"])
        out["exit"] = read_exit(os.path.join(ddir, "releases", server["release"]), server["pid"])
        out["now"] = time.time()
        out["supervisor"] = supervision.read(ddir, server)
        # the start's phases, kept by the deploy that waited for it (hostside/startup.py)
        out["startup"] = read_json(os.path.join(ddir, "releases", server["release"], "startup.json"))
    return out

