"""The decision rules a run may choose (``RunOptions.decision_rule``) and their exact
operating characteristics.

``paired_betting`` is the SPEC's and the default; the others are opt-in, each with the
1/e_confirm ACCEPT guarantee (Monte Carlo checked in tests/stats/test_rules.py):
``lambda_mixture`` (`LambdaMixture`, an adaptive bet) and ``old_blocks`` (`BlockEnd`, the old
gate's block-end decisions, for comparison).
"""

from __future__ import annotations

import math

from ._blocks import BlockEnd
from ._mixture import LambdaMixture
from ._oc import OperatingCharacteristics
from ._params import Action, GateParams, bet_factors
from ._probation import _terminals
from ._process import DecisionRule, PairedBetting, SequentialTest

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


def fastest_accept(params: GateParams, rule: DecisionRule | None = None) -> int | None:
    """The fewest units after which ``rule`` can ACCEPT (that many straight wins, the best a
    candidate can do), or None when no ladder of at most ``params.n_max`` units can ever be
    accepted: a parameter mistake (``w_net_min`` above ``n_max``, an ``e_confirm`` out of
    reach) that would gate every candidate out."""
    if params.w_net_min > params.n_max:  # no need to walk n_max units to know
        return None
    if rule is None or type(rule) is PairedBetting:
        # E+ after k straight wins is win_factor**k; no FUTILE comes first (the futility
        # check never stops a ladder that can still end ACCEPT). The closed form's unit of
        # rounding is settled by multiplying as the kernel multiplies, up to _WALK units.
        k_est = max(params.w_net_min, math.ceil(math.log(params.e_confirm)
                                                / params.log_win_factor))
        if k_est > params.n_max + 1:
            return None
        if k_est > _WALK:  # the closed form, trusted this far out: within n_max or none
            return k_est if k_est <= params.n_max else None
        f_win, e_plus = bet_factors(params, 1)[0], 1.0
        for k in range(1, min(params.n_max, k_est + 1) + 1):
            e_plus *= f_win
            if e_plus >= params.e_confirm and k >= params.w_net_min:
                return k
        return None
    test = SequentialTest(params.n_max, params, rule)  # any other rule: its own walk
    while not test.decided:
        test.consume(test.state.n_consumed, (False, True))
    out = test.outcome()
    return out.n_consumed if out.action is Action.ACCEPT else None


_WALK = 1_000_000
"""Up to this many units `fastest_accept` multiplies E+ out (~50 ms); beyond, the closed form."""
