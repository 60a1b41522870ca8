"""The options of a run (SPEC §8): one validated value, resolved once, passed in whole.

Every command and the Python API build one `RunOptions` with `resolve_options` and hand it to
`vtrm_gate.backends.open_backend`, `run_step`, `train` and `settle_probation` unchanged.
Precedence, per key: a flag > the environment (the process, then ``.env``) > the config file
(TOML or JSON) > the default. `RunOptions.sources` says where each value came from
(``vtrm-gate options``). ``concurrency`` and ``probation_rule`` are `UNSET` unless given: an
unset concurrency is 32 slots, or the endpoints' summed caps for a workspace with several;
the probation rule is fixed at ``init`` and comes from the workspace (a different value given
here is refused). Unknown keys are refused naming the valid ones, and so is a variable of
ours (``VTRM_*``, ``REDIS_CACHE_*``) that nearly spells a setting's; the removed key
``gate_block`` is refused saying why.

Decision fields (``gate``, ``guard``) go into a step manifest's diffed inputs; execution
fields (concurrency, dispatch, cancel policy, clock, cache, an LLM call's adaptive
concurrency, timeout, deadline and retries) are recorded beside them and never block a
re-run (`RunOptions.decision_inputs`, `RunOptions.execution`). The LLM steps' ``max_tokens``
change answers: the llm backend puts them into the agent config, which keys the caches and
is part of the manifest's inputs.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from ._env import (
    DEFAULT_CONCURRENCY,
    DEFAULT_DEADLINE_S,
    DEFAULT_MAX_RETRIES,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TIMEOUT_S,
    DEFAULT_TTL,
    MAX_TIME_SCALE,
    MAX_TTL,
    check_redis_url,
    mask_url,
    prefix_problem,
    read_dotenv,
    read_settings_text,
)
from ._ids import strict_json
from .errors import ConfigError, is_real, is_whole, not_utf8, plain_fields, shown
from .gate import (
    DEFAULT_DISPATCH,
    DISPATCH_NAMES,
    PAST_STOP_POLICIES,
    DispatchName,
    GuardParams,
    PastStop,
)
from .stats import DECISION_RULES, PROBATION_RULES, GateParams, decision_rule, fastest_accept

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_DEADLINE_S",
    "DEFAULT_DECISION_RULE",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_TIMEOUT_S",
    "ENV_KEYS",
    "EXECUTION_FIELDS",
    "MAX_TOKENS_FIELDS",
    "UNSET",
    "RunOptions",
    "Unset",
    "options_from_mapping",
    "resolve_options",
    "valid_keys",
]

REMOVED_KEYS = {
    "gate_block": "gate_block was removed in v3: the gate decides after every unit along the "
                  "ladder prefix (pair-by-pair sequential), so there are no blocks; the "
                  "statistics are unchanged and the anytime-valid guarantee holds at any stop",
}

# Environment variables and the keys they set.
ENV_KEYS = {
    "VTRM_CONCURRENCY": "concurrency",
    "REDIS_URL": "redis_url",
    "REDIS_CACHE_TTL": "redis_cache_ttl",
    "VTRM_CACHE_PREFIX": "cache_prefix",
    "VTRM_CACHE": "cache_enabled",
    "VTRM_CACHE_SHARE": "cache_share",
    "VTRM_DISPATCH": "dispatch",
    "VTRM_CANCEL_AFTER_FREEZE": "cancel_after_freeze",
    "VTRM_ADAPTIVE": "adaptive",
    "VTRM_TIMEOUT": "timeout",
    "VTRM_DEADLINE": "deadline",
    "VTRM_MAX_RETRIES": "max_retries",
    "VTRM_MAX_TOKENS_THINK": "max_tokens_think",
    "VTRM_MAX_TOKENS_ANSWER": "max_tokens_answer",
    "VTRM_MAX_TOKENS_EVOLVE": "max_tokens_evolve",
    "VTRM_PAST_STOP": "past_stop",
    "VTRM_GUARD_RULE": "guard.rule",
    "VTRM_DECISION_RULE": "decision_rule",
}
MAX_TOKENS_FIELDS = {f"max_tokens_{kind}": n for kind, n in DEFAULT_MAX_TOKENS.items()}
"""Each call kind's reply budget and its default (0: none sent, the server's default)."""
CACHE_TABLE = {"share": "cache_share"}  # keys of the ``[cache]`` table
EXECUTION_FIELDS = ("concurrency", "dispatch", "cancel_after_freeze", "past_stop", "adaptive",
                    "timeout", "deadline", "max_retries")
"""`RunOptions.execution`'s keys: recorded in a step's manifest beside its inputs; they
never change this step's decision on the same outcomes (a later step's can move: the base
answers past a stop they let complete join the BaselineCache, docs/limits.md)."""
DEFAULT_DECISION_RULE = "paired_betting"
"""The SPEC's rule; a manifest names its rule only when it is another (older ones compare
equal)."""
FLAG_ONLY = ("time_scale", "backend")
"""Keys set by a command-line flag (or the Python API) only, never by a file."""


class Unset:
    """The "not given" sentinel (one instance, `UNSET`): never a magic default value."""

    _instance: Unset | None = None

    def __new__(cls) -> Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> str:
        return "UNSET"


UNSET: Final = Unset()


@dataclass(frozen=True)
class RunOptions:
    """Everything a run (step, training run, settlement) takes, validated once."""

    concurrency: int | Unset = UNSET
    """Slots of the gate's pool (`UNSET`: `DEFAULT_CONCURRENCY`, 32, or the summed caps of
    several endpoints)."""
    gate: GateParams = field(default_factory=GateParams)
    guard: GuardParams = field(default_factory=GuardParams)
    decision_rule: str = DEFAULT_DECISION_RULE
    """The gate's decision rule (`vtrm_gate.stats.DECISION_RULES`): the SPEC's paired
    betting, or an opt-in one with the same guarantee (``lambda_mixture``, ``old_blocks``)."""
    dispatch: DispatchName = DEFAULT_DISPATCH
    """Which type the gate feeds next (`vtrm_gate.gate`: ``expected_need`` by default, or
    ``round_robin``, the SPEC's fair order, or ``need_aware``); decisions do not depend on
    it."""
    cancel_after_freeze: bool = True
    """Cancel a frozen type's in-flight calls whose answers serve nothing more (every
    candidate call; base-arm calls unless the baseline survives and fills the BaselineCache)
    instead of letting them finish."""
    past_stop: PastStop = "cancel"
    """Once every type has decided: ``cancel`` the calls still in flight (none can change a
    decision) or ``wait`` for them (stored, never counted) before the gate returns."""
    time_scale: float | None = None
    """Simulated workspaces: real seconds per simulated second (None: the virtual clock)."""
    redis_url: str | None = field(default=None, repr=False)
    """The response cache's Redis (None: the workspace's embedded server)."""
    redis_cache_ttl: int = DEFAULT_TTL
    cache_prefix: str = "llm_cache"
    cache_enabled: bool = True
    cache_share: str | None = None
    """Share cached LLM samples with every workspace configured with the same name."""
    probation_rule: str | Unset = UNSET
    """Fixed at ``init``: given here it must equal the workspace's (`with_workspace`)."""
    backend: str | None = None
    """Your own agent, a factory ``package.module:function`` (default: the workspace's
    ``agent.backend``; see `vtrm_gate.llm.AgentBackend`)."""
    adaptive: bool = True
    """LLM endpoints: each one's concurrency adapts to its latency (start low, grow while
    latency holds, back off on timeouts / 429 / 503), within ``concurrency``."""
    timeout: float = DEFAULT_TIMEOUT_S
    """LLM calls: each attempt's timeout in seconds (longer when the endpoint is observed
    slower; always ending before ``deadline``)."""
    deadline: float = DEFAULT_DEADLINE_S
    """LLM calls: each call's deadline in seconds, every attempt and wait included."""
    max_retries: int = DEFAULT_MAX_RETRIES
    """LLM calls: retries after the first attempt (429, 5xx, timeouts, dropped bodies)."""
    max_tokens_think: int | Unset | None = UNSET
    """The think call's reply budget (`UNSET`: the workspace's ``agent.max_tokens``, else
    512; None: none sent, 0 in a flag, variable or file). It changes answers, so it keys the
    caches (the agent config)."""
    max_tokens_answer: int | Unset | None = UNSET
    """The answer call's reply budget (`UNSET`: ``agent.max_tokens``, else 64; None: none)."""
    max_tokens_evolve: int | Unset | None = UNSET
    """The evolver's reply budget (`UNSET`: 2048; None: none sent)."""
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    """Where each resolved value came from: ``flag --x``, ``env X``, ``file P``, ``default``."""

    def __post_init__(self) -> None:
        plain_fields(self)
        c = self.concurrency
        if c is not UNSET and (not is_whole(c) or c < 1):
            raise ConfigError(f"concurrency must be an integer >= 1, got {shown(c)}")
        if not isinstance(self.gate, GateParams) or not isinstance(self.guard, GuardParams):
            raise ConfigError("gate and guard must be GateParams and GuardParams")
        if self.decision_rule not in DECISION_RULES:
            raise ConfigError(f"decision_rule must be one of {', '.join(DECISION_RULES)}, "
                              f"got {shown(self.decision_rule)}")
        _check_reach(self.gate, self.decision_rule)
        if self.dispatch not in DISPATCH_NAMES:
            raise ConfigError(f"dispatch must be one of {', '.join(DISPATCH_NAMES)}, "
                              f"got {shown(self.dispatch)}")
        if self.past_stop not in PAST_STOP_POLICIES:
            raise ConfigError(f"past_stop must be one of {', '.join(PAST_STOP_POLICIES)}, "
                              f"got {shown(self.past_stop)}")
        for name in ("cancel_after_freeze", "cache_enabled"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be on/off (true/false), "
                                  f"got {shown(getattr(self, name))}")
        ts = self.time_scale
        if ts is not None and not (is_real(ts) and 0 <= ts <= MAX_TIME_SCALE):
            raise ConfigError(f"time_scale must be a number from 0 to {MAX_TIME_SCALE:g} (real "
                              f"seconds per simulated second; 1 is real time), got {shown(ts)}")
        self._check_cache()
        self._check_agent()
        if self.backend is not None and (not isinstance(self.backend, str)
                                         or self.backend.count(":") != 1):
            raise ConfigError(f"backend {self.backend!r}: expected 'package.module:function'")
        if self.probation_rule is not UNSET and self.probation_rule not in PROBATION_RULES:
            raise ConfigError(f"probation_rule must be one of {', '.join(PROBATION_RULES)}, "
                              f"got {shown(self.probation_rule)}")

    def _check_agent(self) -> None:
        if not isinstance(self.adaptive, bool):
            raise ConfigError(f"adaptive must be on/off (true/false), got {shown(self.adaptive)}")
        for name in ("timeout", "deadline"):
            v = getattr(self, name)
            if not (is_real(v) and v > 0):
                raise ConfigError(f"{name} must be a number of seconds > 0, got {shown(v)}")
        if not is_whole(self.max_retries) or not 0 <= self.max_retries <= 100:
            raise ConfigError(f"max_retries must be an integer from 0 to 100, "
                              f"got {shown(self.max_retries)}")
        for name in MAX_TOKENS_FIELDS:
            v = getattr(self, name)
            if v is not UNSET and v is not None and (not is_whole(v) or not 1 <= v <= 1_000_000):
                raise ConfigError(f"{name} must be an integer from 1 to 1000000, or None "
                                  f"(none sent; 0 in a flag, variable or file), got {shown(v)}")

    def max_tokens(self, agent: Mapping[str, Any] | None = None) -> dict[str, int]:
        """Each call kind's ``max_tokens`` (``think``, ``answer``, ``evolve``): the value
        given, else the workspace agent's ``max_tokens`` (think and answer), else the
        default; 0 means none is sent."""
        legacy = (agent or {}).get("max_tokens")
        out = {}
        for name, default in MAX_TOKENS_FIELDS.items():
            kind = name.removeprefix("max_tokens_")  # the call kind
            v = getattr(self, name)
            if v is UNSET:
                v = legacy if is_whole(legacy) and kind != "evolve" else default
            out[kind] = 0 if v is None else int(v)
        return out

    def _check_cache(self) -> None:
        if not is_whole(self.redis_cache_ttl) or not 1 <= self.redis_cache_ttl <= MAX_TTL:
            raise ConfigError(f"redis_cache_ttl must be an integer from 1 to {MAX_TTL} "
                              f"(seconds), got {shown(self.redis_cache_ttl)}")
        if (bad := prefix_problem(self.cache_prefix)) is not None:
            raise ConfigError(f"cache_prefix {bad}")
        share = self.cache_share
        if share is not None and (not isinstance(share, str) or not share.strip()
                                  or any(c.isspace() for c in share)):
            raise ConfigError(f"cache.share must be a non-empty name without spaces, "
                              f"got {shown(share)}")
        if self.redis_url is not None:
            if not isinstance(self.redis_url, str):
                raise ConfigError(f"redis_url must be a string (a redis://, rediss://, "
                                  f"unix://, redis+cluster:// or rediss+cluster:// URL), got "
                                  f"{type(self.redis_url).__name__}")
            try:
                check_redis_url(self.redis_url)
            except ValueError as exc:
                raise ConfigError(f"redis_url: {exc}") from None

    # ---- derived values ----

    @property
    def slots(self) -> int:
        """The gate's slot count: ``concurrency``, or 32 when it was not given."""
        return DEFAULT_CONCURRENCY if self.concurrency is UNSET else int(self.concurrency)  # type: ignore[arg-type]  # not UNSET

    @property
    def masked_redis_url(self) -> str | None:
        return None if self.redis_url is None else mask_url(self.redis_url)

    def replace(self, source: str = "resolved", **changes: Any) -> RunOptions:
        """A copy with ``changes`` (validated again), each recorded as coming from ``source``."""
        return dataclasses.replace(self, **changes,
                                   sources={**self.sources, **dict.fromkeys(changes, source)})

    def with_workspace(self, probation_rule: str, where: str = "workspace.json") -> RunOptions:
        """Settle the settings fixed at ``init`` against the workspace's: unset ones come from
        it; a different value given by a flag, the environment or a file is refused."""
        given = self.probation_rule
        if given is not UNSET and given != probation_rule:
            raise ConfigError(
                f"probation_rule is fixed when the workspace is created ({where} says "
                f"{probation_rule!r}); {self.sources.get('probation_rule', 'an option')} says "
                f"{given!r}: remove it, or create a new workspace with --probation-rule {given}")
        return self.replace(where, probation_rule=probation_rule) if given is UNSET else self

    def decision_inputs(self) -> dict[str, Any]:
        """The fields that can change a decision, as plain values (a manifest's inputs)."""
        out: dict[str, Any] = {"params": _plain(self.gate), "guard": self.guard.inputs()}
        if self.decision_rule != DEFAULT_DECISION_RULE:  # older manifests compare equal
            out["decision_rule"] = self.decision_rule
        return out

    def execution(self) -> dict[str, Any]:
        """The fields that never change the step's decision on its outcomes (recorded beside
        a manifest's inputs; `EXECUTION_FIELDS`)."""
        return {name: self.slots if name == "concurrency" else getattr(self, name)
                for name in EXECUTION_FIELDS}

    def as_dict(self) -> dict[str, Any]:
        """Plain values (password masked) for manifests, reports and ``--json``."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "sources":
                continue
            v = getattr(self, f.name)
            if f.name == "redis_url":
                v = self.masked_redis_url
            elif isinstance(v, GateParams | GuardParams):
                v = _plain(v)
            elif v is UNSET:
                v = None
            out[f.name] = v
        return out

    def explain(self, agent: Mapping[str, Any] | None = None) -> list[tuple[str, Any, str]]:
        """(key, value, where it came from) for every option, nested keys dotted; a budget
        not given shows the value a run uses (`max_tokens`, with the workspace ``agent``)."""
        budgets = self.max_tokens(agent)
        legacy = is_whole((agent or {}).get("max_tokens"))
        rows = []
        for key, value in self.as_dict().items():
            items = value.items() if isinstance(value, dict) else [(None, value)]
            for sub, v in items:
                name = key if sub is None else f"{key}.{sub}"
                shown, default = v, "default"
                if name == "concurrency":
                    shown = self.slots
                    default = f"default ({DEFAULT_CONCURRENCY}, or the endpoints' summed caps)"
                elif name in MAX_TOKENS_FIELDS and v is None:
                    shown = budgets[name.removeprefix("max_tokens_")]
                    if legacy and name != "max_tokens_evolve":
                        default = "workspace agent.max_tokens"
                rows.append((name, shown, self.sources.get(name, default)))
        return rows

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        return f"RunOptions({inner})"


def _check_reach(gate: GateParams, rule: str) -> None:
    """Refuse gate parameters under which not even a ladder of straight wins is accepted:
    every candidate of every step would be gated out (a whole training run for nothing)."""
    if fastest_accept(gate, decision_rule(rule)) is not None:
        return
    need = fastest_accept(dataclasses.replace(gate, n_max=_REACH_HINT), decision_rule(rule))
    hint = (f"raise n_max to at least {need}, or lower e_confirm or w_net_min" if need
            else "lower e_confirm or w_net_min")
    raise ConfigError(
        f"gate: no candidate can ever be accepted with e_confirm = {gate.e_confirm:g}, "
        f"w_net_min = {gate.w_net_min}, lambda_dir = {gate.lambda_dir:g}, delta_min = "
        f"{gate.delta_min:g} and n_max = {gate.n_max} under the {rule} rule: even "
        f"{gate.n_max} straight wins (the best a candidate can do) end without ACCEPT; {hint}")


_REACH_HINT = 10_000
"""The longest ladder the refusal's hint looks at for an n_max that would accept."""


