"""The continuous concurrent gate (SPEC §3), on looptime's virtual clock."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests._strategies import gate_params
from vtrm_gate import (
    Action,
    GateAborted,
    GateFinished,
    GateParams,
    GateStarted,
    GuardParams,
    InfraGuardError,
    PrefixAdvanced,
    TaskFinished,
    TaskProgress,
    TaskStarted,
    TypeDecided,
    TypePlan,
    UnitResult,
    UnitTask,
    launch,
    replay_prefix,
    report_progress,
    run_gate,
    run_gate_sync,
)
from vtrm_gate.errors import InvalidResultError
from vtrm_gate.gate import STOP_GRACE_S, SubscriberWarning
from vtrm_gate.sim import run_virtual as run
from vtrm_gate.stats import MeasureAll
from vtrm_gate.testing import OutcomeTable

WIN, LOSS, TIE = (False, True), (True, False), (True, True)
# rule that never stops early except at exhaustion (futility cannot fire: E+ >= 1 always is)
PATIENT = GateParams(e_confirm=1e9, e_reject=1e9, e_provisional=1.0, w_net_min_provisional=0,
                    n_max=10_000)



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
    res = run(run_gate(table.plans(), table, concurrency=32, sink=sink, past_stop="wait",
                       cancel_after_freeze=False))
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


class _UnsetBody(Exception):
    """An SDK error whose ``__str__`` reads a field that was never set."""

    def __str__(self) -> str:
        return self.body["message"]  # type: ignore[attr-defined]


class _NoRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr of a half-built object")


def test_an_exception_whose_text_fails_is_infra_not_a_hang():
    """Hostile pass (h25): formatting the INFRA error of such an exception raised inside the
    worker's handler; the worker died without a word and the gate waited for it for good."""
    async def infer(task):
        if task.ladder_rank == 3 and task.arm == "cand":
            raise _UnsetBody()
        return UnitResult(correct=task.arm == "cand")

    sink = ListSink()
    res = run(asyncio.wait_for(run_gate([TypePlan("A", [f"u{i}" for i in range(12)])], infer,
                                        sink=sink), 60))
    assert res.outcomes["A"].action == Action.ACCEPT and res.counters["A"].infra_units == 1
    [error] = [row[1].error for row in sink.results if row[1].infra]
    assert error == "_UnsetBody: <its str() raised AttributeError>"


def test_a_result_value_whose_repr_fails_still_fails_the_gate():
    """A ``correct`` whose repr raised made the InvalidResultError's own message raise inside
    the worker's try: the bad result counted as INFRA instead of failing the gate."""
    async def infer(task):
        return UnitResult(correct=_NoRepr() if task.ladder_rank == 2 else task.arm == "cand")

    with pytest.raises(InvalidResultError, match=r"UnitResult\.correct=<_NoRepr whose repr "
                                                 r"raised RuntimeError>"):
        run(run_gate([TypePlan("A", [f"u{i}" for i in range(12)])], infer))


@pytest.mark.parametrize("hit", [UnitResult(correct="False"), UnitResult(correct=0.7),
                                 UnitResult(correct=None), UnitResult(correct=False, tokens=-5)],
                         ids=["text", "float", "none", "tokens"])
def test_a_baseline_store_hit_is_checked_like_an_infer_result(hit):
    """Hostile pass (h25): a BaselineStore's hits went unchecked: ``correct="False"`` or 0.7
    counted by its truth value and turned every win into a tie (FUTILE where the outcomes
    ACCEPT); the same result from infer fails the gate, and replay_prefix refuses it."""
    class Store:
        async def get(self, task):
            return hit

        async def put(self, task, result):
            pass

    async def infer(task):
        return UnitResult(correct=task.arm == "cand")

    with pytest.raises(InvalidResultError, match="base arm"):
        run(run_gate([TypePlan("A", [f"u{i}" for i in range(12)])], infer, baseline=Store()))


def test_a_dispatch_policy_that_starves_an_undecided_type_fails_the_gate():
    """Hostile pass (h25): a policy returning None ("never start this lane's remaining
    units") for a type that had not decided made run_gate return a normal result holding a
    CONTINUE outcome after 3 of 12 units, not aborted, with no call counted unstarted."""
    class SkipB:
        def max_wait(self, n):
            return None

        def priority(self, lane, rank):
            return None if lane.task_type == "B" and rank >= 3 else (1.0,)

    async def infer(task):
        return UnitResult(correct=task.arm == "cand")

    plans = [TypePlan(t, [f"{t}{i}" for i in range(12)]) for t in "AB"]
    with pytest.raises(RuntimeError, match=r"SkipB left type 'B' undecided after 3 of its 12 "
                                           r"ladder units"):
        run(run_gate(plans, infer, dispatch=SkipB()))


def _deaf_past(rank: int, swallowed: list[int]):
    """An infer that answers units before ``rank`` and, past it, ignores its cancellation
    (a retry-on-anything loop) once, giving up at the second."""
    async def infer(task):
        if task.ladder_rank < rank:
            await asyncio.sleep(1)
            return UnitResult(correct=task.arm == "cand")
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed.append((task.ladder_rank, task.arm))
                if swallowed.count((task.ladder_rank, task.arm)) > 1:
                    raise
    return infer


