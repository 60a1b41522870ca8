"""The gate step (SPEC §4): phases A–D.

A. evolve, concurrently, every type with error cases this step that is not cooling down;
   a candidate that is no skill to gate (`candidate_problem`: no real change, a rejected
   one, a chat reply...) is a ``skipped`` step_report row naming why: never gated, no
   cooldown charged.
B. build each type's ladder (seed record for ordering only, this step's cases excluded,
   truncated to ``n_max``), materialise the candidate dirs, write the step manifest.
C. run the continuous gate with the BaselineCache and the GateSink.
D. apply the decisions in alphabetical order and checkpoint ``state.json`` (one atomic write).

Phases A–C only read training state; Phase D is its only writer. A step is re-runnable: it
starts with `HarnessLog.clear_step`, a re-run replays the candidates recorded in the step's
manifest (so decisions repeat even with a non-deterministic evolver), and the base arm is
served from the BaselineCache for every unit a previous attempt measured. A re-run whose
inputs (config, agent, base skills, cases, ladders) differ from the manifest is refused
with the list of changes unless ``force=True``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .._ids import (
    as_unicode,
    canonical_json,
    check_ids,
    content_hash,
    json_hash,
    slugify,
    step_run_id,
)
from .._sync import run_sync
from ..errors import (
    CandidateRefused,
    CasesUnavailable,
    StepRefusedError,
    StepUnmeasuredError,
    TargetClashError,
)
from ..gate import GateResult, Infer, Subscriber, TypePlan, build_ladder, ladder_units
from ..options import RunOptions
from ..stats import decision_rule, fastest_accept
from ._access import writer
from ._apply import apply_decisions
from ._candidate import candidate_problem
from ._files import atomic_write, join_notes, link_file, write_json
from ._gating import abort_reason, partial_of, report_aborted, run_workspace_gate
from ._log import GateSink
from ._manifest import (
    Manifests,
    diff_inputs,
    read_manifest,
    recorded_candidates,
    refusal,
    settled_text,
)
from ._order import check_step_order
from ._results import StepResult, TypeStep
from ._state import TrainingState
from ._status import NOT_EVOLVED, StepStatus
from ._workspace import DEFAULT_STRATEGY, Workspace, media_note

DEFAULT_OPTIONS = RunOptions()


class Evolver(Protocol):
    """Proposes a candidate skill text; ``rejected`` holds the type's rejected buffer."""

    async def evolve(self, task_type: str, current_skill: str, rejected: Sequence[str],
                     epoch: int, step: int) -> str: ...


CaseSource = Callable[[str, int, int, str], Sequence[str]]
"""``cases(task_type, epoch, step, current_skill) -> unit ids`` the current skill got wrong
in this step's rollout (the evolution cases; excluded from the ladder). It raises
`CasesUnavailable` when the rollout could not be measured."""
Cases = CaseSource | Mapping[str, Sequence[str]] | None


# ---- inputs -----------------------------------------------------------------------------


def _input_state(ws: Workspace, epoch: int, step: int) -> tuple[TrainingState, bool]:
    """The training state the step starts from, and whether this re-runs the last step."""
    state = ws.state
    if state.last_step == (epoch, step):
        if state.before_last is None:
            raise StepRefusedError(
                f"step e{epoch} s{step} was applied and epoch {epoch}'s probation has been "
                f"settled since; it can no longer be re-run")
        return state.before_last, True
    if state.last_step is not None and state.last_step > (epoch, step):
        e, s = state.last_step
        raise StepRefusedError(
            f"step e{epoch} s{step} is older than the last applied step e{e} s{s}; re-running "
            f"it would fork the training history (only the last applied step can be re-run)")
    check_step_order(ws, state, epoch, step)
    return state, False


def step_input_state(workspace: Workspace, epoch: int, step: int) -> TrainingState:
    """The training state step ``(epoch, step)`` starts from (the state before it when it is
    the last applied step, being re-run); `StepRefusedError` if it may not run.

    What a backend reads to compute the step's inputs (e.g. rollout cases) before `run_step`.
    """
    check_ids(epoch, step)
    return _input_state(workspace, epoch, step)[0]


