"""Preflight on the host, before anything is launched: one record per check.

Each check is {check, status: OK | WARN | FAIL, message}. A FAIL stops the deploy
(exit 1) with nothing launched; WARN is printed and the deploy goes on.
"""
import os
import sys

from ...base.host import engineid
from . import modelcheck, probe
from ...runtime.host import container
from ...gpu.host import nvsmi
from ...runtime.host import runtimes
from ...base.host.hostenv import which
from ...base.host.procfs import group_members
from ...base.host.statefiles import expand, not_writable, read_json
from ...runtime.host.runtimes import server_alive
MIN_DISK_FREE_MIB = 16  # below this a release, let alone its log, may not fit


def _rec(check, status, message):
    return {"check": check, "status": status, "message": message}


def check_python():
    ok = sys.version_info >= (3, 9)
    return _rec("python", "OK" if ok else "FAIL",
                "%s (Python %s)" % (sys.executable, sys.version.split()[0])
                + ("" if ok else ": llmfab's launcher needs Python >= 3.9"))


def check_engine(engine, argv0=None, python=None, env=None, spec=None):
    """The engine's import package and the distribution providing it (engineid.py), found as
    the server will find them: by the server's interpreter `python` (None: this agent's) in the
    server's environment (the host's plus the profile's plain [server.env], `env`), with what
    the engine cannot start without (torch). The record carries them as `engine` ({package,
    distribution, version}), from which the client picks the entry point it launches
    (tasks/steps/argv.py)."""
    if engine in engineid.ENGINE_PACKAGES:
        return _engine_in_server_env(engine, python or sys.executable, env or {}, spec)
    if spec:  # a command in a container: its image has it, or the start says so
        return _rec("engine", "OK", "command %s (in image %s)" % (argv0, spec["image"]))
    if argv0 is None:
        return _rec("engine", "OK", "command")
    found = argv0 if os.path.isabs(argv0) else which(argv0)
    if argv0 and not os.path.isabs(argv0) and found is None and "/" in argv0:
        return _rec("engine", "OK", "command %s (relative to the release directory)" % argv0)
    if found is None or not os.path.exists(found):
        return _rec("engine", "FAIL", "server.command[0] %r not found on this host's PATH" % argv0)
    return _rec("engine", "OK", "command %s" % found)


def _where(python, env, seen=None):
    """`/x/bin/python3 with PYTHONPATH=/a:/b (from [server.env])`: what the engine check looked
    with (`seen`: what the server's interpreter reported; secrets are never sent, so never shown)."""
    if seen is None:
        seen = {"python": python, "pythonpath": env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))}
    if seen.get("pythonpath"):
        origin = "from [server.env]" if "PYTHONPATH" in env else "from the host's environment"
        return "%s with PYTHONPATH=%s (%s)" % (seen["python"], seen["pythonpath"], origin)
    return "%s with PYTHONPATH unset (neither the host's environment nor [server.env] sets it)" % seen["python"]


def _engine_in_server_env(engine, python, env, spec=None):
    package = engineid.ENGINE_PACKAGES[engine]
    try:
        # in a container runtime, the image's interpreter is asked, in the image
        seen = container.engine_probe(spec, engine, python, env) if spec else \
            engineid.in_server_env(engine, python, env)
    except OSError as e:
        return _rec("engine", "FAIL", "cannot run server.python %s here: %s" % (python, e.strerror or e))
    except RuntimeError as e:
        return _rec("engine", "FAIL", "server.python %s could not look for %s (%s) in the server's "
                    "environment: %s" % (python, package, _where(python, env), e))
    info = seen["engine"]
    record = {"package": package, "distribution": info["distribution"], "version": info["version"]}
    if info["origin"] is None:
        return _rec("engine", "FAIL", "%s is not importable by %s: install it into that environment, "
                    "point server.python at the one that has it, or set [server.env] PYTHONPATH to the "
                    "directory holding it" % (package, _where(python, env, seen)))
    missing = [name for name, got in sorted(seen["needs"].items()) if got is None]
    if missing:
        return dict(_rec("engine", "FAIL", "%s is there (%s) but %s, which it needs to start, is not "
                         "importable by %s: the server would die with \"No module named '%s'\"; install "
                         "%s into that environment or put it on [server.env] PYTHONPATH"
                         % (engineid.describe(record), info["origin"], " and ".join(missing),
                            _where(python, env, seen), missing[0], " and ".join(missing))), engine=record)
    torch = seen["needs"].get("torch")
    text = engineid.describe(record)
    if torch:
        text += ", torch %s (%s)" % (torch["version"] or "unknown version", torch["build"] or "build unknown")
    return dict(_rec("engine", "OK", text), engine=record)


