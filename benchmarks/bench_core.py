"""Core benchmarks: scheduler overhead vs a bare Semaphore + gather, and batch replay rate.

Ratios are measured side by side in one process; times are medians over repeats.
Run: ``python -m benchmarks.bench_core`` (or ``make bench``).
"""

from __future__ import annotations

import asyncio
import sys

import numpy as np

from vtrm_gate import GateParams, TypePlan, UnitResult, replay_prefix_batch, run_gate

from ._common import machine, median_time, print_table

NEVER_STOP = GateParams(e_confirm=1e300, e_reject=1e300, e_provisional=1.0,
                        w_net_min_provisional=0, n_max=10**6)


async def _noop(task: object) -> UnitResult:
    await asyncio.sleep(0)
    return UnitResult(correct=True)


def _plans(n_types: int, units: int) -> list[TypePlan]:
    return [TypePlan(f"T{t:02d}", [f"u{i}" for i in range(units)]) for t in range(n_types)]


def _gate(plans: list[TypePlan], concurrency: int, count_tasks: bool = False) -> dict:
    """run_gate over no-op calls; with ``count_tasks`` (untimed) also the peak live tasks."""
    peak_tasks = 0

    def watch(ev: object) -> None:
        nonlocal peak_tasks
        peak_tasks = max(peak_tasks, len(asyncio.all_tasks()))

    subs = [watch] if count_tasks else []
    res = asyncio.run(run_gate(plans, _noop, NEVER_STOP, concurrency, subscribers=subs))
    return {"calls": res.total("completed"), "peak_in_flight": res.peak_in_flight,
            "peak_tasks": peak_tasks}


def _bare(n_calls: int, concurrency: int, count_tasks: bool = False) -> dict:
    """The reference: N coroutines gathered at once under one asyncio.Semaphore."""
    peak_tasks = 0

    async def main():
        nonlocal peak_tasks
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> UnitResult:
            nonlocal peak_tasks
            async with sem:
                if count_tasks and i % 1000 == 0:
                    peak_tasks = max(peak_tasks, len(asyncio.all_tasks()))
                return await _noop(i)

        return await asyncio.gather(*(one(i) for i in range(n_calls)))

    out = asyncio.run(main())
    return {"calls": len(out), "peak_tasks": peak_tasks}


def scheduler_overhead(quick: bool = False) -> list[dict]:
    n_types, units, conc = 12, (200 if quick else 1000), 32
    calls = 2 * n_types * units
    repeats = 3 if quick else 5
    plans = _plans(n_types, units)
    t_gate, g = median_time(lambda: _gate(plans, conc), repeats)
    t_bare, b = median_time(lambda: _bare(calls, conc), repeats)
    assert g["calls"] == b["calls"] == calls
    g = _gate(plans, conc, count_tasks=True)  # untimed: all_tasks() is O(live tasks)
    b = _bare(calls, conc, count_tasks=True)
    return [
        {"what": "bare Semaphore+gather", "calls": calls, "median_s": t_bare,
         "calls_per_s": calls / t_bare, "peak_live_tasks": b["peak_tasks"], "ratio": 1.0},
        {"what": "run_gate (prefix stats, events)", "calls": calls, "median_s": t_gate,
         "calls_per_s": calls / t_gate, "peak_live_tasks": g["peak_tasks"],
         "ratio": t_gate / t_bare},
    ]


def batch_replay(quick: bool = False) -> list[dict]:
    R, n = (20_000 if quick else 100_000), 40
    rng = np.random.default_rng(0)
    base = rng.random((R, n)) < 0.6
    cand = rng.random((R, n)) < 0.65
    t, out = median_time(lambda: replay_prefix_batch(base, cand, GateParams()), 3)
    return [{"what": "replay_prefix_batch", "sequences": R, "units": n, "median_s": t,
             "sequences_per_s": R / t, "accept_rate": float(np.mean(out.action == 1))}]


def main(quick: bool = False) -> list[dict]:
    print(f"machine: {machine()}")
    rows = scheduler_overhead(quick)
    print_table("Scheduler overhead vs bare asyncio.Semaphore + gather (no-op calls, "
                "concurrency 32, median)", rows)
    rep = batch_replay(quick)
    print_table("Vectorised replay (numpy), median of 3", rep)
    return rows + rep


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
