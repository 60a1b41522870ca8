"""The simulator (SPEC §6): a seeded 12-type world that knows the truth, its agent and
evolver, the virtual clock, simulated workspaces, and decision quality against ground truth.

- `_effects`: `World`, the distribution of candidate effects (JSON file, presets)
- `_fit`: `fit_world`, a World fitted to outcomes by empirical Bayes across gates
- `_world`: `SimConfig`, `SimWorld` (agent, latencies, INFRA, true effects), `SimEvolver`
- `_virtual`: `run_virtual` (a looptime loop: hours of inference in seconds, exact makespans)
- `_schedules`: a step's plans, the old block-serial vs v3 continuous schedules, policies
- `_step`: `sim_step(seed)`, the step the demo, the CLI and the notebooks share
- `_workspace`: `init_simulated`, `simulated_backend`
- `_quality`: ground truth, `quality_report`, the old gate's phase times, training curve
- `_eta`: `eta_checks`, the live ETA forecast against the time a step really took
- `_sweep`: `sweep_executor`, `sweep_map`: independent seeded runs on local processes that
  end with their parent, or on a Dask cluster
"""

from __future__ import annotations

from ._effects import PRESETS as PRESETS
from ._effects import World as World
from ._eta import EtaCheck as EtaCheck
from ._eta import eta_checks as eta_checks
from ._fit import TypeFit as TypeFit
from ._fit import WorldFit as WorldFit
from ._fit import fit_world as fit_world
from ._fit import logit_per_theta as logit_per_theta
from ._quality import CLASSES as CLASSES
from ._quality import quality_report as quality_report
from ._quality import record_ground_truth as record_ground_truth
from ._quality import serial_phase_times as serial_phase_times
from ._quality import training_curve as training_curve
from ._quality import training_summary as training_summary
from ._schedules import PolicyRun as PolicyRun
from ._schedules import block_serial_schedule as block_serial_schedule
from ._schedules import continuous_schedule as continuous_schedule
from ._schedules import gate_plans as gate_plans
from ._schedules import ladder_outcomes as ladder_outcomes
from ._schedules import no_early_stop as no_early_stop
from ._schedules import simulate_policy as simulate_policy
from ._step import INTERACTIVE_SECONDS as INTERACTIVE_SECONDS
from ._step import SimStep as SimStep
from ._step import sim_step as sim_step
from ._sweep import local_workers as local_workers
from ._sweep import sweep_executor as sweep_executor
from ._sweep import sweep_map as sweep_map
from ._virtual import run_virtual as run_virtual
from ._workspace import SimBackend as SimBackend
from ._workspace import heldout_split as heldout_split
from ._workspace import init_simulated as init_simulated
from ._workspace import sim_json as sim_json
from ._workspace import simulated_backend as simulated_backend
from ._world import DEFAULT_INFRA_RATE as DEFAULT_INFRA_RATE
from ._world import DEFAULT_POOL_SIZES as DEFAULT_POOL_SIZES
from ._world import EFFECT_SIZE as EFFECT_SIZE
from ._world import EFFECTS as EFFECTS
from ._world import MAX_STEPS as MAX_STEPS
from ._world import REF_STEPS as REF_STEPS
from ._world import ROLLOUT_BATCH as ROLLOUT_BATCH
from ._world import SEED_RUN_ID as SEED_RUN_ID
from ._world import TASK_TYPES as TASK_TYPES
from ._world import TRUE_MARGIN as TRUE_MARGIN
from ._world import Effect as Effect
from ._world import SimConfig as SimConfig
from ._world import SimEvolver as SimEvolver
from ._world import SimWorld as SimWorld
from ._world import TrueEffect as TrueEffect

__all__ = [
    "CLASSES",
    "DEFAULT_INFRA_RATE",
    "DEFAULT_POOL_SIZES",
    "EFFECTS",
    "EFFECT_SIZE",
    "INTERACTIVE_SECONDS",
    "MAX_STEPS",
    "PRESETS",
    "REF_STEPS",
    "ROLLOUT_BATCH",
    "SEED_RUN_ID",
    "TASK_TYPES",
    "TRUE_MARGIN",
    "Effect",
    "EtaCheck",
    "PolicyRun",
    "SimBackend",
    "SimConfig",
    "SimEvolver",
    "SimStep",
    "SimWorld",
    "TrueEffect",
    "TypeFit",
    "World",
    "WorldFit",
    "block_serial_schedule",
    "continuous_schedule",
    "eta_checks",
    "fit_world",
    "gate_plans",
    "heldout_split",
    "init_simulated",
    "ladder_outcomes",
    "local_workers",
    "logit_per_theta",
    "no_early_stop",
    "quality_report",
    "record_ground_truth",
    "run_virtual",
    "serial_phase_times",
    "sim_json",
    "sim_step",
    "simulate_policy",
    "simulated_backend",
    "sweep_executor",
    "sweep_map",
    "training_curve",
    "training_summary",
]

# below __all__: the classes it names report this namespace as their module
from .._api import declare

declare(__name__, globals())
del declare
