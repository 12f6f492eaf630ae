"""What the server's environment has installed: versions and the torch each package was built
for (its `torch` requirement), read from package metadata only (nothing is imported).

The failure explainer asks this when a torch extension package (torchvision, torchaudio,
torchcodec) fails to load against the environment's torch: the fix names the package and the
torch it needs. Standard library only; Python >= 3.9.
"""
import re

from ...base.host.hostenv import site_packages

TORCH_REQ = re.compile(r"torch\s*(?:\(([^)]*)\)|([<>=!~][^;]*))?\s*(?:;|$)")


def op_packages(names=()):
    """{name: {version, torch} or None} for each of `names` and for torch itself;
    `torch` is the package's requirement on torch ("==2.13.0"), None when it states none."""
    site_packages()
    import importlib.metadata as md
    out = {}
    for name in list(names or ()) + ["torch"]:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            out[name] = None
            continue
        need = None
        for r in dist.requires or ():
            m = TORCH_REQ.match(r)
            if m and "extra ==" not in r:
                need = (m.group(1) or m.group(2) or "").strip() or None
                break
        out[name] = {"version": dist.version, "torch": need}
    return out
