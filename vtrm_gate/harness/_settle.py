"""The epoch-end probation settlement: every PROVISIONAL version kept or rolled back on a
fresh probe, through the continuous gate."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._ids import PROBATION_STEP, check_ids, content_hash, probation_run_id
from .._sync import run_sync
from ..errors import WorkspaceError
from ..gate import (
    GateResult,
    Infer,
    Subscriber,
    TypePlan,
    build_ladder,
    ladder_units,
    shuffle_key,
)
from ..options import RunOptions
from ..stats import ProbationRule, TypeOutcome, probation_rule
from ._access import writer
from ._apply import push_rejected
from ._gating import abort_reason, partial_of, report_aborted, run_workspace_gate
from ._log import GateSink
from ._manifest import Manifests, plain, probation_manifest, settled_text
from ._order import check_settle_order
from ._state import Probation, Rejected, SkillRef, TrainingState
from ._status import StepStatus
from ._step import DEFAULT_OPTIONS
from ._workspace import Workspace

if TYPE_CHECKING:
    import polars as pl


@dataclass(frozen=True)
class ProbationOutcome:
    """How one probationary version fared on its held-out probe."""

    task_type: str
    version: int
    prev_version: int
    probe_units: tuple[str, ...]
    W: int
    L: int
    n_used: int
    passed: bool
    applied: str
    rule: str = ""
    """The workspace's ``probation_rule`` that decided it."""
    evidence: str = ""
    """That rule's evidence: the E+ path (``e_continue``), E- (``e_harm``), W - L (``w_net``)."""

    @property
    def line(self) -> str:
        """``kept v3 (e_continue: E+ 2.25 from the gate -> 25.6 after 9 probe units, ...)``."""
        what = (f"kept v{self.version}" if self.passed
                else f"rolled back v{self.version} -> v{self.prev_version}")
        return f"{what} ({self.rule}: {self.evidence})"


@dataclass(frozen=True)
class ProbationResult:
    """The epoch-end settlement: one outcome per type that was on probation."""

    epoch: int
    outcomes: Mapping[str, ProbationOutcome]
    already_settled: bool = False
    gate: GateResult | None = None

    def frame(self) -> pl.DataFrame:
        import polars as pl

        return pl.DataFrame([{**plain(o), "probe_units": len(o.probe_units)}
                             for o in self.outcomes.values()], infer_schema_length=None)


async def settle_probation(workspace: Workspace | str | Path, epoch: int, *, infer: Infer,
                           options: RunOptions = DEFAULT_OPTIONS,
                           subscribers: Iterable[Subscriber] = ()) -> ProbationResult:
    """Settle every PROVISIONAL version on probation from epochs <= ``epoch`` (epoch end).

    Each type's probe: up to ``probation_units`` units of its pool that the PROVISIONAL
    step neither consumed nor used as evolution cases, in a pre-declared order (a
    deterministic shuffle); base = the version a rollback would restore (BaselineCache),
    cand = the probationary version. All types are settled concurrently through the
    continuous gate (one slot pool, dispatch as ``options`` says, BaselineCache, INFRA guard,
    events, the log sink), each with the workspace's ``probation_rule``
    (`vtrm_gate.stats.probation_rule`): keep, or roll back (the text joins the rejected
    buffer). Rows land in predictions (run ids ``e{epoch}_probation_gate_<slug>_<arm>``),
    gate_evidence and step_report at step 0. An INFRA guard abort re-raises
    `InfraGuardError` with nothing settled (re-runnable). The settled epoch's last step can
    no longer be re-run afterwards.
    """
    check_ids(epoch, 1)
    with writer(workspace, f"settle_probation e{epoch}") as ws:
        if epoch in ws.state.settled_epochs:
            return _settled_before(ws, epoch)
        check_settle_order(ws, ws.state, epoch)
        return await _settle(ws, epoch, infer, options, subscribers)