def fail_fast_targets(ws: Workspace) -> None:
    """`TargetClashError` (a RuntimeError) if two types map to one target skill file, before
    any inference."""
    seen: dict[str, str] = {}
    for t in ws.task_types:
        target = ws.target(t)
        if target in seen:
            raise TargetClashError(f"types {seen[target]!r} and {t!r} map to the same target "
                                   f"skill file {target!r}; one step may not evolve one file "
                                   f"twice")
        seen[target] = t


def _case_source(cases: Cases, evolver: object) -> CaseSource:
    if isinstance(cases, Mapping):
        fixed = {t: us if isinstance(us, CasesUnavailable) else list(us)
                 for t, us in cases.items()}

        def lookup(t: str, e: int, s: int, skill: str) -> Sequence[str]:
            found = fixed.get(t, [])
            if isinstance(found, CasesUnavailable):
                raise found
            return found

        return lookup
    if cases is not None:
        return cases
    for owner in (evolver, getattr(evolver, "world", None)):
        fn = getattr(owner, "error_cases", None)
        if callable(fn):
            return fn
    raise TypeError("run_step needs this step's error cases: pass cases=(task_type, epoch, "
                    "step, current_skill) -> unit ids, or an evolver with error_cases "
                    "(or a .world with error_cases, like SimEvolver)")


@dataclass(frozen=True)
class StepInputs:
    """Everything a step is decided from, fixed before anything is written."""

    epoch: int
    step: int
    base_state: TrainingState
    rerun_applied: bool
    texts: Mapping[str, str]
    """Each type's gate base: the text of its last settled version (the base arm)."""
    current: Mapping[str, str]
    """Each type's current skill text (what the evolver edits and the rollout runs); it
    differs from ``texts`` only while a PROVISIONAL version is on probation."""
    cooldown: tuple[str, ...]
    cases: Mapping[str, list[str]]
    rollout_errors: Mapping[str, str]
    ladders: Mapping[str, list[str]]
    manifest_inputs: Mapping[str, Any]
    """The manifest's diffed ``inputs`` (decision fields only)."""
    ladder_notes: Mapping[str, str]
    """Per type, what its report says of its ladder: the units left out because their
    frames cannot be sent; a ladder too short for any ACCEPT."""

    @property
    def srid(self) -> str:
        return step_run_id(self.epoch, self.step)


def _ladder_seed(ws: Workspace, srid: str) -> str:
    # Keyed by the step, so successive steps do not re-test the same in-tier order.
    return f"{ws.config.seed}:{srid}"


def _step_inputs(ws: Workspace, epoch: int, step: int, options: RunOptions,
                 case_fn: CaseSource) -> StepInputs:
    base_state, rerun_applied = _input_state(ws, epoch, step)
    srid = step_run_id(epoch, step)
    types = ws.task_types
    current = {t: ws.skill_text(t, base_state) for t in types}
    # Every gate runs against the last settled version, so an ACCEPT is always against a
    # settled version (a type on probation is never gated against its unsettled bet).
    seen: Manifests = {}
    texts = {t: settled_text(ws, base_state, t, seen) for t in types}
    cooldown = tuple(t for t in types if base_state.in_cooldown(t))
    cases: dict[str, list[str]] = {}
    rollout_errors: dict[str, str] = {}
    for t in types:
        if t not in cooldown:
            try:
                cases[t] = list(dict.fromkeys(case_fn(t, epoch, step, current[t])))
            except CasesUnavailable as exc:
                cases[t], rollout_errors[t] = [], str(exc) or "rollout failed"
    ladders, ladder_notes = _ladders(ws, cases, options, _ladder_seed(ws, srid))
    inputs = json.loads(canonical_json({
        "config": {**options.decision_inputs(), "ladder_seed": _ladder_seed(ws, srid),
                   "cooldown_steps": ws.config.cooldown_steps,
                   "rejected_max": ws.config.rejected_max,
                   # present only when not the default, so older manifests compare equal
                   **({} if ws.config.futile_cooldown else {"futile_cooldown": False})},
        "agent": dict(ws.config.agent),
        "pool_hash": json_hash({t: list(u) for t, u in ws.pool.items()}),
        "seed_record_hash": json_hash(ws.seed_record),
        "base_skills": {t: {"version": base_state.settled_version(t),
                            "hash": content_hash(texts[t])} for t in types},
        # Present only while something is on probation (older manifests compare equal).
        **({"on_probation": {t: {"version": base_state.skills[t].version,
                                 "hash": base_state.skills[t].hash}
                             for t in sorted(base_state.probation)}}
           if base_state.probation else {}),
        "cooldown": list(cooldown),
        "cases": cases,
        "ladders": ladders,
    }))
    return StepInputs(epoch, step, base_state, rerun_applied, texts, current, cooldown,
                      cases, rollout_errors, ladders, inputs, ladder_notes)


