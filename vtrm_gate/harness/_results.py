"""What a step returns: one `TypeStep` per type and the `StepResult` (with a polars frame)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..gate import (
    GateResult,
)
from ..stats import (
    Action,
)
from ._status import StepStatus

if TYPE_CHECKING:
    import polars as pl



# ---- results ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TypeStep:
    """What happened to one type in a step."""

    task_type: str
    status: StepStatus
    """gated | skipped (no real change) | cooldown | no_cases | rollout_error | evolve_error"""
    base_version: int
    version: int
    """The type's skill version after Phase D."""
    action: Action | None = None
    applied: str | None = None
    cases: tuple[str, ...] = ()
    ladder: tuple[str, ...] = ()
    cand_hash: str | None = None
    note: str | None = None
    gated_against: int | None = None
    """The version the gate compared the candidate with: the last settled one (it differs
    from ``base_version`` while a PROVISIONAL version is on probation)."""


@dataclass(frozen=True)
class StepResult:
    """A finished step: per-type summary, the gate's result, where the manifest is."""

    epoch: int
    step: int
    step_run_id: str
    types: Mapping[str, TypeStep]
    gate: GateResult | None
    manifest_path: Path
    reused_candidates: bool
    rerun_of_applied: bool
    cleared: Mapping[str, int] = field(default_factory=dict)

    @property
    def decisions(self) -> dict[str, Action]:
        """The gate's decision per gated type."""
        return {t: s.action for t, s in self.types.items() if s.action is not None}

    @property
    def versions(self) -> dict[str, int]:
        return {t: s.version for t, s in self.types.items()}

    def frame(self) -> pl.DataFrame:
        """One row per type: status, decision, stats, work counters, versions, what D did."""
        import polars as pl

        rows = []
        for t in sorted(self.types):
            s = self.types[t]
            o = self.gate.outcomes.get(t) if self.gate else None
            c = self.gate.counters.get(t) if self.gate else None
            rows.append({
                "task_type": t, "status": str(s.status),  # a plain string column
                "action": None if s.action is None else str(s.action),
                "W": o.W if o else None, "L": o.L if o else None,
                "n_used": o.n_used if o else None, "e_plus": o.e_plus if o else None,
                "e_minus": o.e_minus if o else None,
                "stop_rank": o.stop_rank if o else None,
                "n_ladder": len(s.ladder),
                "started": c.started if c else None,
                "cache_hits": c.cache_hits if c else None,
                "cancelled_before_start": c.cancelled_before_start if c else None,
                "discarded_after_freeze": c.discarded_after_freeze if c else None,
                "tokens": c.tokens if c else None,
                "base_version": s.base_version, "gated_against": s.gated_against,
                "version": s.version,
                "applied": s.applied, "note": s.note,
            })
        return pl.DataFrame(rows, infer_schema_length=None)



