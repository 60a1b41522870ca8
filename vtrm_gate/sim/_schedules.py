"""A step's plans and the schedules compared in the design review (old block-serial, v3
continuous, no early stop), and counterfactual training runs on the same seed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._env import DEFAULT_CONCURRENCY
from .._ids import step_run_id as _step_run_id
from ..errors import shown
from ..gate import GuardParams, TypePlan, UnitResult, UnitTask, build_ladder, ladder_units, run_gate
from ..stats import GateParams, Pair, TypeOutcome, as_params, replay_blocks, replay_prefix
from ._virtual import run_virtual
from ._world import SimEvolver, SimWorld, TrueEffect

# ---- a step's plans and the two schedules (shared by tests, benchmarks, notebooks) -------


def gate_plans(world: SimWorld, epoch: int = 1, step: int = 1, n_max: int = 40,
               step_run_id: str | None = None,
               skills: Mapping[str, str] | None = None) -> list[TypePlan]:
    """One plan per type: ladder (seed record, cases excluded), v0 (or given) skill as base,
    the evolver's proposal as candidate. No Phase A skipping: that is the harness's job."""
    evolver = SimEvolver(world)
    run_id = step_run_id or _step_run_id(epoch, step)
    plans = []
    for t in world.task_types:
        base = (skills or {}).get(t) or world.initial_skill(t)
        cases = world.error_cases(t, epoch, step, base)
        ladder = build_ladder(world.pool(t), world.seed_record(t), exclude=cases,
                              n_max=n_max, seed=world.config.seed)
        plans.append(TypePlan(t, ladder_units(ladder), base,
                              evolver.propose(t, base, (), epoch, step), run_id))
    return plans


def ladder_outcomes(world: SimWorld, plan: TypePlan) -> list[tuple[UnitResult, UnitResult]]:
    """Both arms' results for every ladder unit, as the gate would see them."""
    return [(world.outcome(plan.task(r, "base")), world.outcome(plan.task(r, "cand")))
            for r in range(len(plan.units))]


def _pairs(results: Sequence[tuple[UnitResult, UnitResult]]) -> list[Pair]:
    return [None if b.infra or c.infra else (b.correct, c.correct) for b, c in results]


def _units_run(outcome: TypeOutcome) -> int:
    return 0 if outcome.stop_rank is None else outcome.stop_rank + 1


def block_serial_schedule(world: SimWorld, plans: Sequence[TypePlan],
                          params: GateParams | None = None, block: int = 8) -> dict[str, Any]:
    """The OLD gate on the same outcomes: types one after another, blocks of ``block`` units
    one after another, base arm then candidate arm (a block's arm runs its units
    concurrently), a decision only at block ends (`replay_blocks`).

    The makespan is exact: per block, the slowest base call plus the slowest cand call.
    """
    params = as_params(params)
    per_type: dict[str, dict[str, Any]] = {}
    outcomes: dict[str, TypeOutcome] = {}
    total = busy = 0.0
    calls = tokens = units = 0
    for plan in sorted(plans, key=lambda p: p.task_type):
        res = ladder_outcomes(world, plan)
        out = replay_blocks(_pairs(res), params, block)
        n_run = _units_run(out)
        span = 0.0
        for start in range(0, n_run, block):
            chunk = res[start:min(start + block, n_run)]
            span += max(b.latency_s for b, _ in chunk) + max(c.latency_s for _, c in chunk)
        ran = [r for pair in res[:n_run] for r in pair]
        t_busy = sum(r.latency_s for r in ran)
        t_tokens = sum(r.tokens for r in ran)
        outcomes[plan.task_type] = out
        per_type[plan.task_type] = {"makespan_s": span, "units": n_run, "calls": len(ran),
                                    "tokens": t_tokens, "busy_s": t_busy,
                                    "action": str(out.action)}
        total += span
        busy += t_busy
        calls += len(ran)
        tokens += t_tokens
        units += n_run
    return {"schedule": "block_serial", "block": block, "concurrency": block,
            "makespan_s": total, "busy_s": busy, "calls": calls, "units": units,
            "tokens": tokens,
            "slot_utilisation": busy / (total * block) if total else 0.0,
            "outcomes": outcomes, "per_type": per_type}


def no_early_stop(world: SimWorld, plans: Sequence[TypePlan]) -> dict[str, Any]:
    """Cost of running every ladder unit on both arms (no sequential test at all)."""
    res = [r for p in plans for pair in ladder_outcomes(world, p) for r in pair]
    return {"units": sum(len(p.units) for p in plans), "calls": len(res),
            "tokens": sum(r.tokens for r in res), "busy_s": sum(r.latency_s for r in res)}


