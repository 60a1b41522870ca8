"""What the gate is given: one type's plan, one inference task and its result, the INFRA
guard, and the protocols storage and caching come in through (`BaselineStore`, `ResultSink`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .._ids import Arm, arm_run_id, content_hash, is_unicode, slugify
from ..errors import InvalidResultError, is_real, is_whole, plain_fields, shown
from ..stats import (
    DecisionRule,
    TypeOutcome,
    infra_e_value,
)
from ._ladder import check_unit_ids
from ._slots import slot_builder

if TYPE_CHECKING:
    from ._events import (
        PrefixAdvanced,
    )


@dataclass(frozen=True, slots=True)
class UnitTask:
    """One inference: a unit of a type, on one arm, with that arm's skill content."""

    task_type: str
    unit_id: str
    arm: Arm
    ladder_rank: int
    run_id: str
    skill: str = ""
    skill_hash: str = ""
    skill_dir: str | None = None
    attempt: int = 0
    """How many times this step's gate was aborted by the INFRA guard before (0: first).
    Not part of any cache key: a backend may use it to model an outage that has ended (the
    simulator redraws its INFRA failures); a real agent asks again anyway."""


@dataclass(frozen=True, slots=True)
class UnitResult:
    """What an inference returned. ``infra`` marks an infrastructure failure (excluded);
    ``correct=None, infra=True`` says "no answer" (stored as ``correct=False``)."""

    correct: bool = False
    infra: bool = False
    cached: bool = False
    prediction: str | None = None
    latency_s: float = 0.0
    tokens: int = 0
    trace: Any = None
    error: str | None = None


Infer = Callable[[UnitTask], Awaitable[UnitResult]]

_task = slot_builder(UnitTask)  # one task per call (`TypePlan.task`): slots set directly

MAX_RESULT_TOKENS = 2**63 - 1
"""The most tokens a `UnitResult` may report (an SQLite INTEGER)."""


def _result_fault(res: UnitResult) -> tuple[str, object] | None:
    """The first field of ``res`` that is invalid, with its value, or None."""
    for name in ("infra", "cached", "correct"):
        v = getattr(res, name)
        if not isinstance(v, bool | np.bool_) and not (name == "correct" and v is None
                                                       and res.infra):
            return name, v  # correct=None is "no answer": INFRA only
    t = res.tokens
    if isinstance(t, bool) or not isinstance(t, int | np.integer) \
            or not 0 <= t <= MAX_RESULT_TOKENS:
        return "tokens", t
    lat = res.latency_s
    if isinstance(lat, bool) or not isinstance(lat, int | float | np.number) \
            or not math.isfinite(lat) or lat < 0:
        return "latency_s", lat
    for name in ("prediction", "error"):
        v = getattr(res, name)
        if v is not None and not isinstance(v, str):
            return name, v
    return None


def _plain(res: UnitResult) -> bool:
    """Whether ``res`` is valid as it is: Python bools, an int ``tokens`` in range, a finite
    float or int ``latency_s`` >= 0 (NaN fails the comparison) and str-or-None texts. A
    result this says no to goes to `_result_fault`, which accepts numpy scalars too."""
    lat, p, e = res.latency_s, res.prediction, res.error
    return (type(res.correct) is bool and type(res.infra) is bool
            and type(res.cached) is bool and type(res.tokens) is int
            and 0 <= res.tokens <= MAX_RESULT_TOKENS
            and (type(lat) is float or type(lat) is int) and 0 <= lat < math.inf
            and (p is None or type(p) is str) and (e is None or type(e) is str))


_EXPECTED = {"correct": "a bool (None only with infra=True)", "infra": "a bool", "cached": "a bool",
             "tokens": f"an integer from 0 to {MAX_RESULT_TOKENS}",
             "latency_s": "a finite number of seconds >= 0", "prediction": "a string or None",
             "error": "a string or None"}


def checked_result(task: UnitTask, res: object, source: str = "infer") -> UnitResult:
    """What ``source`` (``infer``, or a baseline store) returned for ``task``, checked: a
    `UnitResult` with bool flags, a non-negative integer ``tokens``, finite ``latency_s`` and
    text or None (numpy scalars become Python values; ``correct=None`` of an INFRA result
    becomes False). `InvalidResultError` naming unit, arm, field and value otherwise: an
    arm-dependent bug (``correct=None`` without ``infra``, ``"no"``, NaN) must fail the gate,
    never count."""
    if type(res) is UnitResult and _plain(res):  # the common case: no union, no text built
        return res
    where = f"type {task.task_type!r}, unit {task.unit_id!r} ({task.arm} arm)"
    if not isinstance(res, UnitResult):
        raise InvalidResultError(f"{source} returned {type(res).__name__}, expected "
                                 f"UnitResult, for {where}")
    fault = _result_fault(res)
    if fault is not None:
        name, value = fault
        raise InvalidResultError(f"{source} returned UnitResult.{name}={shown(value)} for "
                                 f"{where}; it must be {_EXPECTED[name]}")
    if type(res.correct) is bool and type(res.infra) is bool and type(res.cached) is bool \
            and type(res.tokens) is int:
        return res
    return dataclasses.replace(res, correct=bool(res.correct), infra=bool(res.infra),
                               cached=bool(res.cached), tokens=int(res.tokens))