def test_calls_that_ignore_their_cancellation_do_not_hold_the_gate_past_its_grace():
    """Hostile pass (h25): with every type decided, the gate waited for each stopped call
    to confirm it had stopped; an infer that swallowed CancelledError held `await handle`
    for good, though partial() already said ACCEPT."""
    swallowed: list[int] = []
    plans = [TypePlan("A", [f"u{i}" for i in range(40)])]

    async def go():
        t0 = asyncio.get_running_loop().time()
        res = await run_gate(plans, _deaf_past(8, swallowed), concurrency=24,
                             dispatch="round_robin")  # 12 units in flight; ACCEPT at 8
        return res, asyncio.get_running_loop().time() - t0

    res, took = run(go())
    assert res.outcomes["A"].action == Action.ACCEPT and res.aborted is None
    assert 1 + STOP_GRACE_S <= took < 2 + STOP_GRACE_S
    c = res.counters["A"]
    assert c.cancelled_in_flight == len(set(swallowed)) > 0  # stopped, then left behind


def test_cancel_returns_within_the_grace_when_calls_ignore_it():
    swallowed: list[int] = []

    async def go():
        handle = launch([TypePlan("A", [f"u{i}" for i in range(40)])], _deaf_past(0, swallowed),
                        concurrency=4)
        await asyncio.sleep(5)
        handle.cancel()
        return await asyncio.wait_for(handle, STOP_GRACE_S + 1)

    res = run(go())
    assert res.aborted and res.counters["A"].cancelled_in_flight == 4


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
       st.one_of(st.sampled_from([GateParams(), GateParams(e_confirm=4, e_reject=4,
                                                           w_net_min=1)]), gate_params()))
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


def test_correct_none_with_infra_is_an_infra_result():
    """Issue 27 #6: ``UnitResult(correct=None, infra=True)`` says "no answer, the
    infrastructure failed": INFRA for the guard, stored as INFRA, never a failed gate."""
    async def down(task):
        if task.ladder_rank == 1 and task.arm == "cand":
            return UnitResult(correct=None, infra=True, error="503")  # type: ignore[arg-type]
        return UnitResult(correct=True, tokens=1)

    sink = ListSink()
    res = run(run_gate([TypePlan("A", [f"u{i}" for i in range(6)])], down, PATIENT,
                       sink=sink, guard=GuardParams(max_ratio=0.5)))
    assert res.counters["A"].infra_units == 1 and res.outcomes["A"].n_used == 5
    stored = [r for t, r, _ in sink.results if t.ladder_rank == 1 and t.arm == "cand"]
    assert stored == [UnitResult(correct=False, infra=True, error="503")]


def test_correct_none_without_infra_still_fails_the_gate():
    async def bug(task):
        return UnitResult(correct=None, tokens=1)  # type: ignore[arg-type]

    with pytest.raises(TypeError, match=r"UnitResult.correct=None .*unit 'u0'"):
        run(run_gate([TypePlan("A", ["u0"])], bug))


class _Str(str):
    pass


_FLAGS = st.sampled_from([True, False, None, 0, 1, "no"]) | st.booleans().map(np.bool_)
_NUMBERS = st.sampled_from([0, 3, -1, 2**63 - 1, 2**63, True, 0.0, 1.5, -0.5, float("nan"),
                            float("inf"), np.int64(4), np.float64(0.25), np.float32(2.0),
                            None, "7"])
_TEXTS = st.sampled_from([None, "", "x", _Str("y"), b"z", 3])


@settings(max_examples=400, deadline=None)
@given(_FLAGS, _FLAGS, _FLAGS, _NUMBERS, _NUMBERS, _TEXTS, _TEXTS)
def test_the_plain_result_shortcut_agrees_with_the_full_check(correct, infra, cached, tokens,
                                                              latency, prediction, error):
    """Issue 29: a result of plain Python values skips the field-by-field check; it must
    accept exactly what the full check accepts, and change nothing it returns."""
    from vtrm_gate.errors import InvalidResultError
    from vtrm_gate.gate._plan import _plain, _result_fault, checked_result

    res = UnitResult(correct=correct, infra=infra, cached=cached, tokens=tokens,
                     latency_s=latency, prediction=prediction, error=error)
    task = TypePlan("A", ["u0"]).task(0, "base")
    if _plain(res):
        assert _result_fault(res) is None and checked_result(task, res) is res
    elif _result_fault(res) is not None:
        with pytest.raises(InvalidResultError):
            checked_result(task, res)
    else:
        out = checked_result(task, res)
        assert [type(v) for v in (out.correct, out.infra, out.cached, out.tokens)] \
            == [bool, bool, bool, int] and out.latency_s == res.latency_s


