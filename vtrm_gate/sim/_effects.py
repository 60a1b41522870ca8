"""A simulated world's distribution of candidate effects (`World`): the shares of harmful,
neutral and helpful candidates and the size of a non-neutral shift, as a JSON file.

Scale: a candidate shifts the skill's *ability* on the logit scale of ``P(correct) =
sigmoid(ability - difficulty)``: a helpful one by ``+size``, a harmful one by ``-size``, a
neutral one by 0, with ``size ~ Uniform(size_min, size_max)`` (default 0.3..0.9, about +-7
to +-20 accuracy points at 50%). ``scope`` says what draws the class: ``candidate`` (every
candidate draws its own) or ``type`` (a type's class is drawn once for the whole run, the
simulator's original world, kept as the preset ``default``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from .._env import read_settings_text, user_path
from .._ids import strict_json
from ..errors import ConfigError, is_real, plain_fields

Scope = Literal["candidate", "type"]
SHARES: tuple[str, ...] = ("p_harmful", "p_neutral", "p_helpful")
SCOPES: tuple[str, ...] = ("candidate", "type")
_SUM_TOL = 1e-6


def _check_shares(where: str, shares: Mapping[str, Any]) -> None:
    """Each share a probability, and the three summing to 1 (errors name the field)."""
    for k in SHARES:
        if not (is_real(shares.get(k)) and 0 <= shares[k] <= 1):
            raise ConfigError(f"{where}{k} must be a number in [0, 1], got {shares.get(k)!r}")
    total = sum(shares[k] for k in SHARES)
    if abs(total - 1) > _SUM_TOL:
        raise ConfigError(f"{where}p_harmful + p_neutral + p_helpful must sum to 1, got "
                          f"{total:.6g}")


@dataclass(frozen=True)
class World:
    """The distribution every candidate's true effect is drawn from (logit-scale shifts).

    Field defaults are the simulator's original shares and sizes, drawn per candidate;
    ``World.preset("default")`` is the original world exactly (drawn per type).
    """

    p_harmful: float = 0.25
    p_neutral: float = 0.35
    p_helpful: float = 0.40
    size_min: float = 0.3
    """Smallest |ability shift| of a harmful or helpful candidate (logit scale)."""
    size_max: float = 0.9
    """Largest |ability shift| (the size is uniform between the two)."""
    scope: Scope = "candidate"
    """``candidate``: each candidate draws its class; ``type``: once per type and run."""
    types: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Per-type shares overriding the shared ones: ``{type: {p_harmful, p_neutral,
    p_helpful}}`` (sizes and scope stay shared)."""

    def __post_init__(self) -> None:
        plain_fields(self)
        _check_shares("World.", {k: getattr(self, k) for k in SHARES})
        for k in ("size_min", "size_max"):
            v = getattr(self, k)
            if not (is_real(v) and v >= 0):
                raise ConfigError(f"World.{k} must be a finite number >= 0, got {v!r}")
        if self.size_min > self.size_max:
            raise ConfigError(f"World.size_min ({self.size_min}) must be <= size_max "
                              f"({self.size_max})")
        if self.scope not in SCOPES:
            raise ConfigError(f"World.scope must be one of {list(SCOPES)}, got {self.scope!r}")
        if not isinstance(self.types, Mapping):
            raise ConfigError(f"World.types must be an object of type -> shares, got "
                              f"{self.types!r}")
        copy = {}
        for t, shares in self.types.items():
            if not isinstance(shares, Mapping) or set(shares) != set(SHARES):
                raise ConfigError(f"World.types[{t!r}] must be an object with exactly "
                                  f"{list(SHARES)}, got {shares!r}")
            _check_shares(f"World.types[{t!r}].", shares)
            copy[str(t)] = {k: float(shares[k]) for k in SHARES}
        object.__setattr__(self, "types", copy)  # a private copy; plain dicts pickle

    def shares(self, task_type: str | None = None) -> tuple[float, float, float]:
        """``(p_harmful, p_neutral, p_helpful)`` of ``task_type`` (its override, if any)."""
        s = self.types.get(task_type) if task_type is not None else None
        return (s["p_harmful"], s["p_neutral"], s["p_helpful"]) if s else (
            self.p_harmful, self.p_neutral, self.p_helpful)

    def classify(self, u: float, task_type: str | None = None) -> str:
        """The effect class a uniform ``u`` in (0, 1) draws: helpful below ``p_helpful``,
        harmful from ``1 - p_harmful``, neutral between."""
        harmful, _, helpful = self.shares(task_type)
        return "helpful" if u < helpful else "neutral" if u < 1 - harmful else "harmful"

    def size(self, u: float) -> float:
        """The |ability shift| a uniform ``u`` draws: uniform in [size_min, size_max]."""
        return self.size_min + (self.size_max - self.size_min) * u

    # ---- JSON ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (``effect_scale`` states the scale of the sizes)."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["types"] = {t: dict(s) for t, s in self.types.items()}
        return {**out, "effect_scale": "logit"}

    @classmethod
    def from_dict(cls, data: object, where: str = "world") -> World:
        """A world from JSON values; missing fields take the defaults. Errors name ``where``
        and the field."""
        if isinstance(data, str):
            return cls.preset(data)
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}: must be a JSON object of World fields or a preset "
                              f"name {list(PRESETS)}, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        body = dict(data)
        scale = body.pop("effect_scale", "logit")
        if scale != "logit":
            raise ConfigError(f"{where}: effect_scale must be 'logit', got {scale!r}")
        extra = sorted(set(body) - known)
        if extra:
            raise ConfigError(f"{where}: unknown field {extra[0]!r}; fields are "
                              f"{sorted(known)}")
        if any(k in body for k in SHARES) and not all(k in body for k in SHARES):
            missing = [k for k in SHARES if k not in body]
            raise ConfigError(f"{where}: {missing[0]} missing: give all of {list(SHARES)}")
        try:
            return cls(**body)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {str(exc).removeprefix('World.')}") from None

    def to_json(self, path: str | Path | None = None) -> str:
        """The world as JSON text; written to ``path`` too when given."""
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        if path is not None:
            user_path(path).write_text(text, encoding="utf-8")
        return text

    @classmethod
    def from_json(cls, source: str | Path) -> World:
        """A world from a JSON file (or a preset name such as ``mostly_harmful``); a bad file
        raises `ConfigError` naming the file and the field."""
        if isinstance(source, str) and source in PRESETS:
            return PRESETS[source]
        path = user_path(source)
        try:
            text = read_settings_text(path)
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(f"{path}: cannot read the world file ({why}); presets are "
                              f"{list(PRESETS)}") from None
        try:
            data = strict_json(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
        except RecursionError:
            raise ConfigError(f"{path}: nested too deeply to be a world file") from None
        if isinstance(data, str):
            raise ConfigError(f"{path}: must be a JSON object of World fields")
        return cls.from_dict(data, where=str(path))

    @classmethod
    def preset(cls, name: str) -> World:
        """A named world: ``default`` (the original, drawn per type), ``mostly_harmful``,
        ``mostly_neutral``, ``mostly_helpful`` (drawn per candidate)."""
        if not isinstance(name, str):
            raise ConfigError(f"a world preset is named by text, got {type(name).__name__}; "
                              f"presets are {list(PRESETS)}")
        try:
            return PRESETS[name]
        except KeyError:
            raise ConfigError(f"unknown world preset {name!r}; presets are "
                              f"{list(PRESETS)}") from None


PRESETS: Mapping[str, World] = MappingProxyType({
    "default": World(scope="type"),
    "mostly_harmful": World(p_harmful=0.6, p_neutral=0.25, p_helpful=0.15),
    "mostly_neutral": World(p_harmful=0.15, p_neutral=0.7, p_helpful=0.15),
    "mostly_helpful": World(p_harmful=0.15, p_neutral=0.25, p_helpful=0.6),
})
"""The named worlds; ``default`` reproduces the simulator's runs from before worlds."""