def _settled_before(ws: Workspace, epoch: int) -> ProbationResult:
    """The recorded settlement of ``epoch`` (its report rows), nothing run again."""
    rule = ws.config.probation_rule
    rows = ws.log.select("step_report", ["task_type", "W", "L", "n_used", "applied", "note",
                                         "base_version"], epoch=epoch, step=PROBATION_STEP)
    out = {}
    for t, w, lo, n, a, note, base in rows:
        a = a or ""
        v = re.search(r"settling v(\d+)", note or "")
        evidence = a.split(f"({rule}: ", 1)[1][:-1] if f"({rule}: " in a else ""
        out[t] = ProbationOutcome(t, int(v.group(1)) if v else 0, base or 0, (), w or 0,
                                  lo or 0, n or 0, not a.startswith("rolled back"), a, rule,
                                  evidence)
    return ProbationResult(epoch, out, already_settled=True)


def _used_by_step(ws: Workspace, task_type: str, p: Probation, seen: Manifests) -> set[str]:
    """The units the step that began ``p`` used: its gate's consumed units and its cases.
    Without that record a probe could reuse them, so a missing one is refused."""
    used = ws.log.consumed_units(p.epoch, p.step, task_type)
    if not used:  # the step's gate consumed units (a PROVISIONAL needs some): a log older
        raise WorkspaceError(  # than state.json, restored from a backup, has none
            f"harness.sqlite holds no gate rows of step e{p.epoch} s{p.step} for "
            f"{task_type!r}, which state.json put on probation there (a database older than "
            f"state.json?): a probe could reuse the gate's units; restore the database "
            f"that goes with state.json")
    manifest = probation_manifest(ws, task_type, p, seen)
    return used | set(manifest["inputs"].get("cases", {}).get(task_type, ()))


def _probe_units(ws: Workspace, epoch: int, task_type: str, used: set[str], n_max: int
                 ) -> list[str]:
    """Fresh units for a probe: not in ``used`` (`_used_by_step`), in the workspace's
    ``probation_order`` (a seeded shuffle, or seed-wrong units first); at most
    ``probation_units``, and at most the gate's ``n_max`` (a step's ladder is cut there too)."""
    key = f"{ws.config.seed}:probation:{epoch}"
    pool = ws.pool[task_type]
    if ws.config.probation_order == "seed_wrong_first":  # the whole order, like a step's ladder
        order = ladder_units(build_ladder(pool, ws.seed_record.get(task_type), exclude=used,
                                          n_max=len(pool), seed=f"{key}:{task_type}"))
    else:
        order = sorted((u for u in pool if u not in used),
                       key=lambda u: shuffle_key(key, f"{task_type}\x1f{u}"))
    # the first units whose frames can be sent: a broken frame is passed over, not a gap
    return ws.sendable(order, min(ws.config.probation_units, n_max))[0]


def _probation_rule(ws: Workspace, task_type: str, p: Probation) -> ProbationRule:
    """The workspace's rule; ``e_continue`` starts from the gate's E+ when that gate compared
    the probationary version with the version a rollback restores (else afresh at 1)."""
    row = ws.log.select("step_report", ["e_plus", "base_version"], epoch=p.epoch, step=p.step,
                        task_type=task_type)
    e_start = 1.0
    if row and row[0][0] is not None and row[0][1] == p.prev_version:
        e_start = float(row[0][0])
    return probation_rule(ws.config.probation_rule, min_w_net=ws.config.probation_min_w_net,
                          e_start=e_start)


@dataclass(frozen=True)
class _Probe:
    """One type's settlement: its probation record, rule, and both versions' texts."""

    probation: Probation
    rule: ProbationRule
    prev_text: str
    cur_text: str
    plan: TypePlan

    @property
    def extra(self) -> dict[str, Any]:
        return {"base_version": self.probation.prev_version,
                "base_hash": content_hash(self.prev_text),
                "cand_hash": content_hash(self.cur_text)}


def _probes(ws: Workspace, epoch: int, state: TrainingState, n_max: int
            ) -> dict[str, _Probe]:
    """Every probation of an epoch <= ``epoch``, with its probe plan."""
    attempt = ws.log.infra_aborts(epoch, PROBATION_STEP)
    out = {}
    seen: Manifests = {}
    for t, p in sorted(state.probation.items()):
        if p.epoch > epoch or state.skills[t].version != p.version:
            continue
        prev_text, cur_text = settled_text(ws, state, t, seen), ws.version_text(t, p.version)
        rule = _probation_rule(ws, t, p)
        units = _probe_units(ws, epoch, t, _used_by_step(ws, t, p, seen), n_max)
        plan = TypePlan(t, units, prev_text, cur_text, probation_run_id(epoch),
                        target_file=ws.target(t), rule=rule, attempt=attempt)
        out[t] = _Probe(p, rule, prev_text, cur_text, plan)
    return out