@dataclass(frozen=True)
class TypePlan:
    """One type's gate work: its ladder (unit ids in order) and both arms' skills."""

    task_type: str
    units: Sequence[str]
    base_skill: str = ""
    cand_skill: str = ""
    step_run_id: str = "gate"
    base_run_id: str | None = None
    cand_run_id: str | None = None
    target_file: str | None = None
    cand_dir: str | None = None
    rule: DecisionRule | None = field(default=None, compare=False, repr=False)
    """This type's decision rule (default: the gate's); probation probes continue an e-process."""
    attempt: int = 0
    """Passed to every `UnitTask` (see `UnitTask.attempt`)."""

    def __post_init__(self) -> None:
        if not isinstance(self.task_type, str) or not self.task_type.strip():
            raise ValueError(f"TypePlan.task_type must be a non-empty string, "
                             f"got {self.task_type!r}")
        if not is_unicode(self.task_type):
            raise ValueError(f"TypePlan.task_type {self.task_type!r} is not valid Unicode "
                             f"(a lone surrogate): it names files and database rows")
        slugify(self.task_type)
        self._check_fields()
        if isinstance(self.units, set | frozenset):  # its order follows the hash seed
            raise TypeError(
                f"TypePlan {self.task_type!r}: units must be the ladder in order (a list), got "
                f"a {type(self.units).__name__}, whose order changes from one Python process "
                f"to the next (and the gate's decisions with it): pass build_ladder(...) or "
                f"sorted(...)")
        units = check_unit_ids(self.units, f"TypePlan {self.task_type!r}: ")
        object.__setattr__(self, "units", units)

    def _check_fields(self) -> None:
        """TypeError naming the first text field that is not text (``base_skill=None``);
        ValueError for text that is not valid Unicode."""
        for name in ("base_skill", "cand_skill", "step_run_id", "base_run_id", "cand_run_id",
                     "target_file", "cand_dir"):
            v = getattr(self, name)
            optional = name not in ("base_skill", "cand_skill", "step_run_id")
            if not (isinstance(v, str) or (optional and v is None)):
                raise TypeError(f"TypePlan.{name} must be a string"
                                f"{' or None' if optional else ''}, got {type(v).__name__}")
            if v is not None and not is_unicode(v):  # run ids salt keys, skills are sent
                raise ValueError(f"TypePlan.{name} of type {self.task_type!r} is not valid "
                                 f"Unicode (a lone surrogate): it reaches Redis keys, "
                                 f"requests and files")
        a = self.attempt
        if not is_whole(a) or a < 0:
            raise ValueError(f"TypePlan.attempt must be an integer >= 0, got {a!r}")

    @functools.cached_property
    def slug(self) -> str:
        """The type's name in run ids and file names (computed once: a gate asks per plan)."""
        return slugify(self.task_type)

    @property
    def target(self) -> str:
        return self.target_file or f"skills/{self.slug}.md"

    def run_id(self, arm: Arm) -> str:
        explicit = self.base_run_id if arm == "base" else self.cand_run_id
        return explicit or arm_run_id(self.step_run_id, self.task_type, arm)

    def task(self, rank: int, arm: Arm) -> UnitTask:
        skill, skill_hash, run_id = self._arms[arm]
        return _task(self.task_type, self.units[rank], arm, rank, run_id, skill, skill_hash,
                     self.cand_dir if arm == "cand" else None, self.attempt)

    @functools.cached_property
    def _arms(self) -> dict[str, tuple[str, str, str]]:
        """Per arm: skill, its content hash and run id (hashed once per plan, not per call)."""
        return {arm: (skill, content_hash(skill), self.run_id(arm))  # type: ignore[arg-type]  # arm: an Arm literal
                for arm, skill in (("base", self.base_skill), ("cand", self.cand_skill))}


GUARD_RULES = ("ratio", "sequential")


