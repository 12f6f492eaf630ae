"""tasks/record.py: the frozen records the profile and the task options are made of."""
import dataclasses
from typing import Optional

import pytest

from tasks.profile.types import Secret
from tasks.record import Record, fields, replace


class Base(Record):
    profile: Optional[str] = None
    parallel: int = 32


class Child(Base):
    json: bool = False
    timeout: Optional[float] = None


class Pair(Record, hidden=("value",)):
    source: str
    value: str


def test_fields_in_order_base_first_with_defaults():
    assert fields(Child) == ("profile", "parallel", "json", "timeout")
    c = Child(json=True)
    assert (c.profile, c.parallel, c.json, c.timeout) == (None, 32, True, None)
    assert Child("p.toml", 4).parallel == 4


def test_frozen_equal_hashable():
    c = Child(timeout=9.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.timeout = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        del c.json
    assert c == Child(timeout=9.0) and c != Child(timeout=8.0) and c != Base()
    assert hash(c) == hash(Child(timeout=9.0))
    assert {c: 1}[Child(timeout=9.0)] == 1


def test_repr_hides_what_is_hidden():
    assert repr(Child()) == "Child(profile=None, parallel=32, json=False, timeout=None)"
    s = Secret("HF_TOKEN", "hf_supersecret")
    assert "hf_supersecret" not in repr(s) and repr(s) == "Secret(source='HF_TOKEN', value=...)"
    assert s.value == "hf_supersecret"


def test_replace_copies_with_changes():
    c = Child(json=True)
    d = replace(c, parallel=2)
    assert (d.parallel, d.json, c.parallel) == (2, True, 32)
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        replace(c, nope=1)


@pytest.mark.parametrize("make, message", [
    (lambda: Pair("a"), "missing required argument(s): value"),
    (lambda: Pair("a", "b", "c"), "takes 2 positional arguments but 3 were given"),
    (lambda: Pair("a", source="b", value="c"), "multiple values for argument 'source'"),
    (lambda: Child(jsn=True), "unexpected keyword argument 'jsn'"),
])
def test_bad_construction_is_a_type_error(make, message):
    with pytest.raises(TypeError) as e:
        make()
    assert message in str(e.value)


def test_a_required_field_after_a_default_is_refused():
    with pytest.raises(TypeError, match="'late' has no default but follows 'early'"):
        class Bad(Record):  # noqa: F841
            early: int = 1
            late: int
