"""Harness (SPEC §4): persistence, the workspace and the step: what turns gate decisions into
training state.

Layering: imports stats and gate (and the identities and errors) only; no Redis, no HTTP,
no simulator. LLM and simulated workspaces are created and driven from `vtrm_gate.llm` and
`vtrm_gate.sim`, layers below.

- `_workspace`, `_state`, `_units`, `_files`: the directory, its training state and units
- `_lock`, `_atomic_dir`, `_access`: one writer at a time; a workspace appears whole
- `_log`, `_baseline`: HarnessLog (SQLite, WAL) and the BaselineCache
- `_step` (+ `_manifest`, `_results`, `_candidate`): `run_step`, phases A–D
- `_settle`, `_evaluate`, `_train`: probation settlement, held-out evaluation, the run
- `_audit`: how each standing version came to stand, rebuilt from the log
- `_replay`: prefix vs block replay of a recorded step
- `_outcomes`: ladder outcomes as a table (CSV / Parquet / JSONL): read, write, replay
"""

from __future__ import annotations

from .._ids import EVAL_STEP as EVAL_STEP
from .._ids import PROBATION_STEP as PROBATION_STEP
from .._ids import step_run_id as step_run_id
from ..errors import CandidateRefused as CandidateRefused
from ..errors import CasesUnavailable as CasesUnavailable
from ..errors import StepRefusedError as StepRefusedError
from ..errors import StepUnmeasuredError as StepUnmeasuredError
from ..errors import TrainRefusedError as TrainRefusedError
from ..errors import WorkspaceError as WorkspaceError
from ..errors import WorkspaceLockedError as WorkspaceLockedError
from ._atomic_dir import only_lock_file as only_lock_file
from ._audit import FATES as FATES
from ._audit import Fate as Fate
from ._audit import SettledAudit as SettledAudit
from ._audit import Standing as Standing
from ._audit import settled_audit as settled_audit
from ._baseline import BaselineCache as BaselineCache
from ._baseline import BaselineKey as BaselineKey
from ._candidate import MAX_SKILL_CHARS as MAX_SKILL_CHARS
from ._candidate import candidate_problem as candidate_problem
from ._evaluate import HELDOUT_FILE as HELDOUT_FILE
from ._evaluate import EvalResult as EvalResult
from ._evaluate import evaluate_epoch as evaluate_epoch
from ._evaluate import evaluation_frame as evaluation_frame
from ._evaluate import evaluation_summary as evaluation_summary
from ._evaluate import gain_text as gain_text
from ._evaluate import read_heldout as read_heldout
from ._evaluate import split_heldout as split_heldout
from ._files import atomic_write as atomic_write
from ._files import read_json as read_json
from ._files import read_text as read_text
from ._files import temp_sibling as temp_sibling
from ._files import write_json as write_json
from ._lock import LockHolder as LockHolder
from ._lock import WorkspaceLock as WorkspaceLock
from ._lock import read_holder as read_holder
from ._lock import workspace_lock as workspace_lock
from ._log import TABLES as TABLES
from ._log import GateSink as GateSink
from ._log import HarnessLog as HarnessLog
from ._log import loop_clock as loop_clock
from ._manifest import check_agent_unchanged as check_agent_unchanged
from ._manifest import read_manifest as read_manifest
from ._manifest import recorded_manifests as recorded_manifests
from ._outcomes import MAX_OUTCOME_ROWS as MAX_OUTCOME_ROWS
from ._outcomes import OPTIONAL_COLUMNS as OPTIONAL_COLUMNS
from ._outcomes import OUTCOME_COLUMNS as OUTCOME_COLUMNS
from ._outcomes import OutcomesError as OutcomesError
from ._outcomes import check_outcomes as check_outcomes
from ._outcomes import read_outcomes as read_outcomes
from ._outcomes import replay_outcomes as replay_outcomes
from ._outcomes import workspace_outcomes as workspace_outcomes
from ._outcomes import write_outcomes as write_outcomes
from ._replay import replay_step as replay_step
from ._results import StepResult as StepResult
from ._results import TypeStep as TypeStep
from ._settle import ProbationOutcome as ProbationOutcome
from ._settle import ProbationResult as ProbationResult
from ._settle import settle_probation as settle_probation
from ._settle import settle_probation_sync as settle_probation_sync
from ._state import Probation as Probation
from ._state import Rejected as Rejected
from ._state import SkillRef as SkillRef
from ._state import TrainingState as TrainingState
from ._status import StepStatus as StepStatus
from ._step import CaseSource as CaseSource
from ._step import Evolver as Evolver
from ._step import fail_fast_targets as fail_fast_targets
from ._step import never_accepted as never_accepted
from ._step import run_step as run_step
from ._step import run_step_sync as run_step_sync
from ._step import step_input_state as step_input_state
from ._train import Rollout as Rollout
from ._train import TrainEvent as TrainEvent
from ._train import TrainResult as TrainResult
from ._train import train as train
from ._train import train_started as train_started
from ._train import train_sync as train_sync
from ._units import DEFAULT_MAX_FRAME_BYTES as DEFAULT_MAX_FRAME_BYTES
from ._units import DEFAULT_MAX_FRAMES as DEFAULT_MAX_FRAMES
from ._units import DEFAULT_MAX_PIXELS as DEFAULT_MAX_PIXELS
from ._units import DEFAULT_MAX_SIDE as DEFAULT_MAX_SIDE
from ._units import REF_SCHEME as REF_SCHEME
from ._units import Frame as Frame
from ._units import Media as Media
from ._units import MediaOptions as MediaOptions
from ._units import MediaRefs as MediaRefs
from ._units import UnitRecord as UnitRecord
from ._units import Video as Video
from ._units import check_frame as check_frame
from ._units import check_image as check_image
from ._units import check_size as check_size
from ._units import frame_path as frame_path
from ._units import open_image as open_image
from ._units import parse_media as parse_media
from ._units import pick_frames as pick_frames
from ._units import read_units as read_units
from ._units import units_pool as units_pool
from ._units import units_task_description as units_task_description
from ._workspace import DEFAULT_STRATEGY as DEFAULT_STRATEGY
from ._workspace import LOG_FILE as LOG_FILE
from ._workspace import UNITS_FILE as UNITS_FILE
from ._workspace import Workspace as Workspace
from ._workspace import WorkspaceConfig as WorkspaceConfig

