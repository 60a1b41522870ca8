"""An adaptive bet (opt-in): the accept-side e-process as a mixture over fixed bets.

``E+ = mean_j prod_i (1 + lambda_j (d_i - delta))`` over a grid of betting fractions. Each
component is the SPEC's e-process with its own lambda, so under H0+ (``E[d | past] <=
delta``) each is a non-negative supermartingale and so is their average: Ville gives
``P(sup E+ >= e_confirm) <= 1/e_confirm``, the ACCEPT guarantee unchanged. The mixture is an
adaptive bet in disguise: its wealth equals betting, at every unit, the fraction
``lambda_t = sum_j w_j lambda_j`` with weights ``w_j`` proportional to each component's
wealth so far (a predictable, data-driven lambda), so it drifts towards the lambda that
suits the candidate. Because each component depends on (W, L, ties) only, its exit
probabilities are exact by the same dynamic programming as the default rule (`rule_oc`).
The harm side (E-) and every other decision step are the SPEC's, with the fixed
``lambda_dir``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..errors import plain_fields
from ._params import Action, GateParams, Pair
from ._process import FUTILITY_RTOL, GateState, update_state

DEFAULT_LAMBDAS = (0.25, 0.5, 0.75, 0.9)


@dataclass(frozen=True)
class MixtureState(GateState):
    """`GateState` plus each component's capital (``e_plus`` is their mean)."""

    parts: tuple[float, ...] = field(default=())


@dataclass(frozen=True)
class LambdaMixture:
    """Paired betting whose E+ averages fixed-lambda e-processes (``lambdas``, each capped
    at ``1/(1+delta_min)``); decisions as SPEC §1 with that E+."""

    lambdas: tuple[float, ...] = DEFAULT_LAMBDAS
    name: str = "lambda_mixture"

    def __post_init__(self) -> None:
        plain_fields(self)
        if not self.lambdas or not all(isinstance(x, int | float) and 0 < x <= 1
                                       for x in self.lambdas):
            raise ValueError(f"LambdaMixture.lambdas must be numbers in (0, 1], got "
                             f"{self.lambdas!r}")

    def _grid(self, params: GateParams) -> tuple[float, ...]:
        cap = 1.0 / (1.0 + params.delta_min)
        return tuple(min(x, cap) for x in self.lambdas)

    def update(self, state: GateState, pair: Pair, params: GateParams) -> MixtureState:
        grid = self._grid(params)
        parts = getattr(state, "parts", ()) or (1.0,) * len(grid)
        s = update_state(state, pair, params)  # W, L, counts and the harm side E-
        if pair is not None:
            d = int(bool(pair[1])) - int(bool(pair[0]))
            parts = tuple(0.0 if (f := 1.0 + lam * (d - params.delta_min)) == 0.0 else p * f
                          for p, lam in zip(parts, grid, strict=True))
        return MixtureState(s.W, s.L, s.n_used, s.n_consumed, sum(parts) / len(parts),
                            s.e_minus, parts)

    def best_case(self, state: GateState, n_remaining: int, params: GateParams) -> float:
        """E+ after ``n_remaining`` straight wins (log space: no overflow)."""
        grid = self._grid(params)
        parts = getattr(state, "parts", ()) or (1.0,) * len(grid)
        logs = [math.log(p) + n_remaining * math.log1p(lam * (1 - params.delta_min))
                for p, lam in zip(parts, grid, strict=True) if p > 0]
        if not logs:
            return 0.0
        top = max(logs)
        return math.exp(top) * sum(math.exp(v - top) for v in logs) / len(parts)

    def decide(self, state: GateState, n_remaining: int, params: GateParams) -> Action:
        if state.e_plus >= params.e_confirm and state.w_net >= params.w_net_min:
            return Action.ACCEPT
        if state.e_minus >= params.e_reject:
            return Action.REJECT
        if n_remaining > 0:
            best = self.best_case(state, n_remaining, params) * (1.0 + FUTILITY_RTOL)
            w_best = state.w_net + n_remaining
            hopeful = ((best >= params.e_confirm and w_best >= params.w_net_min)
                       or (best >= params.e_provisional
                           and w_best >= params.w_net_min_provisional))
            return Action.CONTINUE if hopeful else Action.FUTILE
        if state.e_plus >= params.e_provisional and state.w_net >= params.w_net_min_provisional:
            return Action.PROVISIONAL
        return Action.INERTIA


def start_state(rule: LambdaMixture) -> MixtureState:
    """The state before any unit (every component's capital 1)."""
    return replace(MixtureState(), parts=(1.0,) * len(rule.lambdas))
