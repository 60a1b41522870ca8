"""Dispatch policies (issue 10): round-robin and need-aware orders, the starvation bound,
decisions unchanged by the order, and cancel_after_freeze (on the gate and the LLM agent)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vtrm_gate import (
    Action,
    GateParams,
    GuardParams,
    InfraGuardError,
    NeedAware,
    RoundRobin,
    TaskFinished,
    TaskStarted,
    replay_prefix,
    run_gate,
)
from vtrm_gate.gate import UnitTask, dispatch_order, resolve_dispatch
from vtrm_gate.llm import MCQ, LLMAgent, RetryPolicy
from vtrm_gate.sim import run_virtual as run
from vtrm_gate.stats import SequentialTest, operating_characteristics
from vtrm_gate.testing import OutcomeTable

WIN, LOSS, TIE = (False, True), (True, False), (True, True)
PATIENT = GateParams(e_confirm=1e9, e_reject=1e9, e_provisional=1.0, w_net_min_provisional=0)
QUICK = GateParams(e_confirm=4, e_reject=4, w_net_min=1)



@dataclass
class FakeLane:
    """A lane as `dispatch_order` sees it, with no test progress (prefix stays 0)."""

    n: int
    task_type: str = "T"
    frozen: bool = False
    prefix: int = 0
    test: SequentialTest = field(init=False)

    def __post_init__(self) -> None:
        self.test = SequentialTest(self.n, GateParams())


@dataclass(frozen=True)
class Greedy:
    """An adversary: always prefers the lowest lane index; only ``wait`` protects others."""

    wait: int | None

    def max_wait(self, n_lanes: int) -> int | None:
        return self.wait

    def priority(self, lane, rank):
        return (-lane.n_index,)


def served_waits(lanes, policy):
    """For every dispatched unit, how many other units were dispatched since its lane's last."""
    last = dict.fromkeys(range(len(lanes)), 0)
    waits, order = [], []
    for count, (lane, rank) in enumerate(dispatch_order(lanes, policy)):
        k = lanes.index(lane)
        waits.append(count - last[k])
        last[k] = count + 1
        order.append((k, rank))
    return waits, order


# ---- the order ------------------------------------------------------------------------

def test_round_robin_policy_keeps_the_spec_order():
    lanes = [FakeLane(2), FakeLane(0), FakeLane(3)]
    _, order = served_waits(lanes, RoundRobin())
    assert order == [(0, 0), (2, 0), (0, 1), (2, 1), (2, 2)]


def test_frozen_lane_gets_nothing_more():
    lanes = [FakeLane(5), FakeLane(5)]
    got = []
    for lane, rank in dispatch_order(lanes, RoundRobin()):
        got.append((lanes.index(lane), rank))
        if len(got) == 3:
            lanes[0].frozen = True
    assert got == [(0, 0), (1, 0), (0, 1), (1, 1), (1, 2), (1, 3), (1, 4)]


def test_default_dispatch_is_round_robin():
    table = OutcomeTable({"C": [TIE] * 3, "A": [TIE] * 3, "B": [TIE] * 3},
                         latency=lambda t, r: 1.0)
    run(run_gate(table.plans(), table, PATIENT, concurrency=1))
    assert [(t.task_type, t.ladder_rank) for t in table.calls[::2]] == [
        (t, r) for r in range(3) for t in "ABC"]


def test_unknown_dispatch_name_is_refused():
    with pytest.raises(ValueError, match="dispatch must be 'round_robin', 'need_aware'"):
        resolve_dispatch("fastest")
    with pytest.raises(TypeError, match="priority"):
        resolve_dispatch(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"NeedAware\.p_win must be a probability"):
        NeedAware(p_win=1.5)
    with pytest.raises(ValueError, match=r"NeedAware\.wait must be an integer >= 1"):
        NeedAware(wait=0)


# ---- starvation bound: max_wait + K - 1 ----------------------------------------------

@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=8), st.integers(1, 10))
def test_no_lane_waits_longer_than_max_wait_plus_lanes_minus_one(sizes, wait):
    lanes = [FakeLane(n) for n in sizes]
    for i, lane in enumerate(lanes):
        lane.n_index = i  # type: ignore[attr-defined]
    waits, order = served_waits(lanes, Greedy(wait))
    k = sum(n > 0 for n in sizes)
    assert len(order) == sum(sizes)
    assert max(waits, default=0) <= wait + k - 1


def test_without_max_wait_a_greedy_policy_starves_the_others():
    lanes = [FakeLane(6), FakeLane(6)]
    for i, lane in enumerate(lanes):
        lane.n_index = i  # type: ignore[attr-defined]
    _, order = served_waits(lanes, Greedy(None))
    assert [k for k, _ in order] == [0] * 6 + [1] * 6
    _, order = served_waits(lanes, Greedy(2))
    assert [k for k, _ in order][:6] == [0, 0, 1, 0, 0, 1]


