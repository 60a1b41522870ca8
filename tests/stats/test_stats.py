"""The statistical kernel: the rule of SPEC §1, replays, batch replays, exact OC."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests._strategies import gate_params
from vtrm_gate import (
    Action,
    GateParams,
    GateState,
    gate_decision,
    operating_characteristics,
    replay_arrival,
    replay_arrival_batch,
    replay_blocks,
    replay_blocks_batch,
    replay_prefix,
    replay_prefix_batch,
)
from vtrm_gate.stats import ACTION_CODES, SequentialTest, update_state

WIN, LOSS, TIE_RIGHT, TIE_WRONG = (False, True), (True, False), (True, True), (False, False)


# ---- GateParams ----------------------------------------------------------------------

@pytest.mark.parametrize("field,value,fragment", [
    ("e_confirm", 1.0, "e_confirm"),
    ("lambda_dir", 0.0, "lambda_dir"),
    ("lambda_dir", 1.5, "lambda_dir"),
    ("delta_min", 1.0, "delta_min"),
    ("w_net_min", -1, "w_net_min"),
    ("w_net_min", 2.5, "w_net_min"),
    ("e_reject", 0.5, "e_reject"),
    ("e_provisional", 0.9, "e_provisional"),
    ("w_net_min_provisional", -2, "w_net_min_provisional"),
    ("n_max", 0, "n_max"),
    ("e_confirm", float("nan"), "e_confirm"),
    ("n_max", True, "n_max"),
])
def test_invalid_params_name_the_field(field, value, fragment):
    with pytest.raises(ValueError, match=fragment):
        GateParams(**{field: value})


def test_lambda_bound_depends_on_delta():
    GateParams(lambda_dir=1 / 1.25, delta_min=0.25)
    with pytest.raises(ValueError, match=r"lambda_dir.*1/\(1\+delta_min\)"):
        GateParams(lambda_dir=0.9, delta_min=0.25)


# ---- golden e-values -----------------------------------------------------------------

def test_golden_e_values_after_wins_losses_ties():
    out = replay_prefix([WIN, WIN, LOSS, TIE_RIGHT, WIN] + [TIE_RIGHT] * 35)
    pt = out.trajectory[4]
    # E+ = 1.5 * 1.5 * 0.5 * 1 * 1.5 ; E- = 0.5 * 0.5 * 1.5 * 1 * 0.5 (exact in binary)
    assert (pt.e_plus, pt.e_minus) == (1.6875, 0.1875)
    assert (pt.W, pt.L, pt.n_used, pt.d, pt.action) == (3, 1, 5, 1, Action.CONTINUE)
    # the same five units on a 5-unit ladder: one unit left after rank 3 cannot reach
    # E+ >= 2 (1.125 * 1.5 < 2), so the type stops FUTILE there
    short = replay_prefix([WIN, WIN, LOSS, TIE_RIGHT, WIN])
    assert (short.action, short.stop_rank, short.e_plus) == (Action.FUTILE, 3, 1.125)


def test_golden_e_values_with_delta():
    p = GateParams(lambda_dir=0.5, delta_min=0.1)
    pt = replay_prefix([WIN, TIE_WRONG, LOSS] + [TIE_RIGHT] * 37, p).trajectory[2]
    assert pt.e_plus == (1 + 0.5 * 0.9) * (1 - 0.5 * 0.1) * (1 - 0.5 * 1.1)
    assert pt.e_minus == 0.5 * 1.0 * 1.5


def test_eight_straight_wins_accept_at_rank_7():
    out = replay_prefix([WIN] * 20)
    assert out.action is Action.ACCEPT
    assert out.stop_rank == 7  # 1.5**8 = 25.6 >= 20 first after the 8th win
    assert out.e_plus == 1.5**8
    assert [p.action for p in out.trajectory[:-1]] == [Action.CONTINUE] * 7


def test_accept_needs_w_net_floor():
    p = GateParams(e_confirm=2.0, w_net_min=3)
    out = replay_prefix([WIN, WIN, WIN, WIN], p)
    assert out.stop_rank == 2  # E+ >= 2 after two wins but W-L = 2 < 3


def test_reject_on_harm():
    out = replay_prefix([LOSS] * 40)
    assert out.action is Action.REJECT
    assert out.stop_rank == 7 and out.e_minus == 1.5**8
    # on a 20-unit ladder futility comes first: 0.5**7 * 1.5**13 < 2 after the 7th loss
    short = replay_prefix([LOSS] * 20)
    assert (short.action, short.stop_rank) == (Action.FUTILE, 6)


# ---- decision order and exits --------------------------------------------------------

def test_decision_order_accept_before_reject():
    s = GateState(W=5, L=0, n_used=5, n_consumed=5, e_plus=30.0, e_minus=30.0)
    assert gate_decision(s, 3, GateParams()) is Action.ACCEPT


def test_futility_is_lossless_and_fires_when_hopeless():
    p = GateParams()
    # 1 unit left, E+ = 1, W-L = 0: best case E+ 1.5 < 2 => neither ACCEPT nor PROVISIONAL.
    assert gate_decision(GateState(e_plus=1.0), 1, p) is Action.FUTILE
    # 2 units left: best case E+ 2.25 >= 2 and W-L 2 >= 2 => PROVISIONAL still reachable.
    assert gate_decision(GateState(e_plus=1.0), 2, p) is Action.CONTINUE


class NoFutility:
    """The default rule with the futility exit removed (for the losslessness check)."""

    def update(self, state, pair, params):
        return update_state(state, pair, params)

    def decide(self, state, n_remaining, params):
        a = gate_decision(state, n_remaining, params)
        return Action.CONTINUE if a is Action.FUTILE else a


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([WIN, LOSS, TIE_RIGHT, None]), min_size=1, max_size=12),
       st.integers(1, 6))
def test_futile_never_stops_a_type_that_could_end_accept_or_provisional(prefix, tail):
    """Wherever FUTILE fires, no continuation at all ends ACCEPT or PROVISIONAL without it."""
    p = GateParams(e_confirm=6.0, e_reject=50.0)
    n = len(prefix) + tail
    out = replay_prefix(list(prefix) + [TIE_RIGHT] * tail, p)
    if out.action is not Action.FUTILE:
        return
    k = out.stop_rank + 1
    for rest in itertools.product([WIN, LOSS, TIE_RIGHT], repeat=n - k):
        alt = replay_prefix(list(prefix[:k]) + list(rest), p, rule=NoFutility())
        assert alt.action not in (Action.ACCEPT, Action.PROVISIONAL), rest


def test_exhaustion_exit_provisional_and_inertia():
    p = GateParams()
    prov = replay_prefix([WIN, WIN, TIE_RIGHT, TIE_RIGHT], p)
    assert prov.action is Action.PROVISIONAL and prov.stop_rank == 3
    assert prov.e_plus == 2.25 and prov.W - prov.L == 2
    inert = replay_prefix([WIN, TIE_RIGHT, WIN, LOSS, WIN, WIN, LOSS], p)
    assert inert.action in (Action.INERTIA, Action.FUTILE)


def test_empty_ladder_is_inertia_at_once():
    out = replay_prefix([])
    assert out.action is Action.INERTIA and out.stop_rank is None and out.n_consumed == 0


def test_infra_units_are_consumed_but_excluded():
    out = replay_prefix([WIN, None, None, WIN], GateParams())
    assert (out.W, out.L, out.n_used, out.n_consumed) == (2, 0, 2, 4)
    assert out.e_plus == 2.25
    assert out.trajectory[1].d is None and out.trajectory[1].e_plus == 1.5
    # INFRA reduces n_remaining: with 2 left after rank 0 the type is still hopeful
    assert out.action is Action.PROVISIONAL


def test_small_types_cannot_accept_by_design():
    """A 9-unit ladder can reach ACCEPT only with >= 8 wins: e_confirm 20 needs 1.5**8."""
    assert replay_prefix([WIN] * 7 + [TIE_RIGHT] * 2).action is Action.PROVISIONAL


def test_bad_outcome_entries_are_refused():
    with pytest.raises(ValueError, match="outcome 1"):
        replay_prefix([WIN, "yes"])  # type: ignore[list-item]


# ---- prefix vs block vs arrival ------------------------------------------------------

def test_block_replay_decides_same_way_later():
    seq = [WIN, TIE_RIGHT, WIN, WIN, WIN, TIE_WRONG, WIN, WIN, WIN, WIN, WIN, TIE_RIGHT] + [
        TIE_RIGHT] * 12
    pre = replay_prefix(seq)
    blk = replay_blocks(seq, block=8)
    assert pre.action is blk.action is Action.ACCEPT
    assert pre.stop_rank == 9 and blk.stop_rank == 15
    assert pre.stop_rank < blk.stop_rank
    assert blk.n_consumed == 16


def test_block_replay_decides_only_at_block_ends_and_the_last_unit():
    # prefix: futile at rank 9 (one unit left, 1.5 < 2); blocks: no look at 9, INERTIA at 10
    assert (replay_prefix([TIE_RIGHT] * 11).action, replay_prefix([TIE_RIGHT] * 11).stop_rank
            ) == (Action.FUTILE, 9)
    blk = replay_blocks([TIE_RIGHT] * 11, block=8)
    assert (blk.action, blk.stop_rank, blk.n_consumed) == (Action.INERTIA, 10, 11)
    blk = replay_blocks([WIN] * 3 + [TIE_RIGHT] * 8, block=8)
    assert blk.action is Action.PROVISIONAL and blk.stop_rank == 10


def test_arrival_order_consumes_by_completion_time():
    seq = [LOSS] * 6 + [WIN] * 10
    times = [100.0] * 6 + list(range(10))
    arr = replay_arrival(seq, times)
    assert arr.action is Action.ACCEPT and arr.W == 8 and arr.L == 0
    assert replay_prefix(seq).action is not Action.ACCEPT


def test_block_size_validated():
    with pytest.raises(ValueError, match="block"):
        replay_blocks([WIN], block=0)


# ---- batch replays equal the scalar ones ---------------------------------------------

pairs = st.sampled_from([WIN, LOSS, TIE_RIGHT, TIE_WRONG, None])


def _to_arrays(seqs):
    base = np.array([[bool(p and p[0]) for p in s] for s in seqs])
    cand = np.array([[bool(p and p[1]) for p in s] for s in seqs])
    infra = np.array([[p is None for p in s] for s in seqs])
    return base, cand, infra


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 45).flatmap(lambda n: st.lists(st.lists(pairs, min_size=n, max_size=n),
                                                     min_size=1, max_size=8)),
       st.one_of(st.sampled_from([GateParams(n_max=45),
                                  GateParams(delta_min=0.1, lambda_dir=0.6, w_net_min=2,
                                             n_max=45),
                                  GateParams(e_confirm=5, e_reject=5, n_max=45)]),
                 gate_params(n_max=45)))
def test_batch_replays_match_scalar_replays_exactly(seqs, params):
    base, cand, infra = _to_arrays(seqs)
    rng = np.random.default_rng(len(seqs))
    times = rng.random(base.shape)
    batches = [
        (replay_prefix_batch(base, cand, params, infra=infra), replay_prefix, ()),
        (replay_blocks_batch(base, cand, params, infra=infra), replay_blocks, ()),
        (replay_arrival_batch(base, cand, times, params, infra=infra), replay_arrival, None),
    ]
    for batch, fn, _ in batches:
        for r, seq in enumerate(seqs):
            if fn is replay_arrival:
                one = replay_arrival(seq, list(times[r]), params)
            else:
                one = fn(seq, params)
            assert ACTION_CODES[batch.action[r]] is one.action
            assert (batch.W[r], batch.L[r], batch.n_used[r], batch.n_consumed[r]) == (
                one.W, one.L, one.n_used, one.n_consumed)
            assert batch.e_plus[r] == one.e_plus and batch.e_minus[r] == one.e_minus
            assert batch.stop_rank[r] == (-1 if one.stop_rank is None else one.stop_rank)


# ---- exact operating characteristics -------------------------------------------------

def test_oc_probabilities_sum_to_one_and_documented_fact():
    oc = operating_characteristics(GateParams(), p_win=0.8, discordance=0.5, n_units=40)
    total = oc.p_accept + oc.p_reject + oc.p_futile + oc.p_provisional + oc.p_inertia
    assert total == pytest.approx(1.0, abs=1e-12)
    # SPEC §1: such a candidate is accepted within 40 units only ~70% of the time.
    assert 0.68 < oc.p_accept < 0.75
    assert 0 < oc.expected_units <= 40


@pytest.mark.parametrize("discordance", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
@pytest.mark.parametrize("n_units", [9, 23, 40])
def test_exact_false_accept_under_h0_is_at_most_one_over_e_confirm(discordance, n_units):
    p = GateParams()
    oc = operating_characteristics(p, p_win=0.5, discordance=discordance, n_units=n_units)
    assert oc.p_accept <= 1 / p.e_confirm
    # and under the harm-side null the false-reject rate is bounded the same way
    assert oc.p_reject <= 1 / p.e_reject


def test_exact_false_accept_with_delta_null():
    p = GateParams(delta_min=0.1, lambda_dir=0.8)
    # H0+: E[d] = discordance * (2 p_win - 1) = delta  => p_win = (1 + delta/disc)/2
    for disc in (0.2, 0.5, 1.0):
        pw = (1 + p.delta_min / disc) / 2
        oc = operating_characteristics(p, pw, disc, 40)
        assert oc.p_accept <= 1 / p.e_confirm


def test_oc_matches_monte_carlo():
    """Exact DP vs 40,000 seeded replicates: every exit within 4.5 binomial SEs."""
    p = GateParams()
    rng = np.random.default_rng(7)
    R, n, disc, pw, infra_rate = 40_000, 40, 0.4, 0.7, 0.05
    discordant = rng.random((R, n)) < disc
    win = rng.random((R, n)) < pw
    both = rng.random((R, n)) < 0.5
    base = np.where(discordant, ~win, both)
    cand = np.where(discordant, win, both)
    infra = rng.random((R, n)) < infra_rate
    mc = replay_prefix_batch(base, cand, p, infra=infra)
    oc = operating_characteristics(p, pw, disc, n, infra_rate=infra_rate)
    for action, prob in [(Action.ACCEPT, oc.p_accept), (Action.REJECT, oc.p_reject),
                         (Action.FUTILE, oc.p_futile), (Action.PROVISIONAL, oc.p_provisional),
                         (Action.INERTIA, oc.p_inertia)]:
        se = math.sqrt(max(prob * (1 - prob), 1e-9) / R)
        assert abs(mc.rate(action) - prob) < 4.5 * se + 1e-4, action
    assert float(np.mean(mc.n_consumed)) == pytest.approx(oc.expected_units, abs=0.15)
    assert float(np.mean(mc.n_used)) == pytest.approx(oc.expected_pairs, abs=0.15)


def test_oc_input_validation():
    with pytest.raises(ValueError, match="p_win"):
        operating_characteristics(GateParams(), 1.5, 0.5, 40)
    with pytest.raises(ValueError, match="n_units"):
        operating_characteristics(GateParams(), 0.5, 0.5, -1)
    assert operating_characteristics(GateParams(), 0.5, 0.5, 0).p_inertia == 1.0


# ---- exact OC == exhaustive enumeration, at every boundary (issue 7, item 13) ----------

def _enumerate(params, p_win, discordance, n, infra_rate=0.0):
    """Every outcome sequence of length n, replayed, weighted by its probability."""
    q = 1.0 - infra_rate
    probs = np.array([q * discordance * p_win, q * discordance * (1 - p_win),
                      q * (1 - discordance), infra_rate])  # win, loss, tie, INFRA
    seqs = np.array(list(itertools.product(range(4 if infra_rate else 3), repeat=n)))
    weight = np.prod(probs[seqs], axis=1)
    base, cand = np.isin(seqs, (1, 2)), np.isin(seqs, (0, 2))
    out = replay_prefix_batch(base, cand, params, infra=seqs == 3)
    rates = {a: float(weight[out.action == ACTION_CODES.index(a)].sum()) for a in ACTION_CODES}
    return (rates, float((weight * out.n_consumed).sum()), float((weight * out.n_used).sum()))


def _random_cases(count, seed):
    import random

    rng = random.Random(seed)
    for _ in range(count):
        delta = rng.choice([0.0, 0.0, rng.uniform(0, 0.5)])
        lam_max = 1 / (1 + delta)
        lam = rng.choice([lam_max, rng.uniform(0.05, lam_max)])
        n = rng.randint(4, 7)
        p = GateParams(e_confirm=rng.uniform(1.5, 30), lambda_dir=lam, delta_min=delta,
                       w_net_min=rng.randint(0, 3), e_reject=rng.uniform(1.5, 30),
                       e_provisional=rng.uniform(1.0, 4.0),
                       w_net_min_provisional=rng.randint(0, 3), n_max=n)
        yield p, rng.uniform(0, 1), rng.uniform(0.05, 1), n, rng.choice([0.0, 0.15])


OC_CASES = [
    # the largest bet: a loss zeroes E+ (log form: 0 * -inf)
    (GateParams(lambda_dir=1.0, n_max=10), 0.8, 0.5, 10, 0.0),
    (GateParams(lambda_dir=1 / 1.25, delta_min=0.25, n_max=7), 0.7, 0.6, 7, 0.1),
    # e_confirm exactly equal to the E+ of 7 straight wins
    (GateParams(e_confirm=1.5**7, n_max=7), 0.8, 1.0, 7, 0.0),
    (GateParams(e_confirm=1.5**5, w_net_min=0, n_max=7), 0.6, 0.7, 7, 0.2),
    (GateParams(delta_min=0.1, lambda_dir=0.8, n_max=7), 0.6, 0.5, 7, 0.1),
    *_random_cases(16, seed=13),
]


@pytest.mark.parametrize("params,p_win,discordance,n,infra_rate", OC_CASES)
def test_oc_equals_exhaustive_enumeration(params, p_win, discordance, n, infra_rate):
    oc = operating_characteristics(params, p_win, discordance, n, infra_rate)
    rates, units, pairs = _enumerate(params, p_win, discordance, n, infra_rate)
    got = {Action.ACCEPT: oc.p_accept, Action.REJECT: oc.p_reject, Action.FUTILE: oc.p_futile,
           Action.PROVISIONAL: oc.p_provisional, Action.INERTIA: oc.p_inertia}
    for action, p in got.items():
        assert p == pytest.approx(rates[action], abs=1e-12), action
    assert rates[Action.CONTINUE] == 0.0
    assert oc.expected_units == pytest.approx(units, abs=1e-12)
    assert oc.expected_pairs == pytest.approx(pairs, abs=1e-12)


def _delta_infra_cases(count, seed, n_range):
    """delta > 0 with INFRA > 0: the case `_oc_chain` computes in O(n^3)."""
    import random

    rng = random.Random(seed)
    for _ in range(count):
        delta = rng.uniform(0.001, 0.5)
        lam_max = 1 / (1 + delta)
        lam = rng.choice([lam_max, rng.uniform(0.05, lam_max)])
        n = rng.randint(*n_range)
        p = GateParams(e_confirm=rng.uniform(1.05, 30), lambda_dir=lam, delta_min=delta,
                       w_net_min=rng.randint(0, 4), e_reject=rng.uniform(1.05, 30),
                       e_provisional=rng.choice([1.0, rng.uniform(1.0, 4.0)]),
                       w_net_min_provisional=rng.randint(0, 3), n_max=n)
        yield (p, rng.uniform(0, 1), rng.choice([1.0, rng.uniform(0.05, 1)]), n,
               rng.choice([0.01, 0.15, 0.5, 0.95]))


@pytest.mark.parametrize("params,p_win,discordance,n,infra_rate",
                         list(_delta_infra_cases(14, seed=29, n_range=(1, 7))))
def test_oc_with_delta_and_infra_equals_exhaustive_enumeration(params, p_win, discordance, n,
                                                               infra_rate):
    test_oc_equals_exhaustive_enumeration(params, p_win, discordance, n, infra_rate)


def test_oc_chain_equals_the_full_wlt_recursion(monkeypatch):
    """The O(n^3) chain against the O(n^4) recursion over (W, L, T) per unit, to 1e-12, on
    ladders too long to enumerate."""
    from vtrm_gate.stats import _oc

    for params, p_win, disc, n, infra in _delta_infra_cases(40, seed=31, n_range=(8, 60)):
        fast = operating_characteristics(params, p_win, disc, n, infra).as_dict()
        fast_alive = _oc.recursion(params, n, p_win, disc, infra)[3]
        with monkeypatch.context() as m:
            m.setattr(_oc, "_oc_chain", _oc._oc_wlt)
            slow = operating_characteristics(params, p_win, disc, n, infra).as_dict()
            slow_alive = _oc.recursion(params, n, p_win, disc, infra)[3]
        for key in fast:
            assert fast[key] == pytest.approx(slow[key], abs=1e-12), (key, params, n, infra)
        # the survival curve the forecast reads (P(undecided after k units), k = 0..n) too
        assert fast_alive == pytest.approx(slow_alive, abs=1e-12) and len(fast_alive) == n + 1


def test_oc_at_the_largest_bet_and_at_an_attainable_threshold():
    assert operating_characteristics(GateParams(lambda_dir=1.0), 0.8, 0.5, 10).p_accept \
        == pytest.approx(0.20416, abs=1e-12)
    oc = operating_characteristics(GateParams(e_confirm=1.5**7), 0.8, 1.0, 7)
    assert oc.p_accept == pytest.approx(0.8**7, abs=1e-12)  # 0.2097: seven straight wins


def test_e_plus_exactly_at_e_confirm_accepts():
    p = GateParams(e_confirm=1.5**7, n_max=7)
    assert 1.5**7 == 17.0859375  # exact in binary: seven wins land on the threshold
    out = replay_prefix([WIN] * 7, p)
    assert (out.action, out.stop_rank, out.e_plus) == (Action.ACCEPT, 6, p.e_confirm)
    base, cand, _ = _to_arrays([[WIN] * 7])
    assert replay_prefix_batch(base, cand, p).actions() == [Action.ACCEPT]
    s = GateState(W=7, n_used=7, n_consumed=7, e_plus=p.e_confirm)
    assert gate_decision(s, 3, p) is Action.ACCEPT


def test_futility_never_stops_an_accept_because_of_rounding():
    """Nine wins multiplied one by one reach e_confirm; ``E+ * wf**8`` rounds just below it."""
    lam = 0.6115957632512388
    e9 = 1.0
    for _ in range(9):
        e9 *= 1.0 + lam
    p = GateParams(e_confirm=e9, lambda_dir=lam, w_net_min=0, e_provisional=e9,
                   w_net_min_provisional=9, n_max=9)
    assert (1.0 + lam) * (1.0 + lam) ** 8 < e9  # the closed form misses by one ulp
    out = replay_prefix([WIN] * 9, p)
    assert (out.action, out.stop_rank) == (Action.ACCEPT, 8)
    base, cand, _ = _to_arrays([[WIN] * 9])
    assert replay_prefix_batch(base, cand, p).actions() == [Action.ACCEPT]
    assert operating_characteristics(p, 1.0, 1.0, 9).p_accept == 1.0


def test_rule_holds_for_a_ladder_of_ten_thousand_units():
    n = 10_000
    p = GateParams(lambda_dir=1.0, w_net_min=9_000, n_max=n)
    for n_rem in (1_000, n - 1):
        assert gate_decision(GateState(W=1, n_used=1, n_consumed=1, e_plus=2.0), n_rem, p) \
            is Action.CONTINUE
    # 5,000 wins overflow E+ to inf; the loss after them zeroes it (never NaN); hopeless then
    seq = [WIN] * 5_000 + [LOSS] + [TIE_RIGHT] * (n - 5_001)
    out = replay_prefix(seq, p)
    assert (out.action, out.stop_rank, out.e_plus) == (Action.FUTILE, 5_000, 0.0)
    base, cand, _ = _to_arrays([seq])
    batch = replay_prefix_batch(base, cand, p)
    assert batch.actions() == [Action.FUTILE] and batch.e_plus[0] == 0.0
    assert replay_blocks(seq, p).action is Action.FUTILE
    ties = replay_prefix([TIE_RIGHT] * n, GateParams(e_provisional=1.0,
                                                     w_net_min_provisional=0, n_max=n))
    assert (ties.action, ties.n_consumed) == (Action.PROVISIONAL, n)


def test_replays_refuse_ladders_longer_than_n_max():
    p = GateParams(n_max=5)
    with pytest.raises(ValueError, match=r"6 units, more than GateParams\.n_max = 5"):
        replay_prefix([TIE_RIGHT] * 6, p)
    with pytest.raises(ValueError, match="n_max"):
        replay_blocks([TIE_RIGHT] * 6, p)
    with pytest.raises(ValueError, match="n_max"):
        replay_arrival([TIE_RIGHT] * 6, list(range(6)), p)
    base, cand, _ = _to_arrays([[TIE_RIGHT] * 6])
    with pytest.raises(ValueError, match="n_max"):
        replay_prefix_batch(base, cand, p)
    assert replay_prefix([TIE_RIGHT] * 5, p).n_ladder == 5


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 0.5), st.floats(0.02, 1.0), st.integers(1, 80))
def test_a_threshold_reached_by_straight_wins_is_never_cut_off_by_futility(delta, frac, m):
    """e_confirm set to exactly what m wins multiply up to: every replay accepts at m - 1
    and the exact OC gives probability 1, whatever rounding does to closed forms."""
    lam = frac / (1 + delta)
    e = 1.0
    for _ in range(m):
        e *= 1.0 + lam * (1 - delta)
    if e <= 1.0:
        return
    p = GateParams(e_confirm=e, lambda_dir=lam, delta_min=delta, w_net_min=0,
                   e_provisional=e, w_net_min_provisional=m, n_max=m)
    out = replay_prefix([WIN] * m, p)
    assert (out.action, out.stop_rank) == (Action.ACCEPT, m - 1)
    base, cand, _ = _to_arrays([[WIN] * m])
    assert replay_prefix_batch(base, cand, p).actions() == [Action.ACCEPT]
    assert operating_characteristics(p, 1.0, 1.0, m).p_accept == 1.0


def test_the_states_and_points_the_test_builds_fast_are_whole_frozen_dataclasses():
    """Issue 29: `SequentialTest` builds its states without the dataclass __init__ (2x
    faster); a state (and a trajectory point) has every field, equals and hashes like one
    built the usual way, and stays frozen."""
    import dataclasses

    from vtrm_gate.stats import GateState, SequentialTest, TrajectoryPoint

    test = SequentialTest(6, GateParams(n_max=6))
    for rank, pair in enumerate([(False, True), None, (True, False), (True, True)]):
        test.consume(rank, pair)
    for obj, cls in [(test.state, GateState), (test.points[-1], TrajectoryPoint)]:
        names = {f.name for f in dataclasses.fields(cls)}
        assert type(obj) is cls and set(vars(obj)) == names
        twin = cls(**{n: getattr(obj, n) for n in names})
        assert obj == twin and hash(obj) == hash(twin) and repr(obj) == repr(twin)
        with pytest.raises(dataclasses.FrozenInstanceError):
            obj.W = 99  # type: ignore[misc]
    assert test.state == GateState(W=1, L=1, n_used=3, n_consumed=4,
                                   e_plus=test.state.e_plus, e_minus=test.state.e_minus)


class _Delegating:
    """The default rule through the general path (not `PairedBetting`, so not inlined)."""

    def update(self, state, pair, params):
        return update_state(state, pair, params)

    def decide(self, state, n_remaining, params):
        return gate_decision(state, n_remaining, params)


@pytest.mark.parametrize("seed", range(300))
def test_the_inlined_default_rule_equals_update_state_and_gate_decision_bit_for_bit(seed):
    """Issue 29: `SequentialTest` inlines the default rule; on random ladders (INFRA
    included) and random params every point, e-value and action equals the general path's
    (`update_state` then `gate_decision`) exactly, not approximately."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 80))
    params = GateParams(e_confirm=float(rng.uniform(1.5, 40)), e_reject=float(rng.uniform(1.5, 40)),
                        lambda_dir=float(rng.uniform(0.05, 0.95)),
                        delta_min=float(rng.choice([0.0, 0.05])),
                        w_net_min=int(rng.integers(0, 6)), e_provisional=float(rng.uniform(1, 5)),
                        w_net_min_provisional=int(rng.choice([0, 2, 3, 99])), n_max=n)
    fast, slow = SequentialTest(n, params), SequentialTest(n, params, _Delegating())
    for rank in range(n):
        u = rng.random()
        pair = None if u < 0.1 else (bool(rng.random() < 0.5), bool(rng.random() < 0.6))
        decide = bool(rng.random() < 0.9) or rank == n - 1
        assert fast.consume(rank, pair, decide) is slow.consume(rank, pair, decide)
        assert fast.state == slow.state and fast.points == slow.points
        if fast.decided:
            break
    assert fast.outcome().same_decision(slow.outcome()) and fast.decided == slow.decided


def test_the_inlined_default_rule_refuses_a_decision_past_the_ladder():
    """Deciding past the ladder's end raises as `gate_decision` does, inlined or not."""
    for rule in (None, _Delegating()):
        test = SequentialTest(2, GateParams(n_max=3), rule)
        for rank in range(3):
            if rank < 2:
                test.consume(rank, (True, True), decide=False)
        with pytest.raises(ValueError, match="n_remaining must be >= 0"):
            test.consume(2, (True, True))
