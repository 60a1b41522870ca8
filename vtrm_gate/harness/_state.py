"""The training state (``state.json``): skill versions, probation, cooldown, rejected buffer."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError, shown
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
    def from_json(cls, data: Any, where: str = "state", nested: bool = False
                  ) -> TrainingState:
        """Parse and validate; ValueError names the offending key path (``nested``: the
        ``before_last`` of a state, which holds no ``before_last`` of its own)."""
        _need(isinstance(data, dict), where, "", "an object", type(data).__name__)
        _need(data.get("format") == FORMAT, where, "format", str(FORMAT), data.get("format"))
        raw = data.get("skills")
        _need(isinstance(raw, dict), where, "skills", "an object {type: {version, hash, "
              "latest}}", raw)
        skills = {t: _skill_ref(s, f"{where}.skills[{t!r}]") for t, s in raw.items()}
        probation = {t: _probation(p, f"{where}.probation[{t!r}]")
                     for t, p in _mapping(data, "probation", where).items()}
        cooldown = _mapping(data, "cooldown_until", where)
        _need(all(_whole(v) and v >= 0 for v in cooldown.values()), where, "cooldown_until",
              "an object {type: integer >= 0}", cooldown)
        rejected = {t: _rejected(rs, f"{where}.rejected[{t!r}]")
                    for t, rs in _mapping(data, "rejected", where).items()}
        steps_applied = data.get("steps_applied", 0)
        _need(_whole(steps_applied) and steps_applied >= 0, where, "steps_applied",
              "an integer >= 0", steps_applied)
        last = data.get("last_step")
        _need(last is None or (isinstance(last, list) and len(last) == 2
                               and all(_whole(x) and x >= 1 for x in last)),
              where, "last_step", "null or [epoch, step] (integers >= 1)", last)
        before = data.get("before_last")
        _need(before is None or not nested, where, "before_last",
              "null (a checkpoint keeps one state back)", "an object")
        settled = data.get("settled_epochs") or []
        _need(isinstance(settled, list) and all(_whole(x) and x >= 1 for x in settled), where,
              "settled_epochs", "a list of integers >= 1", settled)
        return cls(skills, probation, dict(cooldown), rejected, steps_applied,
                   None if last is None else (last[0], last[1]),
                   None if before is None else cls.from_json(before, f"{where}.before_last",
                                                             nested=True),
                   tuple(settled))

    def check_types(self, types: Iterable[str], where: str = "state") -> None:
        """ValueError unless every type named here is one of ``types`` (skills exactly) and
        every probation's versions were issued (1 <= version <= the type's latest)."""
        known = set(types)
        missing, extra = sorted(known - set(self.skills)), sorted(set(self.skills) - known)
        if missing or extra:
            raise InputError(f"{where}.skills must list exactly the types of pool.json "
                             f"(missing {missing}, unknown {extra})")
        for field_name in ("probation", "cooldown_until", "rejected"):
            unknown = sorted(set(getattr(self, field_name)) - known)
            if unknown:
                raise InputError(f"{where}.{field_name} names unknown type(s) {unknown} "
                                 f"(not in pool.json)")
        for t, p in self.probation.items():
            latest = self.skills[t].latest
            if not (1 <= p.prev_version <= latest and 1 <= p.version <= latest):
                raise InputError(f"{where}.probation[{t!r}]: versions v{p.prev_version} -> "
                                 f"v{p.version} must have been issued (1 .. v{latest})")
        if self.before_last is not None:
            self.before_last.check_types(known, f"{where}.before_last")


def _need(cond: bool, where: str, key: str, what: str, value: object) -> None:
    if not cond:
        raise InputError(f"{where}{'.' + key if key else ''} must be {what}, "
                         f"got {shown(value)}")


def _mapping(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    _need(isinstance(value, dict), where, key, "an object {type: ...}", value)
    return value


def _skill_ref(s: Any, where: str) -> SkillRef:
    _need(isinstance(s, dict) and _whole(s.get("version")) and s["version"] >= 1
          and _whole(s.get("latest")) and s["latest"] >= s["version"]
          and isinstance(s.get("hash"), str) and len(s["hash"]) == 64, where, "",
          "{version >= 1, latest >= version, hash: sha256}", s)
    return SkillRef(s["version"], s["hash"], s["latest"])


def _probation(p: Any, where: str) -> Probation:
    keys = ("version", "prev_version", "epoch", "step")
    _need(isinstance(p, dict) and set(p) == set(keys) and all(
        _whole(p[k]) and p[k] >= 1 for k in keys), where, "",
        "{version, prev_version, epoch, step} (integers >= 1)", p)
    return Probation(**p)


def _rejected(rs: Any, where: str) -> tuple[Rejected, ...]:
    _need(isinstance(rs, list), where, "", "a list", rs)
    out = []
    for i, r in enumerate(rs):
        ok = isinstance(r, dict) and set(r) == {"hash", "text", "epoch", "step", "action"} \
            and isinstance(r["hash"], str) and isinstance(r["text"], str) \
            and isinstance(r["action"], str) and _whole(r["epoch"]) and _whole(r["step"])
        _need(ok, f"{where}[{i}]", "", "{hash, text, epoch, step, action}", r)
        out.append(Rejected(**r))
    return tuple(out)