def _plain(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


# ---- resolution -------------------------------------------------------------------------


def valid_keys() -> dict[str, set[str] | None]:
    """Top-level keys of a config file (tables: their keys)."""
    top: dict[str, set[str] | None] = {f.name: None for f in fields(RunOptions)
                                       if f.name != "sources" and f.name not in FLAG_ONLY}
    top["gate"] = {f.name for f in fields(GateParams)}
    top["guard"] = {f.name for f in fields(GuardParams)}
    top["cache"] = set(CACHE_TABLE)  # [cache] share = "name" sets cache_share
    return top


def _refuse_unknown(key: str, valid: set[str], where: str) -> None:
    if key in REMOVED_KEYS:
        raise ConfigError(f"{where}{key}: {REMOVED_KEYS[key]}")
    if not where and key in FLAG_ONLY:
        raise ConfigError(f"{key}: {_flag_only(key)}")
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
    raise ConfigError(f"{name} must be on/off (true/false), got {shown(v)}")


def _coerce_int(name: str, v: Any) -> int:
    if is_whole(v):
        return int(v)
    try:
        return int(str(v).strip())
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {shown(v)}") from None


def _coerce_float(name: str, v: Any) -> float:
    if isinstance(v, int | float) and not isinstance(v, bool):
        return float(v)
    try:
        return float(str(v).strip())
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {shown(v)}") from None


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = read_settings_text(path)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is {not_utf8(exc)}") from None
    try:
        data = strict_json(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path} is malformed: {exc}") from None
    except RecursionError:
        raise ConfigError(f"config file {path} is nested too deeply") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a table of keys")
    return data


def _flatten(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Config-file keys as dotted keys (``gate.e_confirm``; ``[cache] share`` ->
    ``cache_share``), unknown and removed keys refused, naming ``source`` (the file)."""
    try:
        return _flat_keys(data)
    except ConfigError as exc:
        raise _named(source, exc) from None


def _flat_keys(data: Mapping[str, Any]) -> dict[str, Any]:
    valid = valid_keys()
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in valid:
            _refuse_unknown(key, set(valid), "")
        sub = valid[key]
        if sub is None:
            out[key] = value
            continue
        if isinstance(value, GateParams | GuardParams):
            out.update({f"{key}.{k}": v for k, v in _plain(value).items()})
            continue
        if not isinstance(value, Mapping):
            hint = (" (the cache is turned off by cache_enabled = false, or VTRM_CACHE=off)"
                    if key == "cache" else "")
            raise ConfigError(f"{key} must be a table of {', '.join(sorted(sub))}, got "
                              f"{shown(value)}{hint}")
        for k, v in value.items():
            if k not in sub:
                _refuse_unknown(k, sub, f"{key}.")
            out[CACHE_TABLE[k] if key == "cache" else f"{key}.{k}"] = v
    return out


def _named(source: str | None, exc: Exception) -> ConfigError:
    """The error of a value, prefixed with where the value came from (``env REDIS_URL: ...``)."""
    return ConfigError(f"{source}: {exc}" if source and source != "mapping" else str(exc))


def _field(key: str, value: Any, source: str | None) -> Any:
    """One top-level value, coerced (strings from the environment) and validated alone."""
    try:
        if key in ("concurrency", "redis_cache_ttl", "max_retries", *MAX_TOKENS_FIELDS):
            value = _coerce_int(key, value)
            if key in MAX_TOKENS_FIELDS and value == 0:
                value = None  # "0: none sent" in a flag, a variable or a file
        elif key in ("cache_enabled", "cancel_after_freeze", "adaptive"):
            value = _coerce_bool(key, value)
        elif key in ("timeout", "deadline"):
            value = _coerce_float(key, value)
        RunOptions(**{key: value})
    except ConfigError as exc:
        raise _named(source, exc) from None
    return value


def _build(values: Mapping[str, Any], sources: Mapping[str, str]) -> RunOptions:
    """Dotted keys -> RunOptions; a bad value's error names its key and where it came from."""
    kwargs: dict[str, Any] = {}
    tables: dict[str, dict[str, Any]] = {"gate": {}, "guard": {}}
    for key, value in values.items():
        head, _, sub = key.partition(".")
        if sub:
            tables[head][sub] = value
        else:
            kwargs[key] = _field(key, value, sources.get(key))
    for name, cls in (("gate", GateParams), ("guard", GuardParams)):
        if tables[name]:
            try:
                kwargs[name] = cls(**tables[name])
            except (TypeError, ValueError) as exc:  # TypeError: a string compared to 0
                where = {sources.get(f"{name}.{k}") for k in tables[name]}
                raise _named(where.pop() if len(where) == 1 else None, exc) from None
    return RunOptions(**kwargs, sources=dict(sources))


def options_from_mapping(data: Mapping[str, Any], source: str = "mapping") -> RunOptions:
    """RunOptions from nested plain values (a parsed config file), refusing unknown keys."""
    flat = _flatten(data, source)
    return _build(flat, dict.fromkeys(flat, source))


_OUR_PREFIXES = ("VTRM_", "REDIS_CACHE_")
"""Variables under these names are ours: one a letter or two from a setting is a slip."""


def _flag_only(key: str) -> str:
    return (f"set by its flag only (--{key.replace('_', '-')}), not the environment or a "
            f"config file")


def _misspelt_variable(layer: Mapping[str, str], where: str) -> None:
    """Refuse a variable of ours that is no setting but nearly spells one
    (``VTRM_CONCURENCY``): it would be ignored without a word, and the run go on at the
    default. Our other variables (``VTRM_API_KEY``...) are far from every setting's name."""
    for var in layer:
        if var.startswith("VTRM_") and var[5:].lower() in FLAG_ONLY:
            key = var[5:].lower()
            raise ConfigError(f"{var}{where}: {key} is {_flag_only(key)}")
        if var.startswith(_OUR_PREFIXES) and var not in ENV_KEYS:
            meant = difflib.get_close_matches(var, ENV_KEYS, n=1, cutoff=0.85)
            if meant:
                raise ConfigError(f"{var}{where} is no setting; did you mean {meant[0]}?")


def resolve_options(flags: Mapping[str, Any] | None = None, *,
                    config: str | os.PathLike[str] | None = None,
                    env: Mapping[str, str] | None = None,
                    dotenv: str | os.PathLike[str] | None = ".env",
                    flag_names: Mapping[str, str] | None = None) -> RunOptions:
    """The one resolver: ``flags`` (dotted keys; None values are "not given") > the process
    environment (``env``, default `os.environ`) > ``dotenv`` > the ``config`` file > defaults.
    ``flag_names`` spells a key's flag where it is not ``--key`` (``redis_url``: ``--url``).
    """
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def put(key: str, value: Any, source: str) -> None:
        values[key] = value
        sources[key] = source

    if config is not None:
        source = f"file {config}"
        for k, v in _flatten(_read_file(Path(config)), source).items():
            put(k, v, source)
    layers = [(read_dotenv(dotenv) if dotenv is not None else {}, " (.env)"),
              (os.environ if env is None else env, "")]
    for layer, where in layers:
        if "VTRM_GATE_BLOCK" in layer or "GATE_BLOCK" in layer:
            raise ConfigError(f"GATE_BLOCK: {REMOVED_KEYS['gate_block']}")
        _misspelt_variable(layer, where)
        for var, key in ENV_KEYS.items():
            if layer.get(var, "") != "":
                put(key, layer[var], f"env {var}{where}")
    for key, value in (flags or {}).items():
        if value is not None and value is not UNSET:
            name = (flag_names or {}).get(key) or f"--{key.replace('_', '-')}"
            put(key, value, f"flag {name}")
    return _build(values, sources)
