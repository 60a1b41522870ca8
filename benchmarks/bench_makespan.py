"""Makespan of one 12-type gate step on the virtual clock: old block-serial vs continuous.

Same world, same run ids, so both schedules see identical results per (unit, arm):
(1) the OLD schedule — types one after another, blocks of 8 units one after another, base
arm then candidate arm, decisions only at block ends; (2) the continuous gate
(`run_gate`, 32 slots); (3) the lower bound: inference time actually needed / 32.
Targets (issue 3): continuous within 1.10x of the lower bound, >= 5x faster than the old.

Dispatch policies (issue 10), ``--worlds all``: in four worlds, >= 30 seeds each, every
policy's makespan against the needed-work bound and against a clairvoyant schedule (the same
world dispatched by a policy that knows each type's stop rank in advance), and the calls
started past the stop.

Run: ``python -m benchmarks.bench_makespan [--quick] [--worlds all|12x8,12x32,...]
[--seeds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from vtrm_gate import RunOptions
from vtrm_gate.gate import (
    DispatchPolicy,
    GuardParams,
    Lane,
    Priority,
    TypePlan,
    UnitResult,
    UnitTask,
    run_gate,
)
from vtrm_gate.sim import (
    DEFAULT_POOL_SIZES,
    SimConfig,
    SimWorld,
    block_serial_schedule,
    continuous_schedule,
    gate_plans,
    no_early_stop,
)
from vtrm_gate.stats import Action, GateParams, replay_prefix

CONCURRENCY = 32
BLOCK = 8
LB_TARGET = 1.10
SPEEDUP_TARGET = 5.0
# The simulator's former default INFRA rate (0.3% per call, after retries; now 0.04%), kept so
# these rows stay comparable with every earlier issue's. The SPEC guard
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
    from vtrm_gate.errors import InfraGuardError

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


# ---- dispatch policies vs the clairvoyant schedule (issue 10) -----------------------------


@dataclass(frozen=True)
class World:
    """A benchmark world: how many types, slots, and how heavy the latency tail is."""

    label: str
    n_types: int
    slots: int
    tail_sigma: float = 0.0
    """Extra mean-preserving lognormal spread on every call's latency (0: the simulator's)."""

    def config(self, seed: int) -> SimConfig:
        sizes = list(DEFAULT_POOL_SIZES.items())
        pools = (dict(sizes) if self.n_types == len(sizes) else
                 {f"Type {i:02d}": sizes[i % len(sizes)][1] for i in range(self.n_types)})
        return SimConfig(seed=seed, pool_sizes=pools, no_change_rate=0.0,
                         mean_latency_s=120.0, infra_rate=INFRA_RATE, time_scale=1.0)


WORLDS: dict[str, World] = {
    "12x8": World("12 types, 8 slots", 12, 8),
    "12x32": World("12 types, 32 slots", 12, 32),
    "50x32": World("50 types, heavier tails, 32 slots", 50, 32, 0.6),
    "50x256": World("50 types, heavier tails, 256 slots", 50, 256, 0.6),
}
# The guard is not what is measured here; it never trips (INFRA units are still excluded).
NO_GUARD = GuardParams(min_calls=10**9)
MEDIAN_TARGET, WORST_TARGET = 1.02, 1.10  # issue 17 (issue 10 asked 1.05)


@dataclass(frozen=True)
class Clairvoyant:
    """The reference: knows each type's stop (units needed), starts nothing past it, and
    gives the next slot to the type with the most needed units left (ties round-robin);
    ``longest_first=False``: round-robin over the needed units only."""

    needed: Mapping[str, int]
    longest_first: bool = True

    def max_wait(self, n_lanes: int) -> int | None:
        return None

    def priority(self, lane: Lane, rank: int) -> Priority | None:
        left = self.needed[lane.task_type] - rank
        if left <= 0:
            return None
        return (float(left),) if self.longest_first else ()


POLICIES: dict[str, tuple[str, bool, str]] = {
    # name -> (dispatch, cancel_after_freeze, past_stop)
    "round_robin+wait": ("round_robin", False, "wait"),
    "round_robin": ("round_robin", False, "cancel"),
    "round_robin+cancel": ("round_robin", True, "cancel"),
    "need_aware+wait": ("need_aware", False, "wait"),
    "need_aware": ("need_aware", False, "cancel"),
    "need_aware+cancel": ("need_aware", True, "cancel"),
    "expected_need": ("expected_need", False, "cancel"),
    "expected_need+cancel": ("expected_need", True, "cancel"),
}
_DEFAULTS = RunOptions()
DEFAULT_POLICY = next(name for name, p in POLICIES.items() if p == (
    _DEFAULTS.dispatch, _DEFAULTS.cancel_after_freeze, _DEFAULTS.past_stop))
"""The row of `RunOptions`' defaults (expected_need, cancel_after_freeze on, past_stop
cancel), marked ``(default)``."""


def _tail(sigma: float, task: UnitTask, seed: int) -> float:
    if sigma == 0.0:
        return 1.0
    h = hashlib.sha256(repr((seed, task.unit_id, task.run_id, task.arm, "tail")).encode())
    u = (int.from_bytes(h.digest()[:8], "big") + 0.5) / 2**64
    return math.exp(sigma * NormalDist().inv_cdf(u) - sigma**2 / 2)


def world_calls(world: World, seed: int, params: GateParams
                ) -> tuple[list[TypePlan], dict[tuple[str, int, str], UnitResult], dict[str, int]]:
    """The seed's plans, every ladder call's result (latency included), and each type's
    needed units (its `replay_prefix` stop), shared by every policy run on this seed."""
    sim = SimWorld(world.config(seed))
    plans = gate_plans(sim, epoch=1, step=1, n_max=params.n_max)
    calls: dict[tuple[str, int, str], UnitResult] = {}
    needed: dict[str, int] = {}
    for p in plans:
        pairs = []
        for rank in range(len(p.units)):
            arms = []
            for arm in ("base", "cand"):
                task = p.task(rank, arm)  # type: ignore[arg-type]
                res = sim.outcome(task)
                res = UnitResult(res.correct, res.infra, False, res.prediction,
                                 res.latency_s * _tail(world.tail_sigma, task, seed), res.tokens)
                calls[(p.task_type, rank, arm)] = res
                arms.append(res)
            b, c = arms
            pairs.append(None if b.infra or c.infra else (b.correct, c.correct))
        out = replay_prefix(pairs, params)
        needed[p.task_type] = 0 if out.stop_rank is None else out.stop_rank + 1
    return plans, calls, needed


def schedule(plans: Sequence[TypePlan], calls: Mapping[tuple[str, int, str], UnitResult],
             needed: Mapping[str, int], params: GateParams, slots: int,
             dispatch: str | DispatchPolicy, cancel: bool,
             past_stop: str = "cancel") -> dict[str, Any]:
    """One gate run on the virtual clock: makespan, busy slot time, calls past the stop, the
    longest wait of a type with units left (in units dispatched to others)."""
    busy = [0.0]
    order: list[str] = []
    started: list[UnitTask] = []

    async def infer(task: UnitTask) -> UnitResult:
        res = calls[(task.task_type, task.ladder_rank, task.arm)]
        started.append(task)
        if task.arm == "base":
            order.append(task.task_type)
        loop = asyncio.get_running_loop()
        t = loop.time()
        try:
            await asyncio.sleep(res.latency_s)
        finally:  # a cancelled call holds its slot only until it is cancelled
            busy[0] += loop.time() - t
        return res

    gate = _run_fast_virtual(run_gate(plans, infer, params, slots, guard=NO_GUARD,
                                      dispatch=dispatch, cancel_after_freeze=cancel,
                                      past_stop=past_stop))
    past = sum(t.ladder_rank >= needed[t.task_type] for t in started)
    last: dict[str, int] = {}
    max_wait = 0
    for i, t in enumerate(order):
        max_wait = max(max_wait, i - last.get(t, 0))
        last[t] = i + 1
    return {"makespan_s": gate.wall_time_s, "busy_s": busy[0], "calls": len(started),
            "calls_past_stop": past, "cancelled": gate.total("cancelled_in_flight"),
            "max_wait": max_wait, "outcomes": gate.outcomes}


def _run_fast_virtual(coro: Any) -> Any:
    """`run_virtual` with one no-op loop cycle before each clock jump instead of looptime's
    42: the gate is plain asyncio (no timeouts racing sleeps), so the schedule is the same
    and a 50-type step runs several times faster."""
    import looptime

    with asyncio.Runner(loop_factory=lambda: looptime.new_event_loop(noop_cycles=1)) as r:
        return r.run(coro)


def _pct(xs: Sequence[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, math.ceil(q * len(xs)) - 1)]


def compare_policies(world: World, seeds: Sequence[int], params: GateParams | None = None,
                     policies: Mapping[str, tuple[str, bool, str]] = POLICIES
                     ) -> dict[str, list[dict[str, Any]]]:
    """Per policy (and the clairvoyant reference), one row per seed of ``world``."""
    params = params or GateParams()
    rows: dict[str, list[dict[str, Any]]] = {
        name: [] for name in ("clairvoyant", "clairvoyant_rr", *policies)}
    for seed in seeds:
        plans, calls, needed = world_calls(world, seed, params)
        needed_busy = sum(r.latency_s for (t, rank, _), r in calls.items() if rank < needed[t])
        bound = needed_busy / world.slots
        ref = schedule(plans, calls, needed, params, world.slots, Clairvoyant(needed), False)
        runs = {"clairvoyant": ref, "clairvoyant_rr": schedule(
            plans, calls, needed, params, world.slots, Clairvoyant(needed, False), False)}
        for name, (dispatch, cancel, past_stop) in policies.items():
            runs[name] = schedule(plans, calls, needed, params, world.slots, dispatch, cancel,
                                  past_stop)
        for name, r in runs.items():
            decisions = {t: o.action for t, o in r["outcomes"].items()}
            same = decisions == {t: o.action for t, o in ref["outcomes"].items()}
            rows[name].append({
                "seed": seed, "vs_bound": r["makespan_s"] / bound,
                "vs_clairvoyant": r["makespan_s"] / ref["makespan_s"],
                "vs_clairvoyant_rr": r["makespan_s"] / runs["clairvoyant_rr"]["makespan_s"],
                "calls_past_stop": r["calls_past_stop"], "cancelled": r["cancelled"],
                "wasted_share": (r["busy_s"] - needed_busy) / needed_busy,
                "max_wait": r["max_wait"], "same_decisions": same,
                "makespan_h": r["makespan_s"] / 3600})
    return rows


def summarise(rows: Mapping[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One line per policy: median / p90 / worst of both ratios, calls past the stop."""
    out = []
    for name, rs in rows.items():
        vb = [r["vs_bound"] for r in rs]
        vc = [r["vs_clairvoyant"] for r in rs]
        vr = [r["vs_clairvoyant_rr"] for r in rs]
        out.append({
            "policy": f"{name} (default)" if name == DEFAULT_POLICY else name, "seeds": len(rs),
            "bound med": statistics.median(vb), "bound p90": _pct(vb, 0.9),
            "bound worst": max(vb),
            "clair med": statistics.median(vc), "clair p90": _pct(vc, 0.9),
            "clair worst": max(vc),
            "clair_rr med": statistics.median(vr), "clair_rr worst": max(vr),
            "past stop/step": statistics.mean(r["calls_past_stop"] for r in rs),
            "cancelled/step": statistics.mean(r["cancelled"] for r in rs),
            "wasted busy": statistics.mean(r["wasted_share"] for r in rs),
            "max wait": max(r["max_wait"] for r in rs),
            "same decisions": all(r["same_decisions"] for r in rs),
            "meets 2%/10%": (statistics.median(vc) <= MEDIAN_TARGET
                            and max(vc) <= WORST_TARGET)})
    return out