def _incomplete(path):
    """What a model directory `fab pull` fills lacks (None: nothing): its record of a finished
    pull (.llmfab-manifest.json), a file that record lists (or of another size), or a partial
    file (.NAME.llmfab-part) still there. Sizes only: `fab pull --verify` re-hashes."""
    from ...weights.host.receiver import LEGACY, MANIFEST, PART, read_manifest
    if not os.path.isdir(path):
        return None
    parts = []
    for top, _, names in os.walk(path):
        parts += [os.path.relpath(os.path.join(top, n), path) for n in names
                  if n.startswith(".") and n.endswith(PART)]
    if parts:
        return "%d partial file%s of an unfinished pull (%s)" % (
            len(parts), "" if len(parts) == 1 else "s", ", ".join(sorted(parts)[:3]))
    record = read_manifest(path) or read_manifest(path, LEGACY)
    if record is None:
        return "no %s (the record a finished `fab pull` writes)" % MANIFEST
    lacking = []
    for f in record["files"]:
        try:
            if os.path.getsize(os.path.join(path, f["path"])) != f["size"]:
                lacking.append(f["path"])
        except (OSError, KeyError, TypeError):
            lacking.append(str(f.get("path") if isinstance(f, dict) else f))
    if lacking:
        return "%d of the %d files its %s lists missing or of another size (%s)" % (
            len(lacking), len(record["files"]), MANIFEST, ", ".join(lacking[:3]))
    return None


def check_paths(paths, pulled=None):
    """Each model path exists; a missing one with a [weights] source (`pulled`: path ->
    source) names `fab pull` as its fix."""
    out = []
    for key, path in paths:
        missing = _incomplete(path) if os.path.exists(path) and path in (pulled or {}) else None
        if missing:
            out.append(_rec("path", "FAIL", "%s: %s is incomplete: %s; fix: `fab pull` completes "
                                            "it from %s ([weights])" % (key, path, missing, pulled[path])))
        elif os.path.exists(path):
            out.append(_rec("path", "OK", "%s: %s exists" % (key, path)))
        elif path in (pulled or {}):
            out.append(_rec("path", "FAIL", "%s: %s does not exist on this host; fix: `fab pull` "
                                            "copies it there from %s ([weights])"
                            % (key, path, pulled[path])))
        else:
            out.append(_rec("path", "FAIL", "%s: %s does not exist on this host" % (key, path)))
    return out


def check_port(host, port, owner_pgid=None):
    if owner_pgid:
        holders = probe.port_holders(port)
        # A server still loading (vLLM) has bound its port without listening yet, and such a
        # socket is in no /proc/net table: while the running release's group is alive and
        # nobody else listens, the port is taken to be its own (it is stopped first).
        if all(_pgid(h["pid"]) == owner_pgid for h in holders) \
                and (holders or group_members(owner_pgid)):
            return _rec("port", "OK", "port %d is held by the running release, which is stopped "
                        "before the new one starts" % port)
    holder = probe.port_in_use(host, port)
    if holder is None:
        return _rec("port", "OK", "%s:%d is free" % (host, port))
    return _rec("port", "FAIL", "port %d is already in use by %s; stop it (fab stop / "
                "fab kill-gpu-procs) or choose another server.port" % (port, holder))


