"""Small types: option A (today: each type alone, PROVISIONAL + probation) against option B
of the design note's section 7 (the small types pooled into one gate type on one shared
skill file), in the simulator, against its ground truth.

The small types are those with fewer than 50 units (Spatial Perception 9, Spatial Reasoning
23, Temporal Perception 45: 77 units, 61 after the 20% held-out split). Both options run
the training loop of the harness for these types only (rollout cases, the simulated
evolver's candidates, cooldown after REJECT/FUTILE, the SPEC's gate on a seed-wrong-first
ladder of n_max 40, epoch-end e_continue probation on fresh units against the last settled
version) with the simulator's own outcomes, so they differ only in what is gated:

- A: one gate per type, its own candidate and ladder (a 9-unit type can never ACCEPT).
- B: one gate for the group: one shared candidate whose edit shifts each member by its own
  true effect (``independent``: each member's effect is the simulator's draw for that type,
  so an edit can help one and harm another) or by one effect for all (``shared``: the best
  case for B), gated on one ladder over the union of the members' units.

Worlds: today's (each type's evolver helpful / neutral / harmful for the whole run) and the
presets ``mostly_harmful`` / ``mostly_neutral`` / ``mostly_helpful`` of `vtrm_gate.sim.World`
(each candidate draws its class from the world's shares; under ``independent`` each member
draws its own, under ``shared`` the group takes the first member's), and every ``--world``.

Reported per world and option: final true accuracy of the small types (mean over types), changes
applied that were truly better / neutral-or-worse for a member, and subgroup harm (a change
applied to the group that made some member truly worse by >= 1 point).

Run: ``python -m benchmarks.bench_small_types [--quick] [--seeds N] [--world FILE|PRESET ...]``.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks._common import machine, parser, print_table
from vtrm_gate._ids import content_hash
from vtrm_gate.errors import VtrmError
from vtrm_gate.gate import UnitTask, build_ladder, ladder_units, shuffle_key
from vtrm_gate.sim import SimConfig, SimWorld, heldout_split
from vtrm_gate.stats import Action, EContinueRule, GateParams, replay_prefix

EPOCHS, STEPS, COOLDOWN, SMALL, PROBE = 3, 5, 2, 50, 40
MARGIN = 0.01


def _uniform(*parts: object) -> float:
    return int(shuffle_key("small-types", "\x1f".join(map(str, parts)))[:13], 16) / 16.0**13


def skill(world: SimWorld, t: str, ability: float, rev: str) -> str:
    """A skill text of type ``t`` with the given simulated ability."""
    base = world.initial_skill(t)
    return base.replace("ability=+0.000 effect=seed rev=v0",
                        f"ability={ability:+.3f} effect=sim rev={rev}")


@dataclass
class Member:
    """One small type: its pool (held-out split removed) and its current / settled ability."""

    t: str
    pool: list[str]
    seed: Mapping[str, bool]
    ability: float = 0.0
    settled: float = 0.0
    pending: tuple[float, set[str]] | None = None
    """On probation: (E+ at its gate, units its gate consumed and its cases)."""


def _outcome(world: SimWorld, m: Member, unit: str, arm: str, ability: float, run_id: str,
             rank: int) -> bool | None:
    text = skill(world, m.t, ability, f"{ability:+.3f}")
    res = world.outcome(UnitTask(m.t, unit, arm, rank, run_id, text, content_hash(text)))
    return None if res.infra else res.correct


def _pairs(world: SimWorld, group: list[Member], ladder: list[tuple[Member, str]],
           base: dict[str, float], cand: dict[str, float], run_id: str):
    return [(None if (b := _outcome(world, m, u, "base", base[m.t], run_id, r)) is None
             or (c := _outcome(world, m, u, "cand", cand[m.t], run_id, r)) is None
             else (b, c)) for r, (m, u) in enumerate(ladder)]


def _ladder(group: list[Member], exclude: set[str], n: int, key: str) -> list[tuple[Member, str]]:
    """The union of the members' seed-wrong-first ladders, interleaved by tier then shuffle."""
    by_unit = {u: m for m in group for u in m.pool}
    pool = [u for m in group for u in m.pool]
    seed = {u: v for m in group for u, v in m.seed.items()}
    return [(by_unit[u], u) for u in ladder_units(build_ladder(pool, seed, exclude=exclude,
                                                               n_max=n, seed=key))]