def continuous_schedule(world: SimWorld, plans: Sequence[TypePlan],
                        params: GateParams | None = None, concurrency: int = DEFAULT_CONCURRENCY,
                        guard: GuardParams | None = None) -> dict[str, Any]:
    """The continuous gate (`run_gate`) on a virtual clock, with exact makespan, busy slot
    time (discarded work included), and the lower bound: needed inference time / slots.

    "Needed" is every call of the units up to each type's prefix stop (`replay_prefix`).
    """
    params = as_params(params)
    if world.config.time_scale != 1.0:
        raise ValueError("continuous_schedule needs SimConfig.time_scale == 1.0 so that the "
                         "loop clock is simulated seconds")
    started: list[tuple[UnitTask, UnitResult]] = []
    t_start: list[float] = []

    async def infer(task: UnitTask) -> UnitResult:
        started.append((task, world.outcome(task)))
        t_start.append(asyncio.get_running_loop().time())
        return await world.infer(task)

    gate = run_virtual(run_gate(plans, infer, params, concurrency, guard=guard))
    needed_busy = 0.0
    needed_tokens = 0
    prefix_agrees = True
    stop: dict[str, int] = {}
    for plan in plans:
        res = ladder_outcomes(world, plan)
        ref = replay_prefix(_pairs(res), params)
        prefix_agrees &= ref.same_decision(gate.outcomes[plan.task_type])
        stop[plan.task_type] = _units_run(ref)
        ran = [r for pair in res[:stop[plan.task_type]] for r in pair]
        needed_busy += sum(r.latency_s for r in ran)
        needed_tokens += sum(r.tokens for r in ran)
    busy = sum(r.latency_s for _, r in started)
    beyond = [(t, r) for t, r in started if t.ladder_rank >= stop[t.task_type]]
    makespan = gate.wall_time_s
    t0 = min(t_start, default=0.0)
    last = max(t_start, default=t0) - t0  # no work is left to start after this instant
    busy_before = sum(min(r.latency_s, last - (ts - t0))
                      for ts, (_, r) in zip(t_start, started, strict=True))
    return {"schedule": "continuous", "concurrency": concurrency, "makespan_s": makespan,
            "busy_s": busy, "calls": len(started),
            "units": len({(t.task_type, t.unit_id) for t, _ in started}),
            "units_consumed": sum(o.n_consumed for o in gate.outcomes.values()),
            "tokens": gate.tokens, "needed_busy_s": needed_busy,
            "needed_tokens": needed_tokens,
            "lower_bound_s": needed_busy / concurrency,
            "slot_utilisation": busy / (makespan * concurrency) if makespan else 0.0,
            "discarded_after_freeze": gate.total("discarded_after_freeze"),
            "beyond_stop_calls": len(beyond),
            "beyond_stop_busy_s": sum(r.latency_s for _, r in beyond),
            "beyond_stop_tokens": sum(r.tokens for _, r in beyond),
            "last_dispatch_s": last,
            "idle_before_last_dispatch_s": last * concurrency - busy_before,
            "idle_after_last_dispatch_s": (makespan - last) * concurrency - (busy - busy_before),
            "peak_in_flight": gate.peak_in_flight, "matches_replay_prefix": prefix_agrees,
            "outcomes": gate.outcomes, "gate": gate}


# ---- counterfactual training runs on the same seed (the decision-quality baselines) -------


@dataclass(frozen=True)
class PolicyRun:
    """A training run whose gate is replaced by a policy that sees the ground truth."""

    policy: str
    skills: Mapping[str, str]
    """Each type's skill text at the end of the run."""
    decisions: tuple[tuple[int, int, str, bool, TrueEffect], ...]
    """(epoch, step, type, applied, truth) per candidate proposed."""

    def final_accuracy(self, world: SimWorld) -> dict[str, float]:
        return {t: world.true_accuracy(t, s) for t, s in self.skills.items()}


def simulate_policy(world: SimWorld, epochs: int, steps_per_epoch: int, policy: str, *,
                    pools: Mapping[str, Sequence[str]] | None = None, cooldown_steps: int = 2,
                    rejected_max: int = 5) -> PolicyRun:
    """The training loop of the harness (cooldown, no-change skips, rejected buffer, the same
    evolver and rollouts) with the gate replaced: ``accept_all`` applies every candidate;
    ``oracle`` applies exactly the truly better ones and rejects the rest like the gate does.
    """
    if policy not in ("accept_all", "oracle"):
        raise ValueError(f"policy must be 'accept_all' or 'oracle', got {shown(policy)}")
    evolver = SimEvolver(world)
    skills = {t: world.initial_skill(t) for t in world.task_types}
    cooldown: dict[str, int] = {}
    rejected: dict[str, list[str]] = {t: [] for t in world.task_types}
    applied_steps = 0
    decisions = []
    for e in range(1, epochs + 1):
        for s in range(1, steps_per_epoch + 1):
            for t in sorted(world.task_types):
                if cooldown.get(t, 0) > applied_steps:
                    continue
                pool = None if pools is None else pools[t]
                if not world.error_cases(t, e, s, skills[t], pool):
                    continue
                cand = evolver.propose(t, skills[t], rejected[t], e, s)
                if cand.strip() == skills[t].strip():
                    continue
                truth = world.true_effect(t, skills[t], cand)
                apply = policy == "accept_all" or truth.true_class == "better"
                decisions.append((e, s, t, apply, truth))
                if apply:
                    skills[t] = cand
                else:
                    rejected[t] = (rejected[t] + [cand])[-rejected_max:] if rejected_max else []
                    cooldown[t] = applied_steps + 1 + cooldown_steps
            applied_steps += 1
    return PolicyRun(policy, skills, tuple(decisions))


