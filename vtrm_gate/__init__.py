"""vtrm_gate: continuous concurrent e-process gate for skill evolution.

This module is the public API; everything else may move. Names resolve lazily (PEP 562) so
that ``vtrm-gate cache renew`` starts without importing numpy or asyncio machinery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, tuple[str, ...]] = {
    "stats": ("Action", "BatchOutcome", "DecisionRule", "GateParams", "GateState",
              "OperatingCharacteristics", "TypeOutcome", "gate_decision",
              "operating_characteristics", "replay_arrival", "replay_arrival_batch",
              "replay_blocks", "replay_blocks_batch", "replay_prefix", "replay_prefix_batch"),
    "ladder": ("LadderEntry", "build_ladder"),
    "dispatch": ("DispatchPolicy", "NeedAware", "RoundRobin"),
    "scheduler": ("BaselineStore", "EventStream", "GateAborted", "GateEvent", "GateFinished",
                  "GateHandle", "GateResult", "GateStarted", "GuardParams", "InfraGuardError",
                  "PrefixAdvanced", "ResultSink", "TaskFinished", "TaskStarted",
                  "TaskProgress", "TypeCounters", "TypeDecided", "TypePlan", "UnitResult",
                  "UnitTask", "arm_run_id", "launch", "report_progress", "run_gate",
                  "slugify"),
    "config": ("Config", "ConfigError", "load_config"),
    "plugin": ("AgentBackend", "BackendContext", "BackendError"),
}
_WHERE = {name: mod for mod, names in _EXPORTS.items() for name in names}
__all__ = sorted([*_WHERE, "run_gate_sync", "__version__"])


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'vtrm_gate' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


def run_gate_sync(*args: Any, **kwargs: Any) -> Any:
    """`run_gate` for scripts and blocking Jupyter cells (see `vtrm_gate._sync`)."""
    from ._sync import run_sync
    from .scheduler import run_gate

    return run_sync(run_gate(*args, **kwargs))


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from .config import Config, ConfigError, load_config  # noqa: F401
    from .dispatch import DispatchPolicy, NeedAware, RoundRobin  # noqa: F401
    from .ladder import LadderEntry, build_ladder  # noqa: F401
    from .plugin import AgentBackend, BackendContext, BackendError  # noqa: F401
    from .scheduler import (  # noqa: F401
        BaselineStore,
        EventStream,
        GateAborted,
        GateEvent,
        GateFinished,
        GateHandle,
        GateResult,
        GateStarted,
        GuardParams,
        InfraGuardError,
        PrefixAdvanced,
        ResultSink,
        TaskFinished,
        TaskProgress,
        TaskStarted,
        TypeCounters,
        TypeDecided,
        TypePlan,
        UnitResult,
        UnitTask,
        arm_run_id,
        launch,
        report_progress,
        run_gate,
        slugify,
    )
    from .stats import (  # noqa: F401
        Action,
        BatchOutcome,
        DecisionRule,
        GateParams,
        GateState,
        OperatingCharacteristics,
        TypeOutcome,
        gate_decision,
        operating_characteristics,
        replay_arrival,
        replay_arrival_batch,
        replay_blocks,
        replay_blocks_batch,
        replay_prefix,
        replay_prefix_batch,
    )
