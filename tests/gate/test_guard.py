"""The INFRA guard (issue 16): the SPEC's ratio rule stays the default; the opt-in
sequential rule is anytime-valid (false aborts <= alpha per type, checked exactly and by
Monte Carlo), aborts a dead endpoint at min_calls and ignores two unlucky failures in 12
calls; a default training run's abort probability is <= 1%, exactly bounded."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from vtrm_gate import GateParams, GuardParams, InfraGuardError, run_gate
from vtrm_gate.options import RunOptions, options_from_mapping, resolve_options
from vtrm_gate.sim import DEFAULT_INFRA_RATE, SimConfig
from vtrm_gate.sim import run_virtual as run
from vtrm_gate.stats import ALTERNATIVES, guard_oc, infra_e_value, run_abort_probability
from vtrm_gate.testing import OutcomeTable

TIE = (True, True)
PATIENT = GateParams(e_confirm=1e9, e_reject=1e9, e_provisional=1.0, w_net_min_provisional=0,
                     n_max=10_000)
SEQ = GuardParams(rule="sequential")


def _calls(guard: GuardParams):
    return lambda k, n: guard.tripped(k, n, k)


def test_the_default_guard_is_the_specs_ratio_rule_and_the_simulator_keeps_infra_on():
    g = GuardParams()
    assert (g.rule, g.min_calls, g.max_ratio) == ("ratio", 10, 0.10)
    assert SimConfig().infra_rate == DEFAULT_INFRA_RATE > 0


def test_a_default_training_run_aborts_at_most_one_time_in_a_hundred_exactly():
    # Any 3x5 run of 12 types has at most 15*12 step gates + 3*12 settlements + 3*12
    # evaluations = 252 gates; each trips no more often than with unlimited calls (200 here:
    # P(trip) stops growing after 30 calls). Units counted once per pair of calls: a bound.
    worst = run_abort_probability(_calls(GuardParams()), DEFAULT_INFRA_RATE, [200] * 252)
    assert worst <= 0.01
    assert guard_oc(_calls(GuardParams()), DEFAULT_INFRA_RATE, 200).p_trip == pytest.approx(
        guard_oc(_calls(GuardParams()), DEFAULT_INFRA_RATE, 30).p_trip, rel=1e-3)
    # the earlier default (0.003) failed one run in ~six
    assert run_abort_probability(_calls(GuardParams()), 0.003, [80] * 120) > 0.15


@pytest.mark.parametrize("guard", [GuardParams(), SEQ, GuardParams(min_calls=3, max_ratio=0.2)])
def test_guard_oc_matches_enumerating_every_sequence(guard):
    n, rate = 14, 0.3
    trips = 0.0
    for xs in itertools.product((0, 1), repeat=n):
        k = 0
        for i, x in enumerate(xs, 1):
            k += x
            if guard.tripped(k, i, k):
                trips += rate ** sum(xs) * (1 - rate) ** (n - sum(xs))
                break
    assert guard_oc(_calls(guard), rate, n).p_trip == pytest.approx(trips, abs=1e-12)


def test_sequential_guard_false_aborts_at_most_alpha_at_the_boundary_rate():
    # Exactly at rate = max_ratio (the worst case of H0), over 1000 calls ...
    oc = guard_oc(_calls(SEQ), SEQ.max_ratio, 1000)
    assert oc.p_trip <= SEQ.alpha
    # ... and by Monte Carlo: 20000 runs of 300 calls, seeded; the bound holds within 3 SE.
    rng = np.random.default_rng(16)
    x = rng.random((20_000, 300)) < SEQ.max_ratio
    k, n = np.cumsum(x, axis=1), np.arange(1, 301)
    p0 = SEQ.max_ratio
    q = np.array([p0 + f * (1 - p0) for f in ALTERNATIVES])[:, None, None]
    log_lr = k * np.log(q / p0) + (n - k) * np.log((1 - q) / (1 - p0))  # per alternative
    e = np.exp(log_lr).mean(axis=0)  # the mixture (300 calls: no overflow at these rates)
    assert e[0, -1] == pytest.approx(infra_e_value(int(k[0, -1]), 300, p0))
    tripped = ((e >= 1 / SEQ.alpha) & (n >= SEQ.min_calls)).any(axis=1).mean()
    assert tripped <= SEQ.alpha + 3 * np.sqrt(SEQ.alpha / 20_000)
    assert abs(tripped - guard_oc(_calls(SEQ), SEQ.max_ratio, 300).p_trip) < 0.003
    # negative control: a rate well above max_ratio is caught (the test is not inert)
    assert guard_oc(_calls(SEQ), 0.3, 80).p_trip > 0.9


def _table(n_units, infra_ranks):
    seq = [None if i in infra_ranks else TIE for i in range(n_units)]
    return OutcomeTable({"A": seq},
                        latency=lambda t, r: 1.0 + 2 * t.ladder_rank + (t.arm == "cand"))


def test_sequential_guard_aborts_a_dead_endpoint_at_min_calls_naming_its_test():
    table = OutcomeTable({"A": [None] * 30}, infra_arm="both",
                         latency=lambda t, r: 1.0 + 2 * t.ladder_rank + (t.arm == "cand"))
    with pytest.raises(InfraGuardError, match=r"10 INFRA calls out of 10 completed calls: "
                                              r"the sequential test of 'INFRA rate > 10%' "
                                              r"reached E = .* >= 1/alpha = 100") as ei:
        run(run_gate(table.plans(), table, PATIENT, guard=SEQ))
    assert ei.value.calls == 10 and ei.value.infra_calls == 10


def test_two_unlucky_failures_in_twelve_calls_abort_the_ratio_guard_not_the_sequential():
    table = _table(30, {0, 5})  # INFRA units at calls 2 and 12 (cand arm)
    with pytest.raises(InfraGuardError, match=r"2 INFRA units out of 12 completed calls"):
        run(run_gate(table.plans(), table, PATIENT))
    res = run(run_gate(table.plans(), _table(30, {0, 5}), PATIENT, guard=SEQ))
    assert res.counters["A"].completed == 60 and res.outcomes["A"].n_consumed == 30


def test_guard_rule_is_a_run_option_from_file_env_and_flag_recorded_only_when_set():
    assert options_from_mapping({"guard": {"rule": "sequential"}}).guard.rule == "sequential"
    env = resolve_options(env={"VTRM_GUARD_RULE": "sequential"}, dotenv=None)
    assert env.guard.rule == "sequential" and env.sources["guard.rule"] == \
        "env VTRM_GUARD_RULE"
    flag = resolve_options({"guard.rule": "sequential"}, env={}, dotenv=None,
                           flag_names={"guard.rule": "--guard-rule"})
    assert flag.sources["guard.rule"] == "flag --guard-rule"
    assert RunOptions().decision_inputs()["guard"] == {"min_calls": 10, "max_ratio": 0.1}
    assert flag.decision_inputs()["guard"]["rule"] == "sequential"
    with pytest.raises(ValueError, match=r"GuardParams\.rule must be one of ratio, sequential"):
        GuardParams(rule="bayes")
    with pytest.raises(ValueError, match=r"max_ratio must be in \(0, 1\) for the sequential"):
        GuardParams(rule="sequential", max_ratio=0.0)


@pytest.mark.parametrize("value", [True, float("nan"), "0.1", None])
def test_guard_max_ratio_must_be_a_real_number(value):
    """A bool is not a ratio (``max_ratio=True`` meant "guard on", and tripped at nothing
    above 100%); NaN never compares, so a guard with it would never trip."""
    with pytest.raises(ValueError, match=r"GuardParams\.max_ratio must be in \[0, 1\]"):
        GuardParams(max_ratio=value)