def accept_need(options: RunOptions) -> int | None:
    """The fewest ladder units that can ACCEPT under ``options`` (`fastest_accept`)."""
    return fastest_accept(options.gate, decision_rule(options.decision_rule))


def never_accepted(ws: Workspace, options: RunOptions) -> dict[str, tuple[int, int]]:
    """Types no step can accept, each with the most units a ladder of theirs can hold and
    the fewest that ACCEPT needs: a type is gated only with an error case, which its ladder
    leaves out, so its ladders hold at most ``min(n_max, pool - 1)`` units."""
    need = accept_need(options)
    most = {t: min(options.gate.n_max, len(ws.pool[t]) - 1) for t in ws.task_types}
    return {} if need is None else {t: (m, need) for t, m in most.items() if m < need}


def _ladders(ws: Workspace, cases: Mapping[str, list[str]], options: RunOptions, seed: str
             ) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Each type with cases: its ladder (SPEC §2), leaving out the units whose frames
    cannot be sent (checked here, before anything runs), and a note naming them; a ladder
    shorter than the fewest units that can ACCEPT says so (the step cannot adopt it)."""
    need = accept_need(options)
    ladders, notes = {}, {}
    for t, us in cases.items():
        if not us:
            continue
        order = ladder_units(build_ladder(ws.pool[t], ws.seed_record.get(t), exclude=us,
                                          n_max=len(ws.pool[t]), seed=seed))
        ladders[t], faults = ws.sendable(order, options.gate.n_max)
        short = None
        if need is not None and len(ladders[t]) < need:
            short = (f"its ladder holds {len(ladders[t])} units, and ACCEPT needs at least "
                     f"{need} (straight wins at these gate parameters): this step cannot "
                     f"accept its candidate")
        note = join_notes(media_note(faults) if faults else None, short)
        if note:
            notes[t] = note
    return ladders, notes


def _check_manifest(ws: Workspace, si: StepInputs, force: bool
                    ) -> dict[str, tuple[StepStatus, str | None, str | None]] | None:
    """The candidates a previous run of this step recorded (None: evolve afresh);
    `StepRefusedError` listing the changes when the inputs differ (unless ``force``)."""
    prior = read_manifest(ws, si.epoch, si.step)
    if prior is None or force:
        return None
    changes = diff_inputs(prior["inputs"], si.manifest_inputs)
    if changes:
        raise refusal(ws, si.epoch, si.step, changes)
    return recorded_candidates(ws, prior)


# ---- phase A: evolve ----------------------------------------------------------------------


@dataclass
class Proposals:
    """Phase A's outcome per type: status, candidate text (gated types), note."""

    status: dict[str, StepStatus]
    cand: dict[str, str]
    notes: dict[str, str | None]

    def gated(self, types: Iterable[str]) -> list[str]:
        return [t for t in types if self.status[t] is StepStatus.GATED]


def _before_evolving(si: StepInputs) -> Proposals:
    """Types that are not evolved this step, and why (cooldown, rollout error, no cases)."""
    p = Proposals({}, {}, {})
    for t in si.texts:
        if t in si.cooldown:
            p.status[t], p.notes[t] = StepStatus.COOLDOWN, (
                f"cooling down until {si.base_state.cooldown_until[t]} steps are applied "
                f"({si.base_state.steps_applied} so far)")
        elif t in si.rollout_errors:
            p.status[t], p.notes[t] = StepStatus.ROLLOUT_ERROR, si.rollout_errors[t]
        elif not si.cases[t]:
            p.status[t], p.notes[t] = StepStatus.NO_CASES, "no error cases this step"
    return p


