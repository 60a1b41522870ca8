"""The epoch-end evaluation: every type's current and initial skill on the held-out split
(``heldout.json``, never gated), through the continuous gate: the training curve.

One skill on one unit is one measurement: an identical skill hash is measured once and reused
for both columns and for every later epoch (`_OneMeasurement`), so an unchanged skill shows no
gain and no noise of its own. The gain is the paired difference current - initial over the
units both answered, with Newcombe's interval (`vtrm_gate.stats.paired_difference`); overall,
pooled over units, with the mean over types (MOVER) beside it (`evaluation_summary`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._ids import EVAL_STEP, content_hash, eval_run_id
from ..errors import ConfigError, WorkspaceError, is_real, shown
from ..gate import (
    GateResult,
    Infer,
    Subscriber,
    TypePlan,
    UnitResult,
    UnitTask,
    shuffle_key,
)
from ..options import RunOptions
from ..stats import MeasureAll, PairedDiff, mover_mean, paired_difference, same_skill
from ._access import writer
from ._baseline import BaselineCache
from ._files import read_json
from ._gating import run_workspace_gate
from ._step import DEFAULT_OPTIONS
from ._workspace import Workspace

if TYPE_CHECKING:
    import polars as pl

HELDOUT_FILE = "heldout.json"


# ---- held-out split ---------------------------------------------------------------------


def split_heldout(units: Sequence[str], seed: int, fraction: float) -> list[str]:
    """A seeded ``fraction`` of ``units`` (rounded down), in their order: a type's held-out
    split (the same for a simulated and an llm workspace of one seed)."""
    if not (is_real(fraction) and 0 <= fraction < 1):
        raise ConfigError(f"heldout_fraction must be in [0, 1), got {shown(fraction)}")
    k = int(fraction * len(units))
    chosen = set(sorted(units, key=lambda u: shuffle_key(f"{seed}:heldout", u))[:k])
    return [u for u in units if u in chosen]


def read_heldout(ws: Workspace) -> dict[str, list[str]]:
    """The workspace's held-out split ``{type: [unit ids]}`` (empty if none was declared).

    Validated: known types; distinct unit ids, none in any pool (held-out units are never
    used for ladders, rollouts or probes) nor held out for two types; in an ``llm``
    workspace, units of ``units.jsonl`` of that type (a simulated world checks its own:
    `vtrm_gate.sim.simulated_backend`).
    """
    path = ws.root / HELDOUT_FILE
    if not path.is_file():
        return {}
    raw = read_json(path, ws.root)
    if not isinstance(raw, dict):
        raise WorkspaceError(f"{HELDOUT_FILE}: must be an object {{type: [unit ids]}}")
    out: dict[str, list[str]] = {}
    owner: dict[str, str] = {u: t for t, us in ws.pool.items() for u in us}
    for t, us in raw.items():
        if t not in ws.pool:
            raise WorkspaceError(f"{HELDOUT_FILE}: type {t!r} is not in pool.json")
        if not isinstance(us, list) or not all(isinstance(u, str) and u for u in us) \
                or len(set(us)) != len(us):
            raise WorkspaceError(f"{HELDOUT_FILE}: {t!r} must be a list of distinct unit ids")
        for u in us:
            why = _heldout_fault(ws, t, u, owner.get(u))
            if why:
                raise WorkspaceError(f"{HELDOUT_FILE}: type {t!r}: {u!r} {why}")
            owner[u] = t
        out[t] = list(us)
    return out


def _heldout_fault(ws: Workspace, task_type: str, unit: str, owner: str | None) -> str | None:
    """Why ``unit`` cannot be held out for ``task_type`` (None: it can)."""
    if owner == task_type:
        return "is also in pool.json; held-out units must never be gated"
    if owner is not None:
        return f"is not a unit of this type (it belongs to {owner!r})"
    if ws.units:
        rec = ws.units.get(unit)
        if rec is None:
            return "is not a unit of units.jsonl"
        if rec.task_type != task_type:
            return f"is not a unit of this type (units.jsonl gives it {rec.task_type!r})"
    return None


# ---- evaluation ---------------------------------------------------------------------------


class _OneMeasurement:
    """``infer`` for the evaluation: each (type, unit, skill hash) is measured once.

    Reused (``cached``: no tokens, no time): an earlier epoch's answer, the BaselineCache's
    fresh base-arm answer for that skill, or this epoch's call already under way for it.
    A type whose current skill is its initial skill is always measured as its base-arm task,
    whichever arm asks first, so a resumed evaluation measures exactly what an uninterrupted
    one does.
    """

    def __init__(self, infer: Infer, known: dict[tuple[str, str, str], tuple[Any, ...]],
                 baseline: BaselineCache, plans: Sequence[TypePlan]):
        self.infer, self.known, self.baseline = infer, known, baseline
        self.plans = {p.task_type: p for p in plans}
        self.running: dict[tuple[str, str, str], asyncio.Future[UnitResult]] = {}

    def _canonical(self, task: UnitTask) -> UnitTask:
        plan = self.plans[task.task_type]
        if task.arm == "cand" and content_hash(plan.base_skill) == task.skill_hash:
            return dataclasses.replace(plan.task(task.ladder_rank, "base"),
                                       attempt=task.attempt)
        return task

    async def _reused(self, task: UnitTask) -> UnitResult | None:
        known = self.known.get((task.task_type, task.unit_id, task.skill_hash))
        if known is not None:
            correct, prediction, trace = known
            return UnitResult(correct=bool(correct), cached=True, prediction=prediction,
                              trace=None if trace is None else json.loads(trace))
        return await self.baseline.get(task) if task.arm == "base" else None

    async def __call__(self, task: UnitTask) -> UnitResult:
        canon = self._canonical(task)
        found = await self._reused(canon)
        if found is not None:
            return found
        key = (task.task_type, task.unit_id, task.skill_hash)
        fut = self.running.get(key)
        if fut is not None:
            res = await asyncio.shield(fut)
            return dataclasses.replace(res, cached=True, latency_s=0.0, tokens=0)
        fut = self.running[key] = asyncio.get_running_loop().create_future()
        try:
            res = await self.infer(canon)
        except BaseException:
            fut.cancel()  # a waiting arm fails the same way (the gate records it as INFRA)
            raise
        fut.set_result(res)
        return res


class _EvalSink:
    """Logs every evaluation call (predictions/traces) and keeps each unit's answers."""

    def __init__(self, ws: Workspace, epoch: int):
        self.ws, self.epoch = ws, epoch
        self.answers: dict[str, dict[str, dict[str, bool | None]]] = {}

    async def on_result(self, task: UnitTask, result: UnitResult, counted: bool) -> None:
        self.ws.log.write_result(self.epoch, EVAL_STEP, task, result, discarded=not counted)
        unit = self.answers.setdefault(task.task_type, {}).setdefault(task.unit_id, {})
        unit[task.arm] = None if result.infra else bool(result.correct)

    def row(self, task_type: str, same: bool) -> dict[str, Any]:
        """Per-arm accuracy and the paired difference current - initial of one type."""
        units = self.answers.get(task_type, {}).values()
        arm = {a: [u[a] for u in units if u.get(a) is not None] for a in ("base", "cand")}
        pairs = [(c, b) for u in units
                 if (b := u.get("base")) is not None and (c := u.get("cand")) is not None]
        both = sum(c and b for c, b in pairs)
        wins = sum(c and not b for c, b in pairs)
        losses = sum(b and not c for c, b in pairs)
        diff = (same_skill(len(pairs)) if same else
                paired_difference(both, wins, losses, len(pairs) - both - wins - losses))
        return {"n_initial": len(arm["base"]), "correct_initial": sum(arm["base"]),
                "n_current": len(arm["cand"]), "correct_current": sum(arm["cand"]),
                "n_pairs": len(pairs), "both_correct": both, "wins": wins, "losses": losses,
                "gain": diff.estimate, "gain_lo": diff.lo, "gain_hi": diff.hi,
                "gain_method": diff.method, "same_skill": int(same)}

    async def on_consumed(self, event: Any) -> None:
        return None

    async def on_decided(self, task_type: str, outcome: Any) -> None:
        return None


