"""The continuous concurrent gate (SPEC §3), on looptime's virtual clock."""

from __future__ import annotations

import asyncio

import looptime
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vtrm_gate import (
    Action,
    GateAborted,
    GateFinished,
    GateParams,
    GuardParams,
    InfraGuardError,
    PrefixAdvanced,
    TaskFinished,
    TaskStarted,
    TypeDecided,
    TypePlan,
    UnitResult,
    UnitTask,
    launch,
    replay_prefix,
    run_gate,
    run_gate_sync,
)
from vtrm_gate.testing import OutcomeTable

WIN, LOSS, TIE = (False, True), (True, False), (True, True)
# rule that never stops early except at exhaustion (futility cannot fire: E+ >= 1 always is)
PATIENT = GateParams(e_confirm=1e9, e_reject=1e9, e_provisional=1.0, w_net_min_provisional=0)


def run(coro):
    """Run on a virtual clock: sleeps cost no wall time, loop.time() is exact."""
    loop = looptime.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


class Recorder:
    def __init__(self):
        self.events = []

    def __call__(self, ev):
        self.events.append(ev)

    def of(self, kind):
        return [e for e in self.events if isinstance(e, kind)]


class DictBaseline:
    """In-memory BaselineStore keyed like the real one (type, unit, skill hash)."""

    def __init__(self, entries=None):
        self.entries = dict(entries or {})
        self.puts = []

    def key(self, task):
        return (task.task_type, task.unit_id, task.skill_hash)

    async def get(self, task):
        return self.entries.get(self.key(task))

    async def put(self, task, result):
        self.puts.append((task, result))
        self.entries[self.key(task)] = result


# ---- prefix consumption --------------------------------------------------------------

def test_tail_finishing_first_waits_for_the_prefix():
    seq = [WIN] * 10
    table = OutcomeTable({"A": seq}, latency=lambda t, r: 100.0 - 10 * t.ladder_rank)
    rec = Recorder()
    res = run(run_gate(table.plans(), table, PATIENT, concurrency=32, subscribers=[rec]))
    advanced = rec.of(PrefixAdvanced)
    assert [e.ladder_rank for e in advanced] == list(range(10))
    # nothing is consumed until unit 0 (the slowest, t=100) is back; then all at once
    assert all(e.t == 100.0 for e in advanced)
    finished = rec.of(TaskFinished)
    assert finished[0].task.ladder_rank == 9 and finished[0].t == 10.0
    assert [(e.W, e.n_used) for e in advanced] == [(i + 1, i + 1) for i in range(10)]
    assert res.outcomes["A"].same_decision(replay_prefix(seq, PATIENT))


def test_no_decision_while_prefix_incomplete():
    """Unit 0 is a loss that arrives last; the 8 wins behind it cannot decide early."""
    seq = [LOSS] + [WIN] * 11
    table = OutcomeTable({"A": seq}, latency=lambda t, r: 50.0 if t.ladder_rank == 0 else 1.0)
    rec = Recorder()
    res = run(run_gate(table.plans(), table, concurrency=32, subscribers=[rec]))
    decided = rec.of(TypeDecided)[0]
    assert decided.t == 50.0
    out = res.outcomes["A"]
    assert out.same_decision(replay_prefix(seq))
    assert out.action is Action.ACCEPT and out.stop_rank == 10 and out.L == 1


def test_same_outcomes_prefix_and_block_agree_with_earlier_stop():
    from vtrm_gate import replay_blocks

    seq = [WIN, TIE, WIN, WIN, WIN, TIE, WIN, WIN, WIN, WIN, WIN] + [TIE] * 13
    table = OutcomeTable({"A": seq}, latency=lambda t, r: 1.0 + (t.ladder_rank * 7919) % 13)
    out = run(run_gate(table.plans(), table, concurrency=8)).outcomes["A"]
    blk = replay_blocks(seq)
    assert out.action is blk.action is Action.ACCEPT
    assert out.stop_rank == 9 < blk.stop_rank == 15


# ---- freeze --------------------------------------------------------------------------

def test_frozen_type_starts_nothing_new():
    table = OutcomeTable({"A": [WIN] * 40}, latency=lambda t, r: 10.0)
    rec = Recorder()
    res = run(run_gate(table.plans(), table, concurrency=4, subscribers=[rec]))
    out = res.outcomes["A"]
    assert out.action is Action.ACCEPT and out.stop_rank == 7
    t_decided = rec.of(TypeDecided)[0].t
    assert not [e for e in rec.of(TaskStarted) if e.t > t_decided]
    c = res.counters["A"]
    assert c.started == len(table.calls) == len(rec.of(TaskStarted))
    assert c.cancelled_before_start == 80 - c.started > 0
    assert c.completed == c.started