@pytest.mark.parametrize("arm", ["base", "cand"])
def test_a_plans_task_is_the_unit_task_its_fields_build(arm):
    """Issue 29: `TypePlan.task` fills a `UnitTask`'s slots directly (no frozen __init__);
    the task equals, hashes and prints like one built field by field, stays frozen, and
    the slots it fills are the dataclass fields in order (a new field cannot be skipped)."""
    import dataclasses

    from vtrm_gate import UnitTask

    names = [f.name for f in dataclasses.fields(UnitTask)]
    assert list(UnitTask.__slots__) == names
    plan = TypePlan("Type A", ["u0", "u1", "u2"], base_skill="b", cand_skill="c",
                    cand_dir="/skills/c", attempt=2)
    task = plan.task(2, arm)
    twin = UnitTask(**{n: getattr(task, n) for n in names})
    assert task == twin and hash(task) == hash(twin) and repr(task) == repr(twin)
    assert (task.unit_id, task.ladder_rank, task.arm, task.attempt) == ("u2", 2, arm, 2)
    assert task.skill == ("b" if arm == "base" else "c")
    assert task.skill_dir == (None if arm == "base" else "/skills/c")
    assert task.run_id == plan.run_id(arm)
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.unit_id = "x"  # type: ignore[misc]


def test_infer_returning_wrong_type_fails_the_gate():
    async def bad(task):
        return {"correct": True}

    with pytest.raises(TypeError, match="infer returned dict, expected UnitResult"):
        run(run_gate([TypePlan("A", ["u"])], bad, guard=GuardParams(min_calls=100)))


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
    with pytest.warns(SubscriberWarning, match="slow fell behind"):
        slow_res = run(run_gate(table.plans(), table, PATIENT, concurrency=4,
                                subscribers=[slow]))
    assert slow_res.wall_time_s == fast_res.wall_time_s == 10.0


def test_broken_subscriber_does_not_break_the_gate():
    table = OutcomeTable({"A": [WIN] * 10})

    def broken(ev):
        raise RuntimeError("plot failed")

    with pytest.warns(SubscriberWarning, match="plot failed"):
        res = run(run_gate(table.plans(), table, subscribers=[broken]))
    assert res.outcomes["A"].action is Action.ACCEPT


def test_cancel_returns_the_partial_result_and_cancels_in_flight_calls():
    table = OutcomeTable({"A": [TIE] * 40}, latency=lambda t, r: 100.0)
    sink = ListSink()
    rec = Recorder()

    async def main():
        handle = launch(table.plans(), table, PATIENT, concurrency=4, sink=sink,
                        subscribers=[rec])
        await asyncio.sleep(150)
        assert handle.partial().aborted is None
        assert handle.partial().counters["A"].completed == 4
        handle.cancel()
        res = await handle
        return handle, res

    handle, res = run(main())
    assert len(sink.results) == 4  # the first wave finished at t=100 and was persisted
    assert isinstance(rec.events[-1], GateAborted)
    assert table.in_flight == 0
    assert res.aborted and "Cancelled" in res.aborted
    assert res.counters["A"].completed == 4 and res.counters["A"].cancelled_in_flight == 4
    assert res.outcomes["A"].n_consumed == 2 and not res.outcomes["A"].decided
    assert handle.result() is res and handle.partial() is res
    assert "\n" not in repr(res) and "aborted" in repr(res)


def test_sync_wrapper_in_script_and_inside_a_running_loop():
    table = OutcomeTable({"A": [WIN] * 10})
    res = run_gate_sync(table.plans(), table)
    assert res.outcomes["A"].action is Action.ACCEPT

    async def cell():  # what a blocking Jupyter cell does: a loop is already running
        return run_gate_sync(table.plans(), table)

    assert asyncio.run(cell()).outcomes["A"].action is Action.ACCEPT


NESTED_IN_A_BUSY_LOOP = """
import asyncio
from vtrm_gate import TypePlan, UnitResult, launch, run_gate_sync
async def infer(task):
    await asyncio.sleep(0.001)
    return UnitResult(correct=task.arm == "cand")
inner = []
def sub(ev):  # a blocking call from inside the loop while other callbacks are ready
    if not inner:
        inner.append(run_gate_sync([TypePlan("B", [f"u{i}" for i in range(20)])], infer))
async def main():
    outer = await launch([TypePlan("A", [f"u{i}" for i in range(20)])], infer,
                         subscribers=[sub])
    print(outer.outcomes["A"].action, inner[0].outcomes["B"].action)
asyncio.run(main())
"""