def _judge(proposal: object, current: str, base: str, rejected: Sequence[str]
           ) -> tuple[StepStatus, str | None]:
    """(status, note) of one evolver result (``base``: the gate's base, the settled text):
    ``skipped`` with the reason for a candidate that is no skill to gate."""
    if isinstance(proposal, CandidateRefused):  # not a failure: nothing new to gate
        return StepStatus.SKIPPED, str(proposal)
    if isinstance(proposal, Exception):  # its text is shown and stored: Unicode
        return StepStatus.EVOLVE_ERROR, as_unicode(f"{type(proposal).__name__}: {proposal}")
    if not isinstance(proposal, str):
        return StepStatus.EVOLVE_ERROR, f"evolver returned {proposal!r}"
    why = candidate_problem(proposal, current, rejected)
    if why is not None:
        return StepStatus.SKIPPED, why
    if proposal.strip() == base.strip():
        return StepStatus.SKIPPED, ("the candidate is the settled version the gate would "
                                    "compare it with")
    return StepStatus.GATED, None


async def _phase_a(si: StepInputs, evolver: Evolver,
                   recorded: Mapping[str, tuple[StepStatus, str | None, str | None]] | None
                   ) -> Proposals:
    """Evolve every type that has cases (concurrently), or replay the recorded candidates."""
    p = _before_evolving(si)
    todo = [t for t in si.texts if t not in p.status]
    if recorded is not None:
        for t in todo:
            st, text, note = recorded.get(t, (StepStatus.EVOLVE_ERROR, None, "not in manifest"))
            p.status[t], p.notes[t] = st, note
            if text is not None:
                p.cand[t] = text
        return p
    results = await asyncio.gather(
        *(evolver.evolve(t, si.current[t], si.base_state.rejected_texts(t), si.epoch, si.step)
          for t in todo), return_exceptions=True)
    for t, r in zip(todo, results, strict=True):
        if isinstance(r, BaseException) and not isinstance(r, Exception):
            raise r
        p.status[t], p.notes[t] = _judge(r, si.current[t], si.texts[t],
                                         si.base_state.rejected_texts(t))
        if p.status[t] is StepStatus.GATED:
            p.cand[t] = r  # type: ignore[assignment]  # GATED: a str reply (_judge)
    return p


def _refuse_unmeasured(ws: Workspace, si: StepInputs, p: Proposals) -> None:
    """Nothing gated and something failed: report why, apply nothing, write no manifest."""
    failed = [t for t in si.texts
              if p.status[t] in (StepStatus.ROLLOUT_ERROR, StepStatus.EVOLVE_ERROR)]
    if not failed or p.gated(si.texts):
        return
    for t in si.texts:
        ws.log.write_report(si.epoch, si.step, t, p.status[t], note=p.notes.get(t),
                            base_version=si.base_state.settled_version(t),
                            base_hash=content_hash(si.texts[t]))
    raise StepUnmeasuredError(
        f"step e{si.epoch} s{si.step}: nothing could be measured, so it was not applied ("
        + "; ".join(f"{t}: {p.status[t]}: {p.notes[t]}" for t in failed) + ")")


# ---- phase B: candidate dirs, manifest, report rows -----------------------------------------


SHARED_BASE = ".base"
"""candidates/eE_sS/.base/: the step's base skills, written once; each candidate dir holds
hard links to them (K types gated wrote K² fsynced files: 3.9 GB and 10 minutes at 2,000)."""


def _materialise(ws: Workspace, epoch: int, step: int, cand: Mapping[str, str],
                 base_texts: Mapping[str, str]) -> dict[str, Path]:
    """candidates/eE_sS/<slug>/ per gated type: the base skills with the type's file replaced
    by its candidate (an agent-ready skills dir). Returns each type's candidate file."""
    if not cand:
        return {}
    shared = ws.candidates_dir(epoch, step) / SHARED_BASE
    names = {t: Path(ws.target(t)).name for t in base_texts}
    for t, text in base_texts.items():
        atomic_write(shared / names[t], text)
    atomic_write(shared / DEFAULT_STRATEGY, ws.default_strategy())
    out = {}
    for task_type, text in cand.items():
        d = ws.candidates_dir(epoch, step) / slugify(task_type)
        d.mkdir(parents=True, exist_ok=True)
        for name in [*(names[t] for t in base_texts if t != task_type), DEFAULT_STRATEGY]:
            link_file(shared / name, d / name)
        out[task_type] = d / names[task_type]
        atomic_write(out[task_type], text)  # its fsync of d makes the links durable too
    return out


