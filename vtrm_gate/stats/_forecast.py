"""Where a running type is heading: the exact OC recursion started from its current state.

`oc_from_state` is `operating_characteristics` begun at a type's (W, L, E+, E-) with
``n_remaining`` ladder units left, under i.i.d. units from here on: exit probabilities, the
expected number of units still to consume, and P(still undecided after k more units).
`forecast_rates` gives the assumed law: the type's own discordance, win rate and INFRA
rate so far, shrunk toward a prior so that a type with three units seen is not taken at its
word. It is a forecast under that assumption, never a guarantee: the real units are not
i.i.d. (the ladder puts the units the seed baseline got wrong first).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import plain_fields
from ._oc import recursion
from ._params import Action, GateParams
from ._process import GateState


@dataclass(frozen=True)
class StateOC:
    """Exact exits from a type's current state; ``survival[k]`` = P(no decision within the
    next k consumed units), k = 0 .. n_remaining (survival[0] = 1)."""

    p_accept: float
    p_reject: float
    p_futile: float
    p_provisional: float
    p_inertia: float
    expected_units: float
    survival: tuple[float, ...]
    p_win: float
    discordance: float
    infra_rate: float
    n_remaining: int

    def probabilities(self) -> dict[Action, float]:
        return {Action.ACCEPT: self.p_accept, Action.PROVISIONAL: self.p_provisional,
                Action.INERTIA: self.p_inertia, Action.FUTILE: self.p_futile,
                Action.REJECT: self.p_reject}


@dataclass(frozen=True)
class ForecastPrior:
    """Pseudo-counts the observed rates are shrunk toward (defaults: p_win 0.5 over 4
    discordant pairs, discordance 0.3 over 10 units, INFRA 0 over 20 units)."""

    p_win: float = 0.5
    win_weight: float = 4.0
    discordance: float = 0.3
    discordance_weight: float = 10.0
    infra_weight: float = 20.0

    def __post_init__(self) -> None:
        plain_fields(self)
        for name in ("p_win", "discordance"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"ForecastPrior.{name} must be in [0, 1], got {v!r}")
        for name in ("win_weight", "discordance_weight", "infra_weight"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ForecastPrior.{name} must be > 0, got {getattr(self, name)!r}")


def forecast_rates(state: GateState, prior: ForecastPrior | None = None
                   ) -> tuple[float, float, float]:
    """(p_win, discordance, infra_rate) assumed from here on: what the type showed so far,
    shrunk toward ``prior`` (posterior means of Beta priors with those pseudo-counts)."""
    pr = prior or ForecastPrior()
    pairs = state.W + state.L
    p_win = (state.W + pr.p_win * pr.win_weight) / (pairs + pr.win_weight)
    disc = (pairs + pr.discordance * pr.discordance_weight) / (state.n_used
                                                               + pr.discordance_weight)
    infra = (state.n_consumed - state.n_used) / (state.n_consumed + pr.infra_weight)
    return p_win, disc, infra


def oc_from_state(params: GateParams, state: GateState, n_remaining: int, p_win: float,
                  discordance: float, infra_rate: float = 0.0) -> StateOC:
    """Exact P(each exit), E[units still consumed] and the survival curve of the default
    paired-betting rule from ``state`` with ``n_remaining`` units left (O(n³), like
    `operating_characteristics`, whose recursion it is)."""
    n = n_remaining
    start = (state.e_plus, state.e_minus, state.W - state.L)
    exits, units, _, alive = recursion(params, n, p_win, discordance, infra_rate, start,
                                       n_name="n_remaining")
    survival = tuple(alive) + (0.0,) * (n + 1 - len(alive))
    return StateOC(exits[Action.ACCEPT], exits[Action.REJECT], exits[Action.FUTILE],
                   exits[Action.PROVISIONAL], exits[Action.INERTIA], units, survival,
                   p_win, discordance, infra_rate, n)
