"""vtrm_gate: continuous concurrent e-process gate for skill evolution.

This module is the public API; everything else may move.
"""

from __future__ import annotations

from typing import Any

from .ladder import LadderEntry as LadderEntry
from .ladder import build_ladder as build_ladder
from .scheduler import BaselineStore as BaselineStore
from .scheduler import EventStream as EventStream
from .scheduler import GateAborted as GateAborted
from .scheduler import GateEvent as GateEvent
from .scheduler import GateFinished as GateFinished
from .scheduler import GateHandle as GateHandle
from .scheduler import GateResult as GateResult
from .scheduler import GateStarted as GateStarted
from .scheduler import GuardParams as GuardParams
from .scheduler import InfraGuardError as InfraGuardError
from .scheduler import PrefixAdvanced as PrefixAdvanced
from .scheduler import ResultSink as ResultSink
from .scheduler import TaskFinished as TaskFinished
from .scheduler import TaskStarted as TaskStarted
from .scheduler import TypeCounters as TypeCounters
from .scheduler import TypeDecided as TypeDecided
from .scheduler import TypePlan as TypePlan
from .scheduler import UnitResult as UnitResult
from .scheduler import UnitTask as UnitTask
from .scheduler import arm_run_id as arm_run_id
from .scheduler import launch as launch
from .scheduler import run_gate as run_gate
from .scheduler import slugify as slugify
from .stats import Action as Action
from .stats import BatchOutcome as BatchOutcome
from .stats import DecisionRule as DecisionRule
from .stats import GateParams as GateParams
from .stats import GateState as GateState
from .stats import OperatingCharacteristics as OperatingCharacteristics
from .stats import TypeOutcome as TypeOutcome
from .stats import gate_decision as gate_decision
from .stats import operating_characteristics as operating_characteristics
from .stats import replay_arrival as replay_arrival
from .stats import replay_arrival_batch as replay_arrival_batch
from .stats import replay_blocks as replay_blocks
from .stats import replay_blocks_batch as replay_blocks_batch
from .stats import replay_prefix as replay_prefix
from .stats import replay_prefix_batch as replay_prefix_batch


def run_gate_sync(*args: Any, **kwargs: Any) -> GateResult:
    """`run_gate` for scripts and blocking Jupyter cells."""
    from ._sync import run_sync

    return run_sync(run_gate(*args, **kwargs))


__version__ = "0.1.0"
