"""How each skill version came to stand, rebuilt from the log alone (never from
``state.json``): the check that only settled versions stand at an epoch end.

A version is *settled* when it is the initial skill, was ACCEPTed against a settled version,
or was kept by a probation settlement whose base is the last settled version (SPEC
amendment). `settled_audit` walks every gated step_report row and every settlement row in
the order they were applied (an epoch's settlement after its steps), keeps each type's
current and last settled version, and records a violation whenever a change stands on an
unsettled base or an unsettled version stands at an epoch end; the walk must also end in the
versions ``state.json`` holds. `sim.quality_report` counts every gated candidate once, by
its ``fate`` here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._ids import PROBATION_STEP, content_hash
from ._status import StepStatus
from ._workspace import Workspace

if TYPE_CHECKING:
    import polars as pl

FATES = ("accepted", "kept", "rolled_back", "superseded", "pending", "not_applied")
"""What became of a gated candidate: ACCEPTed; PROVISIONAL then kept or rolled back by a
settlement; replaced by a later candidate of its type before any settlement (superseded);
still on probation (pending); or never applied (REJECT, FUTILE, INERTIA)."""


@dataclass(frozen=True)
class Standing:
    """One type's version at the end of one epoch, and how it came to stand."""

    epoch: int
    task_type: str
    version: int
    settled: bool
    how: str


@dataclass(frozen=True)
class Fate:
    """What became of the candidate one step gated for one type."""

    epoch: int
    step: int
    task_type: str
    action: str
    version: int | None
    fate: str


@dataclass(frozen=True)
class SettledAudit:
    """The walk's result: standing versions per epoch end, every candidate's fate, and the
    violations of "only settled versions stand" (empty when it holds)."""

    standing: tuple[Standing, ...]
    fates: tuple[Fate, ...]
    violations: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.violations

    def frame(self) -> pl.DataFrame:
        import polars as pl

        return pl.DataFrame([s.__dict__ for s in self.standing], infer_schema_length=None)


class _Chain:
    """One type's walk: current version, last settled version, and how it was settled."""

    def __init__(self, task_type: str, versions: dict[str, int]):
        self.t, self.versions = task_type, versions
        self.current = self.settled = 1
        self.how = {1: "initial"}
        self.pending: dict[int, int] = {}  # applied PROVISIONAL version -> index in fates

    def version_of(self, cand_hash: str | None) -> int | None:
        return self.versions.get(cand_hash or "")


def _history_versions(ws: Workspace, task_type: str) -> dict[str, int]:
    """content hash -> version number of every recorded version of a type."""
    out: dict[str, int] = {}
    latest = ws.state.skills[task_type].latest
    for v in range(1, latest + 1):
        p = ws.history_path(task_type, v)
        if p.is_file():
            out.setdefault(content_hash(p.read_text(encoding="utf-8")), v)
    return out


def _rows(ws: Workspace) -> list[tuple[Any, ...]]:
    """Applied gated rows and settlement rows, in the order they were applied."""
    rows = ws.log.select("step_report", ["epoch", "step", "task_type", "status", "action",
                                         "base_version", "cand_hash", "applied"])
    keep = [r for r in rows if (r[3] == "gated" and r[1] >= 1 and r[7] is not None)
            or (r[3] == "probation" and r[1] == PROBATION_STEP)]
    return sorted(keep, key=lambda r: (r[0], r[1] if r[1] >= 1 else 10**9, r[2]))


def settled_audit(workspace: Workspace) -> SettledAudit:
    """Rebuild every type's version history from the log and check that only settled
    versions stand at each epoch end (see the module docstring)."""
    ws = workspace
    chains = {t: _Chain(t, _history_versions(ws, t)) for t in ws.task_types}
    fates: list[Fate] = []
    bad: list[str] = []
    standing: list[Standing] = []
    rows = _rows(ws)
    epochs = sorted({r[0] for r in rows})
    for e in epochs:
        for ep, s, t, status, action, base, cand_hash, _ in (r for r in rows if r[0] == e):
            c = chains[t]
            if status == StepStatus.GATED:
                _gated(c, ep, s, action, base, cand_hash, fates, bad)
            else:
                _settlement(c, ep, action, base, cand_hash, fates, bad)
        for t, c in sorted(chains.items()):
            ok = c.current == c.settled
            standing.append(Standing(e, t, c.current, ok, c.how.get(c.current, "unsettled")
                                     if ok else "unsettled"))
            if not ok:
                bad.append(f"e{e} end: {t} stands at unsettled v{c.current} (last settled "
                           f"v{c.settled})")
    for t, c in chains.items():
        if c.current != ws.state.skills[t].version:
            bad.append(f"{t}: the log leads to v{c.current} but state.json holds "
                       f"v{ws.state.skills[t].version}")
    return SettledAudit(tuple(standing), tuple(fates), tuple(bad))


def _gated(c: _Chain, e: int, s: int, action: str, base: int, cand_hash: str | None,
           fates: list[Fate], bad: list[str]) -> None:
    if action not in ("ACCEPT", "PROVISIONAL"):
        fates.append(Fate(e, s, c.t, action, None, "not_applied"))
        return
    v = c.version_of(cand_hash)
    if v is None:
        bad.append(f"e{e} s{s}: {c.t}'s {action} candidate is not in its history")
        return
    for i in c.pending.values():  # a pending bet replaced before its settlement
        fates[i] = Fate(fates[i].epoch, fates[i].step, c.t, fates[i].action, fates[i].version,
                        "superseded")
    c.pending.clear()
    if action == "ACCEPT" and base != c.settled:
        bad.append(f"e{e} s{s}: {c.t} ACCEPT v{v} was gated against v{base}, not the last "
                   f"settled v{c.settled}")
    c.current = v
    if action == "ACCEPT":
        fates.append(Fate(e, s, c.t, action, v, "accepted"))
        if base == c.settled:
            c.settled, c.how[v] = v, f"ACCEPT e{e} s{s} against settled v{base}"
    else:
        c.pending[v] = len(fates)
        fates.append(Fate(e, s, c.t, action, v, "pending"))


def _settlement(c: _Chain, e: int, action: str, base: int, cand_hash: str | None,
                fates: list[Fate], bad: list[str]) -> None:
    v = c.version_of(cand_hash)
    i = c.pending.pop(v, None) if v is not None else None
    if v != c.current or i is None:
        bad.append(f"e{e} settlement: {c.t} settled v{v}, but v{c.current} was standing "
                   f"(pending bets {sorted(c.pending)})")
    kept = action == "PROBATION_PASSED"
    if i is not None:
        f = fates[i]
        fates[i] = Fate(f.epoch, f.step, c.t, f.action, f.version,
                        "kept" if kept else "rolled_back")
    if kept and base != c.settled:
        bad.append(f"e{e} settlement: {c.t} kept v{v} against v{base}, not the last settled "
                   f"v{c.settled}")
    if kept:
        if base == c.settled and v is not None:
            c.settled, c.how[v] = v, f"kept by the e{e} settlement against settled v{base}"
    else:
        c.current = base
