"""Simulated workspaces: created from a `SimWorld` (`init_simulated`) and driven by it
(`simulated_backend`: infer, evolver, rollout, error cases).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._env import DEFAULT_CONCURRENCY
from ..errors import CasesUnavailable, WorkspaceError, shown
from ..gate import Infer, UnitTask
from ..harness import (
    HELDOUT_FILE,
    CaseSource,
    Evolver,
    Workspace,
    WorkspaceConfig,
    read_heldout,
    split_heldout,
    step_input_state,
)
from ._effects import World
from ._world import SimConfig, SimEvolver, SimWorld, rollout_cases

# ---- simulated workspaces -------------------------------------------------------------


def sim_json(sim_config: SimConfig) -> dict[str, Any]:
    """A SimConfig as plain JSON values (mappings become objects; no ``world`` key for the
    default world, so workspaces from before worlds read the same)."""
    out = {}
    for f in dataclasses.fields(sim_config):
        v = getattr(sim_config, f.name)
        if isinstance(v, World):
            out[f.name] = v.to_dict()
        elif f.name != "world" or v is not None:
            out[f.name] = dict(v) if isinstance(v, Mapping) else v
    return out


def check_world(workspace: Workspace, world: SimWorld) -> None:
    """Refuse a world other than the one a simulated workspace was created from (its
    ``time_scale`` aside: latency only): its truths would be another world's, reported as
    this run's. `simulated_backend(workspace).world` is the workspace's."""
    if workspace.config.kind != "simulated" or workspace.config.sim is None:
        raise WorkspaceError(f"{workspace.root}: ground truth exists only for simulated "
                             f"workspaces (kind {workspace.config.kind!r})")
    if not isinstance(world, SimWorld):
        raise TypeError(f"world must be a SimWorld (simulated_backend(workspace).world), got "
                        f"{type(world).__name__}")
    try:
        mine = _plain(sim_json(SimConfig(**workspace.config.sim)))
    except (TypeError, ValueError) as exc:
        raise WorkspaceError(f"workspace.json: sim: {exc}") from None
    given = _plain(sim_json(world.config))
    for k in sorted((set(mine) | set(given)) - {"time_scale"}):
        if mine.get(k) != given.get(k):
            raise WorkspaceError(
                f"{workspace.root}: the world given is not the world this workspace was "
                f"created from: {k} {shown(given.get(k))}, the workspace's {shown(mine.get(k))}; "
                f"pass simulated_backend(workspace).world")


def _plain(sim: Mapping[str, Any]) -> dict[str, Any]:
    """``sim`` as JSON reads it back (tuples as lists, mapping keys as text)."""
    return dict(json.loads(json.dumps(sim)))


def init_simulated(path: str | Path, sim_config: SimConfig | None = None, *,
                   heldout_fraction: float = 0.0, **config: Any) -> Workspace:
    """A workspace over a `vtrm_gate.sim.SimWorld`: its pools, seed record, v0 skills.

    ``heldout_fraction`` declares a held-out split (``heldout.json``): that seeded share of
    each type's units is left out of ``pool.json`` (never used for ladders, rollouts or
    probes) and serves the epoch-end evaluation. ``config`` sets other `WorkspaceConfig`
    fields (cooldown_steps, seed, probation_rule, ...).
    """
    sim_config = sim_config or SimConfig()
    world = SimWorld(sim_config)
    sim = sim_json(sim_config)
    agent = {"backend": "sim", "model": "sim-agent",
             **{k: v for k, v in sim.items() if k != "time_scale"}}
    cfg = WorkspaceConfig(kind="simulated", agent=agent, sim=sim,
                          **{"seed": sim_config.seed, **config})
    heldout = {t: heldout_split(world, t, heldout_fraction) for t in world.task_types}
    files = {HELDOUT_FILE: json.dumps(heldout, indent=2) + "\n"} if heldout_fraction else {}
    return Workspace.create(
        path, pool={t: [u for u in world.pool(t) if u not in set(heldout[t])]
                    for t in world.task_types},
        skills={t: world.initial_skill(t) for t in world.task_types},
        seed_record={t: {u: v for u, v in world.seed_record(t).items()
                         if u not in set(heldout[t])} for t in world.task_types},
        config=cfg, files=files)


def heldout_split(world: SimWorld, task_type: str, fraction: float) -> list[str]:
    """A seeded ``fraction`` of the type's units (rounded down), in pool order."""
    return split_heldout(world.pool(task_type), world.config.seed, fraction)


@dataclass(frozen=True)
class SimBackend:
    """infer, evolver and case source of a simulated workspace's world."""

    world: SimWorld
    infer: Infer
    evolver: Evolver
    cases: CaseSource
    pools: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def rollout(self, workspace: Workspace, concurrency: int = DEFAULT_CONCURRENCY
                ) -> Callable[[int, int], Any]:
        """``train``'s rollout: each step's rollout batch of every type not cooling down, run
        through ``concurrency`` slots with the simulated latency; returns the error cases."""
        world = self.world

        async def run(epoch: int, step: int) -> dict[str, list[str] | CasesUnavailable]:
            state = step_input_state(workspace, epoch, step)
            slots = asyncio.Semaphore(concurrency)

            async def one(task: UnitTask, res: Any) -> None:
                async with slots:
                    await asyncio.sleep(res.latency_s * world.config.time_scale)

            out: dict[str, list[str] | CasesUnavailable] = {}
            calls = []
            for t in workspace.task_types:
                if state.in_cooldown(t):
                    continue
                batch = world.rollout(t, epoch, step, workspace.skill_text(t, state),
                                      self.pools.get(t))
                try:
                    out[t] = rollout_cases(batch)
                except CasesUnavailable as exc:
                    out[t] = exc
                calls += [one(task, res) for task, res in batch]
            await asyncio.gather(*calls)
            return out

        return run


def _check_heldout(heldout: Mapping[str, Sequence[str]], world: SimWorld) -> None:
    """Every held-out unit is a unit of its type in the simulated world."""
    for t, us in heldout.items():
        units = set(world.pool(t)) if t in world.task_types else set()
        for u in us:
            if u not in units:
                raise WorkspaceError(f"{HELDOUT_FILE}: type {t!r}: {u!r} is not a unit of this "
                                     f"type in the simulated world")


def simulated_backend(workspace: Workspace | str | Path, *,
                      time_scale: float | None = None) -> SimBackend:
    """Rebuild the `SimWorld` a simulated workspace was created from (optionally with
    another ``time_scale``: latency only, outcomes are unchanged). Rollouts draw from the
    workspace's pool (never from its held-out split)."""
    ws = workspace if isinstance(workspace, Workspace) else Workspace.open(workspace)
    try:
        if ws.config.kind != "simulated" or ws.config.sim is None:
            raise WorkspaceError(f"workspace.json: {ws.root} is not a simulated workspace "
                                 f"(kind {ws.config.kind!r})")
        sim = dict(ws.config.sim)
        pools = {t: list(us) for t, us in ws.pool.items()}
        heldout = read_heldout(ws)
    finally:
        if ws is not workspace:
            ws.close()
    if time_scale is not None:
        sim["time_scale"] = time_scale
    try:
        world = SimWorld(SimConfig(**sim))
    except (TypeError, ValueError) as exc:
        raise WorkspaceError(f"workspace.json: sim: {exc}") from None
    _check_heldout(heldout, world)

    def cases(task_type: str, epoch: int, step: int, skill: str) -> list[str]:
        return world.error_cases(task_type, epoch, step, skill, pools.get(task_type))

    return SimBackend(world, world.infer, SimEvolver(world), cases, pools)




