"""The step of seed N: one function builds it for the demo, the notebooks and the CLI.

`sim_step(seed)` returns exactly the plans `run_step` gates on a fresh
``init_simulated(path, SimConfig(seed=seed))`` workspace at (epoch, step): the same error
cases, the same ladders (ladder seed ``"{seed}:{step_run_id}"``, as the harness keys it),
the same candidates, and the same types skipped (no cases, or a candidate identical to its
base). So a seed means the same step everywhere (`tests/sim/test_simstep.py` checks it).

Clocks: the simulated latencies are seconds of a real agent (a 12-type step is ~1.3 h).
Pass ``wall_seconds`` to scale real time so the whole step takes about that long (a pace a
person can watch), or keep ``time_scale=1.0`` and run under `vtrm_gate.sim.run_virtual`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .._env import DEFAULT_CONCURRENCY
from .._ids import check_ids, step_run_id
from ..errors import ConfigError, is_real, shown
from ..gate import TypePlan, build_ladder, ladder_units
from ..harness import StepStatus
from ..stats import GateParams, as_params
from ._schedules import continuous_schedule
from ._world import SimConfig, SimEvolver, SimWorld

INTERACTIVE_SECONDS = 30.0
"""Default wall time of a watched 12-type step (a person can follow 20-40 s)."""


@dataclass(frozen=True)
class SimStep:
    """A simulated gate step: the world, the plans `run_step` would gate, and the skips."""

    seed: int
    epoch: int
    step: int
    world: SimWorld
    plans: tuple[TypePlan, ...]
    skipped: dict[str, StepStatus]
    """Types not gated, with the reason (as `run_step`'s step_report status)."""
    virtual_makespan_s: float | None = None
    """The step's exact makespan in simulated seconds (set when ``wall_seconds`` was)."""

    @property
    def infer(self) -> Any:
        """The world's ``infer`` (sleeps latency × time_scale on the loop clock)."""
        return self.world.infer

    @property
    def outcome_sets(self) -> dict[str, list[tuple[bool, bool] | None]]:
        """Every ladder unit's (base, cand) correctness, None for INFRA: input of replays."""
        from ._schedules import ladder_outcomes

        return {p.task_type: [None if b.infra or c.infra else (b.correct, c.correct)
                              for b, c in ladder_outcomes(self.world, p)]
                for p in self.plans}

    def __repr__(self) -> str:
        scale = self.world.config.time_scale
        return (f"SimStep(seed={self.seed}, e{self.epoch} s{self.step}: {len(self.plans)} types "
                f"gated, {len(self.skipped)} skipped, time_scale={scale:g})")


def sim_step(seed: int, epoch: int = 1, step: int = 1, *, params: GateParams | None = None,
             wall_seconds: float | None = INTERACTIVE_SECONDS, time_scale: float = 1.0,
             concurrency: int = DEFAULT_CONCURRENCY, **sim: Any) -> SimStep:
    """The gate step ``(epoch, step)`` of the simulated world ``SimConfig(seed, **sim)``.

    ``wall_seconds`` (default 30, a pace a person can watch): pick ``time_scale`` so that
    the step runs in about that many seconds of real time at ``concurrency`` (its exact
    virtual makespan is computed first, ~0.5 s). ``wall_seconds=None``: ``time_scale`` as
    given (1.0: simulated seconds, for `run_virtual`).
    """
    params = as_params(params)
    check_ids(epoch, step)  # run_step's ids: "e1.0_s1" would be another step
    if wall_seconds is not None and not (is_real(wall_seconds) and wall_seconds > 0):
        raise ConfigError(f"wall_seconds must be a finite number of seconds > 0, got "
                          f"{shown(wall_seconds)}")
    if wall_seconds is not None and time_scale != 1.0:
        raise ConfigError(f"time_scale applies only with wall_seconds=None (wall_seconds picks "
                          f"it), got time_scale={shown(time_scale)} and wall_seconds="
                          f"{float(wall_seconds)!r}")
    world = SimWorld(SimConfig(seed=seed, time_scale=1.0, **sim))
    evolver = SimEvolver(world)
    srid = step_run_id(epoch, step)
    plans: list[TypePlan] = []
    skipped: dict[str, StepStatus] = {}
    for t in world.task_types:
        base = world.initial_skill(t)
        cases = list(dict.fromkeys(world.error_cases(t, epoch, step, base)))
        if not cases:
            skipped[t] = StepStatus.NO_CASES
            continue
        cand = evolver.propose(t, base, (), epoch, step)
        if cand.strip() == base.strip():
            skipped[t] = StepStatus.SKIPPED  # no real change: run_step never gates it
            continue
        # keyed as harness.step keys it (_ladder_seed): "{workspace seed}:{step_run_id}"
        ladder = build_ladder(world.pool(t), world.seed_record(t), exclude=cases,
                              n_max=params.n_max, seed=f"{seed}:{srid}")
        plans.append(TypePlan(t, ladder_units(ladder), base, cand, srid))
    makespan = None
    if wall_seconds is not None:
        makespan = continuous_schedule(world, plans, params, concurrency)["makespan_s"]
        time_scale = wall_seconds / makespan if makespan > 0 else 0.0
    if time_scale != 1.0:
        world = SimWorld(replace(world.config, time_scale=time_scale))
    return SimStep(seed, epoch, step, world, tuple(plans), skipped, makespan)