def _pgid(pid):
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def check_disk(deploy_dir, min_free_mib=MIN_DISK_FREE_MIB):
    """Free space where the release will be written (its nearest existing ancestor)."""
    path = os.path.abspath(os.path.expanduser(deploy_dir))
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        st = os.statvfs(path)
    except OSError as e:
        return _rec("disk", "FAIL", "cannot read free space at %s: %s" % (path, e.strerror))
    free = st.f_bavail * st.f_frsize / 2 ** 20
    msg = "%.0f MiB free at %s" % (free, path)
    why = not_writable(path)
    if why:
        return _rec("disk", "FAIL", "%s (the deployment's directory under target.workdir): %s, so no "
                    "release can be written there; choose a writable target.workdir (or remount it "
                    "read-write)" % (deploy_dir, why))
    if free < min_free_mib:
        return _rec("disk", "FAIL", msg + " (disk full?): a release and its log need at least %d "
                    "MiB; free some space there or choose another target.workdir" % min_free_mib)
    return _rec("disk", "OK", msg)


def _ask_check(g, free, ask, held=()):
    """FAIL when the engine's start-up fraction of this device (tasks/gpu/ask.py) is more than
    is free, with both numbers, who holds the rest and the largest fraction that fits; None
    when it fits."""
    want = ask["fraction"] * g["total_mib"]
    if free >= want:
        return None
    fit = max(0.0, int(free / g["total_mib"] * 100 - 2) / 100)  # as failure rule util_fit: 2 points spare
    others = ["pid %d (%s, %s) %d MiB" % (h["pid"], h["name"], "deployment %s" % h["deployment"]
                                          if h.get("deployment") else "not an llmfab deployment", h["mib"])
              for h in held if h["gpu"] == g["index"] and not h.get("live")]
    return _rec("gpu", "FAIL", "GPU %d: the engine will ask %s %g x %d MiB = %d MiB at start-up%s, but only "
                "%d MiB is free%s; set %s to at most %.2f in [server.args], or free the GPU (`fab "
                "kill-gpu-procs`)" % (g["index"], ask["flag"], ask["fraction"], g["total_mib"], want,
                                      " (the engine's default)" if ask.get("default") else "", free,
                                      " (held by %s)" % ", ".join(others) if others else "",
                                      ask["flag"], fit))


def check_gpus(nvidia_smi, devices, min_free, ask=None, held=()):
    gpus = nvsmi.read_gpus(nvidia_smi)
    if gpus is None:
        status = "FAIL" if min_free else "WARN"
        return [_rec("gpu", status, "%s not found or not working: cannot read GPU memory" % nvidia_smi)]
    chosen = nvsmi.select(gpus, devices)
    if devices is not None:
        missing = sorted(set(devices) - {g["index"] for g in gpus})
        if missing:
            return [_rec("gpu", "FAIL", "GPU(s) %s not present (host has %s)" % (
                missing, [g["index"] for g in gpus]))]
    out = []
    for g in chosen:
        free = None if g["used_mib"] is None or g["total_mib"] is None else g["total_mib"] - g["used_mib"]
        # what this deployment's running server holds comes back before the launch (a redeploy stops it)
        own = sum(h["mib"] for h in held if h.get("live") and h["gpu"] == g["index"])
        if free is not None:
            free += own
        msg = "GPU %d %s: %s MiB free of %s" % (g["index"], g["name"], free, g["total_mib"])
        if own:
            msg += " (with the %d MiB this deployment's server gives back)" % own
        failed = _ask_check(g, free, ask, held) if ask and free is not None and g["total_mib"] else None
        if min_free and (free is None or free < min_free):
            out.append(_rec("gpu", "FAIL", msg + ", below gpu.min_free_mib = %d; free it with "
                            "`fab kill-gpu-procs`" % min_free))
        elif failed:
            out.append(failed)
        else:
            out.append(_rec("gpu", "OK", msg))
    return out


def _container_spec(runtime, runtime_spec):
    """The container a request's engine check looks in (its runtime_spec), or None."""
    return runtime_spec if runtime in container.ENGINES else None


