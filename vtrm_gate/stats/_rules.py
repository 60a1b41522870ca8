"""The decision rules a run may choose (``RunOptions.decision_rule``) and their exact
operating characteristics.

``paired_betting`` is the SPEC's and the default; the others are opt-in, each with the
1/e_confirm ACCEPT guarantee (Monte Carlo checked in tests/stats/test_rules.py):
``lambda_mixture`` (`LambdaMixture`, an adaptive bet) and ``old_blocks`` (`BlockEnd`, the old
gate's block-end decisions, for comparison).
"""

from __future__ import annotations

from ._blocks import BlockEnd
from ._mixture import LambdaMixture
from ._oc import OperatingCharacteristics
from ._params import Action, GateParams
from ._probation import _terminals
from ._process import DecisionRule, PairedBetting

DECISION_RULES = ("paired_betting", "lambda_mixture", "old_blocks")


def decision_rule(name: str) -> DecisionRule:
    """The rule called ``name`` (one of `DECISION_RULES`)."""
    if name == "paired_betting":
        return PairedBetting()
    if name == "lambda_mixture":
        return LambdaMixture()
    if name == "old_blocks":
        return BlockEnd()
    raise ValueError(f"decision_rule must be one of {', '.join(DECISION_RULES)}, got {name!r}")


def rule_oc(rule: DecisionRule, params: GateParams, p_win: float, discordance: float,
            n_units: int) -> OperatingCharacteristics:
    """Exact exit probabilities and expected units of any rule whose state is a function of
    (W, L, units consumed), on i.i.d. units without INFRA (dynamic programming)."""
    ends, units = _terminals(rule, params, p_win, discordance, n_units)
    p = {a: sum(pr for o, pr in ends if o.action is a) for a in Action}
    pairs = sum(pr * o.n_used for o, pr in ends)
    return OperatingCharacteristics(p[Action.ACCEPT], p[Action.REJECT], p[Action.FUTILE],
                                    p[Action.PROVISIONAL], p[Action.INERTIA], units, pairs,
                                    p_win, discordance, n_units, 0.0)
