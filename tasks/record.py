"""Frozen records: what the profile (tasks/profile/types.py) and each task's options
(tasks/options.py) are made of.

    class Gpu(Record):
        devices: Optional[Tuple[int, ...]] = None
        nvidia_smi: str = "nvidia-smi"

    Gpu(nvidia_smi="/opt/bin/nvidia-smi")      # keyword or positional, in field order
    replace(gpu, devices=(0, 1))                # a changed copy
    fields(Gpu)                                 # ("devices", "nvidia_smi")

The fields are the class's annotations in order (a base class's first), the defaults
its class attributes. Instances are immutable (assigning raises dataclasses'
FrozenInstanceError), compare and hash by their fields, and repr as
`Gpu(devices=None, nvidia_smi='nvidia-smi')`; a field named in `hidden=` (a secret's
value) shows as `...`. That is what @dataclass(frozen=True) gave these classes, without
generating and compiling five methods per class at import: with ~20 records that was
~25 ms of every `fab` start on a slow machine (benchmarks/, issue 16).
"""
from dataclasses import FrozenInstanceError


class Record:
    _fields = ()
    _defaults = {}
    _hidden = frozenset()

    def __init_subclass__(cls, hidden=(), **kwargs):
        super().__init_subclass__(**kwargs)
        own = list(cls.__dict__.get("__annotations__", {}))
        names = list(cls._fields) + [n for n in own if n not in cls._fields]
        defaults = dict(cls._defaults)
        defaults.update((n, cls.__dict__[n]) for n in own if n in cls.__dict__)
        with_default = None
        for n in names:
            if n in defaults:
                with_default = n
            elif with_default is not None:
                raise TypeError(f"{cls.__name__}: field {n!r} has no default but follows "
                                f"{with_default!r}, which has one")
        cls._fields = tuple(names)
        cls._defaults = defaults
        cls._hidden = cls._hidden | frozenset(hidden)

    def __init__(self, *args, **kwargs):
        name, names = type(self).__name__, self._fields
        if len(args) > len(names):
            raise TypeError(f"{name}() takes {len(names)} positional arguments but {len(args)} were given")
        values = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise TypeError(f"{name}() got an unexpected keyword argument {k!r}")
            if k in values:
                raise TypeError(f"{name}() got multiple values for argument {k!r}")
            values[k] = v
        missing = [n for n in names if n not in values and n not in self._defaults]
        if missing:
            raise TypeError(f"{name}() missing required argument(s): {', '.join(missing)}")
        d = self.__dict__
        for n in names:
            d[n] = values[n] if n in values else self._defaults[n]

    def __setattr__(self, name, value):
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def _values(self):
        d = self.__dict__
        return tuple(d[n] for n in self._fields)

    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return self._values() == other._values()
        return NotImplemented

    def __hash__(self):
        return hash(self._values())

    def __repr__(self):
        d = self.__dict__
        return "%s(%s)" % (type(self).__name__, ", ".join(
            f"{n}=..." if n in self._hidden else f"{n}={d[n]!r}" for n in self._fields))


def fields(record_or_class):
    """The field names, in order."""
    return record_or_class._fields


def replace(record, **changes):
    """A copy of `record` with `changes`; unknown names are a TypeError, as for the class."""
    d = record.__dict__
    return type(record)(**dict({n: d[n] for n in record._fields}, **changes))
