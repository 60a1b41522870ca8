"""The parameter explorer: exact fast OC, headless figure, sliders redraw, the 40-unit answer."""

from __future__ import annotations

import asyncio

import pytest

from vtrm_gate.stats import Action, GateParams
from vtrm_gate.views import Explorer, Point, explore, monte_carlo_check, point_oc, tradeoffs


@pytest.mark.parametrize(("params", "p_win", "disc", "n", "p_accept"), [
    # λ at its maximum 1/(1+δ): a single loss zeroes E+ (issue 7 item 13's numbers).
    (GateParams(lambda_dir=1.0, n_max=10), 0.8, 0.5, 10, 0.20416),
    # e_confirm exactly equal to an attainable E+ (1.5**7 after 7 straight wins).
    (GateParams(e_confirm=1.5**7, w_net_min=1, n_max=7), 0.8, 1.0, 7, 0.8**7),
])
def test_the_explorer_is_exact_at_the_boundaries(params, p_win, disc, n, p_accept):
    # The explorer's numbers are the kernel's exact OC (once a separate log-space copy that
    # said 0 at a threshold hit exactly).
    assert point_oc(params, p_win, disc, n).p_accept == pytest.approx(p_accept, abs=1e-5)


def test_monte_carlo_check_agrees_with_the_exact_point():
    point = Point(GateParams(), 0.7, 0.5)
    mc = monte_carlo_check(point, n_rep=20_000, seed=1)
    exact = point_oc(point.params, 0.7, 0.5, 40)
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


def test_lambda_is_clamped_to_its_valid_range_as_delta_moves():
    # Was: δ 0.05 then λ 1.0 gave a red error and left the stale figure up.
    ex = Explorer(debounce=0)
    ex.sliders["lambda_dir"].value = 1.0
    ex.sliders["delta_min"].value = 0.05
    assert ex.sliders["lambda_dir"].max == pytest.approx(1 / 1.05)
    assert ex.point.params.lambda_dir == pytest.approx(1 / 1.05)
    assert ex.error == "" and "moved from 1" in ex.note.value
    ex.sliders["lambda_dir"].value = 1.0  # past the end: the slider stops at 1/(1+δ)
    assert ex.point.params.lambda_dir == pytest.approx(1 / 1.05)
    ex.sliders["delta_min"].value = 0.0
    assert ex.sliders["lambda_dir"].max == 1.0


def test_an_invalid_setting_greys_the_figure_and_monte_carlo_says_it_cannot_run():
    ex = Explorer(debounce=0, mc_reps=500)
    good = ex.image.value
    ex.sliders["lambda_dir"].max = 2.0  # a setting the sliders cannot reach on their own
    ex.sliders["lambda_dir"].value = 1.5
    assert "lambda_dir" in ex.error and ex.image.value != good
    assert ex.check() is False and "not run" in ex.message.value
    assert ex.mc is None
    ex.sliders["lambda_dir"].value = 0.5
    assert ex.check() is True and ex.mc is not None and "500 runs" in ex.message.value


def test_forty_units_need_e_confirm_10_to_accept_a_07_candidate_half_the_time():
    grid = tradeoffs(p_win=0.7, n_units=40, discordance=0.5, target=0.5)
    best = grid.filter(grid["meets"]).row(0, named=True)
    assert (best["e_confirm"], best["lambda_dir"]) == (10.0, 0.5)
    assert best["p_accept"] == pytest.approx(0.5083, abs=1e-4)
    assert best["false_accept_h0"] == pytest.approx(0.0563, abs=1e-4)
    assert best["false_accept_h0"] <= best["bound"]


def test_after_a_slider_move_the_explorer_is_greyed_out_until_it_shows_the_new_setting():
    """The slider, the numbers and the figure disagreed for seconds after a move, unmarked;
    now the figure and numbers are greyed out and the button disabled until they agree."""

    async def move() -> tuple[Explorer, tuple[bool, set, set, bool], bytes]:
        ex = Explorer(debounce=0.05)
        before = ex.image.value
        ex.sliders["e_confirm"].value = 10.0
        during = (ex.recomputing, set(ex.image._dom_classes), set(ex.message._dom_classes),
                  ex.button.disabled)
        assert ex.image.value == before and ex.point.params.e_confirm == 20.0  # not yet
        await asyncio.sleep(0.3)
        return ex, during, before

    ex, during, before = asyncio.run(move())
    assert during == (True, {"vtrm-stale"}, {"vtrm-stale"}, True)
    assert not ex.recomputing and not ex.button.disabled
    assert "vtrm-stale" not in ex.image._dom_classes + ex.message._dom_classes
    assert ex.image.value != before and ex.point.params.e_confirm == 10.0
    oc = point_oc(ex.point.params, ex.point.p_win, ex.point.discordance, ex.point.n_units)
    assert f"<b>{oc.p_accept:.1%}</b>" in ex.message.value  # the numbers of the new setting
    assert ".vtrm-stale{opacity:0.35" in ex.widget.children[0].value


def test_the_button_and_every_slider_label_have_room():
    """The "Monte Carlo check" label was cut at the button's default 148 px, "assumed
    discordance" at a 120 px label (8 px a character at the widgets' 13 px font)."""
    ex = Explorer(debounce=0)
    assert ex.button.layout.width == "auto"
    for s in ex.sliders.values():
        width = int(s.style.description_width.removesuffix("px"))
        assert width >= 8 * len(s.description), s.description