def policy_main(world_names: Sequence[str], n_seeds: int = 30) -> dict[str, list[dict[str, Any]]]:
    """Print one table per world; return the summaries by world name."""
    print(f"machine: {os.cpu_count()} CPUs, {platform.platform()}, "
          f"Python {platform.python_version()}")
    print(f"{n_seeds} seeds per world; makespan / needed-work bound (inference the decisions "
          f"needed / slots) and / the clairvoyant schedule (knows every stop; most needed "
          f"units left first; clairvoyant_rr: round-robin over the needed units). Targets "
          f"for the default policy vs clairvoyant: median <= {MEDIAN_TARGET}, worst <= "
          f"{WORST_TARGET}.")
    out = {}
    for name in world_names:
        world = WORLDS[name]
        t0 = time.perf_counter()
        summary = summarise(compare_policies(world, range(n_seeds)))
        _print_summary(f"{name}: {world.label} ({time.perf_counter() - t0:.0f} s)", summary)
        out[name] = summary
    print("\n- past stop/step: calls started beyond a type's stop (mean per step); "
          "cancelled/step: of those, cancelled in flight (cancel_after_freeze); wasted busy: "
          "slot time beyond the needed work, as a share of it; max wait: the most units "
          "dispatched to other types between two units of one type that still had units "
          "left (need_aware's bound is max_wait + K - 1 = 3K - 1).")
    return out


def _print_summary(title: str, summary: Sequence[dict[str, Any]]) -> None:
    from benchmarks._common import print_table

    print_table(title, [{k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()}
                        for r in summary])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one seed instead of ten")
    ap.add_argument("--worlds", help=f"compare dispatch policies in these worlds: all or a "
                                     f"comma list of {', '.join(WORLDS)}")
    ap.add_argument("--seeds", type=int, default=30, help="seeds per world (default 30)")
    args = ap.parse_args()
    if args.worlds:
        names = list(WORLDS) if args.worlds == "all" else args.worlds.split(",")
        unknown = [n for n in names if n not in WORLDS]
        if unknown:
            ap.error(f"unknown world(s) {unknown}; choose from all, {', '.join(WORLDS)}")
        policy_main(names, args.seeds)
    else:
        main(args.quick)
    sys.exit(0)
