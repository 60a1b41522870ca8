"""An ``infer`` that answers from a fixed outcome table, with scripted latencies."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from ..gate import TypePlan, UnitResult, UnitTask
from ..stats import Pair

Latency = Callable[[UnitTask, UnitResult], float]


@dataclass
class OutcomeTable:
    """Per type, the ladder-order outcomes ``(base_correct, cand_correct)`` or None (INFRA).

    ``latency(task, result)`` sets each call's duration on the loop clock, so tests script
    any completion order. ``infra_arm`` chooses which arm fails on an INFRA unit.
    """

    outcomes: Mapping[str, Sequence[Pair]]
    latency: Latency = lambda task, res: 0.0
    infra_arm: str = "cand"
    calls: list[UnitTask] = field(default_factory=list)
    in_flight: int = 0
    peak: int = 0

    def plans(self, **kw: Any) -> list[TypePlan]:
        return [TypePlan(t, [f"{t}-u{i:03d}" for i in range(len(o))], **kw)
                for t, o in self.outcomes.items()]

    def result(self, task: UnitTask) -> UnitResult:
        pair = self.outcomes[task.task_type][task.ladder_rank]
        if pair is None:
            if task.arm == self.infra_arm or self.infra_arm == "both":
                return UnitResult(infra=True, error="503 Service Unavailable")
            return UnitResult(correct=True, tokens=100)
        correct = pair[0] if task.arm == "base" else pair[1]
        return UnitResult(correct=bool(correct), tokens=100)

    async def __call__(self, task: UnitTask) -> UnitResult:
        self.calls.append(task)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            res = self.result(task)
            delay = self.latency(task, res)
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)
            return res
        finally:
            self.in_flight -= 1


@pytest.fixture
def outcome_table() -> Callable[..., OutcomeTable]:
    """Factory fixture: ``outcome_table({"A": [(0, 1), None, ...]}, latency=...)``."""
    return OutcomeTable
