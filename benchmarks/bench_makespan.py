"""Makespan of one 12-type gate step on the virtual clock: old block-serial vs continuous.

Same world, same run ids, so both schedules see identical results per (unit, arm):
(1) the OLD schedule — types one after another, blocks of 8 units one after another, base
arm then candidate arm, decisions only at block ends; (2) the continuous gate
(`run_gate`, 32 slots); (3) the lower bound: inference time actually needed / 32.
Targets (issue 3): continuous within 1.10x of the lower bound, >= 5x faster than the old.

Run: ``python -m benchmarks.bench_makespan [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Any

from vtrm_gate.scheduler import GuardParams
from vtrm_gate.sim import (
    SimConfig,
    SimWorld,
    block_serial_schedule,
    continuous_schedule,
    gate_plans,
    no_early_stop,
)
from vtrm_gate.stats import Action, GateParams

CONCURRENCY = 32
BLOCK = 8
LB_TARGET = 1.10
SPEEDUP_TARGET = 5.0
# The simulator's default INFRA rate (0.3% per call, after retries). The SPEC guard
# (>= 10 calls, > 10%) is jumpy at small denominators: at 1% it trips on ~20% of steps, at
# 0.3% on a few percent. The benchmark measures scheduling, so a seed whose step the default
# guard would abort runs with a guard that ignores that noise; such seeds are reported.
INFRA_RATE = 0.003
BENCH_GUARD = GuardParams(min_calls=40)
APPLIED = {Action.ACCEPT, Action.PROVISIONAL}


def run_one(seed: int, params: GateParams) -> dict[str, Any]:
    """One step of a 12-type world with realistic latency (minutes per inference)."""
    world = SimWorld(SimConfig(seed=seed, no_change_rate=0.0, mean_latency_s=120.0,
                               infra_rate=INFRA_RATE, time_scale=1.0))
    plans = gate_plans(world, epoch=1, step=1, n_max=params.n_max)
    default_guard_trips = _trips_default_guard(world, plans, params)
    t0 = time.perf_counter()
    cont = continuous_schedule(world, plans, params, CONCURRENCY,
                               guard=BENCH_GUARD if default_guard_trips else None)
    wall = time.perf_counter() - t0
    old = block_serial_schedule(world, plans, params, BLOCK)
    full = no_early_stop(world, plans)
    same = sum(cont["outcomes"][t].action is old["outcomes"][t].action for t in world.task_types)
    same_applied = sum((cont["outcomes"][t].action in APPLIED)
                       == (old["outcomes"][t].action in APPLIED) for t in world.task_types)
    lb = cont["lower_bound_s"]
    needed = cont["needed_busy_s"]
    return {
        "seed": seed,
        "types": len(plans),
        "ladder_units": full["units"],
        "old_makespan_h": old["makespan_s"] / 3600,
        "continuous_makespan_h": cont["makespan_s"] / 3600,
        "lower_bound_h": lb / 3600,
        "ratio_to_lower_bound": cont["makespan_s"] / lb,
        # the other reading: all inference the gate ran (speculative included) / 32
        "ratio_to_total_bound": cont["makespan_s"] / (cont["busy_s"] / CONCURRENCY),
        "speedup_vs_old": old["makespan_s"] / cont["makespan_s"],
        "old_slot_utilisation": old["slot_utilisation"],
        "continuous_slot_utilisation": cont["slot_utilisation"],
        # decomposition of ratio - 1: speculative calls past the stop, and idle slot time
        "speculative_share": (cont["busy_s"] - needed) / needed,
        "idle_share": (cont["makespan_s"] * CONCURRENCY - cont["busy_s"]) / needed,
        "idle_tail_share": cont["idle_after_last_dispatch_s"] / needed,
        "tail_min": (cont["makespan_s"] - cont["last_dispatch_s"]) / 60,
        "units_continuous": cont["units"],
        "units_consumed": cont["units_consumed"],
        "units_old": old["units"],
        "units_no_stop": full["units"],
        "calls_continuous": cont["calls"],
        "calls_old": old["calls"],
        "calls_no_stop": full["calls"],
        "tokens_continuous": cont["tokens"],
        "tokens_old": old["tokens"],
        "tokens_no_stop": full["tokens"],
        "discarded_after_freeze": cont["discarded_after_freeze"],
        "calls_past_stop": cont["beyond_stop_calls"],
        "tokens_past_stop": cont["beyond_stop_tokens"],
        "decisions_same_action": same,
        "decisions_same_applied": same_applied,
        "matches_replay_prefix": cont["matches_replay_prefix"],
        "peak_in_flight": cont["peak_in_flight"],
        "default_guard_trips": default_guard_trips,
        "wall_s": wall,
        "meets_lower_bound_target": cont["makespan_s"] <= LB_TARGET * lb,
        "meets_speedup_target": old["makespan_s"] >= SPEEDUP_TARGET * cont["makespan_s"],
    }


def _trips_default_guard(world: SimWorld, plans: list, params: GateParams) -> bool:
    from vtrm_gate.scheduler import InfraGuardError

    try:
        continuous_schedule(world, plans, params, CONCURRENCY)
    except InfraGuardError:
        return True
    return False


def main(quick: bool = False) -> list[dict[str, Any]]:
    """Run the benchmark over 1 (quick) or 10 seeds, print a table and notes, return rows."""
    params = GateParams()
    seeds = [0] if quick else list(range(10))
    print(f"machine: {os.cpu_count()} CPUs, {platform.platform()}, "
          f"Python {platform.python_version()}")
    print(f"world: 12 Video-MME types, pools 9..320, n_max {params.n_max}, mean latency 120 s "
          f"at 8 agent steps (lognormal, wrong answers ~2x slower), INFRA {INFRA_RATE:.1%}; "
          f"old = blocks of {BLOCK} (concurrency {BLOCK} per arm), continuous = "
          f"{CONCURRENCY} slots")
    rows = [run_one(s, params) for s in seeds]
    hdr = (f"{'seed':>4} {'old h':>7} {'cont h':>7} {'LB h':>6} {'cont/LB':>7} {'speedup':>7} "
           f"{'c/LBall':>7} {'util old':>8} {'util cont':>9} {'units c/o/all':>15} "
           f"{'Mtok c/o/all':>17} "
           f"{'past stop':>9} {'same':>5} {'wall s':>6}")
    print(hdr)
    for r in rows:
        print(f"{r['seed']:>4} {r['old_makespan_h']:7.2f} {r['continuous_makespan_h']:7.2f} "
              f"{r['lower_bound_h']:6.2f} {r['ratio_to_lower_bound']:7.3f} "
              f"{r['speedup_vs_old']:7.2f} {r['ratio_to_total_bound']:7.3f} "
              f"{r['old_slot_utilisation']:8.1%} "
              f"{r['continuous_slot_utilisation']:9.1%} "
              f"{r['units_continuous']:>4}/{r['units_old']:>4}/{r['units_no_stop']:>4}  "
              f"{r['tokens_continuous'] / 1e6:5.2f}/{r['tokens_old'] / 1e6:5.2f}/"
              f"{r['tokens_no_stop'] / 1e6:5.2f} {r['calls_past_stop']:>9} "
              f"{r['decisions_same_action']:>2}/{r['types']:<2} {r['wall_s']:6.2f}")
    ratio = [r["ratio_to_lower_bound"] for r in rows]
    ratio_all = [r["ratio_to_total_bound"] for r in rows]
    speed = [r["speedup_vs_old"] for r in rows]
    n_lb = sum(r["meets_lower_bound_target"] for r in rows)
    n_sp = sum(r["meets_speedup_target"] for r in rows)
    print(f"\ncontinuous / lower bound (needed inference / {CONCURRENCY}): median "
          f"{statistics.median(ratio):.3f}, worst {max(ratio):.3f}; target <= {LB_TARGET}: "
          f"met in {n_lb}/{len(rows)} seeds")
    n_all = sum(r <= LB_TARGET for r in ratio_all)
    print(f"continuous / lower bound (all inference run, speculative included, / "
          f"{CONCURRENCY}) 'c/LBall': median {statistics.median(ratio_all):.3f}, worst "
          f"{max(ratio_all):.3f}; <= {LB_TARGET} in {n_all}/{len(rows)} seeds")
    print(f"speed-up vs old: median {statistics.median(speed):.2f}x, worst {min(speed):.2f}x; "
          f"target >= {SPEEDUP_TARGET}x: met in {n_sp}/{len(rows)} seeds")
    print(f"live decisions == replay_prefix on the same outcomes: "
          f"{all(r['matches_replay_prefix'] for r in rows)}")
    print("\nnotes:")
    print("- units c/o/all: units the continuous gate started / the old schedule ran / every "
          "ladder unit (no early stop); tokens likewise, in millions.")
    print("- 'same': types whose action is identical under prefix (live) and block (old) "
          "decisions; block decisions come later (block ends), so FUTILE often becomes "
          f"INERTIA; applied-or-not agrees in "
          f"{sum(r['decisions_same_applied'] for r in rows)}/{sum(r['types'] for r in rows)} "
          f"types.")
    print("- part of the speed-up is 32 slots vs 8; the rest is no barrier per block "
          "(old utilisation is the cost of waiting for each block's slowest call) and "
          "earlier stops.")
    print(f"- work past the stop (calls started beyond a type's stop rank, in flight or "
          f"pending at freeze): {sum(r['calls_past_stop'] for r in rows)} calls over all "
          f"seeds; discarded while in flight: "
          f"{sum(r['discarded_after_freeze'] for r in rows)}.")
    worst = max(rows, key=lambda r: r["ratio_to_lower_bound"])
    if n_lb < len(rows):
        print(f"- the {LB_TARGET}x target is missed in {len(rows) - n_lb} seeds (worst seed "
              f"{worst['seed']}: {worst['ratio_to_lower_bound']:.3f} = 1 + "
              f"{worst['speculative_share']:.3f} speculative + {worst['idle_share']:.3f} idle, of "
              f"which {worst['idle_tail_share']:.3f} after the last dispatch). The lower bound "
              f"counts only needed calls with perfect packing. The gate must also start calls "
              f"past each stop (it cannot know the stop in advance), and once nothing is left "
              f"to start, slots idle while the last calls finish: a tail of "
              f"{worst['tail_min']:.0f} simulated minutes, since wrong answers run long "
              f"(lognormal, several minutes). Both are fixed costs per step, so the ratio "
              f"improves with a bigger step and worsens with a smaller one.")
    else:
        print(f"- ratio to lower bound = 1 + speculative work past the stop + idle slots "
              f"(worst seed {worst['seed']}: {worst['speculative_share']:.3f} + "
              f"{worst['idle_share']:.3f}, of which {worst['idle_tail_share']:.3f} idle after "
              f"the last dispatch).")
    print("- makespans scale linearly with mean_latency_s (120 s here); every ratio above "
          "is independent of it.")
    trips = sum(r["default_guard_trips"] for r in rows)
    print(f"- the default INFRA guard (>= 10 calls, > 10%) would have aborted {trips}/"
          f"{len(rows)} of these steps at a {INFRA_RATE:.1%} INFRA rate; those seeds ran "
          f"with min_calls={BENCH_GUARD.min_calls}.")
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one seed instead of ten")
    main(ap.parse_args().quick)
    sys.exit(0)