def test_in_flight_results_never_change_frozen_stats():
    """Units 8.. are losses still in flight when unit 7 decides; they finish, are
    persisted (sink sees them, counted=False) and discarded."""
    seq = [WIN] * 8 + [LOSS] * 8
    table = OutcomeTable({"A": seq}, latency=lambda t, r: 1.0 if t.ladder_rank < 8 else 5.0)
    sink = ListSink()
    res = run(run_gate(table.plans(), table, concurrency=32, sink=sink))
    out = res.outcomes["A"]
    assert out.same_decision(replay_prefix(seq))
    assert (out.action, out.W, out.L) == (Action.ACCEPT, 8, 0)
    c = res.counters["A"]
    assert c.discarded_after_freeze == 16 == c.completed - 16
    late = [(t.ladder_rank, counted) for t, _, counted in sink.results if t.ladder_rank >= 8]
    assert len(late) == 16 and not any(counted for _, counted in late)
    assert [e.ladder_rank for e in sink.consumed] == list(range(8))


class ListSink:
    def __init__(self):
        self.results, self.consumed, self.decided = [], [], []

    async def on_result(self, task, result, counted):
        self.results.append((task, result, counted))

    async def on_consumed(self, event):
        self.consumed.append(event)

    async def on_decided(self, task_type, outcome):
        self.decided.append((task_type, outcome))


# ---- exits, INFRA and the guard ------------------------------------------------------

def test_exhaustion_exit():
    seq = [WIN, WIN, TIE, TIE]
    table = OutcomeTable({"tiny": seq})
    out = run(run_gate(table.plans(), table)).outcomes["tiny"]
    assert (out.action, out.stop_rank, out.n_consumed) == (Action.PROVISIONAL, 3, 4)


def test_infra_units_excluded_and_consumed():
    seq = [WIN, None, WIN, None, WIN, WIN, TIE, TIE, TIE, TIE, TIE, TIE]
    table = OutcomeTable({"A": seq}, latency=lambda t, r: 1.0)
    res = run(run_gate(table.plans(), table, PATIENT, guard=GuardParams(max_ratio=0.5)))
    out = res.outcomes["A"]
    assert out.same_decision(replay_prefix(seq, PATIENT))
    assert (out.W, out.n_used, out.n_consumed) == (4, 10, 12)
    assert res.counters["A"].infra_units == 2


def _guard_table(n_units, infra_ranks):
    seq = [None if i in infra_ranks else TIE for i in range(n_units)]
    # completions in ladder order, base before cand
    return OutcomeTable({"A": seq},
                        latency=lambda t, r: 1.0 + 2 * t.ladder_rank + (t.arm == "cand"))


def test_guard_exactly_ten_percent_does_not_abort():
    table = _guard_table(10, {8, 9})  # 2 INFRA units / 20 calls
    res = run(run_gate(table.plans(), table, PATIENT))
    assert res.counters["A"].infra_units == 2 and res.counters["A"].completed == 20


def test_guard_above_ten_percent_aborts_naming_type_and_counts():
    table = _guard_table(12, {9, 10, 11})  # the 3rd INFRA unit arrives at call 24: 3/24
    sink = ListSink()
    with pytest.raises(InfraGuardError, match=r"'A'.*3 INFRA units out of 24") as ei:
        run(run_gate(table.plans(), table, PATIENT, sink=sink))
    err = ei.value
    assert isinstance(err, RuntimeError)
    assert (err.task_type, err.infra_units, err.calls) == ("A", 3, 24)
    assert err.partial is not None and err.partial.aborted
    assert len(sink.results) == 24  # everything that finished was persisted


def test_guard_never_fires_below_ten_calls():
    table = _guard_table(4, {0, 1, 2, 3})  # 4 INFRA units / 8 calls
    res = run(run_gate(table.plans(), table, PATIENT))
    assert res.counters["A"].infra_units == 4
    assert res.outcomes["A"].n_used == 0


