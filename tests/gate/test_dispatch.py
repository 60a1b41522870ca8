"""Dispatch policies (issue 10): round-robin and need-aware orders, the starvation bound,
decisions unchanged by the order, and cancel_after_freeze (on the gate and the LLM agent)."""

from __future__ import annotations

import asyncio
import itertools
import random
from dataclasses import dataclass, field
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vtrm_gate import (
    Action,
    ExpectedNeed,
    GateParams,
    GuardParams,
    InfraGuardError,
    NeedAware,
    RoundRobin,
    RunOptions,
    TaskFinished,
    TaskStarted,
    replay_prefix,
    run_gate,
)
from vtrm_gate.gate import DEFAULT_DISPATCH, UnitTask, dispatch_order, resolve_dispatch
from vtrm_gate.llm import MCQ, LLMAgent, RetryPolicy
from vtrm_gate.sim import run_virtual as run
from vtrm_gate.stats import (
    MeasureAll,
    PairedBetting,
    SequentialTest,
    operating_characteristics,
)
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
    params: GateParams = field(default_factory=GateParams)
    test: SequentialTest = field(init=False)

    def __post_init__(self) -> None:
        self.test = SequentialTest(self.n, self.params)


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


def test_round_robin_dispatch_keeps_the_spec_order_in_a_gate():
    table = OutcomeTable({"C": [TIE] * 3, "A": [TIE] * 3, "B": [TIE] * 3},
                         latency=lambda t, r: 1.0)
    run(run_gate(table.plans(), table, PATIENT, concurrency=1, dispatch="round_robin"))
    assert [(t.task_type, t.ladder_rank) for t in table.calls[::2]] == [
        (t, r) for r in range(3) for t in "ABC"]


def test_default_dispatch_is_expected_need_for_the_gate_and_every_run():
    """Issue 17: the default feeds first the type expected to need the most units (here
    the longest ladder), where round-robin would start with A."""
    assert RunOptions().dispatch == DEFAULT_DISPATCH == "expected_need"
    table = OutcomeTable({"A": [TIE] * 3, "B": [TIE] * 9, "C": [TIE] * 6},
                         latency=lambda t, r: 1.0)
    run(run_gate(table.plans(), table, PATIENT, concurrency=1))
    assert [t.task_type for t in table.calls[:6:2]] == ["B", "B", "B"]
    assert sorted((t.task_type, t.ladder_rank) for t in table.calls[::2]) == [
        (t, r) for t, n in (("A", 3), ("B", 9), ("C", 6)) for r in range(n)]


def test_unknown_dispatch_name_is_refused():
    with pytest.raises(ValueError, match="dispatch must be 'round_robin', 'need_aware', "
                                         "'expected_need'"):
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


EVERY_POLICY = [(d, c, p) for d in ("round_robin", "need_aware", "expected_need")
                for c in (False, True) for p in ("cancel", "wait")]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from("ABCDE"), st.lists(outcome, max_size=30), min_size=1),
       st.integers(1, 12), st.integers(0, 2**32 - 1), st.sampled_from([GateParams(), QUICK]))
def test_decisions_are_identical_under_every_policy_for_any_latencies(outcomes, concurrency,
                                                                      seed, params):
    """Dispatch order x cancel_after_freeze x past_stop: twelve ways to run one gate, one
    set of decisions (replay_prefix's), and every cancelled call really stopped."""
    rng = random.Random(seed)
    lat: dict[tuple[str, str, str], float] = {}

    def latency(t, r):
        return lat.setdefault((t.task_type, t.unit_id, t.arm), rng.choice([0.0, 1, 2, 5, 30]))

    guard = GuardParams(min_calls=10**6)
    for dispatch, cancel_after_freeze, past_stop in EVERY_POLICY:
        table = OutcomeTable(outcomes, latency=latency)
        res = run(run_gate(table.plans(), table, params, concurrency=concurrency, guard=guard,
                           dispatch=dispatch, cancel_after_freeze=cancel_after_freeze,
                           past_stop=past_stop))
        assert res.peak_in_flight <= concurrency
        assert table.in_flight == 0
        for t, seq in outcomes.items():
            assert res.outcomes[t].same_decision(replay_prefix(seq, params)), (t, dispatch)
            c = res.counters[t]
            assert c.started == c.completed + c.cancelled_in_flight
            if past_stop == "wait" and not cancel_after_freeze:
                assert c.cancelled_in_flight == 0


