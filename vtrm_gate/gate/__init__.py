"""The continuous concurrent gate (SPEC §2–§3): asyncio, no storage, no Redis.

- `_ladder`: the information ladder (seed-wrong first, case units excluded, ``n_max``)
- `_dispatch`: which type's next unit takes a free slot (`RoundRobin`, `NeedAware`, yours)
- `_plan`: `TypePlan`, `UnitTask`, `UnitResult`, `GuardParams`; the `BaselineStore` and
  `ResultSink` protocols storage comes in through
- `_events`: the events and their bus (callbacks, async iterator, `report_progress`,
  `current_run_id` / `run_scope`: the run id a call belongs to)
- `_scheduler`: `run_gate` (slot pool, prefix consumption, freeze, INFRA guard)
- `_result`: `GateResult`, `TypeCounters`
- `_handle`: `launch` / `GateHandle` for a Jupyter kernel's loop
- `_forecast`: `GateForecast`, each running type's exits from where it stands and the ETA
"""

from __future__ import annotations

from ._dispatch import DEFAULT_DISPATCH as DEFAULT_DISPATCH
from ._dispatch import DISPATCH_NAMES as DISPATCH_NAMES
from ._dispatch import DispatchName as DispatchName
from ._dispatch import DispatchOrder as DispatchOrder
from ._dispatch import DispatchPolicy as DispatchPolicy
from ._dispatch import ExpectedNeed as ExpectedNeed
from ._dispatch import Lane as Lane
from ._dispatch import NeedAware as NeedAware
from ._dispatch import Priority as Priority
from ._dispatch import RoundRobin as RoundRobin
from ._dispatch import dispatch_order as dispatch_order
from ._dispatch import resolve_dispatch as resolve_dispatch
from ._events import EventStream as EventStream
from ._events import GateAborted as GateAborted
from ._events import GateEvent as GateEvent
from ._events import GateFinished as GateFinished
from ._events import GateStarted as GateStarted
from ._events import PrefixAdvanced as PrefixAdvanced
from ._events import Subscriber as Subscriber
from ._events import SubscriberWarning as SubscriberWarning
from ._events import TaskFinished as TaskFinished
from ._events import TaskProgress as TaskProgress
from ._events import TaskStarted as TaskStarted
from ._events import TypeDecided as TypeDecided
from ._events import current_run_id as current_run_id
from ._events import report_progress as report_progress
from ._events import run_scope as run_scope
from ._forecast import Forecast as Forecast
from ._forecast import ForecastInput as ForecastInput
from ._forecast import GateForecast as GateForecast
from ._forecast import TypeForecast as TypeForecast
from ._forecast import duration as duration
from ._forecast import hours as hours
from ._handle import GateHandle as GateHandle
from ._handle import launch as launch
from ._handle import run_gate_sync as run_gate_sync
from ._ladder import LadderEntry as LadderEntry
from ._ladder import build_ladder as build_ladder
from ._ladder import check_unit_ids as check_unit_ids
from ._ladder import ladder_units as ladder_units
from ._ladder import shuffle_key as shuffle_key
from ._plan import MAX_RESULT_TOKENS as MAX_RESULT_TOKENS
from ._plan import Admission as Admission
from ._plan import BaselineStore as BaselineStore
from ._plan import GuardParams as GuardParams
from ._plan import Infer as Infer
from ._plan import ResultSink as ResultSink
from ._plan import TypePlan as TypePlan
from ._plan import UnitResult as UnitResult
from ._plan import UnitTask as UnitTask
from ._plan import checked_result as checked_result
from ._result import GateResult as GateResult
from ._result import TypeCounters as TypeCounters
from ._scheduler import PAST_STOP_POLICIES as PAST_STOP_POLICIES
from ._scheduler import STOP_GRACE_S as STOP_GRACE_S
from ._scheduler import PastStop as PastStop
from ._scheduler import run_gate as run_gate

__all__ = [
    "DEFAULT_DISPATCH",
    "DISPATCH_NAMES",
    "MAX_RESULT_TOKENS",
    "PAST_STOP_POLICIES",
    "STOP_GRACE_S",
    "Admission",
    "BaselineStore",
    "DispatchName",
    "DispatchOrder",
    "DispatchPolicy",
    "EventStream",
    "ExpectedNeed",
    "Forecast",
    "ForecastInput",
    "GateAborted",
    "GateEvent",
    "GateFinished",
    "GateForecast",
    "GateHandle",
    "GateResult",
    "GateStarted",
    "GuardParams",
    "Infer",
    "LadderEntry",
    "Lane",
    "NeedAware",
    "PastStop",
    "PrefixAdvanced",
    "Priority",
    "ResultSink",
    "RoundRobin",
    "Subscriber",
    "SubscriberWarning",
    "TaskFinished",
    "TaskProgress",
    "TaskStarted",
    "TypeCounters",
    "TypeDecided",
    "TypeForecast",
    "TypePlan",
    "UnitResult",
    "UnitTask",
    "build_ladder",
    "check_unit_ids",
    "checked_result",
    "current_run_id",
    "dispatch_order",
    "duration",
    "hours",
    "ladder_units",
    "launch",
    "report_progress",
    "resolve_dispatch",
    "run_gate",
    "run_gate_sync",
    "run_scope",
    "shuffle_key",
]

# below __all__: the classes it names report this namespace as their module
from .._api import declare

declare(__name__, globals())
del declare
