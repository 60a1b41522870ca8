"""`slot_builder`: the fast constructors of what the gate builds per call or per unit
(issue 29) build the very objects the dataclass constructors build, and refuse the
classes they cannot build whole."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from vtrm_gate import UnitResult, UnitTask
from vtrm_gate.gate import PrefixAdvanced, TaskFinished, TaskStarted
from vtrm_gate.gate._slots import slot_builder
from vtrm_gate.stats import Action

_TASK = UnitTask("Type A", "u3", "cand", 3, "run-cand", "skill", "abc", "/skills", 1)
_RESULT = UnitResult(correct=True, tokens=7, latency_s=0.5)
_VALUES = {
    UnitTask: ("Type A", "u3", "cand", 3, "run-cand", "skill", "abc", "/skills", 1),
    PrefixAdvanced: (12.5, "Type A", "u3", 3, _RESULT, _RESULT, 0, 2, 1, 3, 1.5, 0.75, 36,
                     Action.CONTINUE),
    TaskStarted: (1.0, _TASK, 5),
    TaskFinished: (2.0, _TASK, _RESULT, "pending"),
}


@pytest.mark.parametrize("cls", list(_VALUES), ids=lambda c: c.__name__)
def test_a_built_object_is_the_one_the_dataclass_builds(cls):
    values = _VALUES[cls]
    built, made = slot_builder(cls)(*values), cls(*values)
    assert type(built) is cls
    assert built == made and hash(built) == hash(made) and repr(built) == repr(made)
    assert [getattr(built, f.name) for f in dataclasses.fields(cls)] == list(values)
    assert pickle.loads(pickle.dumps(built)) == made  # a sweep ships outcomes to workers
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(built, dataclasses.fields(cls)[-1].name, None)


def test_every_field_must_be_given():
    build = slot_builder(TaskStarted)
    with pytest.raises(TypeError, match="missing 1 required positional argument"):
        build(1.0, _TASK)


@dataclasses.dataclass(frozen=True)
class _NoSlots:
    a: int


@dataclasses.dataclass(slots=True)
class _NotFrozen:
    a: int


@dataclasses.dataclass(frozen=True, slots=True)
class _Checked:
    a: int

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a < 0")


@pytest.mark.parametrize(("cls", "why"), [
    (_NoSlots, "slots=True"), (_NotFrozen, "frozen dataclass"), (_Checked, "__post_init__"),
    (int, "frozen dataclass")])
def test_a_class_it_cannot_build_whole_is_refused(cls, why):
    """No ``__post_init__`` would run, a non-slot field would be lost: refused up front."""
    with pytest.raises(TypeError, match=why):
        slot_builder(cls)
