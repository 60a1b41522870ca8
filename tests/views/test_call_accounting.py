"""`call_accounting`: where each type's 2 x ladder calls went, checked against the gate's own
counters, and refused on events that miss calls (h12: a handle's summarised history gave
479 never-started calls where 58 were)."""

from __future__ import annotations

import pytest

from vtrm_gate import launch
from vtrm_gate.sim import run_virtual, sim_step
from vtrm_gate.views import call_accounting


def _step_events():
    step = sim_step(2, wall_seconds=None)

    async def main():
        every: list = []
        handle = launch(step.plans, step.infer, subscribers=[every.append])
        res = await handle
        return res, every, [ev async for ev in handle.events()]

    return run_virtual(main())


def test_every_call_is_accounted_for_as_the_gate_counted_it():
    res, every, _ = _step_events()
    calls = call_accounting(every)
    assert calls.height == len(res.counters)
    for row in calls.iter_rows(named=True):
        c, o = res.counters[row["task_type"]], res.outcomes[row["task_type"]]
        assert row["started"] == c.started and row["cache_hits"] == c.cache_hits
        assert row["never_started"] == c.cancelled_before_start
        assert row["needed_calls"] + row["past_stop_calls"] == row["started"]
        assert row["started"] + row["cache_hits"] + row["never_started"] == 2 * row["n_ladder"]
        assert row["stop_rank"] == o.stop_rank and row["action"] == str(o.action)
    assert calls["started"].sum() == res.total("started") == 798
    assert calls["never_started"].sum() == 58


def test_events_that_miss_calls_are_refused_naming_the_type():
    _, _, summarised = _step_events()
    with pytest.raises(ValueError, match=r"call_accounting: the events miss calls of type "
                                         r"'[^']+' \(\d+ started .* in the gate's counters\)"):
        call_accounting(summarised)