@dataclass(frozen=True)
class OnlyFirstLane:
    """Retires every lane but the first (as a clairvoyant policy retires stopped types)."""

    def max_wait(self, n_lanes: int) -> int | None:
        return 1

    def priority(self, lane, rank):
        return () if lane.n_index == 0 else None


def test_a_retired_lane_is_never_forced_by_the_starvation_rule():
    lanes = [FakeLane(4), FakeLane(4)]
    for i, lane in enumerate(lanes):
        lane.n_index = i  # type: ignore[attr-defined]
    _, order = served_waits(lanes, OnlyFirstLane())
    assert order == [(0, r) for r in range(4)]


def test_need_aware_starvation_bound_holds_in_a_gate():
    rng = random.Random(7)
    outcomes = {t: [rng.choice([WIN, LOSS, TIE, TIE]) for _ in range(rng.randint(5, 30))]
                for t in "ABCDEFGH"}
    table = OutcomeTable(outcomes, latency=lambda t, r: 1.0 + hash(t.unit_id) % 9)
    starts = []
    policy = NeedAware()
    res = run(run_gate(table.plans(), table, QUICK, concurrency=16, dispatch=policy,
                       subscribers=[lambda ev: isinstance(ev, TaskStarted)
                                    and ev.task.arm == "base" and starts.append(ev.task)]))
    bound = policy.max_wait(len(outcomes)) + len(outcomes) - 1
    last: dict[str, int] = {}
    for i, task in enumerate(starts):
        assert i - last.get(task.task_type, 0) <= bound
        last[task.task_type] = i + 1
    assert all(o.decided for o in res.outcomes.values())


# ---- the need model -------------------------------------------------------------------

@pytest.mark.parametrize(("p_win", "discordance", "infra", "n"),
                         [(0.5, 0.3, 0.0, 40), (0.8, 0.5, 0.0, 23), (0.3, 0.6, 0.05, 9)])
def test_p_needed_sums_to_the_exact_expected_units(p_win, discordance, infra, n):
    # E[units consumed] = sum over j of P(no decision within the first j units)
    params = GateParams()
    policy = NeedAware(p_win=p_win, discordance=discordance, infra_rate=infra)
    t = SequentialTest(n, params)
    total = sum(policy.p_needed(t.rule, params, t.state, n, j) for j in range(n))
    oc = operating_characteristics(params, p_win, discordance, n, infra)
    assert total == pytest.approx(oc.expected_units, rel=1e-12)


def test_p_needed_falls_as_a_type_nears_its_decision():
    params = GateParams()
    policy = NeedAware(p_win=0.8, discordance=0.5)
    t = SequentialTest(40, params)
    for rank in range(7):
        t.consume(rank, WIN)
    # 7 wins: E+ = 1.5**7 ~ 17; the next win (P = 0.5 * 0.8) accepts
    p = [policy.p_needed(t.rule, params, t.state, 40, ahead) for ahead in range(4)]
    assert p[0] == 1.0
    assert p[1] == pytest.approx(1 - 0.4)
    assert p[1] > p[2] > p[3]


def test_need_aware_prefers_the_type_least_likely_to_stop():
    near = FakeLane(40)
    for rank in range(7):
        near.test.consume(rank, WIN)
    near.prefix = 7
    fresh = FakeLane(40)
    policy = NeedAware(p_win=0.8, discordance=0.5)
    # the unit at either prefix is needed for sure; speculation goes to the fresh type first
    assert policy.priority(near, 7)[0] == policy.priority(fresh, 0)[0] == 1.0
    assert policy.priority(near, 8) < policy.priority(fresh, 3)
    # among equally needed units, the longer remaining ladder first
    assert policy.priority(fresh, 0) > policy.priority(near, 7)


# ---- decisions are the order's invariant ----------------------------------------------

outcome = st.sampled_from([WIN, LOSS, TIE, (False, False), None])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from("ABCDE"), st.lists(outcome, max_size=30), min_size=1),
       st.integers(1, 12), st.integers(0, 2**32 - 1), st.booleans(),
       st.sampled_from([GateParams(), QUICK]))
def test_need_aware_decisions_equal_round_robin_for_any_latencies(outcomes, concurrency, seed,
                                                                   cancel, params):
    rng = random.Random(seed)
    lat: dict[tuple[str, str, str], float] = {}

    def latency(t, r):
        return lat.setdefault((t.task_type, t.unit_id, t.arm), rng.choice([0.0, 1, 2, 5, 30]))

    guard = GuardParams(min_calls=10**6)
    results = {}
    for name, dispatch, cancel_after_freeze in (("rr", "round_robin", False),
                                                ("need", "need_aware", cancel)):
        table = OutcomeTable(outcomes, latency=latency)
        results[name] = run(run_gate(table.plans(), table, params, concurrency=concurrency,
                                     guard=guard, dispatch=dispatch,
                                     cancel_after_freeze=cancel_after_freeze))
        assert results[name].peak_in_flight <= concurrency
        assert table.in_flight == 0
    for t, seq in outcomes.items():
        ref = replay_prefix(seq, params)
        assert results["rr"].outcomes[t].same_decision(ref), t
        assert results["need"].outcomes[t].same_decision(ref), t


