"""One validated configuration (SPEC §8): a TOML/JSON file, then environment / ``.env``.

Precedence: defaults < file < ``.env`` < process environment. Unknown keys are refused
naming the valid ones; the removed key ``gate_block`` is refused saying why.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ._env import DEFAULT_TTL, check_redis_url, mask_url, read_dotenv
from .scheduler import GuardParams
from .stats import GateParams

REMOVED_KEYS = {
    "gate_block": "gate_block was removed in v3: the gate decides after every unit along the "
                  "ladder prefix (pair-by-pair sequential), so there are no blocks; the "
                  "statistics are unchanged and the anytime-valid guarantee holds at any stop",
}

# Environment variables and the config keys they set.
ENV_KEYS = {
    "VTRM_CONCURRENCY": "concurrency",
    "REDIS_URL": "redis_url",
    "REDIS_CACHE_TTL": "redis_cache_ttl",
    "VTRM_CACHE_PREFIX": "cache_prefix",
    "VTRM_CACHE": "cache_enabled",
    "VTRM_CACHE_SHARE": "cache_share",
    "VTRM_DISPATCH": "dispatch",
    "VTRM_CANCEL_AFTER_FREEZE": "cancel_after_freeze",
}
DISPATCH_NAMES = ("round_robin", "need_aware")  # `vtrm_gate.dispatch.resolve_dispatch`
# Keys of the ``[cache]`` table and the Config fields they set.
CACHE_TABLE = {"share": "cache_share"}


class ConfigError(ValueError):
    """A configuration value or key is invalid; the message names it."""


@dataclass(frozen=True)
class Config:
    """Everything a gate step needs to know, validated once and passed in explicitly."""

    concurrency: int = 32
    gate: GateParams = field(default_factory=GateParams)
    guard: GuardParams = field(default_factory=GuardParams)
    redis_url: str | None = field(default=None, repr=False)
    redis_cache_ttl: int = DEFAULT_TTL
    cache_prefix: str = "llm_cache"
    cache_enabled: bool = True
    cache_share: str | None = None
    """``[cache] share = "name"`` (or ``VTRM_CACHE_SHARE``): share cached LLM samples with
    every workspace configured with the same name (default: each workspace's are its own)."""
    dispatch: str = "round_robin"
    """Which type the gate feeds next (`vtrm_gate.dispatch`); decisions do not depend on it."""
    cancel_after_freeze: bool = False
    """Cancel a frozen type's in-flight calls instead of letting them finish."""

    def __post_init__(self) -> None:
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) \
                or self.concurrency < 1:
            raise ConfigError(f"concurrency must be an integer >= 1, got {self.concurrency!r}")
        if isinstance(self.redis_cache_ttl, bool) or not isinstance(self.redis_cache_ttl, int) \
                or self.redis_cache_ttl < 1:
            raise ConfigError(f"redis_cache_ttl must be an integer >= 1 (seconds), "
                              f"got {self.redis_cache_ttl!r}")
        if not isinstance(self.cache_prefix, str) or not self.cache_prefix \
                or any(c in self.cache_prefix for c in "*?[] "):
            raise ConfigError(f"cache_prefix must be a non-empty string without glob "
                              f"characters or spaces, got {self.cache_prefix!r}")
        if self.cache_share is not None and (not isinstance(self.cache_share, str)
                                             or not self.cache_share.strip()
                                             or any(c.isspace() for c in self.cache_share)):
            raise ConfigError(f"cache.share must be a non-empty name without spaces, "
                              f"got {self.cache_share!r}")
        if self.dispatch not in DISPATCH_NAMES:
            raise ConfigError(f"dispatch must be one of {', '.join(DISPATCH_NAMES)}, "
                              f"got {self.dispatch!r}")
        if not isinstance(self.cancel_after_freeze, bool):
            raise ConfigError(f"cancel_after_freeze must be on/off (true/false), "
                              f"got {self.cancel_after_freeze!r}")
        if self.redis_url is not None and not isinstance(self.redis_url, str):
            raise ConfigError(f"redis_url must be a string (a redis://, rediss:// or unix:// "
                              f"URL), got {type(self.redis_url).__name__}")
        if self.redis_url is not None:
            try:
                check_redis_url(self.redis_url)
            except ValueError as exc:
                raise ConfigError(f"redis_url: {exc}") from None

    def __repr__(self) -> str:
        return (f"Config(concurrency={self.concurrency}, gate={self.gate}, guard={self.guard}, "
                f"redis_url={self._masked_url!r}, "
                f"redis_cache_ttl={self.redis_cache_ttl}, cache_prefix={self.cache_prefix!r}, "
                f"cache_enabled={self.cache_enabled}, cache_share={self.cache_share!r}, "
                f"dispatch={self.dispatch!r}, cancel_after_freeze={self.cancel_after_freeze})")

    @property
    def _masked_url(self) -> str | None:
        return None if self.redis_url is None else mask_url(self.redis_url)

    def as_dict(self) -> dict[str, Any]:
        """Plain values (password masked) for manifests and reports."""
        return {
            "concurrency": self.concurrency,
            "gate": {f.name: getattr(self.gate, f.name) for f in fields(GateParams)},
            "guard": {f.name: getattr(self.guard, f.name) for f in fields(GuardParams)},
            "redis_url": self._masked_url,
            "redis_cache_ttl": self.redis_cache_ttl,
            "cache_prefix": self.cache_prefix,
            "cache_enabled": self.cache_enabled,
            "cache_share": self.cache_share,
            "dispatch": self.dispatch,
            "cancel_after_freeze": self.cancel_after_freeze,
        }


