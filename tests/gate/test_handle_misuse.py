"""A notebook user's slips with a launched gate, its subscribers and its plans (h12): each
failed before its fix. On looptime's virtual clock, so the waits cost no wall time."""

from __future__ import annotations

import asyncio
import warnings

import pytest

from vtrm_gate import GateParams, TypePlan, UnitResult, launch, run_gate
from vtrm_gate.gate import SubscriberWarning
from vtrm_gate.sim import run_virtual as run

UNITS = [f"u{i}" for i in range(40)]


async def _slow_wins(task):
    await asyncio.sleep(5)
    return UnitResult(correct=task.arm == "cand")


def test_a_timed_wait_stops_the_gate_as_for_any_task_and_asyncio_wait_does_not():
    """``await handle`` is awaiting the gate's task: a waiter cancelled (a ``wait_for``
    timeout, Jupyter's Stop: tests/views/test_kernel_interrupt.py) cancels the gate, so a
    stopped cell stops its calls; ``asyncio.wait([handle.task], timeout=...)`` waits
    without (h12 asked for the first to leave the gate running: docs/api.md says which)."""
    async def main():
        timed_out = launch([TypePlan("A", UNITS)], _slow_wins)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(timed_out, timeout=1)
        waited = launch([TypePlan("A", UNITS)], _slow_wins)
        done, _ = await asyncio.wait([waited.task], timeout=1)
        assert not done and not waited.done() and "running" in repr(waited)
        return await timed_out, await waited

    stopped, finished = run(main())
    assert stopped.aborted == "CancelledError" and stopped.outcomes["A"].action == "CONTINUE"
    assert finished.aborted is None and finished.outcomes["A"].action == "ACCEPT"


@pytest.mark.parametrize("how", ["await handle", "wait_for", "gather", "handle.task"])
def test_an_async_subscriber_that_awaits_the_handle_is_cut_off_not_a_hang(how):
    """Its pump, cut off at the end, cancelled the gate it was awaiting, which was waiting on
    that pump: neither ended, and ``cancel()`` freed nothing. Then (h14), waited for through
    wait_for, gather or the task, the cut-off left a finished gate's task cancelled."""
    async def main():
        handle = None

        async def waits_for_the_end(ev):
            if how == "await handle":
                await handle
            elif how == "wait_for":
                await asyncio.wait_for(handle, 10_000)
            elif how == "handle.task":
                await handle.task
            else:
                await asyncio.gather(handle)

        handle = launch([TypePlan("A", UNITS[:20])], _slow_wins, subscribers=[waits_for_the_end])
        await asyncio.wait([handle.task], timeout=3600)  # a liveness guard (virtual clock)
        return handle

    with pytest.warns(SubscriberWarning, match="cancelled 1 s after the gate ended"):
        handle = run(main())
    assert handle.done() and not handle.task.cancelled() and repr(handle).startswith(
        "<GateHandle finished: 1/1 types decided")
    res = handle.task.result()
    assert res.aborted is None and res.outcomes["A"].action == "ACCEPT"


def test_a_subscriber_that_ignores_its_cancellation_cannot_hold_the_gate():
    """The cut-off waited for the cancelled pump without a bound."""
    async def stubborn(ev):
        try:
            await asyncio.sleep(10_000)
        except asyncio.CancelledError:
            await asyncio.sleep(10_000)

    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        res = await run_gate([TypePlan("A", UNITS[:20])], _slow_wins, subscribers=[stubborn])
        return res, loop.time() - t0

    with pytest.warns(SubscriberWarning, match="stubborn fell behind"):
        res, took = run(main())
    assert res.outcomes["A"].action == "ACCEPT" and took < 100


def test_a_subscriber_raising_cancelled_error_is_reported_as_raising():
    """It was reported as having fallen behind and been cut off 1 s after the end."""
    def sub(ev):
        raise asyncio.CancelledError

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = run(run_gate([TypePlan("A", UNITS[:20])], _slow_wins, subscribers=[sub]))
    texts = [str(w.message) for w in seen if w.category is SubscriberWarning]
    assert res.outcomes["A"].action == "ACCEPT"
    assert texts == [f"gate subscriber {sub.__qualname__} raised CancelledError (on "
                     f"GateStarted); the gate keeps running and later errors of this "
                     f"subscriber are not reported again"]


def test_a_partial_result_of_a_running_gate_says_so():
    async def main():
        handle = launch([TypePlan("A", UNITS)], _slow_wins)
        await asyncio.sleep(1)
        snap = handle.partial()
        handle.cancel()
        return snap, await handle

    snap, end = run(main())
    assert snap.running and repr(snap).startswith("<GateResult running, so far: 0/1 types")
    assert not end.running and end.aborted


