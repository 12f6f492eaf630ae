"""The host process's own environment: state that lives as long as the agent, the interpreter's
site-packages on demand, and `which` without shutil. Standard library only (ships to hosts)."""
import os
import sys


# State that lives as long as the agent process (e.g. open lock files).
CONTEXT = {}


def site_packages():
    """Put the interpreter's site-packages (and its .pth files) on sys.path, once.

    The agent runs with `python -S` (tasks/transport/agent_code.py AGENT_FLAGS): most tasks need only the
    standard library, and an ML environment's site start-up (dozens of .pth files) is paid
    by every task on every host otherwise. What looks up an installed package (the engine's
    version, Ray) calls this first; site.main() is what the interpreter would have run."""
    if sys.flags.no_site and not CONTEXT.get("site"):
        import site
        site.main()
    CONTEXT["site"] = True


def which(name):
    """shutil.which(name) for an executable, without importing shutil (bz2, lzma, fnmatch)."""
    if os.sep in name:
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    for d in (os.environ.get("PATH") or os.defpath).split(os.pathsep):
        path = os.path.join(d or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None
