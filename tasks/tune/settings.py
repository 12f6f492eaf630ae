"""Server settings in a sweep (`--vary server.args.max-num-seqs=64,128`): each value checked
against the host engine's own `--help` before any launch.

A flag the engine's --help does not list, a value outside the choices it lists, or a value
outside a known setting's range (the table) is bad input: exit 2 naming the flag, the value
and the host, with nothing launched anywhere. Refusing the whole sweep rather than skipping the
variant: every alike host has the same engine, so the flag would fail each of its variants
after a deploy apiece, and a misspelt flag is the user's to fix, not a finding of the sweep.

The settings vLLM's own benchmarks/auto_tune/auto_tune.sh explores (max-num-seqs,
max-num-batched-tokens, gpu-memory-utilization) have their ranges here, from vLLM's
EngineArgs (0.32): a count >= 1, and a fraction of GPU memory in (0, 1].
"""
from ..errors import UsageError
from ..profile.args import flag_key

# flag -> (what a value must be, check)
SETTINGS = {
    "max-num-seqs": ("a whole number >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1),
    "max-num-batched-tokens": ("a whole number >= 1",
                               lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1),
    "gpu-memory-utilization": ("a fraction in (0, 1]",
                               lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1),
}
ARGS = "server.args."


def varied_flags(vary):
    """[(flag as written, values)] of the --vary keys that set a top-level [server.args] flag
    (not a key inside a table-valued flag such as speculative-config)."""
    out = []
    for key, values in vary:
        if key.startswith(ARGS) and "." not in key[len(ARGS):]:
            out.append((key[len(ARGS):], values))
    return out


def check(vary, host, flags, engine):
    """UsageError unless every varied flag and value fits the engine's --help (`flags`:
    {flag: choices|None} from tasks/tune/host/enginehelp.py) and the SETTINGS table."""
    known = {flag_key(f): (f, choices) for f, choices in (flags or {}).items()}
    for flag, values in varied_flags(vary):
        hit = known.get(flag_key(flag))
        if hit is None:
            raise UsageError(f"--vary {ARGS}{flag}: the engine on {host} ({engine}) has no "
                             f"--{flag} (its --help lists no such flag); nothing was launched")
        _, choices = hit
        for v in values:
            if choices and str(v).lower() not in [c.lower() for c in choices]:
                raise UsageError(f"--vary {ARGS}{flag}={v}: the engine on {host} ({engine}) "
                                 f"accepts {', '.join(choices)}; nothing was launched")
            rule = SETTINGS.get(flag_key(flag).replace("_", "-"))
            if rule and not rule[1](v):
                raise UsageError(f"--vary {ARGS}{flag}={v}: expected {rule[0]}; nothing was launched")