async def _settle(ws: Workspace, epoch: int, infer: Infer, options: RunOptions,
                  subscribers: Iterable[Subscriber]) -> ProbationResult:
    state = ws.state
    ws.log.clear_step(epoch, PROBATION_STEP, probation_run_id(epoch))
    probes = _probes(ws, epoch, state, options.gate.n_max)
    extra = {t: pr.extra for t, pr in probes.items()}
    gate: GateResult | None = None
    if probes:
        sink = GateSink(ws.log, epoch, PROBATION_STEP, extra)
        try:
            gate = await run_workspace_gate(ws, epoch, PROBATION_STEP,
                                            [pr.plan for pr in probes.values()], infer,
                                            options, sink=sink, subscribers=subscribers)
        except BaseException as exc:
            report_aborted(ws, epoch, PROBATION_STEP, list(probes), extra, abort_reason(exc),
                           *partial_of(exc, sink.outcomes))
            raise
    skills, rejected = dict(state.skills), {t: tuple(rs) for t, rs in state.rejected.items()}
    outcomes = {}
    for t, pr in probes.items():
        o = gate.outcomes[t]  # type: ignore[union-attr]  # probes ran the gate
        outcomes[t] = _decide(ws, epoch, pr, o, skills, rejected)
        ws.log.write_report(epoch, PROBATION_STEP, t, StepStatus.PROBATION, outcome=o,
                            counters=gate.counters[t],  # type: ignore[union-attr]  # as above
                            applied=outcomes[t].applied,
                            note=f"settling v{pr.probation.version} from "
                                 f"e{pr.probation.epoch} s{pr.probation.step}", **extra[t])
        ws.log.set_action(epoch, PROBATION_STEP, t, "PROBATION_PASSED"
                          if outcomes[t].passed else "PROBATION_FAILED")
    probation = {t: p for t, p in state.probation.items() if p.epoch > epoch}
    ws.save_state(dataclasses.replace(
        state, skills=skills, probation=probation, rejected=rejected, before_last=None,
        settled_epochs=tuple(sorted({*state.settled_epochs, epoch}))))
    return ProbationResult(epoch, outcomes, gate=gate)


def _decide(ws: Workspace, epoch: int, pr: _Probe, o: TypeOutcome,
            skills: dict[str, SkillRef], rejected: dict[str, tuple[Rejected, ...]]
            ) -> ProbationOutcome:
    """Keep, or roll back (updating ``skills`` and ``rejected``), one probationary version."""
    p, t = pr.probation, pr.plan.task_type
    passed = pr.rule.keep(o)
    evidence = pr.rule.describe(o)
    if not pr.plan.units:  # "after 0 probe units" alone read like a bug
        evidence += (f"; no probe: {t} has no fresh units left (its gate and cases used "
                     f"the whole pool)")
    why = f"{ws.config.probation_rule}: {evidence}"
    if passed:
        applied = f"kept v{p.version} ({why})"
    else:
        applied = f"rolled back v{p.version} -> v{p.prev_version} ({why})"
        skills[t] = SkillRef(p.prev_version, content_hash(pr.prev_text), skills[t].latest)
        rejected[t] = push_rejected(ws, rejected.get(t, ()),
                                    Rejected(content_hash(pr.cur_text), pr.cur_text, epoch,
                                             PROBATION_STEP, "PROBATION_FAILED"))
    return ProbationOutcome(t, p.version, p.prev_version, tuple(pr.plan.units), o.W, o.L,
                            o.n_used, passed, applied, ws.config.probation_rule, evidence)


def settle_probation_sync(*args: Any, **kwargs: Any) -> ProbationResult:
    """`settle_probation` for scripts and blocking Jupyter cells."""
    return run_sync(settle_probation(*args, **kwargs))
