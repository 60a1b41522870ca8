"""Statistical kernel (SPEC §1): the paired betting e-processes, the gate decision, offline
replays, exact operating characteristics, probation rules and Monte Carlo helpers.

Pure functions over values; numpy is the only dependency. Nothing here knows about asyncio,
storage or plotting. One private module per concern:

- `_params`: outcomes (`Pair`), `Action`, `GateParams`, the bet's factors
- `_process`: `GateState`, `gate_decision`, `PairedBetting`, `SequentialTest`, `TypeOutcome`
- `_replay`: `replay_prefix`, `replay_blocks`, `replay_arrival` (one sequence)
- `_batch`: the same replays vectorised over replicates (Monte Carlo)
- `_oc`: `operating_characteristics` (exact, dynamic programming)
- `_forecast`: the same recursion from a running type's state (`oc_from_state`), the rates
  it assumes (`forecast_rates`)
- `_probation`: the epoch-end probation rules and their exact operating characteristics
- `_paired`: paired accuracy differences with Newcombe / MOVER intervals (evaluation)
- `_guard`: the INFRA guard's sequential test and its exact trip probability
- `_rules` (`_mixture`, `_blocks`): the opt-in decision rules, exact OC of any rule
- `_effects`: empirical Bayes over gates: the shares of harmful / neutral / helpful
  candidates from each gate's discordant pairs, bootstrap over gates
- `_montecarlo`: seeded paired outcomes, correlated latencies, false-accept and units curves
"""

from __future__ import annotations

from .._env import MAX_BOOT as MAX_BOOT
from ._batch import BatchOutcome as BatchOutcome
from ._batch import replay_arrival_batch as replay_arrival_batch
from ._batch import replay_blocks_batch as replay_blocks_batch
from ._batch import replay_prefix_batch as replay_prefix_batch
from ._blocks import BlockEnd as BlockEnd
from ._effects import BOOT_CHUNK as BOOT_CHUNK
from ._effects import BOOT_GROUP as BOOT_GROUP
from ._effects import EffectsFit as EffectsFit
from ._effects import bootstrap_effects as bootstrap_effects
from ._effects import check_n_boot as check_n_boot
from ._effects import fit_effects as fit_effects
from ._forecast import ForecastPrior as ForecastPrior
from ._forecast import StateOC as StateOC
from ._forecast import forecast_rates as forecast_rates
from ._forecast import oc_from_state as oc_from_state
from ._guard import ALTERNATIVES as ALTERNATIVES
from ._guard import GuardOC as GuardOC
from ._guard import guard_oc as guard_oc
from ._guard import infra_e_value as infra_e_value
from ._guard import run_abort_probability as run_abort_probability
from ._mixture import LambdaMixture as LambdaMixture
from ._mixture import MixtureState as MixtureState
from ._montecarlo import FalseAcceptCurve as FalseAcceptCurve
from ._montecarlo import PairedSample as PairedSample
from ._montecarlo import UnitsCurve as UnitsCurve
from ._montecarlo import cand_wrong_probability as cand_wrong_probability
from ._montecarlo import correlated_latency as correlated_latency
from ._montecarlo import false_accept_curve as false_accept_curve
from ._montecarlo import paired_outcomes as paired_outcomes
from ._montecarlo import paired_sample as paired_sample
from ._montecarlo import units_curve as units_curve
from ._montecarlo import wilson_interval as wilson_interval
from ._oc import MAX_OC_UNITS as MAX_OC_UNITS
from ._oc import OperatingCharacteristics as OperatingCharacteristics
from ._oc import operating_characteristics as operating_characteristics
from ._paired import MOVER as MOVER
from ._paired import NEWCOMBE as NEWCOMBE
from ._paired import PairedDiff as PairedDiff
from ._paired import mover_mean as mover_mean
from ._paired import paired_difference as paired_difference
from ._paired import same_skill as same_skill
from ._params import ACTION_CODES as ACTION_CODES
from ._params import Action as Action
from ._params import Decision as Decision
from ._params import GateParams as GateParams
from ._params import Pair as Pair
from ._params import as_correct as as_correct
from ._params import as_params as as_params
from ._params import bet_factors as bet_factors
from ._params import check_block as check_block
from ._probation import GUARANTEES as GUARANTEES
from ._probation import PROBATION_RULES as PROBATION_RULES
from ._probation import EContinueRule as EContinueRule
from ._probation import EHarmRule as EHarmRule
from ._probation import ProbationRule as ProbationRule
from ._probation import ProbeOC as ProbeOC
from ._probation import SettledOC as SettledOC
from ._probation import WNetRule as WNetRule
from ._probation import probation_rule as probation_rule
from ._probation import probe_oc as probe_oc
from ._probation import settled_oc as settled_oc
from ._process import DEFAULT_RULE as DEFAULT_RULE
from ._process import DecisionRule as DecisionRule
from ._process import GateState as GateState
from ._process import MeasureAll as MeasureAll
from ._process import PairedBetting as PairedBetting
from ._process import SequentialTest as SequentialTest
from ._process import TrajectoryPoint as TrajectoryPoint
from ._process import TypeOutcome as TypeOutcome
from ._process import best_case_floor as best_case_floor
from ._process import check_ladder_length as check_ladder_length
from ._process import gate_decision as gate_decision
from ._process import pair_d as pair_d
from ._process import stops_early as stops_early
from ._process import update_state as update_state
from ._replay import replay_arrival as replay_arrival
from ._replay import replay_blocks as replay_blocks
from ._replay import replay_prefix as replay_prefix
from ._rules import DECISION_RULES as DECISION_RULES
from ._rules import decision_rule as decision_rule
from ._rules import fastest_accept as fastest_accept
from ._rules import rule_oc as rule_oc