__all__ = [
    "DEFAULT_MAX_FRAMES",
    "DEFAULT_MAX_FRAME_BYTES",
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_MAX_SIDE",
    "DEFAULT_STRATEGY",
    "EVAL_STEP",
    "FATES",
    "HELDOUT_FILE",
    "LOG_FILE",
    "MAX_OUTCOME_ROWS",
    "MAX_SKILL_CHARS",
    "OPTIONAL_COLUMNS",
    "OUTCOME_COLUMNS",
    "PROBATION_STEP",
    "REF_SCHEME",
    "TABLES",
    "UNITS_FILE",
    "BaselineCache",
    "BaselineKey",
    "CandidateRefused",
    "CaseSource",
    "CasesUnavailable",
    "EvalResult",
    "Evolver",
    "Fate",
    "Frame",
    "GateSink",
    "HarnessLog",
    "LockHolder",
    "Media",
    "MediaOptions",
    "MediaRefs",
    "OutcomesError",
    "Probation",
    "ProbationOutcome",
    "ProbationResult",
    "Rejected",
    "Rollout",
    "SettledAudit",
    "SkillRef",
    "Standing",
    "StepRefusedError",
    "StepResult",
    "StepStatus",
    "StepUnmeasuredError",
    "TrainEvent",
    "TrainRefusedError",
    "TrainResult",
    "TrainingState",
    "TypeStep",
    "UnitRecord",
    "Video",
    "Workspace",
    "WorkspaceConfig",
    "WorkspaceError",
    "WorkspaceLock",
    "WorkspaceLockedError",
    "atomic_write",
    "candidate_problem",
    "check_agent_unchanged",
    "check_frame",
    "check_image",
    "check_outcomes",
    "check_size",
    "evaluate_epoch",
    "evaluation_frame",
    "evaluation_summary",
    "fail_fast_targets",
    "frame_path",
    "gain_text",
    "loop_clock",
    "never_accepted",
    "only_lock_file",
    "open_image",
    "parse_media",
    "pick_frames",
    "read_heldout",
    "read_holder",
    "read_json",
    "read_manifest",
    "read_outcomes",
    "read_text",
    "read_units",
    "recorded_manifests",
    "replay_outcomes",
    "replay_step",
    "run_step",
    "run_step_sync",
    "settle_probation",
    "settle_probation_sync",
    "settled_audit",
    "split_heldout",
    "step_input_state",
    "step_run_id",
    "temp_sibling",
    "train",
    "train_started",
    "train_sync",
    "units_pool",
    "units_task_description",
    "workspace_lock",
    "workspace_outcomes",
    "write_json",
    "write_outcomes",
]

# below __all__: the classes it names report this namespace as their module
from .._api import declare

declare(__name__, globals())
del declare
