"""The forecast kernel: the exact OC recursion started from a running type's state."""

from __future__ import annotations

import pytest

from vtrm_gate.stats import (
    Action,
    ForecastPrior,
    GateParams,
    GateState,
    forecast_rates,
    gate_decision,
    oc_from_state,
    operating_characteristics,
    update_state,
)

PARAMS = [GateParams(), GateParams(delta_min=0.05, lambda_dir=0.6, n_max=30),
          GateParams(e_confirm=8.0, w_net_min=2, e_provisional=1.5, n_max=25)]
WIN, LOSS, TIE = (False, True), (True, False), (True, True)


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("infra", [0.0, 0.05])
def test_from_the_start_it_is_operating_characteristics(params, infra):
    n = params.n_max
    a = oc_from_state(params, GateState(), n, 0.7, 0.4, infra)
    b = operating_characteristics(params, 0.7, 0.4, n, infra)
    for name in ("p_accept", "p_reject", "p_futile", "p_provisional", "p_inertia",
                 "expected_units"):
        assert getattr(a, name) == pytest.approx(getattr(b, name), abs=1e-12), name


def _after(params: GateParams, pairs) -> GateState:
    state = GateState()
    for p in pairs:
        state = update_state(state, p, params)
    return state


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("seen", [[WIN, WIN, TIE], [LOSS, WIN, None, TIE, LOSS], [WIN] * 4])
def test_one_step_of_the_recursion_from_any_state(params, seen):
    """Total probability over the next unit: exits from a state = the law of the next unit
    times the exits of the state it leads to (a decided next state is its own exit)."""
    state, n = _after(params, seen), params.n_max - len(seen)
    p_win, disc, infra = 0.65, 0.5, 0.05
    here = oc_from_state(params, state, n, p_win, disc, infra)
    q = 1 - infra
    law = ((WIN, q * disc * p_win), (LOSS, q * disc * (1 - p_win)), (TIE, q * (1 - disc)),
           (None, infra))
    expect = dict.fromkeys(here.probabilities(), 0.0)
    units = 0.0
    for pair, p in law:
        nxt = update_state(state, pair, params)
        action = gate_decision(nxt, n - 1, params)
        if action is not Action.CONTINUE:
            expect[action] += p
            units += p
            continue
        sub = oc_from_state(params, nxt, n - 1, p_win, disc, infra)
        for a, v in sub.probabilities().items():
            expect[a] += p * v
        units += p * (1 + sub.expected_units)
    for a, v in here.probabilities().items():
        assert v == pytest.approx(expect[a], abs=1e-9), a
    assert here.expected_units == pytest.approx(units, abs=1e-9)


@pytest.mark.parametrize("params", PARAMS)
def test_expected_units_left_is_the_sum_of_the_survival_curve(params):
    state = _after(params, [WIN, TIE, LOSS, WIN])
    oc = oc_from_state(params, state, params.n_max - 4, 0.7, 0.5, 0.02)
    assert oc.survival[0] == 1.0 and len(oc.survival) == params.n_max - 4 + 1
    assert all(a >= b - 1e-12 for a, b in zip(oc.survival, oc.survival[1:], strict=False))
    assert oc.expected_units == pytest.approx(sum(oc.survival[:-1]), abs=1e-9)
    assert sum(oc.probabilities().values()) == pytest.approx(1.0, abs=1e-9)


def test_a_type_on_its_last_unit_exits_there():
    oc = oc_from_state(GateParams(), GateState(), 1, 0.9, 1.0)
    assert oc.expected_units == 1.0 and oc.survival == (1.0, 0.0)
    assert oc.p_inertia == pytest.approx(1.0)  # one win cannot reach E+ >= 2 with W-L >= 2


def test_forecast_rates_start_at_the_prior_and_move_to_the_data():
    prior = ForecastPrior()
    assert forecast_rates(GateState(), prior) == (0.5, 0.3, 0.0)
    many = GateState(W=80, L=20, n_used=200, n_consumed=210)
    p_win, disc, infra = forecast_rates(many, prior)
    assert p_win == pytest.approx(80 / 100, abs=0.02) and disc == pytest.approx(0.5, abs=0.02)
    assert infra == pytest.approx(10 / 230)
    with pytest.raises(ValueError, match="win_weight"):
        ForecastPrior(win_weight=0)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="n_remaining"):
        oc_from_state(GateParams(), GateState(), -1, 0.5, 0.5)
    with pytest.raises(ValueError, match="p_win"):
        oc_from_state(GateParams(), GateState(), 3, 1.5, 0.5)