# ---- cancel_after_freeze --------------------------------------------------------------

def _fast_stop_table():
    # A accepts after 4 wins (QUICK); its speculative units beyond that run 1000 s.
    return OutcomeTable({"A": [WIN] * 12, "B": [TIE] * 12},
                        latency=lambda t, r: 1.0 if t.task_type == "B" or t.ladder_rank < 4
                        else 1000.0)


def test_without_cancel_after_freeze_a_frozen_types_calls_finish():
    table = _fast_stop_table()
    res = run(run_gate(table.plans(), table, QUICK, concurrency=24, past_stop="wait",
                       cancel_after_freeze=False))
    c = res.counters["A"]
    assert res.outcomes["A"].action is Action.ACCEPT
    assert c.cancelled_in_flight == 0
    assert c.discarded_after_freeze > 0
    assert c.completed == c.started


def test_cancel_after_freeze_cancels_a_frozen_types_in_flight_calls():
    table = _fast_stop_table()
    finished = []
    res = run(run_gate(table.plans(), table, QUICK, concurrency=24, cancel_after_freeze=True,
                       past_stop="wait", subscribers=[lambda ev: isinstance(ev, TaskFinished)
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


class Store:
    """A BaselineStore in memory (what the harness's BaselineCache does, minus SQLite)."""

    def __init__(self):
        self.entries, self.ranks = {}, set()

    async def get(self, task):
        return self.entries.get((task.task_type, task.unit_id))

    async def put(self, task, result):
        self.entries[(task.task_type, task.unit_id)] = result
        self.ranks.add((task.task_type, task.ladder_rank))


@pytest.mark.parametrize("seq, kept", [([LOSS] * 12, True), ([WIN] * 12, False)],
                         ids=["rejected: the baseline survives", "accepted"])
def test_cancel_after_freeze_keeps_only_calls_whose_answer_still_serves(seq, kept):
    """A frozen type's candidate calls are worth nothing; its base-arm calls fill the
    BaselineCache for the next step when the baseline survives (REJECT), not after ACCEPT."""
    table = OutcomeTable({"A": seq, "B": [TIE] * 40},
                         latency=lambda t, r: 1.0 if t.task_type == "B" or t.ladder_rank < 4
                         else 50.0)
    store = Store()
    res = run(run_gate(table.plans(), table, QUICK, concurrency=24, cancel_after_freeze=True,
                       past_stop="wait", baseline=store, dispatch="round_robin"))
    assert res.outcomes["A"].same_decision(replay_prefix(seq, QUICK))
    assert res.outcomes["A"].stop_rank == 3
    speculative = {(t.ladder_rank, t.arm) for t in table.calls
                   if t.task_type == "A" and t.ladder_rank >= 4}
    assert speculative  # in flight when A froze
    c = res.counters["A"]
    stored = {rank for t, rank in store.ranks if t == "A" and rank >= 4}
    bases = {r for r, arm in speculative if arm == "base"}
    if kept:
        assert c.cancelled_in_flight == len(speculative) - len(bases)  # the candidate's
        assert stored == bases  # every kept base answer reached the store
    else:
        assert c.cancelled_in_flight == len(speculative) and stored == set()
    assert table.in_flight == 0


def test_the_gate_returns_at_its_last_decision_cancelling_calls_past_every_stop():
    """The SPEC amendment's default: once every type has decided, nothing in flight can
    change a decision, so the gate cancels it (counted) instead of waiting 1000 s."""

    class Sink:
        def __init__(self):
            self.results = []

        async def on_result(self, task, result, counted):
            self.results.append((task.task_type, task.ladder_rank, counted))

        async def on_consumed(self, event):
            pass

        async def on_decided(self, task_type, outcome):
            pass

    table = _fast_stop_table()
    sink = Sink()
    res = run(run_gate(table.plans(), table, QUICK, concurrency=24, sink=sink,
                       cancel_after_freeze=False))  # only past_stop cancels here
    a = res.counters["A"]
    assert res.outcomes["A"].same_decision(replay_prefix([WIN] * 12, QUICK))
    assert res.outcomes["B"].same_decision(replay_prefix([TIE] * 12, QUICK))
    assert a.cancelled_in_flight == 4 and a.discarded_after_freeze == 0
    assert a.started == a.completed + a.cancelled_in_flight
    assert table.in_flight == 0  # every cancelled call really stopped
    assert res.wall_time_s < 1000.0  # virtual clock: the gate did not wait for them
    # nothing of a cancelled call was stored: the sink saw exactly the completed calls
    assert len(sink.results) == res.total("completed")
    assert not [r for r in sink.results if r[0] == "A" and r[1] >= 4]
    table = _fast_stop_table()
    waited = run(run_gate(table.plans(), table, QUICK, concurrency=24, past_stop="wait",
                          cancel_after_freeze=False))
    assert waited.wall_time_s >= 1000.0 and waited.total("cancelled_in_flight") == 0
    with pytest.raises(ValueError, match="past_stop must be one of cancel, wait"):
        run(run_gate(table.plans(), table, QUICK, past_stop="later"))


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


# ---- the ready structure (issue 17): same order as the scan, O(1) lane reads ---------

def scan_order(lanes, policy):
    """The scan `dispatch_order` was until issue 17 (every lane looked at per dispatch),
    kept verbatim as the reference the heap must reproduce."""
    k_all = len(lanes)
    cursor = [0] * k_all
    last = [0] * k_all
    dead = [lane.n == 0 for lane in lanes]
    max_wait = policy.max_wait(sum(not d for d in dead))
    count = 0
    turn = 0
    scored = [None] * k_all
    while True:
        best, best_key = -1, None
        for j in range(k_all):
            k = (turn + j) % k_all
            if dead[k]:
                continue
            lane = lanes[k]
            if lane.frozen or cursor[k] >= lane.n:
                dead[k] = True
                continue
            seen = scored[k]
            if seen is not None and seen[0] == lane.prefix and seen[1] == cursor[k]:
                prio = seen[2]
            else:
                prio = policy.priority(lane, cursor[k])
                scored[k] = (lane.prefix, cursor[k], prio)
            if prio is None:
                dead[k] = True
                continue
            wait = count - last[k]
            starving = max_wait is not None and wait >= max_wait
            key = (1.0, wait) if starving else (0.0, *prio)
            if best_key is None or key > best_key:
                best, best_key = k, key
        if best < 0:
            return
        rank = cursor[best]
        cursor[best] += 1
        last[best] = count = count + 1
        turn = (best + 1) % k_all
        yield lanes[best], rank


PRIORITIES = [None, (), (0.0,), (1.0,), (1.0, 0.0), (1.0, 2.0), (2.0,), (-1.0, 5.0)]


@dataclass(frozen=True)
class TablePolicy:
    """Scores drawn from a table keyed by (lane, prefix, rank): ties, tuples of unequal
    length and None (retire the lane) all occur; the score depends only on the lane's
    state and the rank, as the protocol asks."""

    seed: int
    wait: int | None
    spread: int

    def max_wait(self, n_lanes: int) -> int | None:
        return self.wait

    def priority(self, lane, rank):
        h = hash((self.seed, lane.n_index, lane.prefix, rank)) % (self.spread * 8)
        return PRIORITIES[min(h // self.spread, len(PRIORITIES) - 1)] if h else None


def _lanes(sizes):
    lanes = [FakeLane(n) for n in sizes]
    for i, lane in enumerate(lanes):
        lane.n_index = i  # type: ignore[attr-defined]
    return lanes


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 7), min_size=1, max_size=9), st.integers(0, 10**6),
       st.one_of(st.none(), st.integers(1, 6)), st.integers(1, 4),
       st.lists(st.tuples(st.sampled_from(["none", "none", "advance", "freeze"]),
                          st.integers(0, 8)), max_size=60),
       st.booleans())
def test_heap_order_equals_the_scan(sizes, seed, wait, spread, script, round_robin):
    policy = RoundRobin() if round_robin else TablePolicy(seed, wait, spread)
    ref_lanes, new_lanes = _lanes(sizes), _lanes(sizes)
    ref, new = scan_order(ref_lanes, policy), dispatch_order(new_lanes, policy)
    got_ref, got_new = [], []
    for step in range(sum(sizes) + 1):
        a = next(ref, None)
        b = next(new, None)
        got_ref.append(None if a is None else (ref_lanes.index(a[0]), a[1]))
        got_new.append(None if b is None else (new_lanes.index(b[0]), b[1]))
        if a is None or b is None:
            break
        what, i = script[step] if step < len(script) else ("none", 0)
        i %= len(sizes)
        for lanes in (ref_lanes, new_lanes):  # the same change to both worlds
            if what == "advance":
                lanes[i].prefix += 1
            elif what == "freeze":
                lanes[i].frozen = True
        if what == "advance":
            new.moved(new_lanes[i])
    assert got_new == got_ref


class CountingLane(FakeLane):
    """Counts how often the dispatcher reads a lane's state."""

    reads = 0

    def __getattribute__(self, name):
        if name in ("frozen", "prefix", "n"):
            CountingLane.reads += 1
        return object.__getattribute__(self, name)


@dataclass
class CountingPolicy:
    inner: object
    calls: int = 0

    def max_wait(self, n_lanes):
        return self.inner.max_wait(n_lanes)

    def priority(self, lane, rank):
        self.calls += 1
        return self.inner.priority(lane, rank)


@pytest.mark.parametrize("policy", [RoundRobin(), NeedAware()], ids=["round_robin", "need_aware"])
def test_a_dispatch_at_400_types_reads_a_few_lanes_not_all(policy):
    k = 400
    lanes = [CountingLane(5, task_type=f"T{i:03d}") for i in range(k)]
    counting = CountingPolicy(policy)
    order = dispatch_order(lanes, policy if isinstance(policy, RoundRobin) else counting)
    CountingLane.reads = 0
    n = 0
    for lane, rank in order:
        n += 1
        if rank == 2:  # every type's prefix moves once along the way
            lane.prefix = 1
            order.moved(lane)
    assert n == 5 * k
    # the scan read every open lane per dispatch: ~2 * 400 reads each, 1.6 M in all
    assert CountingLane.reads / n <= 12
    if not isinstance(policy, RoundRobin):
        # one score per unit dispatched, plus one per reported prefix move
        assert counting.calls <= n + k


class _ScanOrder:
    """`scan_order` behind the `DispatchOrder` face (it re-reads every lane: moved is moot)."""

    def __init__(self, lanes, policy):
        self._it = scan_order(lanes, policy)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._it)

    def moved(self, lane):
        pass


@pytest.mark.parametrize("dispatch", ["need_aware", "round_robin"])
def test_a_gate_starts_units_in_the_order_the_scan_gave(dispatch, monkeypatch):
    rng = random.Random(3)
    outcomes = {f"T{i:02d}": [rng.choice([WIN, LOSS, TIE, TIE, None]) for _ in range(
        rng.randint(0, 25))] for i in range(14)}

    def starts():
        table = OutcomeTable(outcomes, latency=lambda t, r: 1.0 + hash(t.unit_id) % 7)
        seen = []
        run(run_gate(table.plans(), table, QUICK, concurrency=6, dispatch=dispatch,
                     guard=GuardParams(min_calls=10**6),
                     subscribers=[lambda ev: isinstance(ev, TaskStarted)
                                  and seen.append((ev.task.task_type, ev.task.ladder_rank))]))
        return seen

    heap = starts()
    from vtrm_gate.gate import _scheduler

    monkeypatch.setattr(_scheduler, "dispatch_order", _ScanOrder)
    assert starts() == heap and len(heap) > 100


def test_expected_need_scores_the_expected_units_left_and_is_found_by_name():
    params = GateParams()
    policy = ExpectedNeed(p_win=0.8, discordance=0.5)
    assert resolve_dispatch("expected_need") is resolve_dispatch("expected_need")
    assert isinstance(resolve_dispatch("expected_need"), ExpectedNeed)
    fresh = FakeLane(40)
    # from the start, the units a type is expected to consume are the OC's expected units
    oc = operating_characteristics(params, 0.8, 0.5, 40)
    assert policy.priority(fresh, 0)[0] == pytest.approx(oc.expected_units, rel=1e-12)
    # each unit further out is expected to be needed less: P(reaching it) leaves the sum
    p = [policy.priority(fresh, r)[0] for r in range(6)]
    assert all(a - b == pytest.approx(policy.p_needed(fresh.test.rule, params,
                                                      fresh.test.state, 40, r), rel=1e-9)
               for r, (a, b) in enumerate(itertools.pairwise(p)))
    short = FakeLane(9)  # a small type cannot reach ACCEPT: fewer units expected
    assert policy.priority(short, 0) < policy.priority(fresh, 0)
    assert policy.max_wait(50) == 400
    with pytest.raises(ValueError, match=r"ExpectedNeed\.horizon must be an integer >= 1"):
        ExpectedNeed(horizon=0)


@dataclass(frozen=True)
class CountingMeasureAll(MeasureAll):
    """`MeasureAll`, counting the state updates a policy asks of it (as `CountingBetting`)."""

    updates: list[int] = field(default_factory=lambda: [0], compare=False)

    def update(self, state, pair, params):
        self.updates[0] += 1
        return super().update(state, pair, params)


@dataclass(frozen=True)
class SearchedMeasureAll(MeasureAll):
    """The same rule without its declaration: the policy must search for a stop."""

    stops_early: ClassVar[bool] = True


@pytest.mark.parametrize("policy", [NeedAware(), ExpectedNeed(), ExpectedNeed(horizon=8)],
                         ids=["need_aware", "expected_need", "expected_need_h8"])
def test_a_rule_that_cannot_stop_early_is_scored_without_a_search(policy):
    """An evaluation gate (`MeasureAll`) needs every unit: its score is what a search would
    find (P(needed) 1, the units left), computed without one (the search cost an evaluation
    phase ~0.3 s of CPU per type on every 48-unit horizon)."""
    params = GateParams()
    for n, rank in [(30, 0), (30, 7), (40, 0), (40, 20), (40, 39), (9, 3)]:
        lane = FakeLane(n)
        counting = CountingMeasureAll()
        lane.test = SequentialTest(n, params, counting)
        fast = policy.priority(lane, rank)
        assert counting.updates[0] == 0
        lane.test = SequentialTest(n, params, SearchedMeasureAll())
        assert fast == pytest.approx(policy.priority(lane, rank), rel=1e-12)
        assert fast == ((1.0, n - rank) if type(policy) is NeedAware
                        else (float(n - rank), float(n - rank)))


def test_equal_rules_and_params_built_anew_share_one_memo():
    """Each plan of an evaluation builds its own `MeasureAll`, each step its own params: a
    memo found only by identity was refilled for every one of them (and cleared after 16)."""
    policy = ExpectedNeed()
    first = policy._table(PairedBetting(), GateParams())
    first[("marker",)] = 1.0
    for _ in range(40):
        assert policy._table(PairedBetting(), GateParams()) is first
    assert policy._table(PairedBetting(), GateParams(n_max=60)) is not first
    assert policy._table(MeasureAll(), GateParams()) is not first


def test_the_memo_keeps_at_most_four_tables_however_many_rules_a_session_brings():
    """Issue 29: a dropped table stayed alive (and in use) through its identity alias, so a
    training run, whose probations bring a new rule each, grew by 11-16 MiB an epoch."""
    from vtrm_gate.gate._dispatch import _MEMO_CAP, _TABLES

    policy = ExpectedNeed()
    kept = []  # the rules and params stay alive, as a run's do, so their aliases could too
    for i in range(12):
        lane = FakeLane(30, params=GateParams(e_confirm=20.0 + i))
        kept.append(lane)
        policy.priority(lane, 5)
        live = {id(t): t for _, _, t in policy._memo.values()}
        live |= {id(t): t for _, _, t in policy._tables}
        assert len(live) <= _TABLES and sum(map(len, live.values())) <= _TABLES * _MEMO_CAP
    # the latest rule's table is still the one its alias finds (nothing it needs was lost)
    assert policy._table(kept[-1].test.rule, kept[-1].params) is policy._tables[-1][2]


@dataclass(frozen=True)
class CountingBetting(PairedBetting):
    """The default rule, counting the state updates (the gate's and the policy's)."""

    updates: list[int] = field(default_factory=lambda: [0], compare=False)

    def update(self, state, pair, params):
        self.updates[0] += 1
        return super().update(state, pair, params)


def test_expected_need_searches_a_long_never_deciding_ladder_once_not_at_every_unit():
    """4 types x 200 units whose thresholds no run reaches: the search from each new state
    over the next 48 units cost ~10M rule steps (112 s of CPU); far from its end a type now
    counts every unit left, and near it one search serves every later state."""
    params = GateParams(e_confirm=1e9, e_reject=1e9, e_provisional=1.0,
                        w_net_min_provisional=0, n_max=10_000)
    rule = CountingBetting()
    table = OutcomeTable({t: [TIE] * 200 for t in "ABCD"}, latency=lambda t, r: 1.0)
    res = run(run_gate(table.plans(), table, params, concurrency=8, rule=rule,
                       dispatch=ExpectedNeed()))
    assert all(o.stop_rank == 199 for o in res.outcomes.values())  # every ladder exhausted
    gate_updates = 4 * 200
    h = ExpectedNeed().horizon
    assert rule.updates[0] - gate_updates <= 3 * (h + 1) ** 3 // 6 + 3 * 32 ** 3
    far = FakeLane(100, params=params)
    assert ExpectedNeed().priority(far, 10) == (90.0, 90.0)  # > horizon from its end


def test_expected_need_near_the_end_of_a_long_ladder_equals_a_short_ladders_score():
    """Within the horizon the score depends on the units left, not on where the ladder began."""
    params = GateParams(n_max=200)
    long, short = FakeLane(100, params=params), FakeLane(40, params=params)
    for _ in range(60):
        long.test.consume(long.prefix, (True, True))
        long.prefix += 1
    policy = ExpectedNeed()
    assert policy.priority(long, 60) == pytest.approx(policy.priority(short, 0), rel=1e-12)


def _pinned_world_starts(dispatch: str) -> tuple[list[tuple[str, int, str]], dict]:
    """A fixed virtual-clock world (9 types of 40 units, one of 25 and one of 60; outcomes
    and latencies from fixed seeds, crc32 not the salted hash): the calls in the order the
    gate started them, and each type's (action, stop_rank)."""
    import zlib

    rng = random.Random(29)
    sizes = [40] * 9 + [25, 60]
    outcomes = {f"T{i:02d}": [rng.choice([WIN, WIN, LOSS, TIE, TIE, TIE, None])
                              for _ in range(n)] for i, n in enumerate(sizes)}
    table = OutcomeTable(outcomes, latency=lambda t, r: 1.0 + zlib.crc32(
        f"{t.task_type}/{t.unit_id}/{t.arm}".encode()) % 9)
    starts: list[tuple[str, int, str]] = []

    async def infer(task):
        starts.append((task.task_type, task.ladder_rank, task.arm))
        return await table(task)

    params = GateParams(e_confirm=4, e_reject=4, w_net_min=1, n_max=60)
    res = run(run_gate(table.plans(), infer, params, concurrency=8, dispatch=dispatch,
                       guard=GuardParams(min_calls=10**6)))
    return starts, {t: (o.action.name, o.stop_rank) for t, o in res.outcomes.items()}


@pytest.mark.parametrize(("dispatch", "n_starts", "digest"), [
    ("expected_need", 634, "0dd1d2fcc5f8e27e"), ("need_aware", 624, "7e2b78ea1289e2c3"),
    ("round_robin", 625, "78b9bb4f63452b17")])
def test_the_dispatch_sequence_of_a_fixed_world_is_pinned(dispatch, n_starts, digest):
    """Issue 29: the per-call cost was cut without moving a call: the sequence of starts
    (and the decisions) of a fixed world is the one the gate gave before (its sha256)."""
    import hashlib

    starts, decisions = _pinned_world_starts(dispatch)
    got = hashlib.sha256(repr((starts, sorted(decisions.items()))).encode()).hexdigest()[:16]
    assert (len(starts), got) == (n_starts, digest), decisions
