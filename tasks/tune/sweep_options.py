"""`fab tune`'s command-line options, parsed once into a frozen record (tasks/options.py)."""
import dataclasses
from typing import Optional, Tuple

from ..errors import UsageError
from ..options import Common, _flag, whole
from .results import parse_objective
from .variants import parse_vary

TUNE_KEEP = ("previous", "winner")


def int_list(key, text, default):
    """'1,8' -> (1, 8): positive whole numbers, each once, in the order given."""
    if text is None:
        return default
    parts = [p.strip() for p in str(text).split(",")]
    out = tuple(whole(key, p, 1) if p else whole(key, None, 1, 0) for p in parts)
    if not out or 0 in out or len(set(out)) != len(out):
        raise UsageError(f"{_flag(key)} expects distinct positive whole numbers like 1,8 (got {text!r})")
    return out


@dataclasses.dataclass(frozen=True)
class TuneOptions(Common):
    vary: Tuple[Tuple[str, tuple], ...] = ()     # (dotted key, values) (tasks/tune/variants.py)
    profiles: Tuple[str, ...] = ()
    baseline: bool = False
    concurrency: Tuple[int, ...] = (1, 8)
    requests: int = 16
    input_len: Optional[int] = None
    max_tokens: int = 128
    repeat: int = 3
    seed: int = 0
    objective: Optional[str] = None              # tokens_per_s@C | ttft_p90@C; None: tokens_per_s@max C
    keep: str = "previous"
    out: Optional[str] = None
    resume: Optional[str] = None
    json: bool = False
    slo: Optional[tuple] = None                  # (slo.Bound, ...) or None: fixed concurrencies
    load: str = "concurrency"                    # with --slo: concurrency | rate
    max_load: int = 64
    slots: str = "1"                             # auto | N

    @staticmethod
    def convert(flags):
        vary = flags.get("vary") or ()
        flags["vary"] = tuple((k, v) for k, v in parse_vary([vary] if isinstance(vary, str) else vary))
        profiles = flags.get("profiles")
        flags["profiles"] = tuple(p.strip() for p in str(profiles).split(",") if p.strip()) \
            if profiles else ()
        flags["baseline"] = bool(flags.get("baseline"))
        flags["concurrency"] = int_list("concurrency", flags.get("concurrency"), (1, 8))
        flags["requests"] = whole("requests", flags.get("requests"), 1, 16)
        flags["input_len"] = whole("input_len", flags.get("input_len"), 1)
        flags["max_tokens"] = whole("max_tokens", flags.get("max_tokens"), 1, 128)
        flags["repeat"] = whole("repeat", flags.get("repeat"), 1, 3)
        flags["seed"] = whole("seed", flags.get("seed"), 0, 0)
        objective = flags.get("objective")
        if objective is not None and parse_objective(objective) is None:
            raise UsageError(f"--objective expects tokens_per_s@C or ttft_p90@C, C a concurrency "
                             f"(got {objective!r})")
        keep = flags.get("keep") or "previous"
        if keep not in TUNE_KEEP:
            raise UsageError(f"--keep expects previous or winner (got {keep!r})")
        flags["keep"] = keep
        from .slo import LOADS, parse_slo
        flags["slo"] = parse_slo(flags["slo"]) if flags.get("slo") else None
        load = flags.get("load") or "concurrency"
        if load not in LOADS:
            raise UsageError(f"--load expects concurrency or rate (got {load!r})")
        flags["load"] = load
        flags["max_load"] = whole("max_load", flags.get("max_load"), 1, 64)
        if flags["slo"] is None and (flags.get("load") != "concurrency" or flags["max_load"] != 64):
            raise UsageError("--load and --max-load steer the search under --slo: give --slo too")
        if flags["slo"] is not None and objective is not None:
            raise UsageError("--objective and --slo: under --slo the objective is goodput (output "
                             "tok/s at each variant's capacity); give one of them")
        slots = str(flags.get("slots") or "1").strip()
        if slots != "auto" and not (slots.isdigit() and int(slots) >= 1):
            raise UsageError(f"--slots expects auto or a whole number >= 1 (got {slots!r})")
        flags["slots"] = slots
        if flags.get("out") and flags.get("resume"):
            raise UsageError("give --out or --resume, not both (--resume writes into its own directory)")
        return flags
