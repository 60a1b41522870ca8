"""Validity by seeded Monte Carlo (tier 2; tier 1, exact, lives in test_stats.py).

Each null case compares a Monte Carlo false-accept count with the exact rate ``p0`` of
`operating_characteristics` at the H0+ boundary (``E[d] = delta``) and checks Ville's
bound ``p0 <= 1/e_confirm``. Replicate counts R are sized so that each case would detect a
doubling of its exact rate: the acceptance band ``p0 ± 3.29 sd0`` (a correct
implementation fails a case 1 time in 1,000) lies below ``2 p0 - 2.33 sd1`` (a doubled
rate is caught 99 times in 100); ``test_sizing`` asserts it for every case. Each check
also has a negative control that must fail.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from vtrm_gate import (
    Action,
    GateParams,
    GuardParams,
    operating_characteristics,
    replay_arrival_batch,
    replay_prefix,
    replay_prefix_batch,
    run_gate,
)
from vtrm_gate.stats import GateState, gate_decision
from vtrm_gate.testing import OutcomeTable

Z99 = 2.3263478740408408  # one-sided 99% normal quantile
Z_ALARM = 3.2905267314919255  # two-sided 99.9%: false alarm rate of one case
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


def band(p0: float, R: int) -> tuple[float, float]:
    """The counts a correct implementation produces 999 times in 1,000."""
    sd = math.sqrt(R * p0 * (1 - p0))
    return R * p0 - Z_ALARM * sd, R * p0 + Z_ALARM * sd


def detects_doubling(p0: float, R: int) -> bool:
    """A true rate of 2 p0 lands above the band 99 times in 100."""
    return band(p0, R)[1] < R * 2 * p0 - Z99 * math.sqrt(R * 2 * p0 * (1 - 2 * p0))


def h0_p_win(params: GateParams, discordance: float) -> float:
    """p_win at the H0+ boundary: E[d] = discordance * (2 p_win - 1) = delta_min."""
    return (1 + params.delta_min / discordance) / 2


def null_world(rng: np.random.Generator, R: int, n: int, discordance: float,
               slow_wrong: float = 0.0, p_win: float = 0.5, infra_rate: float = 0.0):
    """Paired outcomes (H0 by default); cand latency lognormal, slower when cand is wrong.

    The base arm is a cache hit (instant), so a unit completes when its cand arm does.
    Returns base, cand, completion times and the INFRA mask, each of shape (R, n).
    """
    disc = rng.random((R, n)) < discordance
    win = rng.random((R, n)) < p_win
    both = rng.random((R, n)) < 0.6
    base = np.where(disc, ~win, both)
    cand = np.where(disc, win, both)
    t = rng.lognormal(0.0, 0.5, (R, n)) * np.exp(slow_wrong * ~cand)
    infra = rng.random((R, n)) < infra_rate
    return base, cand, t, infra


def as_pairs(base, cand, infra):
    return [[None if i else (bool(b), bool(c)) for b, c, i in zip(rb, rc, ri, strict=True)]
            for rb, rc, ri in zip(base, cand, infra, strict=True)]


# (path, params, discordance, infra_rate, R): R sized by test_sizing
DELTA = GateParams(delta_min=0.1, lambda_dir=0.8)
CASES = {
    "batch delta 0, disc 0.2": ("batch", GateParams(), 0.2, 0.0, R_NULL),
    "batch delta 0, disc 0.5": ("batch", GateParams(), 0.5, 0.0, R_NULL),
    "batch delta 0, disc 1.0": ("batch", GateParams(), 1.0, 0.0, R_NULL),
    "batch delta 0.1, INFRA 0.1": ("batch", DELTA, 0.5, 0.1, R_NULL),
    "scalar delta 0.1, INFRA 0.1": ("scalar", GateParams(e_confirm=10, delta_min=0.1,
                                                     lambda_dir=0.8), 0.5, 0.1, 2_000),
    "live delta 0.05, INFRA 0.1": ("live", GateParams(e_confirm=4, w_net_min=1, delta_min=0.05,
                                                 lambda_dir=0.6, n_max=20), 0.6, 0.1, 600),
}


def exact_null_rate(params: GateParams, discordance: float, infra_rate: float) -> float:
    return operating_characteristics(params, h0_p_win(params, discordance), discordance,
                                     params.n_max, infra_rate).p_accept


@pytest.mark.parametrize("case", list(CASES))
def test_sizing(case):
    """Every case can detect a doubling of its exact rate, and that rate obeys Ville."""
    _, params, disc, infra_rate, R = CASES[case]
    p0 = exact_null_rate(params, disc, infra_rate)
    assert p0 <= 1 / params.e_confirm, (p0, 1 / params.e_confirm)
    assert detects_doubling(p0, R), (p0, R)


def _accepts(path: str, params: GateParams, base, cand, infra, seed: int) -> int:
    if path == "batch":
        return int(np.sum(replay_prefix_batch(base, cand, params, infra=infra).action == 1))
    pairs = as_pairs(base, cand, infra)
    if path == "scalar":
        return sum(replay_prefix(p, params).action is Action.ACCEPT for p in pairs)
    import random

    from vtrm_gate.sim import run_virtual

    rng = random.Random(seed)
    table = OutcomeTable({f"T{i:04d}": p for i, p in enumerate(pairs)},
                         latency=lambda t, r: rng.choice([0.5, 1.0, 2.0, 8.0]))
    res = run_virtual(run_gate(table.plans(), table, params, concurrency=64,
                               guard=GuardParams(max_ratio=1.0)))
    return sum(a is Action.ACCEPT for a in res.decisions().values())


@pytest.mark.parametrize("case", list(CASES))
def test_false_accept_under_h0_matches_the_exact_rate(case):
    """The count of false accepts lies in the 99.9% band around R * p0 (sizes: see
    `CASES`; R 20,000 for the numpy batch replay, 2,000 for the scalar replay, 600 types in
    one live gate on a virtual clock, with random completion order)."""
    path, params, disc, infra_rate, R = CASES[case]
    seed = 2026 + sorted(CASES).index(case)
    rng = np.random.default_rng(seed)
    base, cand, _, infra = null_world(rng, R, params.n_max, disc,
                                      p_win=h0_p_win(params, disc), infra_rate=infra_rate)
    k = _accepts(path, params, base, cand, infra, seed)
    lo, hi = band(exact_null_rate(params, disc, infra_rate), R)
    assert lo <= k <= hi, (k, lo, hi)


def test_negative_control_arrival_order_with_slow_wrong_answers_fails():
    """Consuming in completion order when wrong answers are slower inflates false accepts
    to several times the bound; the same outcomes in ladder order stay valid."""
    p = GateParams()
    rng = np.random.default_rng(11)
    base, cand, t, _ = null_world(rng, R_NULL, p.n_max, 0.5, slow_wrong=2.0)
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
    base, cand, _, _ = null_world(rng, R, p.n_max, 0.5)
    pairs = np.stack([base, cand], axis=-1).tolist()
    k_peek = sum(replay_prefix([tuple(x) for x in row], p, rule=PeekingBet()).action
                 is Action.ACCEPT for row in pairs)
    k_fair = sum(replay_prefix([tuple(x) for x in row], p).action is Action.ACCEPT
                 for row in pairs)
    assert not valid(k_peek, R, p)
    assert wilson_lower(k_peek, R) > 3 / p.e_confirm
    assert valid(k_fair, R, p)


def test_negative_control_a_doubled_rate_leaves_the_band():
    """The band is not too wide to notice: a world at twice each case's exact rate (a
    candidate that truly improves) lands above it in the batch replay."""
    params, disc = DELTA, 0.5
    p0 = exact_null_rate(params, disc, 0.1)
    # find the p_win at which the exact accept rate doubles, then sample it
    lo_pw, hi_pw = h0_p_win(params, disc), 1.0
    for _ in range(20):
        mid = (lo_pw + hi_pw) / 2
        rate = operating_characteristics(params, mid, disc, params.n_max, 0.1).p_accept
        lo_pw, hi_pw = (mid, hi_pw) if rate < 2 * p0 else (lo_pw, mid)
    rng = np.random.default_rng(99)
    base, cand, _, infra = null_world(rng, R_NULL, params.n_max, disc, p_win=lo_pw,
                                      infra_rate=0.1)
    k = _accepts("batch", params, base, cand, infra, 0)
    assert k > band(p0, R_NULL)[1]


def test_wilson_bounds_are_sane():
    assert wilson_upper(0, 20_000) < 3e-4
    assert wilson_lower(500, 1000) < 0.5 < wilson_upper(500, 1000)
    assert detects_doubling(0.05, 2_000) and not detects_doubling(0.01, 1_000)
