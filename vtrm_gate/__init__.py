"""vtrm_gate: continuous concurrent e-process gate for skill evolution.

This module is the notebook user's API; everything else may move. Audiences:
``vtrm_gate`` (this), ``vtrm_gate.harness`` / ``vtrm_gate.llm`` / ``vtrm_gate.backends``
(integrators), ``vtrm_gate.testing`` (tests). Names resolve lazily (PEP 562) from the
subpackage named in `_HOME`, so ``vtrm-gate cache renew`` starts without importing numpy;
the subpackages too (``vtrm_gate.views.show_live`` after ``import vtrm_gate``).
`__all__` is the one export list; ``tests/test_packaging.py`` resolves every name.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

__all__ = [  # noqa: RUF022 - grouped by audience, alphabetical within a group
    # statistics (vtrm_gate.stats)
    "Action", "BatchOutcome", "DecisionRule", "GateParams", "GateState",
    "OperatingCharacteristics", "TypeOutcome", "gate_decision", "operating_characteristics",
    "replay_arrival", "replay_arrival_batch", "replay_blocks", "replay_blocks_batch",
    "replay_prefix", "replay_prefix_batch",
    # the gate (vtrm_gate.gate)
    "BaselineStore", "DispatchPolicy", "EventStream", "ExpectedNeed", "GateAborted", "GateEvent",
    "GateFinished", "GateHandle", "GateResult", "GateStarted", "GuardParams", "LadderEntry",
    "NeedAware", "PrefixAdvanced", "ResultSink", "RoundRobin", "TaskFinished", "TaskProgress",
    "TaskStarted", "TypeCounters", "TypeDecided", "TypePlan", "UnitResult", "UnitTask",
    "build_ladder", "launch", "report_progress", "run_gate", "run_gate_sync",
    # identities and errors
    "arm_run_id", "slugify", "ConfigError", "InfraGuardError", "VtrmError",
    # options and the one path that drives a workspace
    "RunOptions", "UNSET", "resolve_options", "open_backend", "step_workspace",
    "step_workspace_sync", "train_workspace", "train_workspace_sync", "settle_workspace",
    "settle_workspace_sync",
    # reading a workspace in a notebook (vtrm_gate.views)
    "open_workspace",
    # outcomes from outside (vtrm_gate.harness) and the world they come from (vtrm_gate.sim)
    "read_outcomes", "check_outcomes", "replay_outcomes", "write_outcomes", "World",
    "fit_world",
    # bring your own agent, and the response cache
    "AgentBackend", "BackendContext", "BackendError", "ResponseCache", "cached_infer",
    "__version__",
]

_HOME = {
    **dict.fromkeys(("Action", "BatchOutcome", "DecisionRule", "GateParams", "GateState",
                     "OperatingCharacteristics", "TypeOutcome", "gate_decision",
                     "operating_characteristics", "replay_arrival", "replay_arrival_batch",
                     "replay_blocks", "replay_blocks_batch", "replay_prefix",
                     "replay_prefix_batch"), "stats"),
    **dict.fromkeys(("arm_run_id", "slugify"), "_ids"),
    **dict.fromkeys(("ConfigError", "InfraGuardError", "VtrmError", "BackendError"), "errors"),
    **dict.fromkeys(("RunOptions", "UNSET", "resolve_options"), "options"),
    **dict.fromkeys(("open_backend", "step_workspace", "step_workspace_sync",
                     "train_workspace", "train_workspace_sync", "settle_workspace",
                     "settle_workspace_sync"), "backends"),
    **dict.fromkeys(("AgentBackend", "BackendContext"), "llm"),
    **dict.fromkeys(("read_outcomes", "check_outcomes", "replay_outcomes",
                     "write_outcomes"), "harness"),
    **dict.fromkeys(("World", "fit_world"), "sim"),
    **dict.fromkeys(("ResponseCache", "cached_infer"), "cache"),
    "open_workspace": "views",
}


SUBPACKAGES = ("stats", "gate", "options", "harness", "cache", "llm", "sim", "backends",
               "views", "cli", "testing", "errors")
"""Reachable as attributes after ``import vtrm_gate`` (``vtrm_gate.views.show_live``),
imported on first use like the names."""


def __getattr__(name: str) -> Any:
    if name in SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)  # sets the attribute itself
    if name not in __all__ or name == "__version__":
        raise AttributeError(f"module 'vtrm_gate' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOME.get(name, 'gate')}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return [*__all__, *SUBPACKAGES]
