"""A tiny, fully scripted world for the harness tests (imported by the other harness tests).

A skill's text carries ``level=K``; a unit has a difficulty in 0..9; the agent answers
right iff ``level >= difficulty``. So a candidate one level up wins exactly the units of
that difficulty, and both arms agree everywhere else: decisions are easy to predict.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vtrm_gate._ids import slugify
from vtrm_gate.gate import UnitResult, UnitTask
from vtrm_gate.harness import Workspace, WorkspaceConfig

_LEVEL = re.compile(r"level=(-?\d+)")


def skill(task_type: str, level: int, note: str = "") -> str:
    return f"# {task_type}\n\nlevel={level}\n{note}"


def level_of(text: str) -> int:
    m = _LEVEL.search(text)
    return int(m.group(1)) if m else 0


def difficulty(unit_id: str) -> int:
    """0..9, spread evenly: the unit's index modulo 10."""
    return int(unit_id.rsplit("-", 1)[1]) % 10


def units(task_type: str, n: int) -> list[str]:
    return [f"{slugify(task_type)}-{i:03d}" for i in range(n)]


def correct(task_type: str, unit_id: str, text: str) -> bool:
    return level_of(text) >= difficulty(unit_id)


@dataclass
class ToyInfer:
    """Deterministic agent; ``latency`` seconds per call; INFRA on scripted (type, arm)s."""

    latency: float | Callable[[UnitTask], float] = 0.0
    infra: Mapping[str, str] = field(default_factory=dict)  # type -> "base" | "cand" | "both"
    calls: list[UnitTask] = field(default_factory=list)

    async def __call__(self, task: UnitTask) -> UnitResult:
        self.calls.append(task)
        delay = self.latency(task) if callable(self.latency) else self.latency
        await asyncio.sleep(delay)
        arm = self.infra.get(task.task_type)
        if arm in (task.arm, "both"):
            return UnitResult(infra=True, error="503 Service Unavailable (toy)", latency_s=delay)
        ok = correct(task.task_type, task.unit_id, task.skill)
        h = int(hashlib.sha256(task.unit_id.encode()).hexdigest()[:4], 16)
        return UnitResult(correct=ok, prediction="A" if ok else "B", latency_s=delay,
                          tokens=100 + h % 50, trace={"level": level_of(task.skill)})


@dataclass
class ToyEvolver:
    """Proposes ``level + delta[type]`` (0 = no real change); records every call."""

    delta: Mapping[str, int]
    calls: list[tuple[str, str, tuple[str, ...], int, int]] = field(default_factory=list)
    fail: Sequence[str] = ()

    async def evolve(self, task_type: str, current_skill: str, rejected: Sequence[str],
                     epoch: int, step: int) -> str:
        self.calls.append((task_type, current_skill, tuple(rejected), epoch, step))
        await asyncio.sleep(0)
        if task_type in self.fail:
            raise RuntimeError("evolver LLM timed out")
        d = self.delta.get(task_type, 0)
        if d == 0:
            return current_skill
        new = level_of(current_skill) + d
        return skill(task_type, new, f"tried at e{epoch} s{step} after {len(rejected)} rejects\n")


def make_workspace(path: Path, sizes: Mapping[str, int], levels: Mapping[str, int] | None = None,
                   seed_record: Mapping[str, Mapping[str, bool]] | None = None,
                   **config: object) -> Workspace:
    """A custom workspace: pools of the given sizes, skills at ``levels`` (default 5)."""
    levels = levels or {}
    return Workspace.create(
        path, pool={t: units(t, n) for t, n in sizes.items()},
        skills={t: skill(t, levels.get(t, 5)) for t in sizes},
        seed_record=seed_record, config=WorkspaceConfig(agent={"backend": "toy"}, **config))


def cases_first(sizes: Mapping[str, int],
                k: int = 2) -> Callable[[str, int, int, str], list[str]]:
    """Error cases: the first ``k`` pool units the current skill gets wrong."""
    def cases(task_type: str, epoch: int, step: int, current: str) -> list[str]:
        pool = units(task_type, sizes[task_type])
        return [u for u in pool if not correct(task_type, u, current)][:k]
    return cases


def test_toy_world_is_consistent() -> None:
    assert level_of(skill("A", 7)) == 7
    assert correct("A", "a-003", skill("A", 3)) and not correct("A", "a-004", skill("A", 3))
