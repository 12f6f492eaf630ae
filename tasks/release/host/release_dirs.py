"""Release directories (host side): allocate, discard, list, prune, and `current`.

    <workdir>/<name>/releases/<UTC stamp>/   launch.py argv.json profile.toml server.log
    <workdir>/<name>/current -> releases/<stamp>

A release whose server failed to start holds start-failed.json (op mark_failed).
"""
import os
import time

from ...base.host.hosterrors import HostError
from ...base.host.layout import FAILED_FILE, current_release, releases_sorted
from ...base.host.statefiles import expand, remove_tree, utc_iso, write_json

STAMP_FORMAT = "%Y%m%dT%H%M%SZ"


def op_new_release(deploy_dir, files=()):
    """Create releases/<UTC stamp>[-N] (0700) and return its absolute path.

    `files` ([[name, mode, base64 data]]): written into it in the same request (deploy's
    launch.py, argv.json, profile.toml...; a name may hold folders, as the supervisor's
    llmfab_host/<capability>/host/*.py do); if one cannot be, the new release is removed again and nothing is
    left half-written."""
    files = files or []
    for name, _mode, _data in files:
        parts = name.split("/") if isinstance(name, str) else ()
        if not parts or any(p in ("", ".", "..") for p in parts):
            raise HostError("not a file name for a release: %r" % (name,), kind="internal")
    out = _new_release_dir(deploy_dir)
    if files:
        from binascii import a2b_base64  # what base64.b64decode calls, without its module
        from ...transport.host.files import write_file
        try:
            for name, mode, data in files:
                if "/" in name:
                    os.makedirs(os.path.join(out["path"], name.rsplit("/", 1)[0]), 0o700, exist_ok=True)
                write_file(os.path.join(out["path"], name), a2b_base64(data), mode)
        except BaseException:
            remove_tree(out["path"])
            raise
    return out


def _new_release_dir(deploy_dir):
    ddir = expand(deploy_dir)
    rdir = os.path.join(ddir, "releases")
    os.makedirs(rdir, mode=0o700, exist_ok=True)
    stamp = time.strftime(STAMP_FORMAT, time.gmtime())
    for n in range(1, 1000):
        name = stamp if n == 1 else "%s-%d" % (stamp, n)
        path = os.path.join(rdir, name)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        os.chmod(path, 0o700)
        return {"release": name, "path": path, "deploy_dir": ddir}
    raise HostError("could not allocate a release directory under %s" % rdir)


def op_discard_release(deploy_dir, release):
    """Remove a release that never launched (e.g. the push failed). Never the current one."""
    ddir = expand(deploy_dir)
    path = os.path.join(ddir, "releases", release)
    if current_release(ddir) != release and os.path.isdir(path) \
            and not os.path.exists(os.path.join(path, "server.log")):
        remove_tree(path)
    return {}


def prune(ddir, keep):
    """Remove the oldest releases beyond `keep`; never the current one or the one before it."""
    names = releases_sorted(ddir)
    current = current_release(ddir)
    protected = {current}
    if current in names:
        idx = names.index(current)
        if idx > 0:
            protected.add(names[idx - 1])
    removed = []
    excess = len(names) - keep
    for n in names:
        if excess <= 0:
            break
        if n in protected:
            continue
        remove_tree(os.path.join(ddir, "releases", n))
        removed.append(n)
        excess -= 1
    return removed


def op_mark_failed(deploy_dir, release, rule=None, cause=None, fix=None, line=None):
    """Record in the release that it failed to start (`rule`, `cause`, when), so `fab rollback`
    never picks it as the release to go back to. Its files and log stay as they are."""
    path = os.path.join(expand(deploy_dir), "releases", release)
    if not os.path.isdir(path):
        raise HostError("no release %s in %s" % (release, deploy_dir), kind="no_release")
    record = {"failed_at": utc_iso(), "rule": rule, "cause": cause, "fix": fix, "line": line}
    write_json(os.path.join(path, FAILED_FILE), record)
    return {}


def release_launcher(rpath):
    """The release's launch.py as a module (its ARGV, ENV, ...); importing runs nothing. The
    runtimes that start a release themselves (systemd, containers) read its argv from there."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("llmfab_release_launch", os.path.join(rpath, "launch.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