def test_the_sync_wrapper_inside_a_loop_with_ready_callbacks_leaves_that_loop_running():
    """The first nested run (nest-asyncio applied then) ran the callbacks the loop's current
    pass had counted, and that pass, asyncio's own, popped an empty queue: IndexError, the
    outer run dead (h14). A fresh process: nest-asyncio patches loops once per process."""
    out = subprocess.run([sys.executable, "-c", NESTED_IN_A_BUSY_LOOP], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["ACCEPT", "ACCEPT"], out.stderr


def test_result_counters_add_up():
    seq = [WIN] * 12 + [None] + [TIE] * 27
    table = OutcomeTable({"A": seq, "B": [LOSS, TIE] * 10},
                         latency=lambda t, r: 1.0 + t.ladder_rank % 3)
    res = run(run_gate(table.plans(), table, concurrency=5, past_stop="wait",
                       cancel_after_freeze=False))
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


# ---- edge cases (issue 7, item 12; issue 8, item 5) -----------------------------------

def _alive_tasks():
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


def test_cancelled_error_raised_by_infer_is_infra_not_a_hang():
    """A CancelledError the gate did not cause (a backend's own) used to hold its slot
    for ever; it is an INFRA result for that arm."""
    async def infer(task):
        await asyncio.sleep(1)
        if (task.ladder_rank, task.arm) == (0, "cand"):
            raise asyncio.CancelledError
        return UnitResult(correct=True)

    sink = ListSink()
    res = run(asyncio.wait_for(run_gate([TypePlan("A", ["u0", "u1", "u2"])], infer, PATIENT,
                                        sink=sink, guard=GuardParams(min_calls=100)), 1000))
    assert res.counters["A"].infra_units == 1 and res.outcomes["A"].n_used == 2
    errors = [r.error for _, r, _ in sink.results if r.infra]
    assert errors == ["CancelledError: raised by infer (the gate did not cancel this call)"]


def test_a_second_cancel_during_the_abort_still_cleans_up():
    """Calls take 5 s to unwind after a cancel; a second cancel lands meanwhile."""
    table = OutcomeTable({"A": [TIE] * 40}, latency=lambda t, r: 100.0)

    async def slow_to_unwind(task):
        try:
            return await table(task)
        except asyncio.CancelledError:
            await asyncio.sleep(5)
            raise

    sink = ListSink()
    rec = Recorder()

    async def main():
        handle = launch(table.plans(), slow_to_unwind, PATIENT, concurrency=4, sink=sink,
                        subscribers=[rec])
        reader = asyncio.ensure_future(_collect(handle.events()))
        await asyncio.sleep(150)
        handle.cancel()
        await asyncio.sleep(1)
        handle.cancel()
        await asyncio.sleep(100)  # the abort needs 5 s
        alive = _alive_tasks() - {reader}
        return handle, reader, alive

    handle, reader, alive = run(main())
    assert isinstance(rec.events[-1], GateAborted)
    assert reader.done() and isinstance(reader.result()[-1], GateAborted)
    assert alive == set()  # no pump task, no call left behind
    assert len(sink.results) == 4  # the first wave, persisted
    res = handle.result()
    assert res.aborted and res.counters["A"].cancelled_in_flight == 4


async def _collect(stream):
    return [ev async for ev in stream]


def test_cancel_before_the_task_first_runs_ends_events():
    table = OutcomeTable({"A": [TIE] * 4})
    rec = Recorder()

    async def main():
        handle = launch(table.plans(), table, subscribers=[rec])
        handle.cancel()
        seen = await asyncio.wait_for(_collect(handle.events()), 1000)
        return seen, await handle, handle

    seen, res, handle = run(main())
    assert [type(e) for e in seen] == [GateStarted, GateAborted]
    assert isinstance(rec.events[-1], GateAborted)
    assert res.aborted and table.calls == [] and handle.result() is res


def test_one_plan_where_a_list_belongs_and_a_dict_of_params_are_refused_naming_them():
    """``run_gate(plan, ...)`` said only "'TypePlan' object is not iterable", and
    ``cancel_after_freeze="False"`` ran as True."""
    table = OutcomeTable({"A": [TIE]})
    with pytest.raises(TypeError, match=r"^plans must be a list of TypePlan, got one TypePlan "
                                        r"\('A'\): pass \[plan\]$"):
        run_gate_sync(table.plans()[0], table)
    with pytest.raises(TypeError, match=r"^params must be a GateParams .*, got dict"):
        run_gate_sync(table.plans(), table, {"e_confirm": 5.0})
    with pytest.raises(ValueError, match=r"^cancel_after_freeze must be True or False, got "
                                         r"'False'$"):  # it was taken as True (truthy)
        run_gate_sync(table.plans(), table, cancel_after_freeze="False")
    assert table.calls == []


def test_launch_without_a_running_loop_points_to_run_gate_sync():
    table = OutcomeTable({"A": [TIE]})
    with pytest.raises(RuntimeError, match="run_gate_sync"):
        launch(table.plans(), table)


def test_handle_repr_is_one_line():
    table = OutcomeTable({t: [WIN] * 20 for t in "ABC"}, latency=lambda t, r: 1.0)

    async def main():
        handle = launch(table.plans(), table, concurrency=4)
        await asyncio.sleep(2.5)
        during = repr(handle)
        await handle
        return during, repr(handle)

    during, after = run(main())
    assert during == "<GateHandle running: 0/3 types decided, 4 calls in flight, 2.5 s elapsed>"
    assert after.startswith("<GateHandle finished: 3/3 types decided, 0 calls in flight")


def test_a_cancelled_handles_repr_has_no_call_in_flight_and_its_clock_stopped():
    """After Jupyter's Stop button cancelled ``await handle``, the repr still counted the
    stopped calls "in flight" and its elapsed time kept growing."""
    table = OutcomeTable({t: [WIN] * 20 for t in "ABC"}, latency=lambda t, r: 1.0)

    async def main():
        handle = launch(table.plans(), table, concurrency=4)
        await asyncio.sleep(2.5)
        handle.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await handle
        ended = repr(handle)
        await asyncio.sleep(10)
        return ended, repr(handle), len(table.calls)

    ended, later, calls = run(main())
    assert ended == "<GateHandle aborted: 0/3 types decided, 0 calls in flight, 2.5 s elapsed>"
    assert later == ended and calls == 12


def test_a_running_handles_result_says_how_to_get_one():
    """``handle.result()`` in a cell while the gate ran raised asyncio's bare "Result is not
    set."; it now says to await the handle, or read ``partial()`` meanwhile."""
    table = OutcomeTable({t: [WIN] * 20 for t in "AB"}, latency=lambda t, r: 1.0)

    async def main():
        handle = launch(table.plans(), table, concurrency=4)
        await asyncio.sleep(2.5)
        with pytest.raises(asyncio.InvalidStateError, match=r"the gate is still running: "
                                                             r"await the handle .*partial\(\)"):
            handle.result()
        so_far = handle.partial()
        return so_far, await handle, handle.result()

    so_far, res, again = run(main())
    assert so_far.aborted is None and sum(c.completed for c in so_far.counters.values()) > 0
    assert again is res


def test_slow_subscriber_never_delays_the_return():
    """20 ms per event (the gate itself is over in 0.1 s) used to delay the return by the
    whole backlog; now by at most the close timeout (loop clock)."""
    table = OutcomeTable({"A": [TIE] * 100}, latency=lambda t, r: 0.001)

    async def slow(ev):
        await asyncio.sleep(0.02)

    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.warns(SubscriberWarning, match=r"slow fell behind: \d+ events"):
            res = await run_gate(table.plans(), table, PATIENT, concurrency=4,
                                 subscribers=[slow], subscriber_timeout_s=0.5)
        return res, loop.time() - t0, _alive_tasks()

    res, returned_after, alive = run(main())
    assert res.total("completed") == 200 and res.wall_time_s == pytest.approx(0.05)
    assert returned_after <= res.wall_time_s + 0.5 + 1e-9
    assert alive == set()


def test_hung_subscriber_never_blocks_the_result():
    table = OutcomeTable({"A": [WIN] * 10}, latency=lambda t, r: 1.0)

    async def hung(ev):
        await asyncio.Event().wait()

    with pytest.warns(SubscriberWarning, match="hung fell behind"):
        res = run(asyncio.wait_for(run_gate(table.plans(), table, subscribers=[hung]), 1000))
    assert res.outcomes["A"].action is Action.ACCEPT


def test_subscriber_error_is_reported_once_and_the_gate_keeps_running(recwarn):
    table = OutcomeTable({"A": [WIN] * 10})
    calls = []

    def broken(ev):
        calls.append(ev)
        raise RuntimeError("plot failed")

    res = run(run_gate(table.plans(), table, subscribers=[broken]))
    assert res.outcomes["A"].action is Action.ACCEPT
    ours = [w for w in recwarn if issubclass(w.category, SubscriberWarning)]
    assert len(ours) == 1 and len(calls) > 10  # every event still delivered
    msg = str(ours[0].message)
    assert "broken" in msg and "RuntimeError: plot failed" in msg


def test_a_subscriber_error_whose_text_raises_is_reported_and_the_gate_keeps_running(recwarn):
    """Formatting the warning of such an error raised inside the subscriber's handler: the
    subscriber's delivery task died, and its later events were never delivered."""
    table = OutcomeTable({"A": [WIN] * 10})
    calls = []

    class Unprintable(RuntimeError):
        def __str__(self):
            raise AttributeError("detail")

    def broken(ev):
        calls.append(ev)
        raise Unprintable()

    res = run(run_gate(table.plans(), table, subscribers=[broken]))
    assert res.outcomes["A"].action is Action.ACCEPT
    ours = [w for w in recwarn if issubclass(w.category, SubscriberWarning)]
    assert len(ours) == 1 and len(calls) > 10, (ours, len(calls))
    assert "Unprintable: <its str() raised AttributeError>" in str(ours[0].message)


@pytest.mark.parametrize("error", [TypeError("bad argument"), AttributeError("no attribute x"),
                                   NameError("name 'x' is not defined")])
def test_programming_errors_from_infer_fail_the_gate_at_once(error):
    calls = []

    async def infer(task):
        calls.append(task)
        await asyncio.sleep(1)
        raise error

    sink = ListSink()
    with pytest.raises(type(error)) as ei:
        run(run_gate([TypePlan("A", [f"u{i}" for i in range(30)])], infer, concurrency=4,
                     sink=sink))
    assert len(calls) == 4  # the first wave; nothing more was started
    assert any(entry.name == "infer" for entry in ei.traceback)  # the traceback is kept
    assert "programming error" in "".join(getattr(ei.value, "__notes__", []))


def test_infer_that_is_not_a_coroutine_function_fails_the_gate_at_once():
    def infer(task):  # forgot "async"
        return UnitResult(correct=True)

    with pytest.raises(TypeError, match="infer must be an async function"):
        run(run_gate([TypePlan("A", [f"u{i}" for i in range(30)])], infer))
    with pytest.raises(TypeError, match="infer must be an async function"):
        run(run_gate([TypePlan("A", ["u"])], "not callable"))


def test_other_exceptions_from_infer_stay_infra_and_the_guard_names_them():
    async def infer(task):
        raise ConnectionError(f"backend down at {task.unit_id}")

    with pytest.raises(InfraGuardError, match=r"last errors: .*ConnectionError: backend down "
                                              r"at u\d+"):
        run(run_gate([TypePlan("A", [f"u{i}" for i in range(20)])], infer))


def test_ladders_longer_than_n_max_are_refused_before_anything_runs():
    table = OutcomeTable({"A": [TIE] * 41})
    with pytest.raises(ValueError, match=r"type 'A' has 41 units, more than GateParams\.n_max"):
        run(run_gate(table.plans(), table))

    async def main():
        launch(table.plans(), table)

    with pytest.raises(ValueError, match="n_max"):
        run(main())
    assert table.calls == []


def test_types_that_share_a_slug_are_refused_before_anything_runs():
    table = OutcomeTable({"OCR Problems": [TIE], "OCR problems": [TIE]})
    plans = [TypePlan("OCR Problems", ["u"], target_file="skills/a.md"),
             TypePlan("OCR problems", ["u"], target_file="skills/b.md")]
    sink = ListSink()
    with pytest.raises(ValueError, match=r"'OCR Problems' and 'OCR problems'.*'ocr-problems'"):
        run(run_gate(plans, table, sink=sink))
    assert table.calls == [] and sink.results == []


# ---- tests that kill mutants (issue 7, item 17) ---------------------------------------

def test_guard_denominator_excludes_cache_hits():
    """Base arms all cached, 2 cand calls INFRA of 10: 2/10 trips (2/20 would not)."""
    seq = [TIE] * 8 + [None] * 2
    table = OutcomeTable({"A": seq}, latency=lambda t, r: 1.0 + t.ladder_rank)
    plan = table.plans()[0]
    store = DictBaseline({store_key: UnitResult(correct=True)
                          for store_key in ((plan.task_type, u, plan.task(0, "base").skill_hash)
                                            for u in plan.units)})
    with pytest.raises(InfraGuardError, match="2 INFRA units out of 10 completed calls"):
        run(run_gate([plan], table, PATIENT, baseline=store, guard=GuardParams(max_ratio=0.1)))


def test_guard_counts_infra_units_not_calls():
    """Both arms of 3 units fail: 3 units / 20 calls = 0.15 stays under 0.2 (6 calls would
    be 0.3)."""
    seq = [TIE] * 7 + [None] * 3
    table = OutcomeTable({"A": seq}, infra_arm="both",
                         latency=lambda t, r: 1.0 + 2 * t.ladder_rank + (t.arm == "cand"))
    res = run(run_gate(table.plans(), table, PATIENT, guard=GuardParams(max_ratio=0.2),
                       past_stop="wait", cancel_after_freeze=False))
    c = res.counters["A"]
    assert (c.infra_units, c.infra_calls, c.completed) == (3, 6, 20)


class SlowBaseline(DictBaseline):
    """A BaselineStore whose lookup takes loop time (a remote cache), always a miss."""

    async def get(self, task):
        await asyncio.sleep(0.5)
        return None


def test_no_arm_starts_after_its_type_froze_even_mid_unit():
    """Unit 7 decides right after unit 8's base arm started (its lookup took loop time):
    unit 8's cand arm, next in the emission order, must not start (the dispatch check)."""
    table = OutcomeTable({"A": [WIN] * 12}, latency=lambda t, r: 1.0)
    rec = Recorder()
    res = run(run_gate(table.plans(), table, concurrency=4, baseline=SlowBaseline(),
                       subscribers=[rec], past_stop="wait", cancel_after_freeze=False))
    assert res.outcomes["A"].stop_rank == 7
    decided_at = next(i for i, e in enumerate(rec.events) if isinstance(e, TypeDecided))
    assert not [e for e in rec.events[decided_at:] if isinstance(e, TaskStarted)]
    assert (8, "base") in {(t.ladder_rank, t.arm) for t in table.calls}
    assert (8, "cand") not in {(t.ladder_rank, t.arm) for t in table.calls}


def test_launch_refuses_unknown_options_at_once():
    table = OutcomeTable({"A": [TIE]})

    async def main():
        launch(table.plans(), table, concurency=4)

    with pytest.raises(TypeError, match="concurency"):
        run(main())
    assert table.calls == []


def test_a_task_cancelled_from_outside_before_it_ran_still_ends_events():
    table = OutcomeTable({"A": [TIE] * 4})

    async def main():
        handle = launch(table.plans(), table)
        handle.task.cancel()  # not through the handle
        seen = await asyncio.wait_for(_collect(handle.events()), 1000)
        return seen, await handle

    seen, res = run(main())
    assert [type(e) for e in seen] == [GateAborted]
    assert res.aborted == "cancelled" and table.calls == []


# ---- admission: an adaptive limit consulted before every dispatch ---------------------


class Admitted(OutcomeTable):
    """An outcome table whose ``admission`` limit changes as calls complete (1, 2, 3, then
    back to 1 ...), recording the in-flight count each call started with."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.admission = self
        self.done = 0
        self.started_over = []

    def limit(self):
        return (1, 2, 3, 2)[(self.done // 5) % 4]

    async def __call__(self, task):
        if self.in_flight + 1 > self.limit():
            self.started_over.append((self.in_flight + 1, self.limit()))
        try:
            return await super().__call__(task)
        finally:
            self.done += 1


def test_the_gate_starts_no_call_past_the_admission_limit_and_decides_the_same():
    seqs = {"A": [WIN, TIE, LOSS, WIN] * 6, "B": [WIN] * 20, "C": [TIE, LOSS] * 8}
    table = Admitted(seqs, latency=lambda t, r: 1.0 + (t.ladder_rank * 7 % 5))
    res = run(run_gate(table.plans(), table, PATIENT, concurrency=32))
    assert table.started_over == [] and res.peak_in_flight == 3
    for t, seq in seqs.items():
        ref = replay_prefix(seq, PATIENT)
        assert (res.outcomes[t].action, res.outcomes[t].W, res.outcomes[t].L) == \
            (ref.action, ref.W, ref.L)


def test_an_explicit_admission_wins_and_a_frozen_types_unstarted_work_stays_unstarted():
    class Two:
        def limit(self):
            return 2

    fast = GateParams(e_confirm=4.0, w_net_min=1, n_max=10_000)
    table = OutcomeTable({"A": [WIN] * 30}, latency=lambda t, r: 1.0)
    res = run(run_gate(table.plans(), table, fast, concurrency=32, admission=Two()))
    c = res.counters["A"]
    assert res.peak_in_flight == 2 and res.outcomes["A"].action is Action.ACCEPT
    # 30 units, 60 calls: everything past the stop was never started (no hidden queue)
    assert c.started <= res.outcomes["A"].stop_rank * 2 + 4
    assert c.cancelled_before_start == 60 - c.started


def test_a_handle_keeps_its_newest_events_whole_and_every_trajectory_before_them():
    """history_limit bounds what a handle holds; the older part keeps the start, every
    decision and every type's whole trajectory, equal to a full record but base/cand."""
    table = OutcomeTable({"A": [TIE] * 40, "B": [WIN, TIE] * 20, "C": [LOSS] * 40},
                         latency=lambda t, r: 1.0 + t.ladder_rank % 3)
    full: list = []

    async def main():
        handle = launch(table.plans(), table, concurrency=4, history_limit=20,
                        subscribers=[full.append], past_stop="wait")
        await handle
        return handle

    handle = run(main())
    assert len(full) > 200 and len(handle._recent) == 20
    hist = handle.history
    assert hist[-20:] == full[-20:]
    older = hist[:-20]

    def key(e):
        return (e.task_type, e.ladder_rank, e.W, e.L, e.n_used, e.e_plus, e.e_minus, e.action)

    full_old = [e for e in full[:-20] if isinstance(e, PrefixAdvanced | TypeDecided
                                                     | GateStarted)]
    assert [type(e) for e in older] == [type(e) for e in full_old]
    assert [key(e) for e in older if isinstance(e, PrefixAdvanced)] == \
        [key(e) for e in full_old if isinstance(e, PrefixAdvanced)]
    assert all(e.base is None and e.cand is None for e in older
               if isinstance(e, PrefixAdvanced))
    assert [e for e in older if isinstance(e, TypeDecided)] == \
        [e for e in full_old if isinstance(e, TypeDecided)]


class Declared:
    """A subscriber that declares the event classes it takes, recording what it got."""

    def __init__(self, *kinds):
        self.gate_events = kinds
        self.got: list[type] = []

    def __call__(self, ev):
        self.got.append(type(ev))


def test_a_subscriber_gets_only_the_events_it_declares_and_the_gate_builds_no_others():
    """A listener of decisions only (``gate_events``) costs the gate no per-call event; one
    that declares nothing gets every class, as before."""
    progress: list[bool] = []

    async def infer(task):
        progress.append(report_progress("working", unit=task.unit_id))
        await asyncio.sleep(1.0)
        return UnitResult(correct=True)

    table_plans = OutcomeTable({"A": [TIE] * 4, "B": [TIE] * 3}).plans()
    decisions, every = Declared(TypeDecided, GateFinished), []
    built: list[type] = []
    res = run(run_gate(table_plans, infer, PATIENT, concurrency=4, subscribers=[decisions]))
    assert decisions.got == [TypeDecided, TypeDecided, GateFinished]
    assert progress and not any(progress)  # nobody takes TaskProgress: none is built
    progress.clear()
    run(run_gate(table_plans, infer, PATIENT, concurrency=4,
                 subscribers=[decisions, every.append, lambda ev: built.append(type(ev))]))
    assert all(progress)
    assert {type(ev) for ev in every} == set(built) >= {TaskStarted, TaskFinished,
                                                          TaskProgress, PrefixAdvanced}
    assert decisions.got[3:] == [TypeDecided, TypeDecided, GateFinished]
    assert res.total("completed") == 14


def test_a_subscriber_declaring_what_is_no_event_class_is_refused_before_any_call():
    table = OutcomeTable({"A": [TIE] * 3})
    bad = Declared("TypeDecided")
    with pytest.raises(TypeError, match=r"gate_events must be a tuple of GateEvent classes"):
        run(run_gate(table.plans(), table, PATIENT, concurrency=2, subscribers=[bad]))
    assert table.calls == []


# ---- Python API validation (issue 27 #12) -------------------------------------------

@pytest.mark.parametrize(("field", "value"), [
    ("base_skill", None), ("cand_skill", 3), ("step_run_id", None), ("cand_run_id", 7),
    ("target_file", b"x.md"), ("attempt", -1), ("attempt", True)])
def test_a_plan_field_of_the_wrong_type_is_refused_naming_it(field, value):
    with pytest.raises((TypeError, ValueError), match=rf"TypePlan\.{field}"):
        TypePlan("A", ["u"], **{field: value})


def test_a_string_as_units_is_refused_not_split_into_characters():
    with pytest.raises(TypeError, match=r"TypePlan 'A': units must be a sequence of unit "
                                        r"ids, got a str"):
        TypePlan("A", "u01")


def test_a_type_name_with_a_lone_surrogate_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"TypePlan\.task_type .*not valid Unicode"):
        TypePlan("Count\ud800", ["u"])
    with pytest.raises(ValueError, match=r"TypePlan\.task_type"):
        run(run_gate([TypePlan("A", ["u"]), TypePlan("B\udfff", ["v"])],
                     OutcomeTable({"A": [TIE]})))


