"""Harness (SPEC §4): persistence (HarnessLog, BaselineCache), the workspace, the gate step.

Layering: imports stats, ladder, scheduler and _sync only. Simulated and LLM workspaces are
created and driven from `vtrm_gate.backends`, a layer below. The LLM backend of ``llm`` workspaces
lives in `vtrm_gate.backends` (it builds on this package, not the other way round).
"""

from __future__ import annotations

from .baseline import BaselineCache as BaselineCache
from .baseline import BaselineKey as BaselineKey
from .lock import LockHolder as LockHolder
from .lock import WorkspaceLock as WorkspaceLock
from .lock import WorkspaceLockedError as WorkspaceLockedError
from .lock import workspace_lock as workspace_lock
from .log import TABLES as TABLES
from .log import GateSink as GateSink
from .log import HarnessLog as HarnessLog
from .step import PROBATION_STEP as PROBATION_STEP
from .step import CaseSource as CaseSource
from .step import CasesUnavailable as CasesUnavailable
from .step import Evolver as Evolver
from .step import ProbationOutcome as ProbationOutcome
from .step import ProbationResult as ProbationResult
from .step import StepRefusedError as StepRefusedError
from .step import StepResult as StepResult
from .step import StepUnmeasuredError as StepUnmeasuredError
from .step import TypeStep as TypeStep
from .step import fail_fast_targets as fail_fast_targets
from .step import replay_step as replay_step
from .step import run_step as run_step
from .step import run_step_sync as run_step_sync
from .step import settle_probation as settle_probation
from .step import settle_probation_sync as settle_probation_sync
from .step import step_input_state as step_input_state
from .train import EVAL_STEP as EVAL_STEP
from .train import HELDOUT_FILE as HELDOUT_FILE
from .train import EvalResult as EvalResult
from .train import TrainEvent as TrainEvent
from .train import TrainRefusedError as TrainRefusedError
from .train import TrainResult as TrainResult
from .train import evaluate_epoch as evaluate_epoch
from .train import evaluation_frame as evaluation_frame
from .train import read_heldout as read_heldout
from .train import train as train
from .train import train_sync as train_sync
from .workspace import UNITS_FILE as UNITS_FILE
from .workspace import Probation as Probation
from .workspace import Rejected as Rejected
from .workspace import SkillRef as SkillRef
from .workspace import TrainingState as TrainingState
from .workspace import UnitRecord as UnitRecord
from .workspace import Workspace as Workspace
from .workspace import WorkspaceConfig as WorkspaceConfig
from .workspace import WorkspaceError as WorkspaceError
from .workspace import read_units as read_units
from .workspace import step_run_id as step_run_id
