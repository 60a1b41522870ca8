"""Validity by seeded Monte Carlo (tier 2; tier 1, exact, lives in test_stats.py).

Pass criterion: the one-sided 99% upper confidence bound (Wilson) of the false-accept rate
is <= 1/e_confirm. Each check has a negative control that must fail the same criterion.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from vtrm_gate import Action, GateParams, replay_arrival_batch, replay_prefix, replay_prefix_batch
from vtrm_gate.stats import GateState, gate_decision

Z99 = 2.3263478740408408  # one-sided 99% normal quantile
R_NULL = 20_000


def wilson_upper(k: int, n: int, z: float = Z99) -> float:
    p = k / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre + half) / (1 + z * z / n)


def wilson_lower(k: int, n: int, z: float = Z99) -> float:
    p = k / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n)


def valid(k: int, n: int, params: GateParams) -> bool:
    return wilson_upper(k, n) <= 1 / params.e_confirm


def null_world(rng: np.random.Generator, R: int, n: int, discordance: float,
               slow_wrong: float = 0.0):
    """H0 (p_win = 0.5) paired outcomes; cand latency lognormal, slower when cand is wrong.

    The base arm is a cache hit (instant), so a unit completes when its cand arm does.
    """
    disc = rng.random((R, n)) < discordance
    win = rng.random((R, n)) < 0.5
    both = rng.random((R, n)) < 0.6
    base = np.where(disc, ~win, both)
    cand = np.where(disc, win, both)
    t = rng.lognormal(0.0, 0.5, (R, n)) * np.exp(slow_wrong * ~cand)
    return base, cand, t


@pytest.mark.parametrize("discordance", [0.2, 0.5, 1.0])
def test_prefix_false_accept_under_h0_monte_carlo(discordance):
    p = GateParams()
    rng = np.random.default_rng(2026 + int(discordance * 10))
    base, cand, _ = null_world(rng, R_NULL, p.n_max, discordance)
    out = replay_prefix_batch(base, cand, p)
    k = int(np.sum(out.action == 1))
    assert valid(k, R_NULL, p), (k, wilson_upper(k, R_NULL))


def test_negative_control_arrival_order_with_slow_wrong_answers_fails():
    """Consuming in completion order when wrong answers are slower inflates false accepts
    to several times the bound; the same outcomes in ladder order stay valid."""
    p = GateParams()
    rng = np.random.default_rng(11)
    base, cand, t = null_world(rng, R_NULL, p.n_max, 0.5, slow_wrong=2.0)
    arrival = replay_arrival_batch(base, cand, t, p)
    prefix = replay_prefix_batch(base, cand, p)
    k_arr = int(np.sum(arrival.action == 1))
    k_pre = int(np.sum(prefix.action == 1))
    assert not valid(k_arr, R_NULL, p)
    assert wilson_lower(k_arr, R_NULL) > 3 / p.e_confirm  # several times the bound
    assert valid(k_pre, R_NULL, p)


class PeekingBet:
    """A look-ahead bug: it bets only when it has already seen that the unit is a win."""

    def update(self, state: GateState, pair, params: GateParams) -> GateState:
        if pair is None:
            return GateState(state.W, state.L, state.n_used, state.n_consumed + 1,
                             state.e_plus, state.e_minus)
        d = int(pair[1]) - int(pair[0])
        lam = params.lambda_dir if d == 1 else 0.0  # peeks at d before choosing the bet
        return GateState(state.W + (d == 1), state.L + (d == -1), state.n_used + 1,
                         state.n_consumed + 1, state.e_plus * (1 + lam * d),
                         state.e_minus * (1 - params.lambda_dir * d))

    def decide(self, state, n_remaining, params):
        return gate_decision(state, n_remaining, params)


def test_negative_control_look_ahead_bet_fails():
    p = GateParams()
    rng = np.random.default_rng(5)
    R = 4_000
    base, cand, _ = null_world(rng, R, p.n_max, 0.5)
    pairs = np.stack([base, cand], axis=-1).tolist()
    k_peek = sum(replay_prefix([tuple(x) for x in row], p, rule=PeekingBet()).action
                 is Action.ACCEPT for row in pairs)
    k_fair = sum(replay_prefix([tuple(x) for x in row], p).action is Action.ACCEPT
                 for row in pairs)
    assert not valid(k_peek, R, p)
    assert wilson_lower(k_peek, R) > 3 / p.e_confirm
    assert valid(k_fair, R, p)


def test_wilson_bounds_are_sane():
    assert wilson_upper(0, 20_000) < 3e-4
    assert wilson_lower(500, 1000) < 0.5 < wilson_upper(500, 1000)