def _valid_keys() -> dict[str, set[str] | None]:
    top: dict[str, set[str] | None] = {f.name: None for f in fields(Config)}
    top["gate"] = {f.name for f in fields(GateParams)}
    top["guard"] = {f.name for f in fields(GuardParams)}
    top["cache"] = set(CACHE_TABLE)  # [cache] share = "name" sets cache_share
    return top


def _refuse_unknown(key: str, valid: set[str], where: str) -> None:
    if key in REMOVED_KEYS:
        raise ConfigError(f"{where}{key}: {REMOVED_KEYS[key]}")
    raise ConfigError(f"unknown config key '{where}{key}'; valid keys: "
                      f"{', '.join(sorted(valid))}")


def _coerce_bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be on/off (true/false), got {v!r}")


def _coerce_int(name: str, v: Any) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    try:
        return int(str(v).strip())
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {v!r}") from None


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text ({exc.reason} at byte "
                          f"{exc.start})") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path} is malformed: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a table of keys")
    return data


def config_from_mapping(data: Mapping[str, Any]) -> Config:
    """Build a Config from nested plain values, refusing unknown and removed keys."""
    valid = _valid_keys()
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in valid:
            _refuse_unknown(key, set(valid), "")
        sub = valid[key]
        if key == "cache":
            if not isinstance(value, Mapping):
                raise ConfigError(f"cache must be a table of {', '.join(sorted(sub or ()))}")
            for k, v in value.items():
                if k not in CACHE_TABLE:
                    _refuse_unknown(k, set(CACHE_TABLE), "cache.")
                kwargs[CACHE_TABLE[k]] = v
            continue
        if sub is not None:
            if isinstance(value, GateParams | GuardParams):
                kwargs[key] = value
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(f"{key} must be a table of {', '.join(sorted(sub))}")
            for k in value:
                if k not in sub:
                    _refuse_unknown(k, sub, f"{key}.")
            try:
                kwargs[key] = (GateParams if key == "gate" else GuardParams)(**value)
            except (TypeError, ValueError) as exc:  # TypeError: e.g. a string compared to 0
                raise ConfigError(str(exc)) from None
        elif key == "redis_cache_ttl" or key == "concurrency":
            kwargs[key] = _coerce_int(key, value)
        elif key in ("cache_enabled", "cancel_after_freeze"):
            kwargs[key] = _coerce_bool(key, value)
        else:
            kwargs[key] = value
    return Config(**kwargs)


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None,
                dotenv: str | Path | None = ".env") -> Config:
    """Defaults, then ``path`` (TOML or JSON), then ``dotenv``, then ``env`` (os.environ)."""
    data: dict[str, Any] = {}
    if path is not None:
        data.update(_read_file(Path(path)))
    layered: dict[str, str] = {}
    if dotenv is not None:
        layered.update(read_dotenv(dotenv))
    layered.update(os.environ if env is None else env)
    for var, key in ENV_KEYS.items():
        if var in layered and layered[var] != "":
            data[key] = layered[var]
    if "VTRM_GATE_BLOCK" in layered or "GATE_BLOCK" in layered:
        raise ConfigError(f"GATE_BLOCK: {REMOVED_KEYS['gate_block']}")
    return config_from_mapping(data)
