"""Each task's command-line options, parsed once into a frozen dataclass.

    opts = DeployOptions.from_flags(profile=None, timeout="90", ...)   # UsageError on bad input

Invoke hands flags over as text (every default in tasks/cli.py is None or a bool: a number
there would make Invoke convert the flag itself, with an error naming neither flag nor value,
tests/unit/test_flag_values.py); every conversion, default and check happens here, so a bad value is one UsageError (exit 2) before any host is touched,
and task bodies read typed fields instead of a dict they could write into.
"""
import dataclasses
import math
import re
from typing import Optional, Tuple

from .errors import UsageError
from .base.host.stopping import DEFAULT_GRACE_S, KILL_GPU_GRACE_S

RELEASE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def _flag(key):
    return "--" + key.replace("_", "-")


def seconds(key, value, minimum=0.0, above=False):
    """A finite number of seconds >= minimum (> minimum with `above`: a timeout of 0 waits for
    nothing), or None when not given."""
    if value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{_flag(key)} expects a number of seconds (got {value!r})") from None
    if not math.isfinite(out):
        raise UsageError(f"{_flag(key)} expects a finite number of seconds (got {value!r})")
    if out < minimum or (above and out == minimum):
        raise UsageError(f"{_flag(key)} must be {'more than' if above else '>='} {minimum:g} "
                         f"(got {value!r})")
    return out


def whole(key, value, minimum, default=None):
    """A whole number >= minimum (\"5\" and 5.0 are fine, 5.5 is not), or `default`."""
    if value is None:
        return default
    try:
        n = int(value)
        if n != float(value):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        n = None
    if n is None or n < minimum:
        what = "a positive integer" if minimum == 1 else f"a whole number >= {minimum}"
        raise UsageError(f"{_flag(key)} expects {what} (got {value!r})")
    return n


def no_empty(flags):
    """An empty value is never "not given": `--profile "$P"` with P unset would otherwise run
    on the default profile's hosts. UsageError naming the first flag given an empty value
    (a list flag: any empty item)."""
    for key, value in flags.items():
        items = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, str) and not v.strip() for v in items):
            raise UsageError(f"{_flag(key)} was given an empty value; give one, or leave the flag "
                             "out for its default (nothing was done)")


def gpu_list(text):
    """'0,1' -> (0, 1)."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise UsageError(f"--gpus expects comma-separated GPU indexes like 0,1 (got {text!r})")
    out = tuple(int(p) for p in parts)
    if len(set(out)) != len(out):
        raise UsageError(f"--gpus names a GPU twice ({text!r})")
    return out


# What `fab --help TASK` shows a flag takes (`--parallel=INT`), from its field's type in the
# task's options record; a few named for what they hold rather than their type.
METAVARS = {int: "INT", float: "FLOAT", str: "STRING", tuple: "LIST"}
NAMED_METAVARS = {"profile": "PATH", "prompts": "PATH", "out": "PATH", "resume": "DIR",
                  "profiles": "PATHS", "compare": "A.json,B.json", "grep": "REGEX",
                  "release": "STAMP", "gpus": "INDICES", "vary": "KEY=V1,V2", "slo": "SLO",
                  "objective": "METRIC@C", "keep": {"releases": "INT", "tune": "previous|winner"},
                  "load": "concurrency|rate", "concurrency": {"tune": "INT,..."}, "slots": "INT|auto"}


def _value_type(annotation):
    """int for int, Optional[int]; tuple for Tuple[...]; None for bool and the unknown."""
    import typing
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Union and len(args) == 1:
        annotation = args[0]
    if typing.get_origin(annotation) is tuple:
        return tuple
    return annotation if annotation in METAVARS else None


def flag_help(cls, name, task=None):
    """(metavar, default text or None) of the flag for field `name` of options record `cls`:
    `("INT", "32")` for --parallel. A default is given for numbers (and lists of them) only:
    None and words ("the profile's ready.timeout") are the help text's to say."""
    field = {f.name: f for f in dataclasses.fields(cls)}.get(name)
    if field is None:
        return None, None
    kind = _value_type(field.type)
    named = NAMED_METAVARS.get(name)
    metavar = (named.get(task) if isinstance(named, dict) else named) or METAVARS.get(kind)
    default = field.default
    if isinstance(default, bool) or kind not in (int, float, tuple) or default in (None, ()):
        return metavar, None
    if isinstance(default, tuple):
        return metavar, ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in default)
    return metavar, f"{default:g}" if isinstance(default, float) else str(default)


