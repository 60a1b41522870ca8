"""Core benchmarks: scheduler overhead vs a bare Semaphore + gather at 12 to 1,000 types, the
live view's and a launch handle's overhead and memory, and batch replay rate.

Ratios are measured side by side in one process; times are medians over repeats.
Run: ``python -m benchmarks.bench_core`` (or ``make bench``).
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
import tracemalloc
from typing import Any

import numpy as np

from vtrm_gate import GateParams, TypePlan, UnitResult, replay_prefix_batch, run_gate
from vtrm_gate.gate import DEFAULT_DISPATCH

from ._common import machine, median_time, print_table, run_quick

NEVER_STOP = GateParams(e_confirm=1e300, e_reject=1e300, e_provisional=1.0,
                        w_net_min_provisional=0, n_max=10**6)


async def _noop(task: object) -> UnitResult:
    await asyncio.sleep(0)
    return UnitResult(correct=True)


def _plans(n_types: int, units: int) -> list[TypePlan]:
    return [TypePlan(f"T{t:02d}", [f"u{i}" for i in range(units)]) for t in range(n_types)]


def _gate(plans: list[TypePlan], concurrency: int, count_tasks: bool = False,
          dispatch: str = DEFAULT_DISPATCH) -> dict:
    """run_gate over no-op calls; with ``count_tasks`` (untimed) also the peak live tasks."""
    peak_tasks = 0

    def watch(ev: object) -> None:
        nonlocal peak_tasks
        peak_tasks = max(peak_tasks, len(asyncio.all_tasks()))

    subs = [watch] if count_tasks else []
    res = asyncio.run(run_gate(plans, _noop, NEVER_STOP, concurrency, subscribers=subs,
                               dispatch=dispatch))
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


def _interleaved(fns: dict[str, Any], repeats: int) -> dict[str, tuple[float, float]]:
    """Median (wall s, CPU s) of each function, run in turn repeat after repeat, so a load
    change on a shared machine hits every variant alike. CPU time (this process only) is
    the steadier of the two when other jobs share the cores."""
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            w, c = time.perf_counter(), time.process_time()
            fn()
            times[name].append((time.perf_counter() - w, time.process_time() - c))
    return {k: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v))
            for k, v in times.items()}


TYPE_COUNTS = (12, 100, 400, 1000)


def scheduler_overhead(quick: bool = False) -> list[dict]:
    """run_gate vs a bare Semaphore + gather at 12 to 1,000 types, 24,000 no-op calls each
    (fewer units per type as the types grow), 32 slots: the default dispatch
    (expected_need) and round-robin, side by side."""
    calls, conc = (4800 if quick else 24_000), 32
    repeats = 3 if quick else 5
    fns: dict[Any, Any] = {"bare": lambda: _bare(calls, conc)}
    for k in TYPE_COUNTS:
        plans = _plans(k, calls // (2 * k))
        for dispatch in (DEFAULT_DISPATCH, "round_robin"):
            fns[(k, dispatch)] = lambda plans=plans, d=dispatch: _gate(plans, conc, dispatch=d)
    med = _interleaved(fns, repeats)
    rows = []
    for key, (wall, cpu) in med.items():
        k, dispatch = (None, None) if key == "bare" else key
        n = calls if k is None else 2 * k * (calls // (2 * k))
        rows.append({"what": "bare Semaphore+gather" if k is None else
                     f"run_gate, {k} types x {n // (2 * k)} units, {dispatch}",
                     "calls": n, "median_s": wall, "cpu_s": cpu, "calls_per_s": n / wall,
                     "ratio (wall)": wall / med["bare"][0] * calls / n,
                     "ratio (cpu)": cpu / med["bare"][1] * calls / n})
    g = _gate(_plans(12, calls // 24), conc, count_tasks=True)  # untimed: all_tasks() is O(n)
    b = _bare(calls, conc, count_tasks=True)
    rows[0]["peak_live_tasks"], rows[1]["peak_live_tasks"] = b["peak_tasks"], g["peak_tasks"]
    return rows


def listeners_overhead(quick: bool = False) -> list[dict]:
    """The live view (headless) and a `launch` handle on the same gate, 12 types, 32 slots:
    time next to run_gate alone, and memory retained per call at 20,000 and 200,000 calls."""
    units = 200 if quick else 1000
    repeats = 3 if quick else 5
    plans = _plans(12, units)
    med = _interleaved({"run_gate": lambda: _listened(plans, None),
                        "run_gate + a subscriber that does nothing": lambda: _listened(
                            plans, "noop"),
                        "run_gate + LiveGateView": lambda: _listened(plans, "view"),
                        "run_gate + LiveGateView(calls=False)": lambda: _listened(
                            plans, "light"),
                        "launch + await handle": lambda: _listened(plans, "handle")}, repeats)
    rows = [{"what": k, "calls": 24 * units, "median_s": w, "cpu_s": c,
             "ratio (wall)": w / med["run_gate"][0], "ratio (cpu)": c / med["run_gate"][1]}
            for k, (w, c) in med.items()]
    sizes = (834, 2_000) if quick else (834, 8_334)  # ~20,000 and ~200,000 calls
    for what in ("run_gate", "run_gate + LiveGateView", "launch + await handle"):
        kind = {"run_gate": None, "run_gate + LiveGateView": "view",
                "launch + await handle": "handle"}[what]
        for per_type in sizes:
            row = next(r for r in rows if r["what"] == what)
            row[f"B/call kept @{24 * per_type:,}"] = _retained(_plans(12, per_type), kind)
    return rows


def _listened(plans: list[TypePlan], kind: str | None) -> Any:
    from vtrm_gate import launch
    from vtrm_gate.views import LiveGateView

    async def main() -> Any:
        if kind == "handle":
            handle = launch(plans, _noop, NEVER_STOP, 32)
            await handle
            return handle
        # only the variant's own subscriber is built (not every variant's, every time)
        make = {"view": LiveGateView, "light": lambda: LiveGateView(calls=False),
                "noop": lambda: (lambda ev: None)}.get(kind or "")
        subs = [make()] if make is not None else []
        res = await run_gate(plans, _noop, NEVER_STOP, 32, subscribers=subs)
        return res, subs

    return asyncio.run(main())


def _retained(plans: list[TypePlan], kind: str | None) -> float:
    """Bytes per call still allocated once the gate is over, what it returns kept alive
    (after one untimed gate of the same shape: the dispatch policy's memo, a bounded cache
    shared by every gate of the process, is not the gate's retention)."""
    _listened(plans, None)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    kept = _listened(plans, kind)
    gc.collect()
    now = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return (now - base) / (2 * sum(len(p.units) for p in plans))


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
                "concurrency 32, default dispatch, medians of interleaved repeats; ratio per "
                "call)", rows)
    listen = listeners_overhead(quick)
    print_table("Listeners: live view and launch handle next to run_gate alone (12 types, 32 "
                "slots); B/call kept = tracemalloc bytes still allocated after the gate, per "
                "call", listen)
    rep = batch_replay(quick)
    print_table("Vectorised replay (numpy), median of 3", rep)
    return rows + listen + rep


if __name__ == "__main__":
    run_quick(main)
