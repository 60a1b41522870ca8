"""The opt-in decision rules (issue 16): the lambda mixture (an adaptive bet) and the old
gate's block-end decisions. Exact OC by dynamic programming, checked against Monte Carlo;
validity (H0 false accept <= 1/e_confirm) exactly and by seeded Monte Carlo with a 99.9%
band; the live gate decides what replay_prefix decides with the rule, whatever the order."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from vtrm_gate import GateParams, run_gate
from vtrm_gate.options import options_from_mapping, resolve_options
from vtrm_gate.sim import run_virtual
from vtrm_gate.stats import (
    DECISION_RULES,
    Action,
    BlockEnd,
    LambdaMixture,
    PairedBetting,
    decision_rule,
    fastest_accept,
    operating_characteristics,
    replay_blocks,
    replay_prefix,
    rule_oc,
)
from vtrm_gate.testing import OutcomeTable

Z_ALARM = 3.2905267314919255  # two-sided 99.9%


def _sample(rng: np.random.Generator, n: int, p_win: float, disc: float, infra: float = 0.0):
    u = rng.random(n)
    out = []
    for x, i in zip(u, rng.random(n), strict=True):
        if i < infra:
            out.append(None)
        elif x < disc * p_win:
            out.append((False, True))
        elif x < disc:
            out.append((True, False))
        else:
            out.append((True, True) if x < (1 + disc) / 2 else (False, False))
    return out


def test_rule_oc_of_the_default_rule_is_the_kernels_exact_oc():
    for pw, d in ((0.5, 0.3), (0.8, 0.235), (0.9, 0.6)):
        a = operating_characteristics(GateParams(), pw, d, 40)
        b = rule_oc(PairedBetting(), GateParams(), pw, d, 40)
        assert (b.p_accept, b.p_provisional, b.expected_units) == pytest.approx(
            (a.p_accept, a.p_provisional, a.expected_units), abs=1e-12)


def test_block_end_rule_decides_what_replay_blocks_decides():
    rng = np.random.default_rng(7)
    for _ in range(300):
        seq = _sample(rng, int(rng.integers(1, 60)), float(rng.random()), 0.5, infra=0.1)
        params = GateParams(n_max=60)
        assert replay_prefix(seq, params, BlockEnd()).same_decision(replay_blocks(seq, params))


@pytest.mark.parametrize("name, rule", [("lambda_mixture", LambdaMixture()),
                                        ("old_blocks", BlockEnd())])
@pytest.mark.parametrize("disc, n", [(0.1, 9), (0.235, 40), (0.5, 80)])
def test_false_accept_is_at_most_one_over_e_confirm_exactly(name, rule, disc, n):
    params = GateParams(n_max=n)
    assert rule_oc(rule, params, 0.5, disc, n).p_accept <= 1 / params.e_confirm
    assert decision_rule(name) == rule


@pytest.mark.parametrize("name, rule", [("lambda_mixture", LambdaMixture()),
                                        ("old_blocks", BlockEnd())])
@pytest.mark.parametrize("disc", [0.235, 0.5])
def test_monte_carlo_false_accepts_fall_in_the_band_of_the_exact_rate(name, rule, disc):
    n = 40
    params = GateParams(n_max=n)
    p0 = rule_oc(rule, params, 0.5, disc, n).p_accept  # H0 boundary: E[d] = 0
    R = 2000  # the 99.9% band around the exact rate; seeded
    rng = np.random.default_rng(hash((name, disc, n)) % 2**32)
    hits = sum(replay_prefix(_sample(rng, n, 0.5, disc), params, rule).action is Action.ACCEPT
               for _ in range(R))
    sd = math.sqrt(R * p0 * (1 - p0))
    assert R * p0 - Z_ALARM * sd - 1 <= hits <= R * p0 + Z_ALARM * sd + 1, (hits, R * p0)


def test_mixture_is_valid_with_delta_at_the_h0_boundary():
    params = GateParams(delta_min=0.05, n_max=60)
    # E[d] = delta: p_win chosen so that disc * (2 p_win - 1) = delta
    disc = 0.4
    p_win = (1 + params.delta_min / disc) / 2
    assert rule_oc(LambdaMixture(), params, p_win, disc, 60).p_accept <= 1 / params.e_confirm


def test_mixture_power_exceeds_the_default_bet_where_discordance_is_low():
    # the simulator's ladders: ~0.235 discordance (issue 16's audit)
    for pw in (0.75, 0.85):
        mix = rule_oc(LambdaMixture(), GateParams(), pw, 0.235, 40).p_accept
        base = operating_characteristics(GateParams(), pw, 0.235, 40).p_accept
        assert mix > base + 0.08


def test_live_gate_with_the_mixture_matches_its_replay_whatever_the_completion_order():
    rng = np.random.default_rng(3)
    outcomes = {f"T{i}": _sample(rng, 40, 0.8, 0.4, infra=0.05) for i in range(5)}
    order = random.Random(5)
    lat = {}
    table = OutcomeTable(outcomes, latency=lambda t, r: lat.setdefault(
        (t.task_type, t.ladder_rank, t.arm), order.uniform(1, 100)))
    res = run_virtual(run_gate(table.plans(), table, GateParams(), concurrency=7,
                               rule=LambdaMixture(),
                               guard=__import__("vtrm_gate").GuardParams(min_calls=10**6)))
    for t, seq in outcomes.items():
        assert res.outcomes[t].same_decision(replay_prefix(seq, GateParams(), LambdaMixture()))


def test_decision_rule_is_a_run_option_recorded_only_when_not_the_default():
    o = options_from_mapping({"decision_rule": "lambda_mixture"})
    assert o.decision_rule == "lambda_mixture"
    assert o.decision_inputs()["decision_rule"] == "lambda_mixture"
    assert "decision_rule" not in resolve_options(env={}, dotenv=None).decision_inputs()
    env = resolve_options(env={"VTRM_DECISION_RULE": "old_blocks"}, dotenv=None)
    assert env.decision_rule == "old_blocks"
    with pytest.raises(ValueError, match="decision_rule must be one of paired_betting"):
        options_from_mapping({"decision_rule": "agrapa"})


@pytest.mark.parametrize("name", DECISION_RULES)
@pytest.mark.parametrize("kw", [{}, {"e_confirm": 1e6}, {"w_net_min": 12}, {"n_max": 5},
                                {"w_net_min": 41}, {"e_confirm": 1e300},
                                {"delta_min": 0.5, "lambda_dir": 0.2, "n_max": 30},
                                {"e_confirm": 2.0, "w_net_min": 0, "n_max": 1},
                                {"e_confirm": 1.5**7, "n_max": 7},  # exactly 7 wins
                                {"e_confirm": 1.5**7 + 1e-12, "n_max": 7},
                                {"lambda_dir": 0.3, "e_confirm": 1.3**10, "n_max": 10},
                                {"lambda_dir": 0.3, "e_confirm": 1.3**10, "n_max": 11}])
def test_fastest_accept_is_where_straight_wins_accept_and_none_where_none_can(name, kw):
    """The fewest straight wins that ACCEPT is the stop of replay_prefix on straight wins,
    and None exactly where the exact operating characteristics put ACCEPT at 0 even when
    every unit is a win."""
    params, rule = GateParams(**kw), decision_rule(name)
    n = fastest_accept(params, rule)
    oc = rule_oc(rule, params, p_win=1.0, discordance=1.0, n_units=params.n_max)
    assert (n is None) == (oc.p_accept == 0.0)
    if n is not None:
        out = replay_prefix([(False, True)] * params.n_max, params, rule=rule)
        assert out.action is Action.ACCEPT and out.stop_rank == n - 1


def test_fastest_accept_of_the_defaults_and_of_parameters_that_cannot_accept():
    assert fastest_accept(GateParams()) == 8  # 1.5**8 = 25.6 >= 20 (1.5**7 = 17.1)
    assert fastest_accept(GateParams(w_net_min=12)) == 12
    assert fastest_accept(GateParams(w_net_min=41)) is None  # W-L <= 40 = n_max
    assert fastest_accept(GateParams(e_confirm=1e8)) is None  # 1.5**40 = 1.1e7
    assert fastest_accept(GateParams(e_confirm=1e8, n_max=46)) == 46  # 1.5**46 = 1.3e8
    # a walk of n_max units is never needed to know: no time goes by for absurd ladders
    assert fastest_accept(GateParams(e_confirm=1e300, lambda_dir=1e-9, n_max=10**9)) is None
    k = fastest_accept(GateParams(e_confirm=1e300, lambda_dir=1e-9, n_max=10**12))
    # (the factor as the kernel holds it, 1 + 1e-9 rounded to a double)
    assert k is not None and abs(k - math.log(1e300) / math.log(1.0 + 1e-9)) <= 1
    # one unit past n_max, beyond the walk (hostile pass h25): 1,000,001, so RunOptions took
    # parameters under which no candidate can be accepted
    assert fastest_accept(GateParams(lambda_dir=1e-6, e_confirm=math.e, w_net_min=0,
                                     n_max=1_000_000)) is None