@dataclasses.dataclass(frozen=True)
class Common:
    """Options every task takes."""
    profile: Optional[str] = None
    parallel: int = 32
    accept_new_host_keys: bool = False

    @classmethod
    def from_flags(cls, **flags):
        """The validated options of one task from Invoke's keyword arguments."""
        flags = dict(flags)
        flags.pop("c", None)
        no_empty(flags)
        flags["parallel"] = whole("parallel", flags.get("parallel"), 1, 32)
        flags["accept_new_host_keys"] = bool(flags.get("accept_new_host_keys"))
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(flags) - names
        if unknown:  # a task passing a flag its record lacks: a bug here, not the user's
            raise TypeError(f"{cls.__name__} has no option(s) {sorted(unknown)}")
        return cls(**cls.convert(flags))

    @staticmethod
    def convert(flags):
        return flags


@dataclasses.dataclass(frozen=True)
class DeployOptions(Common):
    dry_run: bool = False
    no_wait: bool = False
    timeout: Optional[float] = None
    stop_on_timeout: bool = False
    json: bool = False
    rolling: Optional[int] = None    # batches of N hosts (tasks/fleet/rolling.py); None: the profile's
    smoke: bool = False              # ready also means: one 1-token completion answered
    no_restore: bool = False         # a failed new release leaves the stopped one stopped

    @staticmethod
    def convert(flags):
        flags["timeout"] = seconds("timeout", flags.get("timeout"), above=True)
        flags["rolling"] = whole("rolling", flags.get("rolling"), 1)
        flags["smoke"] = bool(flags.get("smoke"))
        for key in ("rolling", "smoke"):  # both wait for ready, which --no-wait does not
            if flags.get("no_wait") and flags[key]:
                raise UsageError(f"{_flag(key)} waits for each host to be ready; it cannot be "
                                 "combined with --no-wait (nothing was done)")
        return flags


@dataclasses.dataclass(frozen=True)
class CheckOptions(Common):
    json: bool = False


@dataclasses.dataclass(frozen=True)
class StatusOptions(Common):
    json: bool = False


@dataclasses.dataclass(frozen=True)
class PullOptions(Common):
    json: bool = False
    verify: bool = False


@dataclasses.dataclass(frozen=True)
class StopOptions(Common):
    grace: float = DEFAULT_GRACE_S
    json: bool = False

    @staticmethod
    def convert(flags):
        grace = seconds("grace", flags.get("grace"))
        flags["grace"] = DEFAULT_GRACE_S if grace is None else grace
        return flags


def release_stamp(flags):
    """--release: a stamp as `fab releases` lists them (nothing that leaves releases/)."""
    release = flags.get("release")
    if release is not None and (not RELEASE_NAME.match(str(release)) or release in (".", "..")):
        raise UsageError(f"--release expects a release stamp such as 20250101T120000Z "
                         f"(see `fab releases`), got {release!r}")


@dataclasses.dataclass(frozen=True)
class TailLogOptions(Common):
    lines: int = 50
    follow: bool = False
    grep: Optional[str] = None
    release: Optional[str] = None
    raw: bool = False

    @staticmethod
    def convert(flags):
        flags["lines"] = whole("lines", flags.get("lines"), 0, 50)
        grep = flags.get("grep") or None
        if grep:
            try:
                re.compile(grep)
            except re.error as e:
                raise UsageError(f"--grep {grep!r} is not a valid regular expression: {e}") from None
        flags["grep"] = grep
        release_stamp(flags)
        return flags

    @property
    def regex(self):
        return re.compile(self.grep) if self.grep else None