def test_guard_cancels_in_flight_calls():
    seq = [None] * 6 + [TIE] * 30
    table = OutcomeTable({"A": seq}, latency=lambda t, r: 1.0 if r.infra else 1000.0)
    with pytest.raises(InfraGuardError) as ei:
        run(run_gate(table.plans(), table, PATIENT, concurrency=8,
                     guard=GuardParams(min_calls=2, max_ratio=0.1)))
    c = ei.value.partial.counters["A"]
    assert c.cancelled_in_flight > 0


def test_exception_in_infer_counts_as_infra_with_text_kept():
    async def broken(task):
        raise ConnectionError("backend down")

    sink = ListSink()
    with pytest.raises(InfraGuardError):
        run(run_gate([TypePlan("A", [f"u{i}" for i in range(20)])], broken, sink=sink))
    assert sink.results[0][1].infra
    assert sink.results[0][1].error == "ConnectionError: backend down"


# ---- several types -------------------------------------------------------------------

def test_two_types_interleave_without_contaminating_each_other():
    a, b = [WIN] * 30, [LOSS] * 30 + [TIE] * 10
    table = OutcomeTable({"A": a, "B": b},
                         latency=lambda t, r: 1.0 + (hash((t.unit_id, t.arm)) % 7))
    res = run(run_gate(table.plans(), table, concurrency=6))
    assert res.outcomes["A"].same_decision(replay_prefix(a))
    assert res.outcomes["B"].same_decision(replay_prefix(b))
    assert res.outcomes["A"].action is Action.ACCEPT
    assert res.outcomes["B"].action is Action.REJECT


def test_round_robin_fair_order_base_then_cand():
    table = OutcomeTable({"C": [TIE] * 3, "A": [TIE] * 3, "B": [TIE] * 3},
                         latency=lambda t, r: 1.0)
    run(run_gate(table.plans(), table, PATIENT, concurrency=1))
    order = [(t.task_type, t.ladder_rank, t.arm) for t in table.calls]
    assert order[:6] == [("A", 0, "base"), ("A", 0, "cand"), ("B", 0, "base"),
                         ("B", 0, "cand"), ("C", 0, "base"), ("C", 0, "cand")]
    assert order[6][:2] == ("A", 1)


@pytest.mark.parametrize("concurrency", [1, 3, 32])
def test_peak_in_flight_never_exceeds_concurrency(concurrency):
    table = OutcomeTable({t: [TIE] * 25 for t in "ABCD"},
                         latency=lambda t, r: 1.0 + (hash(t.unit_id) % 5))
    res = run(run_gate(table.plans(), table, PATIENT, concurrency=concurrency))
    assert res.peak_in_flight == table.peak <= concurrency
    assert res.peak_in_flight == min(concurrency, 100)


def test_emission_is_lazy_live_tasks_bounded_by_concurrency():
    table = OutcomeTable({t: [TIE] * 500 for t in "ABCD"}, latency=lambda t, r: 1.0)
    peak_tasks = 0

    async def main():
        nonlocal peak_tasks

        async def watch(ev):
            nonlocal peak_tasks
            peak_tasks = max(peak_tasks, len(asyncio.all_tasks()))

        return await run_gate(table.plans(), table, PATIENT, concurrency=8,
                              subscribers=[lambda ev: watch(ev)])

    res = run(main())
    assert sum(c.completed for c in res.counters.values()) == 4000
    assert peak_tasks <= 8 + 4  # in-flight calls + main + subscriber pump + slack


# ---- the base-arm cache --------------------------------------------------------------

def test_baseline_hits_take_no_slot_and_misses_are_written_back():
    seq = [TIE] * 6
    table = OutcomeTable({"A": seq}, latency=lambda t, r: 1.0)
    plan = table.plans(base_skill="v0")[0]
    store = DictBaseline()
    first = run(run_gate([plan], table, PATIENT, baseline=store))
    assert first.counters["A"].cache_hits == 0 and len(store.puts) == 6
    table.calls.clear()
    second = run(run_gate([plan], table, PATIENT, baseline=store))
    assert second.counters["A"].cache_hits == 6
    assert {t.arm for t in table.calls} == {"cand"}
    assert second.outcomes["A"].same_decision(first.outcomes["A"])


def test_infra_base_results_are_never_cached():
    table = OutcomeTable({"A": [None, TIE, TIE]}, infra_arm="base")
    store = DictBaseline()
    run(run_gate(table.plans(), table, PATIENT, baseline=store))
    assert [t.ladder_rank for t, _ in store.puts] == [1, 2]