@dataclass(frozen=True)
class EvalResult:
    """Accuracy of each type's current and initial skill on the held-out split."""

    epoch: int
    rows: tuple[dict[str, Any], ...]
    gate: GateResult | None = None
    already_done: bool = False

    def frame(self) -> pl.DataFrame:
        import polars as pl

        return pl.DataFrame(list(self.rows), infer_schema_length=None)


def evaluation_frame(ws: Workspace) -> pl.DataFrame:
    """Every recorded evaluation row (one per epoch and type): the measured training curve."""
    return ws.log.frame("evaluation").sort("epoch", "task_type")


async def evaluate_epoch(workspace: Workspace | str | Path, epoch: int, *, infer: Infer,
                         options: RunOptions = DEFAULT_OPTIONS,
                         subscribers: Iterable[Subscriber] = ()) -> EvalResult:
    """Measure every type's current skill and its initial skill (v1) on the held-out split,
    through the continuous gate (one slot pool, BaselineCache for the initial skill)."""
    with writer(workspace, f"evaluate e{epoch}") as ws:
        return await _evaluate(ws, epoch, infer, options, subscribers)


def _eval_rows(ws: Workspace, epoch: int) -> tuple[dict[str, Any], ...]:
    df = ws.log.frame("evaluation", epoch=epoch)
    return tuple(df.sort("task_type").to_dicts())