def _effect_class(world: SimWorld, t: str, e: int, s: int) -> str:
    """Member ``t``'s true effect class for the candidate of step (e, s): the type's class
    fixed for the run, or in a per-candidate world its own draw from the world's shares."""
    return world.effects.get(t) or world.world.classify(
        _uniform(world.config.seed, t, e, s, "effect"), t)


def _effect_shift(world: SimWorld, group: list[Member], e: int, s: int, mode: str
                  ) -> dict[str, float] | None:
    """The candidate's ability shift per member (None: the evolver changed nothing); one
    size from the world's size distribution, each member's own class (``independent``) or
    the first member's for all (``shared``)."""
    lead = group[0].t
    if _uniform(world.config.seed, lead, e, s, "no-change") < world.config.no_change_rate:
        return None
    size = world.world.size(_uniform(world.config.seed, lead, e, s, "size"))
    sign = {"helpful": 1.0, "neutral": 0.0, "harmful": -1.0}
    return {m.t: size * sign[_effect_class(world, m.t if mode != "shared" else lead, e, s)]
            for m in group}


def train_group(world: SimWorld, group: list[Member], mode: str, log: list[dict[str, Any]]
                ) -> None:
    """Train one gate type (a single small type, or the pooled group) for EPOCHS x STEPS."""
    params, cool = GateParams(), 0
    for e in range(1, EPOCHS + 1):
        for s in range(1, STEPS + 1):
            if cool > 0:
                cool -= 1
                continue
            cases = {u for m in group for u in world.error_cases(
                m.t, e, s, skill(world, m.t, m.ability, "cur"), m.pool)}
            shift = _effect_shift(world, group, e, s, mode) if cases else None
            if not shift:
                continue
            base = {m.t: m.settled for m in group}
            cand = {m.t: m.ability + shift[m.t] for m in group}
            ladder = _ladder(group, cases, params.n_max, f"{world.config.seed}:{e}:{s}")
            out = replay_prefix(_pairs(world, group, ladder, base, cand, f"e{e}s{s}"), params)
            used = cases | {u for _, u in ladder[:out.n_consumed]}
            _apply(world, group, out, base, cand, used, log)
            if out.action in (Action.REJECT, Action.FUTILE):
                cool = COOLDOWN
        _settle(world, group, e, log)


def _apply(world: SimWorld, group: list[Member], out: Any, base: dict[str, float],
           cand: dict[str, float], used: set[str], log: list[dict[str, Any]]) -> None:
    if out.action is Action.ACCEPT:
        for m in group:
            m.ability = m.settled = cand[m.t]
            m.pending = None
        log.append(_change(world, group, base, cand, "accepted"))
    elif out.action is Action.PROVISIONAL:
        for m in group:
            m.ability, m.pending = cand[m.t], (out.e_plus, used)


def _settle(world: SimWorld, group: list[Member], e: int, log: list[dict[str, Any]]) -> None:
    if group[0].pending is None:
        return
    e_start, used = group[0].pending
    base = {m.t: m.settled for m in group}
    cand = {m.t: m.ability for m in group}
    fresh = [(m, u) for m in group for u in m.pool if u not in used]
    fresh.sort(key=lambda mu: shuffle_key(f"{world.config.seed}:probe:{e}", mu[1]))
    probe = fresh[:PROBE]
    out = replay_prefix(_pairs(world, group, probe, base, cand, f"e{e}_probe"),
                        GateParams(n_max=max(1, len(probe))), EContinueRule(e_start))
    kept = bool(probe) and out.action is Action.ACCEPT
    for m in group:
        if kept:
            m.settled = m.ability
        else:
            m.ability = m.settled
        m.pending = None
    if kept:
        log.append(_change(world, group, base, cand, "kept"))


def _change(world: SimWorld, group: list[Member], base: dict[str, float],
            cand: dict[str, float], how: str) -> dict[str, Any]:
    gains = {m.t: world.true_accuracy(m.t, skill(world, m.t, cand[m.t], "c"))
             - world.true_accuracy(m.t, skill(world, m.t, base[m.t], "b")) for m in group}
    return {"how": how, "gains": gains}