def test_new_baseline_content_gets_new_keys():
    table = OutcomeTable({"A": [TIE] * 3})
    store = DictBaseline()
    run(run_gate(table.plans(base_skill="v0"), table, PATIENT, baseline=store))
    res = run(run_gate(table.plans(base_skill="v1"), table, PATIENT, baseline=store))
    assert res.counters["A"].cache_hits == 0


# ---- the property: live == replay_prefix, whatever the completion order ---------------

outcome = st.sampled_from([WIN, LOSS, TIE, (False, False), None])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["A", "B", "C"]), st.lists(outcome, max_size=30),
                       min_size=1),
       st.integers(1, 12), st.integers(0, 2**32 - 1), st.booleans(),
       st.sampled_from([GateParams(), GateParams(e_confirm=4, e_reject=4, w_net_min=1)]))
def test_decisions_equal_replay_prefix_for_any_completion_order(outcomes, concurrency, seed,
                                                                  cached, params):
    import random

    rng = random.Random(seed)
    lat = {}

    def latency(t, r):
        return lat.setdefault((t.task_type, t.unit_id, t.arm), rng.choice([0.0, 1, 2, 5, 30]))

    table = OutcomeTable(outcomes, latency=latency)
    store = None
    if cached:  # pre-fill from a previous *fresh base-arm run*, never from selection data
        store = DictBaseline()
        plans = table.plans()
        for p in plans:
            for i, _u in enumerate(p.units):
                task = p.task(i, "base")
                res = table.result(task)
                if not res.infra and rng.random() < 0.5:
                    store.entries[store.key(task)] = res
    res = run(run_gate(table.plans(), table, params, concurrency=concurrency, baseline=store,
                       guard=GuardParams(min_calls=10**6)))
    for t, seq in outcomes.items():
        assert res.outcomes[t].same_decision(replay_prefix(seq, params)), t
    assert res.peak_in_flight <= concurrency


# ---- fail-fast and bad input ---------------------------------------------------------

def test_two_types_with_one_target_file_fail_before_inference():
    table = OutcomeTable({"A": [TIE], "B": [TIE]})
    plans = [TypePlan("A", ["u1"], target_file="skills/shared.md"),
             TypePlan("B", ["u1"], target_file="skills/shared.md")]
    with pytest.raises(RuntimeError, match=r"same target skill file 'skills/shared\.md'"):
        run(run_gate(plans, table))
    assert table.calls == []


@pytest.mark.parametrize("concurrency", [0, -1, 2.5, True])
def test_bad_concurrency_is_refused(concurrency):
    with pytest.raises(ValueError, match="concurrency"):
        run(run_gate([TypePlan("A", ["u"])], OutcomeTable({"A": [TIE]}), concurrency=concurrency))


def test_duplicate_type_names_and_unit_ids_are_refused():
    with pytest.raises(ValueError, match="duplicate task type"):
        run(run_gate([TypePlan("A", ["u"]), TypePlan("A", ["v"])], OutcomeTable({"A": [TIE]})))
    with pytest.raises(ValueError, match="duplicate unit id 'u'"):
        TypePlan("A", ["u", "u"])
    with pytest.raises(ValueError, match="task_type"):
        TypePlan("", ["u"])


def test_empty_ladders_end_inertia_without_inference():
    table = OutcomeTable({"A": [], "B": [WIN] * 10})
    rec = Recorder()
    res = run(run_gate(table.plans(), table, subscribers=[rec]))
    assert res.outcomes["A"].action is Action.INERTIA and res.outcomes["A"].stop_rank is None
    assert not [c for c in table.calls if c.task_type == "A"]
    assert rec.of(TypeDecided)[0].task_type == "A"


def test_no_plans_returns_at_once():
    res = run(run_gate([], OutcomeTable({})))
    assert res.outcomes == {} and res.peak_in_flight == 0


def test_infer_returning_wrong_type_is_infra():
    async def bad(task):
        return {"correct": True}

    res = run(run_gate([TypePlan("A", ["u"])], bad, guard=GuardParams(min_calls=100)))
    assert res.counters["A"].infra_units == 1


# ---- events, handles, cancellation, sync wrapper -------------------------------------

def test_event_stream_and_order_of_lifecycle_events():
    table = OutcomeTable({"A": [WIN] * 10}, latency=lambda t, r: 1.0)

    async def main():
        handle = launch(table.plans(), table, concurrency=4)
        seen = [ev async for ev in handle.events()]
        result = await handle
        late = [ev async for ev in handle.events()]  # replays the history after the end
        return seen, late, result

    seen, late, result = run(main())
    assert isinstance(seen[-1], GateFinished) and seen[-1].result is result
    assert [type(e) for e in late] == [type(e) for e in seen]
    kinds = {type(e).__name__ for e in seen}
    assert {"GateStarted", "TaskStarted", "TaskFinished", "PrefixAdvanced",
            "TypeDecided"} <= kinds