async def _evaluate(ws: Workspace, epoch: int, infer: Infer, options: RunOptions,
                    subscribers: Iterable[Subscriber]) -> EvalResult:
    heldout = read_heldout(ws)
    if ws.log.count("evaluation", epoch=epoch):
        return EvalResult(epoch, _eval_rows(ws, epoch), already_done=True)
    srid = eval_run_id(epoch)
    ws.log.clear_step(epoch, EVAL_STEP, srid)
    state = ws.state
    attempt = ws.log.infra_aborts(epoch, EVAL_STEP)
    plans = [TypePlan(t, heldout[t], ws.version_text(t, 1), ws.skill_text(t, state), srid,
                      target_file=ws.target(t), rule=MeasureAll(), attempt=attempt)
             for t in ws.task_types if heldout.get(t)]
    if not plans:
        return EvalResult(epoch, ())
    # The held-out split is measured whole (MeasureAll never stops early), so n_max, the
    # gate ladder's cap, must not refuse a split longer than a ladder may be.
    longest = max(len(p.units) for p in plans)
    params = options.gate
    if longest > params.n_max:
        params = dataclasses.replace(params, n_max=longest)
    sink = _EvalSink(ws, epoch)
    once = _OneMeasurement(infer, ws.log.eval_measurements(epoch),
                           BaselineCache.for_workspace(ws), plans)
    gate = await run_workspace_gate(ws, epoch, EVAL_STEP, plans, once, options, sink=sink,
                                    subscribers=subscribers, params=params)
    rows = []
    for p in plans:
        t = p.task_type
        r = sink.row(t, same=content_hash(p.base_skill) == content_hash(p.cand_skill))
        ni, ci, nc, cc = r["n_initial"], r["correct_initial"], r["n_current"], \
            r["correct_current"]
        rows.append((epoch, t, state.skills[t].version, state.skills[t].hash, len(p.units),
                     ni, ci, nc, cc, ci / ni if ni else None, cc / nc if nc else None,
                     *(r[k] for k in ("n_pairs", "both_correct", "wins", "losses", "gain",
                                      "gain_lo", "gain_hi", "gain_method", "same_skill"))))
    ws.log.upsert("evaluation", rows)  # one transaction: the evaluation's checkpoint
    return EvalResult(epoch, _eval_rows(ws, epoch), gate)



def _diff_of(row: Mapping[str, Any]) -> PairedDiff:
    return PairedDiff(row["gain"], row["gain_lo"], row["gain_hi"], row["n_pairs"],
                      row["wins"], row["losses"], row["gain_method"])


def _plain_diff(d: PairedDiff) -> dict[str, Any]:
    return {"estimate": d.estimate, "lo": d.lo, "hi": d.hi, "n": d.n, "wins": d.wins,
            "losses": d.losses, "method": d.method, "level": d.level}


def evaluation_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """One epoch's held-out result: accuracy of the current and the initial skills (pooled
    over units) and the gain current - initial, named twice: ``gain_pooled`` over every
    paired unit (Newcombe) and ``gain_mean_over_types`` (the unweighted mean of the per-type
    gains, MOVER), each with its 95% interval. None when nothing was measured."""
    rows = [r for r in rows if r.get("acc_current") is not None]
    if not rows:
        return None
    paired = [r for r in rows if r.get("n_pairs")]
    both = sum(r["both_correct"] for r in paired)
    wins, losses = sum(r["wins"] for r in paired), sum(r["losses"] for r in paired)
    n = sum(r["n_pairs"] for r in paired)
    pooled = paired_difference(both, wins, losses, n - both - wins - losses)
    mean = mover_mean([_diff_of(r) for r in paired])
    return {
        "epoch": rows[0]["epoch"], "types": len(rows), "units": sum(r["n_units"] for r in rows),
        "same_skill_types": sum(bool(r.get("same_skill")) for r in rows),
        "acc_current": sum(r["correct_current"] for r in rows)
        / max(1, sum(r["n_current"] for r in rows)),
        "acc_initial": sum(r["correct_initial"] for r in rows)
        / max(1, sum(r["n_initial"] for r in rows)),
        "gain_pooled": _plain_diff(pooled), "gain_mean_over_types": _plain_diff(mean)}


def gain_text(summary: Mapping[str, Any]) -> str:
    """``gain +8.1 points [+5.2, +11.0] pooled over 612 units (Newcombe), +7.0 [...] mean
    over 12 types (MOVER)``."""
    p, m = summary["gain_pooled"], summary["gain_mean_over_types"]
    pd_, md = PairedDiff(**p), PairedDiff(**m)
    same = summary["same_skill_types"]
    return (f"gain {pd_.points()} pooled over {p['n']} units ({NEWCOMBE_SHORT}), "
            f"{md.points()} mean over {summary['types']} types (95% MOVER); "
            f"{same} type{'' if same == 1 else 's'} unchanged (measured once, gain 0)")


NEWCOMBE_SHORT = "95% Newcombe"