@pytest.mark.parametrize("field", ["base_skill", "cand_skill", "step_run_id", "base_run_id",
                                   "cand_run_id", "target_file", "cand_dir"])
def test_a_plan_text_with_a_lone_surrogate_is_refused_naming_the_field(field):
    """A run id with a lone surrogate was taken: every call then failed in the cache's salt
    and the run header (UnicodeEncodeError, counted INFRA until the guard aborted the gate),
    and a skill or a path with one could never be written or sent. Refused before any call."""
    with pytest.raises(ValueError, match=rf"TypePlan\.{field} .*not valid Unicode"):
        TypePlan("A", ["u"], **{field: "x\udc80y"})


@pytest.mark.parametrize("value", [float("nan"), -1, float("inf"), "1", True])
def test_a_bad_subscriber_timeout_is_refused_before_any_call(value):
    table = OutcomeTable({"A": [TIE]})
    with pytest.raises((TypeError, ValueError), match="subscriber_timeout_s"):
        run(run_gate(table.plans(), table, subscriber_timeout_s=value))
    assert table.calls == []


# ---- long-lived workers (issue 29, item 5) --------------------------------------------

def test_calls_run_on_at_most_concurrency_long_lived_tasks():
    """No task per call: 800 calls at 8 slots create at most 8 worker tasks (the gate
    created one task per call before, 800 here)."""
    table = OutcomeTable({t: [TIE] * 100 for t in "ABCD"},
                         latency=lambda t, r: 1.0 + zlib.crc32(t.unit_id.encode()) % 3)
    created = []

    async def main():
        loop = asyncio.get_running_loop()

        def factory(loop, coro, **kw):
            task = asyncio.Task(coro, loop=loop, **kw)
            created.append(task)
            return task

        loop.set_task_factory(factory)
        return await run_gate(table.plans(), table, PATIENT, concurrency=8)

    res = run(main())
    assert sum(c.completed for c in res.counters.values()) == len(table.calls) == 800
    assert res.peak_in_flight == 8
    workers = [t for t in created if t.get_coro().__qualname__ == "_Gate._worker"]
    assert len(workers) == 8
    assert len(created) <= 8 + 3  # the bus's close, the runner's shutdown