def test_slow_subscriber_does_not_slow_the_gate():
    table = OutcomeTable({"A": [TIE] * 20}, latency=lambda t, r: 1.0)

    async def slow(ev):
        await asyncio.sleep(3600)

    fast_res = run(run_gate(table.plans(), table, PATIENT, concurrency=4))
    slow_res = run(run_gate(table.plans(), table, PATIENT, concurrency=4, subscribers=[slow]))
    assert slow_res.wall_time_s == fast_res.wall_time_s == 10.0


def test_broken_subscriber_does_not_break_the_gate():
    table = OutcomeTable({"A": [WIN] * 10})

    def broken(ev):
        raise RuntimeError("plot failed")

    res = run(run_gate(table.plans(), table, subscribers=[broken]))
    assert res.outcomes["A"].action is Action.ACCEPT


def test_cancel_propagates_and_cancels_in_flight_calls():
    table = OutcomeTable({"A": [TIE] * 40}, latency=lambda t, r: 100.0)
    sink = ListSink()
    rec = Recorder()

    async def main():
        handle = launch(table.plans(), table, PATIENT, concurrency=4, sink=sink,
                        subscribers=[rec])
        await asyncio.sleep(150)
        handle.cancel()
        with pytest.raises(asyncio.CancelledError):
            await handle
        await asyncio.sleep(0)
        return handle

    run(main())
    assert len(sink.results) == 4  # the first wave finished at t=100 and was persisted
    assert isinstance(rec.events[-1], GateAborted)
    assert table.in_flight == 0


def test_sync_wrapper_in_script_and_inside_a_running_loop():
    table = OutcomeTable({"A": [WIN] * 10})
    res = run_gate_sync(table.plans(), table)
    assert res.outcomes["A"].action is Action.ACCEPT

    async def cell():  # what a blocking Jupyter cell does: a loop is already running
        return run_gate_sync(table.plans(), table)

    assert asyncio.run(cell()).outcomes["A"].action is Action.ACCEPT


def test_result_counters_add_up():
    seq = [WIN] * 12 + [None] + [TIE] * 27
    table = OutcomeTable({"A": seq, "B": [LOSS, TIE] * 10},
                         latency=lambda t, r: 1.0 + t.ladder_rank % 3)
    res = run(run_gate(table.plans(), table, concurrency=5))
    for _t, c in res.counters.items():
        assert c.started + c.cache_hits + c.cancelled_before_start == 2 * c.units
        assert c.completed == c.started
        assert c.tokens == 100 * c.completed
    assert res.tokens == 100 * len(table.calls)


def test_unit_task_carries_run_ids_per_arm():
    plan = TypePlan("Action Reasoning", ["u1"], step_run_id="e1_s2")
    assert plan.task(0, "base").run_id == "e1_s2_gate_action-reasoning_base"
    assert plan.task(0, "cand").run_id == "e1_s2_gate_action-reasoning_cand"
    assert plan.target == "skills/action-reasoning.md"
    assert isinstance(plan.task(0, "base"), UnitTask)
    assert UnitResult(correct=True).infra is False


def test_base_exception_escaping_infer_stops_the_gate_instead_of_hanging():
    class Boom(BaseException):
        pass

    async def infer(task):
        await asyncio.sleep(1)
        raise Boom("out of band")

    with pytest.raises(Boom):
        run(run_gate([TypePlan("A", ["u1", "u2"])], infer))


def test_late_arm_of_an_infra_unit_is_counted_as_discarded():
    # base fails fast (INFRA), cand comes back later for an already-excluded unit
    table = OutcomeTable({"A": [None, TIE, TIE]}, infra_arm="base",
                         latency=lambda t, r: {"base": 1.0, "cand": 5.0}[t.arm]
                         if t.ladder_rank == 0 else 10.0)
    sink = ListSink()
    res = run(run_gate(table.plans(), table, PATIENT, sink=sink,
                       guard=GuardParams(min_calls=100)))
    c = res.counters["A"]
    assert c.discarded_after_infra == 1 and c.discarded_after_freeze == 0
    assert sum(not counted for *_, counted in sink.results) == 1
