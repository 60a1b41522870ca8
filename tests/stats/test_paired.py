"""Paired differences of proportions (the evaluation's gain): Newcombe's method 10 against a
published value, its coverage by Monte Carlo, the MOVER mean over types."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vtrm_gate.stats import MOVER, NEWCOMBE, mover_mean, paired_difference, same_skill


def test_newcombe_method_10_matches_the_published_example():
    # Fagerland, Lydersen & Laake (2017), ch. 8 (Cavo et al. 2012): table 59 6 / 16 80,
    # difference -0.0621, 95% CI -0.1186 to -0.0046 (R contingencytables).
    d = paired_difference(59, 6, 16, 80)
    assert d.method == NEWCOMBE and d.n == 161
    assert (round(d.estimate, 4), round(d.lo, 4), round(d.hi, 4)) == (-0.0621, -0.1186,
                                                                      -0.0046)


def test_swapping_the_two_skills_mirrors_the_interval():
    a, b = paired_difference(20, 9, 3, 8), paired_difference(20, 3, 9, 8)
    assert (a.estimate, a.lo, a.hi) == pytest.approx((-b.estimate, -b.hi, -b.lo))


@pytest.mark.parametrize("n, p_first, p_second, rho", [(40, 0.6, 0.5, 0.6), (64, 0.55, 0.55, 0.7),
                                                       (30, 0.7, 0.5, 0.3)])
def test_coverage_is_close_to_95_percent(n, p_first, p_second, rho):
    # 4000 replicates of n correlated pairs (Gaussian copula); Newcombe's method 10 is
    # near nominal from n ~ 30 (Fagerland et al. 2014). The band 0.93-0.975 is +-6 SE.
    rng = np.random.default_rng(20260516)
    from statistics import NormalDist

    nd = NormalDist()
    z = rng.standard_normal((4000, n, 2))
    z[..., 1] = rho * z[..., 0] + math.sqrt(1 - rho * rho) * z[..., 1]
    first, second = z[..., 0] < nd.inv_cdf(p_first), z[..., 1] < nd.inv_cdf(p_second)
    truth = p_first - p_second
    hits = 0
    for f, s in zip(first, second, strict=True):
        d = paired_difference(int((f & s).sum()), int((f & ~s).sum()), int((~f & s).sum()),
                              int((~f & ~s).sum()))
        hits += d.lo <= truth <= d.hi
    assert 0.93 <= hits / 4000 <= 0.975, hits / 4000


def test_the_mean_over_types_combines_the_limits_by_square_and_add():
    ds = [paired_difference(20, 6, 2, 12), paired_difference(10, 1, 4, 5), same_skill(30)]
    m = mover_mean(ds)
    est = sum(d.estimate for d in ds) / 3
    assert m.method == MOVER and m.estimate == pytest.approx(est)
    assert m.lo == pytest.approx(est - math.sqrt(sum((d.estimate - d.lo) ** 2 for d in ds)) / 3)
    assert m.hi == pytest.approx(est + math.sqrt(sum((d.hi - d.estimate) ** 2 for d in ds)) / 3)
    assert m.n == 40 + 20 + 30


def test_no_units_give_no_estimate_and_the_same_skill_gives_exactly_zero():
    assert math.isnan(paired_difference(0, 0, 0, 0).estimate)
    s = same_skill(12)
    assert (s.estimate, s.lo, s.hi, s.n) == (0.0, 0.0, 0.0, 12)
    assert s.points() == "+0.0 points [+0.0, +0.0]"
    with pytest.raises(ValueError, match="counts must be integers >= 0"):
        paired_difference(1, -1, 0, 0)