__all__ = [
    "ACTION_CODES",
    "ALTERNATIVES",
    "BOOT_CHUNK",
    "BOOT_GROUP",
    "DECISION_RULES",
    "DEFAULT_RULE",
    "GUARANTEES",
    "MAX_BOOT",
    "MAX_OC_UNITS",
    "MOVER",
    "NEWCOMBE",
    "PROBATION_RULES",
    "Action",
    "BatchOutcome",
    "BlockEnd",
    "Decision",
    "DecisionRule",
    "EContinueRule",
    "EHarmRule",
    "EffectsFit",
    "FalseAcceptCurve",
    "ForecastPrior",
    "GateParams",
    "GateState",
    "GuardOC",
    "LambdaMixture",
    "MeasureAll",
    "MixtureState",
    "OperatingCharacteristics",
    "Pair",
    "PairedBetting",
    "PairedDiff",
    "PairedSample",
    "ProbationRule",
    "ProbeOC",
    "SequentialTest",
    "SettledOC",
    "StateOC",
    "TrajectoryPoint",
    "TypeOutcome",
    "UnitsCurve",
    "WNetRule",
    "as_correct",
    "as_params",
    "best_case_floor",
    "bet_factors",
    "bootstrap_effects",
    "cand_wrong_probability",
    "check_block",
    "check_ladder_length",
    "check_n_boot",
    "correlated_latency",
    "decision_rule",
    "false_accept_curve",
    "fastest_accept",
    "fit_effects",
    "forecast_rates",
    "gate_decision",
    "guard_oc",
    "infra_e_value",
    "mover_mean",
    "oc_from_state",
    "operating_characteristics",
    "pair_d",
    "paired_difference",
    "paired_outcomes",
    "paired_sample",
    "probation_rule",
    "probe_oc",
    "replay_arrival",
    "replay_arrival_batch",
    "replay_blocks",
    "replay_blocks_batch",
    "replay_prefix",
    "replay_prefix_batch",
    "rule_oc",
    "run_abort_probability",
    "same_skill",
    "settled_oc",
    "stops_early",
    "units_curve",
    "update_state",
    "wilson_interval",
]

# below __all__: the classes it names report this namespace as their module
from .._api import declare

declare(__name__, globals())
del declare
