"""The epoch-end evaluation: every type's current and initial skill on the held-out split
(``heldout.json``, never gated), through the continuous gate: the training curve.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._ids import EVAL_STEP, eval_run_id
from ..errors import WorkspaceError
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
from ..stats import MeasureAll
from ._access import writer
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
    if not (isinstance(fraction, int | float) and 0 <= fraction < 1):
        raise ValueError(f"heldout_fraction must be in [0, 1), got {fraction!r}")
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


class _EvalSink:
    """Logs every evaluation call (predictions/traces) and counts correct answers per arm."""

    def __init__(self, ws: Workspace, epoch: int):
        self.ws, self.epoch = ws, epoch
        self.correct: dict[tuple[str, str], list[int]] = {}

    async def on_result(self, task: UnitTask, result: UnitResult, counted: bool) -> None:
        self.ws.log.write_result(self.epoch, EVAL_STEP, task, result, discarded=not counted)
        if not result.infra:
            n = self.correct.setdefault((task.task_type, task.arm), [0, 0])
            n[0] += 1
            n[1] += int(result.correct)

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
    gate = await run_workspace_gate(ws, epoch, EVAL_STEP, plans, infer, options, sink=sink,
                                    subscribers=subscribers, params=params)
    rows = []
    for p in plans:
        t = p.task_type
        ni, ci = sink.correct.get((t, "base"), [0, 0])
        nc, cc = sink.correct.get((t, "cand"), [0, 0])
        rows.append((epoch, t, state.skills[t].version, state.skills[t].hash, len(p.units),
                     ni, ci, nc, cc, ci / ni if ni else None, cc / nc if nc else None))
    ws.log.upsert("evaluation", rows)  # one transaction: the evaluation's checkpoint
    return EvalResult(epoch, _eval_rows(ws, epoch), gate)



