"""Prefix vs block replay of the outcomes a recorded step logged (notebook 02, ``replay``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._ids import (
    arm_run_id,
)
from ..errors import (
    WorkspaceError,
)
from ..options import DEFAULT_DECISION_RULE
from ..stats import (
    GateParams,
    SequentialTest,
    TypeOutcome,
    check_block,
    replay_blocks,
    replay_prefix,
)
from ._status import StepStatus
from ._workspace import Workspace

if TYPE_CHECKING:
    import polars as pl

from ._access import for_reading
from ._manifest import read_manifest

# ---- replay of a recorded step ----------------------------------------------------------


def replay_step(workspace: Workspace | str | Path, epoch: int, step: int, *,
                block: int = 8) -> pl.DataFrame:
    """Prefix vs block replay of the outcomes a step recorded, one row per gated type.

    ``prefix`` and ``block`` replay the SPEC's rule (paired betting); ``live_rule`` names
    the rule the step decided with, so a step run with another (``--decision-rule``) shows
    why its live decision may differ. Outcomes come from the step's predictions (discarded
    in-flight results included: they are real measurements). Units the live gate never ran
    are *unknown*: if the block replay would need one, its decision is ``UNKNOWN (needs k
    unrun units)`` with ``block_needs_unrun_units=True`` (k counts the unrun units up to the
    end of the block it would have had to finish), never an invented outcome.
    """
    check_block(block)  # before opening anything: 0 divided by zero deep in the replay
    ws = for_reading(workspace)
    try:
        return _replay(ws, epoch, step, block)
    finally:
        if ws is not workspace:
            ws.close()


def _replay(ws: Workspace, epoch: int, step: int, block: int) -> pl.DataFrame:
    import polars as pl

    manifest = read_manifest(ws, epoch, step)
    if manifest is None:
        raise WorkspaceError(f"{ws.manifest_path(epoch, step).relative_to(ws.root)}: missing; "
                             f"step e{epoch} s{step} has not been run in this workspace")
    try:
        params = GateParams(**manifest["inputs"]["config"]["params"])
    except (KeyError, TypeError, ValueError) as exc:
        raise WorkspaceError(f"{ws.manifest_path(epoch, step).relative_to(ws.root)}: "
                             f"inputs.config.params: {exc}") from None
    srid = manifest["step_run_id"]
    rule = manifest["inputs"]["config"].get("decision_rule", DEFAULT_DECISION_RULE)
    live = {r[0]: r[1:] for r in ws.log.select(
        "step_report", ["task_type", "status", "action", "stop_rank"], epoch=epoch, step=step)}
    rows = []
    for t, c in sorted(manifest["candidates"].items()):
        if c.get("status") != StepStatus.GATED:
            continue
        ladder = manifest["inputs"]["ladders"][t]
        units = ladder_units(ws, srid, t, ladder)
        known = [u.known for u in units]
        pairs = [u.pair for u in units]
        tokens = [u.tokens for u in units]
        status, live_action, live_stop = live.get(t, (None, None, None))
        prefix = _replay_known(pairs, known, params, None)
        blocks = _replay_known(pairs, known, params, block)
        rows.append({
            "task_type": t, "n_ladder": len(ladder), "status": status,
            "live_rule": rule, "live_action": live_action, "live_stop_rank": live_stop,
            **_replay_columns("prefix", prefix, tokens),
            "prefix_matches_live": prefix["action"] == live_action
            and prefix["stop_rank"] == live_stop,
            **_replay_columns("block", blocks, tokens),
            "block_needs_unrun_units": blocks["needs"] > 0,
            "block_unrun_needed": blocks["needs"],
            "agree": None if blocks["needs"] else prefix["action"] == blocks["action"],
        })
    return pl.DataFrame(rows, infer_schema_length=None)


@dataclass(frozen=True)
class LadderUnit:
    """What a recorded step logged for one ladder unit: whether its outcome is known (both
    arms ran, or one failed for INFRA), the pair (None: INFRA or unknown), tokens of both."""

    unit_id: str
    known: bool
    infra: bool
    pair: tuple[bool, bool] | None
    tokens: int


def ladder_units(ws: Workspace, step_run_id: str, task_type: str,
                 ladder: Sequence[str]) -> list[LadderUnit]:
    """Every ladder unit of one gated type of a recorded step, in ladder order."""
    arms = {arm: ws.log.run_results(arm_run_id(step_run_id, task_type, arm))
            for arm in ("base", "cand")}
    out = []
    for u in ladder:
        b, k = arms["base"].get(u), arms["cand"].get(u)
        infra = bool((b and b[1]) or (k and k[1]))
        known = infra or (b is not None and k is not None)
        pair = None if infra or b is None or k is None else (bool(b[0]), bool(k[0]))
        out.append(LadderUnit(u, known, infra, pair, (b[2] if b else 0) + (k[2] if k else 0)))
    return out


def _replay_columns(name: str, r: Mapping[str, Any], tokens: Sequence[int]) -> dict[str, Any]:
    """One replay's columns (decision, stats, units and tokens used), prefixed by ``name``."""
    units = r["units"]
    return _columns(name, r, None if units is None else sum(tokens[:units]))


def _columns(name: str, r: Mapping[str, Any], spent: int | None) -> dict[str, Any]:
    """`_replay_columns` with the tokens its units spent already summed (a batch sums them
    for every gate at once)."""
    return {f"{name}_{k}": r[k] for k in ("action", "stop_rank", "W", "L", "n_used",
                                           "e_plus", "units")} | {f"{name}_tokens": spent}


def _replay_known(pairs: Sequence[tuple[bool, bool] | None], known: Sequence[bool],
                  params: GateParams, block: int | None) -> dict[str, Any]:
    """Replay along the ladder; stop with UNKNOWN where an unrun unit would be needed."""
    n = len(pairs)
    if all(known):
        o = replay_prefix(pairs, params) if block is None else replay_blocks(pairs, params, block)
        return _row(o, 0)
    test = SequentialTest(n, params)
    for rank in range(n):
        if test.decided:
            break
        if not known[rank]:
            end = n if block is None else min(n, (rank // block + 1) * block)
            # The prefix rule needs just this unit; a block must be finished before it decides.
            needs = 1 if block is None else sum(1 for r in range(rank, end) if not known[r])
            unit = "unit" if needs == 1 else "units"
            return {"action": f"UNKNOWN (needs {needs} unrun {unit})", "stop_rank": None,
                    "W": test.state.W, "L": test.state.L, "n_used": test.state.n_used,
                    "e_plus": test.state.e_plus, "units": None, "needs": needs}
        decide = block is None or (rank + 1) % block == 0 or rank == n - 1
        test.consume(rank, pairs[rank], decide=decide)
    return _row(test.outcome(), 0)


def _row(o: TypeOutcome, needs: int) -> dict[str, Any]:
    return {"action": str(o.action), "stop_rank": o.stop_rank, "W": o.W, "L": o.L,
            "n_used": o.n_used, "e_plus": o.e_plus,
            "units": 0 if o.stop_rank is None else o.stop_rank + 1, "needs": needs}