def op_preflight(engine, port, python=None, env=None, argv0=None, runtime=None, runtime_spec=None,
                 paths=(), pulled=None, models=None, doctor=None, host=None, port_owner_pgid=None,
                 deploy_dir=None, nvidia_smi=nvsmi.NVIDIA_SMI, devices=None, min_free_mib=0, ask=None):
    """The host's checks before a launch: the engine as `python` runs it in `env` (or in the
    container of `runtime_spec`), the model `paths`, `models`' files, the speculative method of
    `doctor`, the port, the disk and the GPUs (`ask`: MiB each needs). The answer is {checks,
    spec_facts}: the doctor's facts of a speculative deployment (tasks/doctor/host/spec_facts.py),
    which deploy keeps in its release as spec-facts.json for the ready line, status and bench to
    read; else None."""
    found_runtime = runtimes.for_server({"runtime": runtime})
    # systemd or a container engine present and working (tasks/runtime/host/)
    found = found_runtime.check(runtime_spec or {}) if found_runtime is not None else []
    spec = _container_spec(runtime, runtime_spec)
    if spec and any(r["status"] == "FAIL" for r in found):  # a container that cannot run
        engine_check = _rec("engine", "WARN", "not looked for: the container cannot run (see above)")
    else:  # in a container, its image's interpreter is asked (container.engine_probe)
        engine_check = check_engine(engine, argv0, python, env, spec)
    checks = [check_python()] + (found + [engine_check] if spec else [engine_check] + found)
    checks += check_paths(paths or [], pulled)
    checks += modelcheck.run(models)
    facts = None
    if (doctor or {}).get("method"):  # rules of doctor/host/spec_rules.py (a speculative method)
        from ...doctor.host import spec_check
        # the engine version as the server's environment has it (the check above)
        doctor = dict(doctor, version=(engine_check.get("engine") or {}).get("version"))
        facts, found = spec_check.run(doctor)
        checks += spec_check.checks(found)
    checks.append(check_port(host or "0.0.0.0", port, port_owner_pgid))
    if deploy_dir:
        checks.append(check_disk(deploy_dir))
    held = gpu_holders(deploy_dir, nvidia_smi, devices)
    checks += check_gpus(nvidia_smi, devices, min_free_mib, ask, held)
    if deploy_dir:
        checks += check_orphans(deploy_dir, held)
        checks += check_neighbours(held)
    return {"checks": checks, "spec_facts": facts}


def gpu_holders(ddir, nvidia_smi, devices):
    """gpuprocs.holders of the deployment's GPUs, with `live` (the holder is part of this
    deployment's running server, which a redeploy stops first); [] without a deploy_dir."""
    from ...gpu.host.gpuprocs import holders
    if not ddir or not nvsmi.available(nvidia_smi):
        return []
    ddir = expand(ddir)
    server = read_json(os.path.join(ddir, "server.json"))
    live = server["release"] if server and server_alive(ddir, server) else None
    return [dict(h, live=h["ours"] and h["release"] == live) for h in holders(ddir, nvidia_smi, devices)]


def check_orphans(ddir, held):
    """A FAIL for each process of this deployment that holds GPU memory while not being part of
    the live server (an engine child left behind by a killed server); others: check_gpus."""
    return [_rec("gpu", "FAIL", "GPU %d: pid %d (%s) of release %s holds %s MiB with no server running; "
                 "free it with `fab kill-gpu-procs`" % (h["gpu"], h["pid"], h["name"], h["release"], h["mib"]))
            for h in held if h["ours"] and not h["live"]]


def check_neighbours(held):
    """A WARN per other llmfab deployment on the deployment's GPUs: they share the memory."""
    seen = {}
    for h in held:
        if not h["ours"] and h.get("deployment"):
            seen.setdefault((h["gpu"], h["deployment"], h["release"]), 0)
            seen[(h["gpu"], h["deployment"], h["release"])] += h["mib"]
    return [_rec("gpu", "WARN", "GPU %d is shared with another deployment: %s (release %s) holds %d MiB"
                 % (gpu, name, rel, mib)) for (gpu, name, rel), mib in sorted(seen.items())]


def op_host_facts(engine, python=None, env=None, argv0=None, runtime=None, runtime_spec=None,
                  nvidia_smi=nvsmi.NVIDIA_SMI):
    """What makes two hosts alike for a sweep (`fab tune`): the engine and its version (as
    the preflight reads it), and the GPUs' names (None: no nvidia-smi)."""
    gpus = nvsmi.read_gpus(nvidia_smi)
    spec = _container_spec(runtime, runtime_spec)
    return {"engine": check_engine(engine, argv0, python, env, spec)["message"],
            "gpus": None if gpus is None else [g["name"] for g in gpus]}