def run_seed(seed: int, option: str, mode: str = "independent",
             world_spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """One run of ``option`` (A or B, effects ``mode``) on ``seed`` in ``world_spec`` (a
    `World`'s JSON object; None: today's per-type world)."""
    world = SimWorld(SimConfig(seed=seed, world=world_spec))
    members = []
    for t in world.task_types:
        units = world.pool(t)
        if len(units) >= SMALL:
            continue
        held = set(heldout_split(world, t, 0.2))
        members.append(Member(t, [u for u in units if u not in held],
                              {u: v for u, v in world.seed_record(t).items() if u not in held}))
    log: list[dict[str, Any]] = []
    groups = [members] if option == "B" else [[m] for m in members]
    for g in groups:
        train_group(world, g, mode, log)
    acc = {m.t: world.true_accuracy(m.t, skill(world, m.t, m.ability, "end")) for m in members}
    init = {m.t: world.true_accuracy(m.t, world.initial_skill(m.t)) for m in members}
    gains = [g for c in log for g in c["gains"].values()]
    return {"seed": seed, "accuracy": statistics.mean(acc.values()),
            "initial": statistics.mean(init.values()),
            "applied_better": sum(g >= MARGIN for g in gains),
            "applied_neutral": sum(-MARGIN < g < MARGIN for g in gains),
            "applied_worse": sum(g <= -MARGIN for g in gains),
            "subgroup_harm": sum(any(g <= -MARGIN for g in c["gains"].values())
                                 and any(g >= MARGIN for g in c["gains"].values()) for c in log),
            "accepted": sum(c["how"] == "accepted" for c in log),
            "kept": sum(c["how"] == "kept" for c in log)}


def boot(xs: list[float]) -> str:
    a = np.asarray(xs, dtype=float)
    rng = np.random.default_rng(16)
    m = a[rng.integers(0, len(a), (2000, len(a)))].mean(axis=1)
    return f"{a.mean():.3g} [{np.quantile(m, 0.025):.3g}, {np.quantile(m, 0.975):.3g}]"


def compare(n: int, world_spec: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A, B with independent and B with shared effects on seeds 0..n-1 of one world, each
    summarised over seeds (B - A paired by seed)."""
    rows = []
    a = [run_seed(s, "A", world_spec=world_spec) for s in range(n)]
    for option, mode in (("A", "independent"), ("B", "independent"), ("B", "shared")):
        rs = a if option == "A" else [run_seed(s, option, mode, world_spec) for s in range(n)]
        rows.append({"option": option + ("" if option == "A" else f" ({mode} effects)"),
                     "true_accuracy": boot([r["accuracy"] for r in rs]),
                     "minus_A_paired": boot([r["accuracy"] - ra["accuracy"]
                                             for r, ra in zip(rs, a, strict=True)]),
                     "member_changes_better": boot([r["applied_better"] for r in rs]),
                     "neutral": boot([r["applied_neutral"] for r in rs]),
                     "worse": boot([r["applied_worse"] for r in rs]),
                     "subgroup_harm": sum(r["subgroup_harm"] for r in rs),
                     "accepted": sum(r["accepted"] for r in rs),
                     "kept": sum(r["kept"] for r in rs)})
    return rows


def main(quick: bool = False, seeds: int | None = None, worlds: list[str] | None = None
         ) -> None:
    """Today's world and the three preset worlds (and every ``worlds`` entry: a preset name
    or a JSON file), ``seeds`` seeds each (default 40; ``quick``: 4)."""
    from benchmarks.bench_power import PRESET_WORLDS, read_worlds

    world_set = read_worlds(["default", *PRESET_WORLDS, *(worlds or [])])
    n = seeds or (4 if quick else 40)
    print(f"machine: {machine()}")
    print(f"{n} seeds x {EPOCHS} epochs x {STEPS} steps per world, small types (< {SMALL} "
          f"units), n_max 40, e_continue probation ({PROBE} fresh units); mean [95% "
          f"bootstrap interval over seeds]")
    t0 = time.perf_counter()
    for name, spec in world_set.items():
        print_table(f"{name}: small types, option A (today) vs option B (one pooled gate)",
                    compare(n, spec))
    print(f"wall time of this benchmark: {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    ap = parser()
    ap.add_argument("--seeds", type=int, default=None, help="seeds per world (default 40)")
    ap.add_argument("--world", action="append", default=None, metavar="FILE|PRESET",
                    help="also run on this world (repeatable; today's and the three "
                         "presets always run)")
    args = ap.parse_args()
    try:
        main(quick=args.quick, seeds=args.seeds, worlds=args.world)
    except VtrmError as e:
        print(f"bench_small_types: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(0)
