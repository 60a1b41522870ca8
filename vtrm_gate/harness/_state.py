"""The training state (``state.json``): skill versions, probation, cooldown, rejected buffer."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._files import _whole

FORMAT = 1


@dataclass(frozen=True)
class SkillRef:
    """A type's current skill version, its content hash, and the highest version issued."""

    version: int
    hash: str
    latest: int


@dataclass(frozen=True)
class Probation:
    """A PROVISIONAL version on probation; ``prev_version`` is what a rollback restores."""

    version: int
    prev_version: int
    epoch: int
    step: int


@dataclass(frozen=True)
class Rejected:
    """A rejected candidate in the evolver's rejected buffer."""

    hash: str
    text: str
    epoch: int
    step: int
    action: str


@dataclass(frozen=True)
class TrainingState:
    """``state.json``: everything a step's Phase D changes, checkpointed once per step.

    ``steps_applied`` counts applied steps (the cooldown clock: a type is cooling down while
    ``cooldown_until[t] > steps_applied``). ``before_last`` is the state before the last
    applied step, so that step can be re-run (idempotently) until the epoch is settled.
    """

    skills: Mapping[str, SkillRef]
    probation: Mapping[str, Probation] = field(default_factory=dict)
    cooldown_until: Mapping[str, int] = field(default_factory=dict)
    rejected: Mapping[str, tuple[Rejected, ...]] = field(default_factory=dict)
    steps_applied: int = 0
    last_step: tuple[int, int] | None = None
    before_last: TrainingState | None = None
    settled_epochs: tuple[int, ...] = ()

    def settled_version(self, task_type: str) -> int:
        """The type's last settled version: what a rollback restores, and the base every
        gate of the type is run against (so an ACCEPT is always against a settled version)."""
        p = self.probation.get(task_type)
        return p.prev_version if p is not None else self.skills[task_type].version

    def in_cooldown(self, task_type: str) -> bool:
        return self.cooldown_until.get(task_type, 0) > self.steps_applied

    def rejected_texts(self, task_type: str) -> list[str]:
        return [r.text for r in self.rejected.get(task_type, ())]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "skills": {t: dataclasses.asdict(s) for t, s in sorted(self.skills.items())},
            "probation": {t: dataclasses.asdict(p) for t, p in sorted(self.probation.items())},
            "cooldown_until": dict(sorted(self.cooldown_until.items())),
            "rejected": {t: [dataclasses.asdict(r) for r in rs]
                         for t, rs in sorted(self.rejected.items())},
            "steps_applied": self.steps_applied,
            "last_step": None if self.last_step is None else list(self.last_step),
            "before_last": None if self.before_last is None else self.before_last.to_json(),
            "settled_epochs": list(self.settled_epochs),
        }

    @classmethod
    def from_json(cls, data: Any, where: str = "state") -> TrainingState:
        """Parse and validate; ValueError names the offending key path."""
        def need(cond: bool, key: str, what: str, value: object) -> None:
            if not cond:
                raise ValueError(f"{where}.{key} must be {what}, got {value!r}")

        need(isinstance(data, dict), "", "an object", type(data).__name__)
        need(data.get("format") == FORMAT, "format", str(FORMAT), data.get("format"))
        skills: dict[str, SkillRef] = {}
        raw = data.get("skills")
        need(isinstance(raw, dict), "skills", "an object {type: {version, hash, latest}}", raw)
        for t, s in raw.items():
            need(isinstance(s, dict) and _whole(s.get("version")) and s["version"] >= 1
                 and _whole(s.get("latest")) and s["latest"] >= s["version"]
                 and isinstance(s.get("hash"), str) and len(s["hash"]) == 64,
                 f"skills[{t!r}]", "{version >= 1, latest >= version, hash: sha256}", s)
            skills[t] = SkillRef(s["version"], s["hash"], s["latest"])
        probation: dict[str, Probation] = {}
        for t, p in (data.get("probation") or {}).items():
            try:
                probation[t] = Probation(**p)
            except TypeError:
                need(False, f"probation[{t!r}]", "{version, prev_version, epoch, step}", p)
            need(all(_whole(getattr(probation[t], k)) for k in
                     ("version", "prev_version", "epoch", "step")),
                 f"probation[{t!r}]", "integers", p)
        cooldown = data.get("cooldown_until") or {}
        need(isinstance(cooldown, dict) and all(_whole(v) for v in cooldown.values()),
             "cooldown_until", "an object {type: integer}", cooldown)
        rejected: dict[str, tuple[Rejected, ...]] = {}
        for t, rs in (data.get("rejected") or {}).items():
            need(isinstance(rs, list), f"rejected[{t!r}]", "a list", rs)
            try:
                rejected[t] = tuple(Rejected(**r) for r in rs)
            except TypeError:
                need(False, f"rejected[{t!r}]", "a list of {hash, text, epoch, step, action}",
                     rs)
        steps_applied = data.get("steps_applied", 0)
        need(_whole(steps_applied) and steps_applied >= 0, "steps_applied", "an integer >= 0",
             steps_applied)
        last = data.get("last_step")
        need(last is None or (isinstance(last, list) and len(last) == 2
                              and all(_whole(x) for x in last)),
             "last_step", "null or [epoch, step]", last)
        before = data.get("before_last")
        settled = data.get("settled_epochs") or []
        need(isinstance(settled, list) and all(_whole(x) for x in settled), "settled_epochs",
             "a list of integers", settled)
        return cls(skills, probation, dict(cooldown), rejected, steps_applied,
                   None if last is None else (last[0], last[1]),
                   None if before is None else cls.from_json(before, f"{where}.before_last"),
                   tuple(settled))