def test_history_limit_past_sys_maxsize_is_refused_naming_it():
    async def main():
        launch([TypePlan("A", ["u1"])], _slow_wins, history_limit=2**63)

    with pytest.raises(ValueError, match=r"history_limit must be an integer from 1 to \d+ "
                                         r"\(sys\.maxsize\), got 9223372036854775808"):
        run(main())


def test_a_programming_error_inside_a_task_group_fails_the_gate():
    """A TaskGroup in ``infer`` wraps an AttributeError in an ExceptionGroup, which counted
    as INFRA: the gate went on and decided."""
    async def infer(task):
        async def frames():
            if task.unit_id == "u3":
                return None.shape  # type: ignore[attr-defined]  # the bug under test
        async with asyncio.TaskGroup() as tg:
            tg.create_task(frames())
        return UnitResult(correct=task.arm == "cand")

    with pytest.raises(ExceptionGroup) as err:
        run(run_gate([TypePlan("A", UNITS)], infer, GateParams()))
    assert err.group_contains(AttributeError)
    assert "a programming error fails the gate" in "".join(err.value.__notes__)

    async def flaky(task):  # a group of backend errors is still INFRA for that arm
        if task.unit_id == "u3":
            raise ExceptionGroup("frames", [ValueError("no frame")])
        return UnitResult(correct=task.arm == "cand")

    res = run(run_gate([TypePlan("A", UNITS)], flaky, GateParams()))
    assert res.counters["A"].infra_units == 1


@pytest.mark.parametrize("units", [set(UNITS), frozenset(UNITS)])
def test_a_plan_from_a_set_is_refused_its_order_follows_the_hash_seed(units):
    """The same ids made ACCEPT under PYTHONHASHSEED=1 and PROVISIONAL under 2 to 6 (h12)."""
    with pytest.raises(TypeError, match=r"units must be the ladder in order \(a list\), got a "
                                        r"(frozen)?set, whose order changes"):
        TypePlan("Counting", units)


@pytest.mark.parametrize("how", ["timeout", "cancel"])
def test_a_callers_timeout_or_cancel_during_the_subscribers_cut_off_is_not_swallowed(how):
    """A first fix of the cut-off (h14) absorbed every cancel that came while late
    subscribers were cut off: ``asyncio.timeout(8)`` around a gate that finished at 5 s and
    cut a slow subscriber off at 15 s returned its result, no TimeoutError (h18)."""
    async def slow(ev):
        if type(ev).__name__ == "GateFinished":
            await asyncio.sleep(100)

    async def gate():
        return await run_gate([TypePlan("A", UNITS[:20])], _slow_wins, subscribers=[slow],
                              subscriber_timeout_s=10)

    async def main():
        if how == "timeout":
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(8):
                    await gate()
            return
        task = asyncio.ensure_future(gate())
        await asyncio.sleep(8)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with pytest.warns(SubscriberWarning):
        run(main())


def test_a_subscriber_awaiting_the_task_of_its_own_run_gate_keeps_its_result():
    """No handle: ``t = ensure_future(run_gate(..., subscribers=[sub]))`` with ``sub``
    awaiting ``t``. The cut-off's cancel reached the finished gate and ``await t`` raised
    CancelledError (h19); the gate knows that cancel for its own (its message)."""
    async def main():
        task = None

        async def sub(ev):
            await task

        task = asyncio.ensure_future(run_gate([TypePlan("A", UNITS[:20])], _slow_wins,
                                              subscribers=[sub]))
        return await task

    with pytest.warns(SubscriberWarning, match="cancelled 1 s after the gate ended"):
        res = run(main())
    assert res.aborted is None and res.outcomes["A"].action == "ACCEPT"


def test_a_gate_launched_by_a_subscriber_is_no_subscriber_of_the_outer_gate():
    """The mark that shields a subscriber's own waits leaked into a gate the subscriber
    launched: its calls awaiting the outer handle were shielded, so cancelling the inner
    gate no longer reached the outer one, as asyncio's rule has it (h19)."""
    async def main():
        outer, inner = None, []

        async def wait_for_outer(task):
            await outer
            return UnitResult(correct=True)

        def launch_inner(ev):
            if type(ev).__name__ == "GateStarted":
                inner.append(launch([TypePlan("B", UNITS[:4])], wait_for_outer))

        outer = launch([TypePlan("A", UNITS)], _slow_wins, subscribers=[launch_inner])
        await asyncio.sleep(1)
        inner[0].cancel()
        await asyncio.wait([outer.task, inner[0].task], timeout=3600)
        return outer

    outer = run(main())
    assert outer.done() and outer.result().aborted is not None