@dataclass(frozen=True)
class GuardParams:
    """INFRA guard, per type, checked on every completion once ``calls >= min_calls``.

    ``rule = "ratio"`` (the SPEC's, default): abort when INFRA units / completed calls >
    ``max_ratio``. ``rule = "sequential"`` (opt-in): abort when the anytime-valid test of
    "the INFRA rate exceeds max_ratio" (`vtrm_gate.stats.infra_e_value` on INFRA calls)
    reaches ``1/alpha``; a type whose INFRA rate is at most ``max_ratio`` is aborted with
    probability <= ``alpha``, however long its gate runs.
    """

    min_calls: int = 10
    max_ratio: float = 0.10
    rule: str = "ratio"
    alpha: float = 0.01
    """``sequential`` only: the false-abort bound per type (the threshold is 1/alpha)."""

    def __post_init__(self) -> None:
        plain_fields(self)
        if not is_whole(self.min_calls) \
                or self.min_calls < 1:
            raise ValueError(f"GuardParams.min_calls must be an integer >= 1, "
                             f"got {self.min_calls!r}")
        if not (is_real(self.max_ratio) and 0 <= self.max_ratio <= 1):
            raise ValueError(f"GuardParams.max_ratio must be in [0, 1], got {self.max_ratio!r}")
        if self.rule not in GUARD_RULES:
            raise ValueError(f"GuardParams.rule must be one of {', '.join(GUARD_RULES)}, "
                             f"got {self.rule!r}")
        if not (is_real(self.alpha) and 0 < self.alpha < 1):
            raise ValueError(f"GuardParams.alpha must be in (0, 1), got {self.alpha!r}")
        if self.rule == "sequential" and not 0 < self.max_ratio < 1:
            raise ValueError(f"GuardParams.max_ratio must be in (0, 1) for the sequential "
                             f"rule, got {self.max_ratio!r}")

    def tripped(self, infra_units: int, calls: int, infra_calls: int | None = None) -> bool:
        """Whether the guard aborts the type now (``infra_calls``: the sequential rule's
        data; INFRA units when not given)."""
        if calls < self.min_calls:
            return False
        if self.rule == "ratio":
            # infra/calls is correctly rounded, so exactly max_ratio never trips (3/30 == 0.1)
            return infra_units / calls > self.max_ratio
        k = infra_units if infra_calls is None else infra_calls
        return infra_e_value(k, calls, self.max_ratio) >= 1.0 / self.alpha

    def explain(self, infra_units: int, calls: int, infra_calls: int | None = None) -> str:
        """Why it tripped, for the abort message."""
        if self.rule == "ratio":
            return (f"{infra_units} INFRA units out of {calls} completed calls "
                    f"({infra_units / calls:.1%} > {self.max_ratio:.0%}, minimum "
                    f"{self.min_calls} calls)")
        k = infra_units if infra_calls is None else infra_calls
        e = infra_e_value(k, calls, self.max_ratio)
        return (f"{k} INFRA calls out of {calls} completed calls: the sequential test of "
                f"'INFRA rate > {self.max_ratio:.0%}' reached E = {e:.3g} >= 1/alpha = "
                f"{1 / self.alpha:.3g}")

    def inputs(self) -> dict[str, object]:
        """The decision fields a manifest records (``rule``/``alpha`` only when not the
        default rule, so manifests written before they existed compare equal)."""
        out: dict[str, object] = {"min_calls": self.min_calls, "max_ratio": self.max_ratio}
        if self.rule != "ratio":
            out |= {"rule": self.rule, "alpha": self.alpha}
        return out



class Admission(Protocol):
    """An adaptive limit on the calls in flight (an LLM endpoint pool's), consulted before
    every dispatch: the gate starts a call only while fewer than ``min(concurrency,
    limit())`` are in flight, so an unstarted call waits in the gate, where a freeze can
    still drop it. ``run_gate(admission=...)``, or the ``infer`` callable's ``admission``
    attribute."""

    def limit(self) -> int: ...


class BaselineStore(Protocol):
    """Base-arm cache: looked up before a slot is taken; written after a fresh non-INFRA run."""

    async def get(self, task: UnitTask) -> UnitResult | None: ...

    async def put(self, task: UnitTask, result: UnitResult) -> None: ...


class ResultSink(Protocol):
    """Persistence: every finished inference, every consumed unit, every decision.

    Awaited inline (a write must land before the gate moves on); keep it fast.
    """

    async def on_result(self, task: UnitTask, result: UnitResult, counted: bool) -> None: ...

    async def on_consumed(self, event: PrefixAdvanced) -> None: ...

    async def on_decided(self, task_type: str, outcome: TypeOutcome) -> None: ...



