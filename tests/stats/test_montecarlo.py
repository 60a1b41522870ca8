"""Monte Carlo helpers: the outcome/latency model, and why arrival order is invalid."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vtrm_gate import GateParams
from vtrm_gate.stats import (
    cand_wrong_probability,
    correlated_latency,
    false_accept_curve,
    paired_outcomes,
    paired_sample,
    units_curve,
    wilson_interval,
)

N_REP = 20_000  # binomial SE at p = 0.05 is 0.0015: tight enough, ~0.5 s


def test_null_outcomes_have_zero_mean_difference_and_requested_discordance():
    base, cand = paired_outcomes(np.random.default_rng(1), 4000, 40, 0.3, 0.5)
    d = cand.astype(int) - base.astype(int)
    assert abs(d.mean()) < 0.005
    assert abs(np.mean(d != 0) - 0.3) < 0.005


def test_alternative_outcomes_have_the_model_mean():
    base, cand = paired_outcomes(np.random.default_rng(2), 4000, 40, 0.5, 0.8)
    d = cand.astype(int) - base.astype(int)
    assert abs(d.mean() - 0.5 * (2 * 0.8 - 1)) < 0.01


def test_latency_log_correlates_with_wrongness_as_requested():
    rng = np.random.default_rng(3)
    _, cand = paired_outcomes(rng, 2000, 40, 0.5, 0.5)
    p_wrong = cand_wrong_probability(0.5, 0.5, 0.5)
    for rho in (0.0, 0.5, 0.9):
        t = correlated_latency(rng, cand, rho, p_wrong)
        r = np.corrcoef(np.log(t).ravel(), (~cand).ravel().astype(float))[0, 1]
        assert abs(r - rho) < 0.02


def test_full_correlation_makes_every_right_answer_arrive_first():
    s = paired_sample(200, 40, 0.5, 0.5, correlation=1.0, seed=4)
    for row_t, row_c in zip(s.completion, s.cand, strict=True):
        assert row_t[row_c].max() < row_t[~row_c].min()


def test_same_seed_same_curve_other_seed_other_curve():
    p = GateParams()
    a = false_accept_curve(p, [0.0, 0.8], 2000, seed=7)
    assert a == false_accept_curve(p, [0.0, 0.8], 2000, seed=7)
    assert a != false_accept_curve(p, [0.0, 0.8], 2000, seed=8)


def test_prefix_false_accept_under_h0_is_within_ville_bound():
    p = GateParams()
    c = false_accept_curve(p, [0.0, 0.5, 0.9], N_REP, seed=11)
    se = math.sqrt(c.bound * (1 - c.bound) / N_REP)
    assert c.prefix_rate <= c.bound + 3 * se
    # and it matches the exact dynamic programme for the same i.i.d. model
    se_exact = math.sqrt(c.exact_prefix * (1 - c.exact_prefix) / N_REP)
    assert abs(c.prefix_rate - c.exact_prefix) <= 4 * se_exact


def test_arrival_order_false_accept_grows_with_correlation_and_breaks_the_bound():
    c = false_accept_curve(GateParams(), [0.0, 0.5, 0.9], N_REP, seed=12)
    r0, r5, r9 = c.arrival_rates
    se = math.sqrt(0.05 * 0.95 / N_REP)
    # no correlation: arrival order is a random permutation, still valid
    assert r0 <= c.bound + 3 * se
    assert r0 < r5 < r9
    assert r9 >= 5 * c.prefix_rate and r9 > 5 * c.bound


def test_curve_columns_state_the_replicate_count_and_bound():
    c = false_accept_curve(GateParams(e_confirm=10), [0.0, 1.0], 500, seed=1, n_units=20)
    cols = c.columns()
    assert cols["order"] == ["prefix", "prefix", "arrival", "arrival"]
    assert set(cols["n_rep"]) == {500} and set(cols["bound"]) == {0.1}
    assert set(cols["n_units"]) == {20}
    assert all(lo <= r <= hi for lo, r, hi in
               zip(cols["ci_low"], cols["false_accept"], cols["ci_high"], strict=True))


def test_prefix_never_consumes_more_than_blocks_and_saves_more_for_good_candidates():
    u = units_curve(GateParams(), [0.5, 0.7, 0.9], 3000, seed=5)
    assert all(p <= b for p, b in zip(u.prefix_units, u.block_units, strict=True))
    assert all(p <= u.n_units for p in u.prefix_units)
    assert u.prefix_units[2] < u.prefix_units[1]
    assert u.prefix_accept[2] > u.prefix_accept[0]


def test_wilson_interval_brackets_the_estimate():
    lo, hi = wilson_interval(np.array([0, 5, 100]), 100)
    assert lo[0] == pytest.approx(0.0, abs=1e-12) and hi[0] > 0
    assert lo[1] < 0.05 < hi[1] and hi[2] == pytest.approx(1.0)


@pytest.mark.parametrize("n", [7, 100, 500, 20_000])
def test_wilson_interval_contains_k_over_n_at_both_ends(n):
    # At k = 0 the lower end came out 4e-19 > 0 (n = 500): an error bar drawn from it has a
    # negative length, which matplotlib refuses (the explorer's Monte Carlo check crashed).
    lo, hi = wilson_interval(np.array([0, n]), n)
    assert lo[0] <= 0.0 <= hi[0] and lo[1] <= 1.0 <= hi[1]


@pytest.mark.parametrize("kw,fragment", [
    ({"discordance": 1.5}, "discordance"),
    ({"p_win": -0.1}, "p_win"),
    ({"n_rep": 0}, "n_rep"),
])
def test_invalid_model_arguments_name_the_argument(kw, fragment):
    args = {"n_rep": 10, "n_units": 5, "discordance": 0.5, "p_win": 0.5} | kw
    with pytest.raises(ValueError, match=fragment):
        paired_sample(**args)


def test_invalid_correlation_is_refused():
    with pytest.raises(ValueError, match="correlation"):
        false_accept_curve(GateParams(), [1.2], 10)