def _phase_b(ws: Workspace, si: StepInputs, p: Proposals, options: RunOptions
             ) -> tuple[dict[str, Path], dict[str, dict[str, Any]]]:
    """Materialise the candidates, write the manifest and each type's report row; returns
    the candidate dirs and the per-type report extras (base version and hashes)."""
    ws.check_root()
    made = _materialise(ws, si.epoch, si.step, {t: p.cand[t] for t in p.gated(si.texts)},
                        si.current)
    dirs = {t: f.parent for t, f in made.items()}
    files = {t: str(f.relative_to(ws.root)) for t, f in made.items()}
    todo = [t for t in si.texts if p.status[t] not in NOT_EVOLVED]
    write_json(ws.manifest_path(si.epoch, si.step), {
        "format": 1, "epoch": si.epoch, "step": si.step, "step_run_id": si.srid,
        "inputs": si.manifest_inputs,
        "config_hash": json_hash(si.manifest_inputs["config"]),
        "agent_hash": ws.config.agent_hash,
        **options.execution(),
        "candidates": {t: {"status": p.status[t], "note": p.notes.get(t),
                           **({"hash": content_hash(p.cand[t]), "file": files[t],
                               "dir": str(dirs[t].relative_to(ws.root))}
                              if t in p.cand else {})}
                       for t in todo},
    })
    extra: dict[str, dict[str, Any]] = {t: {"base_version": si.base_state.settled_version(t),
                 "base_hash": content_hash(si.texts[t]),
                 "cand_hash": content_hash(p.cand[t]) if t in p.cand else None,
                 "note": join_notes(p.notes.get(t), si.ladder_notes.get(t))}
             for t in si.texts}
    for t in si.texts:
        ws.log.write_report(si.epoch, si.step, t, p.status[t], **extra[t])
    return dirs, extra


# ---- phase C: the continuous gate ----------------------------------------------------------


def _arm_cache_stats(cache_stats: Callable[[str], Any] | None,
                     plan: TypePlan) -> dict[str, Any] | None:
    """The response-cache counters of both arm runs of one type, as plain values."""
    if cache_stats is None:
        return None
    out = {}
    for arm in ("base", "cand"):
        st = cache_stats(plan.run_id(arm))
        out[arm] = st.as_dict() if hasattr(st, "as_dict") else dict(st)
    return out


async def _phase_c(ws: Workspace, si: StepInputs, p: Proposals, dirs: Mapping[str, Path],
                   extra: Mapping[str, dict[str, Any]], infer: Infer, options: RunOptions,
                   subscribers: Iterable[Subscriber],
                   cache_stats: Callable[[str], Any] | None) -> GateResult | None:
    """Gate every candidate; an abort marks the gated types ``aborted`` and propagates."""
    gated = p.gated(si.texts)
    if not gated:
        return None
    attempt = ws.log.infra_aborts(si.epoch, si.step)
    plans = [TypePlan(t, si.ladders[t], si.texts[t], p.cand[t], si.srid,
                      target_file=ws.target(t), cand_dir=str(dirs[t]), attempt=attempt)
             for t in gated]
    sink = GateSink(ws.log, si.epoch, si.step, extra)
    try:
        gate = await run_workspace_gate(ws, si.epoch, si.step, plans, infer, options,
                                        sink=sink, subscribers=subscribers)
    except BaseException as exc:
        report_aborted(ws, si.epoch, si.step, gated, extra, abort_reason(exc),
                       *partial_of(exc, sink.outcomes))
        raise
    for plan in plans:
        t = plan.task_type
        ws.log.write_report(si.epoch, si.step, t, StepStatus.GATED, outcome=gate.outcomes[t],
                            counters=gate.counters[t],
                            llm_cache=_arm_cache_stats(cache_stats, plan), **extra[t])
    return gate