@dataclasses.dataclass(frozen=True)
class ReleasesOptions(Common):
    json: bool = False
    keep: Optional[int] = None

    @staticmethod
    def convert(flags):
        keep = flags.get("keep")
        if keep is not None:
            try:
                keep = whole("keep", keep, 1)
            except UsageError:
                raise UsageError(f"--keep expects a whole number >= 1 (got {keep!r})") from None
        flags["keep"] = keep
        return flags


@dataclasses.dataclass(frozen=True)
class RollbackOptions(Common):
    timeout: Optional[float] = None
    no_wait: bool = False
    json: bool = False
    release: Optional[str] = None    # this release rather than the one before `current`
    member: Optional[str] = None     # an endpoint's member (its target.name); None: every member

    @staticmethod
    def convert(flags):
        flags["timeout"] = seconds("timeout", flags.get("timeout"), above=True)
        release_stamp(flags)
        return flags


@dataclasses.dataclass(frozen=True)
class KillGpuProcsOptions(Common):
    gpus: Optional[Tuple[int, ...]] = None
    all: bool = False
    grace: float = KILL_GPU_GRACE_S
    dry_run: bool = False
    json: bool = False

    @staticmethod
    def convert(flags):
        if flags.get("all") and flags.get("gpus") is not None:
            raise UsageError("give --gpus or --all, not both")
        if flags.get("gpus") is not None:
            flags["gpus"] = gpu_list(flags["gpus"])
        grace = seconds("grace", flags.get("grace"))
        flags["grace"] = KILL_GPU_GRACE_S if grace is None else grace
        return flags


@dataclasses.dataclass(frozen=True)
class ParkOptions(Common):
    member: Optional[str] = None  # one endpoint member (its target.name); None: every member
    json: bool = False


@dataclasses.dataclass(frozen=True)
class TargetsOptions(Common):
    out: Optional[str] = None        # the file_sd file, replaced atomically; None: stdout


BENCH_DEFAULTS = {"requests": 32, "concurrency": 4, "max_tokens": 128}


@dataclasses.dataclass(frozen=True)
class BenchOptions(Common):
    requests: int = BENCH_DEFAULTS["requests"]
    concurrency: int = BENCH_DEFAULTS["concurrency"]
    max_tokens: int = BENCH_DEFAULTS["max_tokens"]
    prompts: Optional[str] = None
    json: bool = False
    compare: Optional[Tuple[str, str]] = None
    repeat: int = 1  # runs of the bench; medians and spread (tasks/measure/repeats.py)
    seed: int = 0    # the order of the shipped prompts (tasks/measure/workload.py)
    temperature: Optional[float] = None  # sent with every request; None: the server's default
    random_input_len: Optional[int] = None  # prompts of N random token ids (vLLM's random set)
    ignore_eos: bool = False                # every request generates max_tokens tokens

    @staticmethod
    def convert(flags):
        temp = flags.get("temperature")
        if temp is not None:
            try:
                temp = float(temp)
            except (TypeError, ValueError):
                temp = -1.0
            if not 0.0 <= temp <= 100.0:
                raise UsageError(f"--temperature expects a number >= 0 (got {flags['temperature']!r})")
        flags["temperature"] = temp
        for key, default in BENCH_DEFAULTS.items():
            flags[key] = whole(key, flags.get(key), 1, default)
        flags["repeat"] = whole("repeat", flags.get("repeat"), 1, 1)
        flags["seed"] = whole("seed", flags.get("seed"), 0, 0)
        flags["random_input_len"] = whole("random_input_len", flags.get("random_input_len"), 1)
        if flags["random_input_len"] is not None and flags.get("prompts"):
            raise UsageError("--random-input-len and --prompts exclude each other: give one")
        spec = flags.get("compare")
        if spec is not None:
            paths = tuple(p.strip() for p in str(spec).split(",") if p.strip())
            if len(paths) != 2:
                raise UsageError(f"--compare expects two files: --compare A.json,B.json (got {spec!r})")
            flags["compare"] = paths
        return flags
