"""The parameter explorer: exact fast OC, headless figure, sliders redraw, the 40-unit answer."""

from __future__ import annotations

import pytest

from vtrm_gate.explore import Explorer, Point, explore, fast_oc, monte_carlo_check, tradeoffs
from vtrm_gate.stats import Action, GateParams, operating_characteristics


@pytest.mark.parametrize("params", [GateParams(), GateParams(lambda_dir=0.9),
                                    GateParams(delta_min=0.1, lambda_dir=0.6),
                                    GateParams(e_confirm=8, w_net_min=0)])
@pytest.mark.parametrize(("p_win", "disc", "n"), [(0.7, 0.5, 40), (0.5, 0.3, 23), (0.9, 1.0, 9)])
def test_fast_oc_equals_the_exact_dynamic_programme(params, p_win, disc, n):
    a, b = fast_oc(params, p_win, disc, n), operating_characteristics(params, p_win, disc, n)
    for f in ("p_accept", "p_provisional", "p_inertia", "p_futile", "p_reject"):
        assert getattr(a, f) == pytest.approx(getattr(b, f), abs=1e-12)
    assert a.expected_units == pytest.approx(b.expected_units, abs=1e-9)


def test_monte_carlo_check_agrees_with_the_exact_point():
    point = Point(GateParams(), 0.7, 0.5)
    mc = monte_carlo_check(point, n_rep=20_000, seed=1)
    exact = fast_oc(point.params, 0.7, 0.5, 40)
    _, lo, hi = mc[Action.ACCEPT]
    assert lo <= exact.p_accept <= hi


def test_headless_explore_renders_the_default_point_once():
    fig = explore(interactive=False)
    assert "ACCEPT 36.0% at p_win 0.7" in fig.texts[0].get_text() or \
        "ACCEPT 36.0% at p_win 0.7" in fig._suptitle.get_text()


def test_moving_a_slider_redraws_a_different_figure():
    ex = Explorer(debounce=0)  # no loop: redraw at once
    first, n = ex.image.value, ex.redraws
    ex.sliders["e_confirm"].value = 10.0
    assert ex.redraws == n + 1 and ex.image.value != first
    assert ex.point.params.e_confirm == 10.0


def test_an_invalid_combination_is_named_and_keeps_the_last_figure():
    ex = Explorer(debounce=0)
    ex.sliders["delta_min"].value = 0.3
    ex.sliders["lambda_dir"].value = 1.0
    assert "lambda" in ex.error.lower() or "λ" in ex.error


def test_forty_units_need_e_confirm_10_to_accept_a_07_candidate_half_the_time():
    grid = tradeoffs(p_win=0.7, n_units=40, discordance=0.5, target=0.5)
    best = grid.filter(grid["meets"]).row(0, named=True)
    assert (best["e_confirm"], best["lambda_dir"]) == (10.0, 0.5)
    assert best["p_accept"] == pytest.approx(0.5083, abs=1e-4)
    assert best["false_accept_h0"] == pytest.approx(0.0563, abs=1e-4)
    assert best["false_accept_h0"] <= best["bound"]