def test_a_worker_whose_call_was_stopped_runs_its_next_calls_untouched():
    """Workers outlive their calls: a call stopped after its type froze (cancelled, or
    cancelled but answered all the same) leaves its worker ready for other types' calls,
    which all complete and count; decisions equal the replay."""
    outcomes = {"A": [WIN] * 12, "B": [TIE] * 30}
    table = OutcomeTable(outcomes)
    quick = GateParams(e_confirm=4, e_reject=4, w_net_min=1)
    # B measures its whole ladder (no freeze of its own): its calls must all complete
    plans = [TypePlan(t, [f"{t}-u{i:03d}" for i in range(len(o))],
                      rule=MeasureAll() if t == "B" else None) for t, o in outcomes.items()]
    swallowed = []

    async def infer(task):
        if task.task_type == "A" and task.ladder_rank >= 4:  # past A's stop: 1000 s
            try:
                await asyncio.sleep(1000)
            except asyncio.CancelledError:
                if task.arm == "cand":  # answers all the same: a result, not a stop
                    swallowed.append(task)
                    return table.result(task)
                raise
        await asyncio.sleep(1.0 + task.ladder_rank % 3)
        return table.result(task)

    res = run(run_gate(plans, infer, quick, concurrency=6, past_stop="wait"))
    a, b = res.counters["A"], res.counters["B"]
    assert res.outcomes["A"].same_decision(replay_prefix(outcomes["A"], quick))
    assert res.outcomes["B"].same_decision(replay_prefix(outcomes["B"], quick, MeasureAll()))
    assert a.cancelled_in_flight > 0 and swallowed
    assert a.discarded_after_freeze == len(swallowed)
    assert a.started == a.completed + a.cancelled_in_flight
    assert b.cancelled_in_flight == 0 and b.started == b.completed == 2 * 30
    assert res.wall_time_s < 1000.0