# ---- the step ---------------------------------------------------------------------------


async def run_step(workspace: Workspace | str | Path, epoch: int, step: int, *, infer: Infer,
                   evolver: Evolver, options: RunOptions = DEFAULT_OPTIONS,
                   force: bool = False, subscribers: Iterable[Subscriber] = (),
                   cases: Cases = None,
                   cache_stats: Callable[[str], Any] | None = None) -> StepResult:
    """Run (or re-run) gate step ``(epoch, step)`` of ``workspace``: phases A–D.

    ``options`` (`RunOptions`) gives the gate parameters, guard, slots, dispatch and cancel
    policy. ``cases`` gives the step's evolution cases (default: ``evolver.error_cases`` or
    ``evolver.world.error_cases``). ``cache_stats(run_id)`` (e.g. an LLM
    ``ResponseCache.stats``) puts each arm run's hit/miss/error counters in the step report.
    A type whose cases are `CasesUnavailable` is ``rollout_error``; when no type reaches the
    gate and some failed (rollout or evolver), `StepUnmeasuredError` is raised after the
    step_report rows are written, and nothing is applied.
    Holds the workspace's writer lock throughout (`WorkspaceLockedError` at once if another
    process holds it). Raises `StepRefusedError` if a recorded manifest differs
    (unless ``force``), `TargetClashError` if two types share a target file, and re-raises
    `InfraGuardError` after recording an ``aborted`` step_report (state untouched).
    """
    check_ids(epoch, step)
    if not isinstance(options, RunOptions):
        raise TypeError(f"options must be RunOptions, got {type(options).__name__}")
    with writer(workspace, f"run_step e{epoch} s{step}") as ws:
        fail_fast_targets(ws)
        si = _step_inputs(ws, epoch, step, options, _case_source(cases, evolver))
        recorded = _check_manifest(ws, si, force)
        # Nothing has been written so far; from here on the step's old rows are replaced.
        cleared = ws.log.clear_step(epoch, step, si.srid)
        if ws.stale_skills:  # finish an interrupted checkpoint: skills/ follows state.json
            ws.sync_skills()
        p = await _phase_a(si, evolver, recorded)
        _refuse_unmeasured(ws, si, p)
        dirs, extra = _phase_b(ws, si, p, options)
        gate = await _phase_c(ws, si, p, dirs, extra, infer, options, subscribers, cache_stats)
        if gate is not None:  # the gate's makespan (`train` adds its other phases)
            ws.log.record_timings(epoch, step, {"gate": gate.wall_time_s})
        outcomes = gate.outcomes if gate else {}
        new_state, applied = apply_decisions(ws, si.base_state, epoch, step, outcomes, p.cand)
        return _result(ws, si, p, gate, new_state, applied, recorded is not None, cleared)


def _result(ws: Workspace, si: StepInputs, p: Proposals, gate: GateResult | None,
            new_state: TrainingState, applied: Mapping[str, str], reused: bool,
            cleared: Mapping[str, int]) -> StepResult:
    outcomes = gate.outcomes if gate else {}
    gated = set(p.gated(si.texts))
    types = {t: TypeStep(t, p.status[t], si.base_state.skills[t].version,
                         new_state.skills[t].version,
                         outcomes[t].action if t in outcomes else None, applied.get(t),
                         tuple(si.cases.get(t, ())),
                         tuple(si.ladders.get(t, ())) if t in gated else (),
                         content_hash(p.cand[t]) if t in p.cand else None,
                         join_notes(p.notes.get(t), si.ladder_notes.get(t)),
                         si.base_state.settled_version(t) if t in gated else None)
             for t in si.texts}
    return StepResult(si.epoch, si.step, si.srid, types, gate,
                      ws.manifest_path(si.epoch, si.step), reused, si.rerun_applied, cleared)


def run_step_sync(*args: Any, **kwargs: Any) -> StepResult:
    """`run_step` for scripts and blocking Jupyter cells (via `vtrm_gate._sync.run_sync`)."""
    return run_sync(run_step(*args, **kwargs))