# ---- cancel_after_freeze --------------------------------------------------------------

def _fast_stop_table():
    # A accepts after 4 wins (QUICK); its speculative units beyond that run 1000 s.
    return OutcomeTable({"A": [WIN] * 12, "B": [TIE] * 12},
                        latency=lambda t, r: 1.0 if t.task_type == "B" or t.ladder_rank < 4
                        else 1000.0)


def test_cancel_after_freeze_is_off_by_default_and_calls_finish():
    table = _fast_stop_table()
    res = run(run_gate(table.plans(), table, QUICK, concurrency=24))
    c = res.counters["A"]
    assert res.outcomes["A"].action is Action.ACCEPT
    assert c.cancelled_in_flight == 0
    assert c.discarded_after_freeze > 0
    assert c.completed == c.started


def test_cancel_after_freeze_cancels_a_frozen_types_in_flight_calls():
    table = _fast_stop_table()
    finished = []
    res = run(run_gate(table.plans(), table, QUICK, concurrency=24, cancel_after_freeze=True,
                       subscribers=[lambda ev: isinstance(ev, TaskFinished)
                                    and finished.append(ev.status)]))
    c = res.counters["A"]
    assert res.outcomes["A"].same_decision(replay_prefix([WIN] * 12, QUICK))
    assert c.cancelled_in_flight > 0
    assert c.discarded_after_freeze == 0
    assert c.started == c.completed + c.cancelled_in_flight
    assert finished.count("cancelled") == c.cancelled_in_flight
    assert table.in_flight == 0  # every cancelled call really stopped
    assert res.wall_time_s < 1000.0  # virtual clock: nobody waited for the 1000 s calls
    assert res.peak_in_flight <= 24


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_cancelled_llm_call_closes_its_http_request():
    """The agent's request is closed when its task is cancelled, so the server frees it."""

    async def main():
        got_request, closed = asyncio.Event(), asyncio.Event()

        async def handle(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            got_request.set()
            while await reader.read(1024):  # never answer; wait for the client to go away
                pass
            closed.set()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        agent = LLMAgent({"u1": MCQ("Q?", ("a", "b"), "A")}, base_url=f"http://127.0.0.1:{port}/v1",
                         model="m", timeout=3600.0,
                         retry=RetryPolicy(max_attempts=1, base_delay_s=0.01, max_delay_s=0.01,
                                           max_total_s=1.0))
        call = asyncio.ensure_future(agent.infer(UnitTask("OCR", "u1", "cand", 0, "r", "s")))
        await asyncio.wait_for(got_request.wait(), 30)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.wait_for(closed.wait(), 30)  # a liveness guard, not a timing check
        await agent.aclose()
        server.close()
        await server.wait_closed()
        return closed.is_set()

    assert asyncio.run(main())


def test_launch_refuses_an_unknown_dispatch_before_starting():
    from vtrm_gate import launch

    table = OutcomeTable({"A": [TIE]})

    async def main():
        launch(table.plans(), table, dispatch="fastest")

    with pytest.raises(ValueError, match="dispatch must be"):
        run(main())
    assert table.calls == []


class GuardAtDecisionSink:
    """A sink that raises the guard's error while the decision is written: the gate aborts
    inside the freeze, and the error's ``partial`` shows the counters."""

    async def on_result(self, task, result, counted):
        pass

    async def on_consumed(self, event):
        pass

    async def on_decided(self, task_type, outcome):
        raise InfraGuardError("B", 2, 10, GuardParams())


def test_freeze_cancelled_calls_are_counted_once_when_the_gate_aborts_right_after():
    # A accepts at t=1 and its 4 speculative calls are asked to cancel; the gate then aborts
    # while those cancellations are still pending: each must be counted exactly once.
    table = _fast_stop_table()
    with pytest.raises(InfraGuardError) as err:
        run(run_gate(table.plans(), table, QUICK, concurrency=24, cancel_after_freeze=True,
                     sink=GuardAtDecisionSink()))
    assert table.in_flight == 0
    a = err.value.partial.counters["A"]
    long_calls = sum(t.task_type == "A" and t.ladder_rank >= 4 for t in table.calls)
    assert long_calls == 4
    assert a.cancelled_in_flight == long_calls
    assert a.started == a.completed + a.cancelled_in_flight
