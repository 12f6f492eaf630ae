"""--slots: several variants at once on one host, each on its own GPUs and port.

A host with G GPUs (or the profile's [gpu] devices) holds floor(G / GPUs per variant) slots;
a variant needs tensor-parallel-size x pipeline-parallel-size GPUs (1 unless the profile sets
them). Slot K of a host measures its variants as deployment `<name>` (K = 0) or `<name>-s<K>`,
on port `<port> + K`, with CUDA_VISIBLE_DEVICES and [gpu] devices its own GPUs: a profile file
per variant and slot that extends the variant's file, so what runs is a profile like any other.
"""
from pathlib import Path

from ..errors import UsageError
from ..profile import load_profile
from ..profile.toml_text import dumps, value as toml_value

PARALLEL_FLAGS = ("tensor-parallel-size", "pipeline-parallel-size")


def gpus_per_variant(profile):
    """How many GPUs one server of `profile` uses: the product of its parallel sizes."""
    n = 1
    for flag in PARALLEL_FLAGS:
        value = profile.server.flags.value(flag)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            n *= value
    return n


def pool(profile, host_gpus):
    """The GPUs the sweep may use on a host: [gpu] devices, else all it has."""
    if profile.gpu.devices is not None:
        return list(profile.gpu.devices)
    return list(range(host_gpus))


def plan(text, base, variants, host_gpus):
    """[[gpu indices] per slot] for `--slots auto|N` on a host with `host_gpus` GPUs; [] means
    one slot as the profile says (no per-slot GPUs)."""
    if text in (None, "", "1"):
        return []
    per = max(gpus_per_variant(v.profile) for v in variants)
    gpus = pool(base, host_gpus)
    fits = len(gpus) // per
    if text == "auto":
        n = fits
    else:
        n = int(text)
        if n > fits:
            raise UsageError(f"--slots {n}: the host has {len(gpus)} GPU(s) for the sweep and a "
                             f"variant needs {per}, so at most {fits} slot(s) fit (nothing was done)")
    if n <= 1:
        return []
    return [gpus[i * per:(i + 1) * per] for i in range(n)]


def slot_name(base_name, k):
    return base_name if k == 0 else f"{base_name}-s{k}"


def slot_profile(variant, k, gpus, base):
    """The profile of `variant` in slot k: its file, on slot k's deployment, port and GPUs."""
    folder = Path(variant.path).parent / "slots"
    folder.mkdir(exist_ok=True)
    path = folder / f"{Path(variant.path).stem}.s{k}.toml"
    import os
    tree = {"target": {"name": slot_name(base.target.name, k)},
            "server": {"port": base.server.port + k,
                       "env": {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}},
            "gpu": {"devices": list(gpus)}}
    from ..base.host.safefile import replace
    replace(str(path), f"# fab tune: {variant.name} in slot {k} (GPUs {','.join(map(str, gpus))})\n"
                       f"extends = {toml_value(os.path.relpath(variant.path, folder))}\n" + dumps(tree))
    return load_profile(path)
