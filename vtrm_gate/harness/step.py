"""The gate step (SPEC §4): phases A–D, the epoch-end probation settlement, and replays.

A. evolve, concurrently, every type with error cases this step that is not cooling down;
   a candidate with no real change is a ``skipped`` step_report row.
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
import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .._sync import run_sync
from ..dispatch import DispatchName, resolve_dispatch
from ..ladder import build_ladder, ladder_units, shuffle_key
from ..scheduler import (
    GateResult,
    GuardParams,
    Infer,
    InfraGuardError,
    Subscriber,
    TypeCounters,
    TypePlan,
    arm_run_id,
    content_hash,
    run_gate,
    slugify,
)
from ..stats import (
    Action,
    GateParams,
    SequentialTest,
    TypeOutcome,
    replay_blocks,
    replay_prefix,
)
from .baseline import BaselineCache
from .lock import workspace_lock
from .log import GateSink
from .probation import ProbationRule, probation_rule
from .workspace import (
    DEFAULT_STRATEGY,
    Probation,
    Rejected,
    SkillRef,
    TrainingState,
    Workspace,
    WorkspaceError,
    atomic_write,
    canonical_json,
    json_hash,
    read_json,
    step_run_id,
    write_json,
)

if TYPE_CHECKING:
    import polars as pl

DEFAULT_PARAMS = GateParams()

PROBATION_STEP = 0
"""step_report rows of the epoch-end probation settlement use step 0 of the epoch."""


class StepRefusedError(ValueError):
    """The step may not run as asked (changed manifest, or a step older than the state)."""

    def __init__(self, message: str, changes: Sequence[str] = ()):
        super().__init__(message)
        self.changes = tuple(changes)


class CasesUnavailable(Exception):
    """A type's rollout could not be measured (its calls were INFRA): a case source raises
    it (or a ``cases`` mapping holds it) and the type is reported ``rollout_error``, never
    ``no_cases``."""


class StepUnmeasuredError(RuntimeError):
    """Nothing in the step could be measured: no type reached the gate and some failed
    (``rollout_error`` / ``evolve_error``). step_report says why per type; the training
    state is untouched (the step is not applied) and the step can be re-run as new."""


class Evolver(Protocol):
    """Proposes a candidate skill text; ``rejected`` holds the type's rejected buffer."""

    async def evolve(self, task_type: str, current_skill: str, rejected: Sequence[str],
                     epoch: int, step: int) -> str: ...


CaseSource = Callable[[str, int, int, str], Sequence[str]]
"""``cases(task_type, epoch, step, current_skill) -> unit ids`` the current skill got wrong
in this step's rollout (the evolution cases; excluded from the ladder). It raises
`CasesUnavailable` when the rollout could not be measured."""


# ---- results ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TypeStep:
    """What happened to one type in a step."""

    task_type: str
    status: str
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
                "task_type": t, "status": s.status,
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
                "base_version": s.base_version, "version": s.version,
                "applied": s.applied, "note": s.note,
            })
        return pl.DataFrame(rows, infer_schema_length=None)


# ---- helpers ----------------------------------------------------------------------------


def _for_reading(workspace: Workspace | str | Path) -> Workspace:
    """The workspace as given, or opened read-only from a path (readers take no lock)."""
    return workspace if isinstance(workspace, Workspace) else Workspace.open(workspace,
                                                                           readonly=True)


@contextmanager
def _writer(workspace: Workspace | str | Path, command: str) -> Iterator[Workspace]:
    """The workspace opened for writing: validated first (a broken workspace is refused
    before anything is written), then its writer lock held for the block (a second writer
    gets `WorkspaceLockedError` at once) and its state re-read under the lock."""
    ws = workspace if isinstance(workspace, Workspace) else Workspace.open(workspace)
    try:
        with workspace_lock(ws.root, command):
            ws.reload_state()  # another writer may have moved it on since it was opened
            yield ws
    finally:
        if ws is not workspace:  # opened here from a path: release the SQLite connection
            ws.close()


def _check_ids(epoch: int, step: int) -> None:
    for name, v in (("epoch", epoch), ("step", step)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")


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
    return state, False


def step_input_state(workspace: Workspace, epoch: int, step: int) -> TrainingState:
    """The training state step ``(epoch, step)`` starts from (the state before it when it is
    the last applied step, being re-run); `StepRefusedError` if it may not run.

    What a backend reads to compute the step's inputs (e.g. rollout cases) before `run_step`.
    """
    _check_ids(epoch, step)
    return _input_state(workspace, epoch, step)[0]


def fail_fast_targets(ws: Workspace) -> None:
    """RuntimeError if two types map to one target skill file (before any inference)."""
    seen: dict[str, str] = {}
    for t in ws.task_types:
        target = ws.target(t)
        if target in seen:
            raise RuntimeError(f"types {seen[target]!r} and {t!r} map to the same target skill "
                               f"file {target!r}; one step may not evolve one file twice")
        seen[target] = t


def _case_source(cases: CaseSource | Mapping[str, Sequence[str]] | None,
                 evolver: object) -> CaseSource:
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
            return fn  # type: ignore[return-value]
    raise TypeError("run_step needs this step's error cases: pass cases=(task_type, epoch, "
                    "step, current_skill) -> unit ids, or an evolver with error_cases "
                    "(or a .world with error_cases, like SimEvolver)")


def _ladder_seed(ws: Workspace, srid: str) -> str:
    # Keyed by the step, so successive steps do not re-test the same in-tier order.
    return f"{ws.config.seed}:{srid}"


def _diff(old: Any, new: Any, path: str = "") -> list[str]:
    """Human-readable differences between two manifests' inputs."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new), key=str):
            p = f"{path}.{k}" if path else str(k)
            if k not in old:
                out.append(f"{p}: added ({_short(new[k])})")
            elif k not in new:
                out.append(f"{p}: removed (was {_short(old[k])})")
            else:
                out.extend(_diff(old[k], new[k], p))
        return out
    if old == new:
        return []
    if isinstance(old, list) and isinstance(new, list):
        first = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b),
                     min(len(old), len(new)))
        return [f"{path}: changed ({len(old)} -> {len(new)} items, first difference at "
                f"index {first})"]
    return [f"{path}: {_short(old)} -> {_short(new)}"]


def _short(v: Any) -> str:
    s = json.dumps(v, sort_keys=True)
    return s if len(s) <= 80 else s[:77] + "..."


def _read_manifest(ws: Workspace, epoch: int, step: int) -> dict[str, Any] | None:
    p = ws.manifest_path(epoch, step)
    if not p.exists():
        return None
    data = read_json(p, ws.root)
    if not isinstance(data, dict) or not isinstance(data.get("inputs"), dict) \
            or not isinstance(data.get("candidates"), dict):
        raise WorkspaceError(f"{p.relative_to(ws.root)}: malformed manifest (needs 'inputs' "
                             f"and 'candidates'); delete it or re-run with force=True")
    return data


def _recorded_candidates(ws: Workspace, manifest: Mapping[str, Any]
                         ) -> dict[str, tuple[str, str | None, str | None]]:
    """(status, candidate text, note) per type from a manifest, verified against its hashes."""
    out: dict[str, tuple[str, str | None, str | None]] = {}
    for t, c in manifest["candidates"].items():
        text = None
        if c.get("status") == "gated":
            p = ws.root / c["file"]
            if not p.is_file() or content_hash(p.read_text(encoding="utf-8")) != c["hash"]:
                raise StepRefusedError(
                    f"candidate file {c['file']} of {t!r} is missing or differs from the "
                    f"manifest's hash; re-run with force=True to evolve new candidates",
                    [f"candidates.{t}"])
            text = p.read_text(encoding="utf-8")
        out[t] = (c["status"], text, c.get("note"))
    return out


def _materialise(ws: Workspace, epoch: int, step: int, task_type: str, cand: str,
                 base_texts: Mapping[str, str]) -> tuple[Path, Path]:
    """candidates/eE_sS/<slug>/: the base skills with the type's file replaced by the
    candidate (an agent-ready skills dir). Returns (dir, candidate file)."""
    d = ws.candidates_dir(epoch, step) / slugify(task_type)
    for t, text in base_texts.items():
        name = Path(ws.target(t)).name
        atomic_write(d / name, cand if t == task_type else text)
    atomic_write(d / DEFAULT_STRATEGY, ws.default_strategy())
    return d, d / Path(ws.target(task_type)).name


def _plain(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


# ---- the step ---------------------------------------------------------------------------


async def run_step(workspace: Workspace | str | Path, epoch: int, step: int, *, infer: Infer,
                   evolver: Evolver, params: GateParams = DEFAULT_PARAMS, concurrency: int = 32,
                   guard: GuardParams | None = None, force: bool = False,
                   subscribers: Iterable[Subscriber] = (),
                   cases: CaseSource | Mapping[str, Sequence[str]] | None = None,
                   cache_stats: Callable[[str], Any] | None = None,
                   dispatch: DispatchName = "round_robin",
                   cancel_after_freeze: bool = False) -> StepResult:
    """Run (or re-run) gate step ``(epoch, step)`` of ``workspace``: phases A–D.

    ``cases`` gives the step's evolution cases (default: ``evolver.error_cases`` or
    ``evolver.world.error_cases``). ``cache_stats(run_id)`` (e.g. an LLM
    ``ResponseCache.stats``) puts each arm run's hit/miss/error counters in the step report.
    A type whose cases are `CasesUnavailable` is ``rollout_error``; when no type reaches the
    gate and some failed (rollout or evolver), `StepUnmeasuredError` is raised after the
    step_report rows are written, and nothing is applied.
    Holds the workspace's writer lock throughout (`WorkspaceLockedError` at once if another
    process holds it). Raises `StepRefusedError` if a recorded manifest differs
    (unless ``force``), `RuntimeError` if two types share a target file, and re-raises
    `InfraGuardError` after recording an ``aborted`` step_report (state untouched).
    """
    with _writer(workspace, f"run_step e{epoch} s{step}") as ws:
        return await _run_step(ws, epoch, step, infer=infer, evolver=evolver, params=params,
                               concurrency=concurrency, guard=guard, force=force,
                               subscribers=subscribers, cases=cases,
                               cache_stats=cache_stats, dispatch=dispatch,
                               cancel_after_freeze=cancel_after_freeze)


async def _run_step(ws: Workspace, epoch: int, step: int, *, infer: Infer, evolver: Evolver,
                    params: GateParams, concurrency: int, guard: GuardParams | None,
                    force: bool, subscribers: Iterable[Subscriber],
                    cases: CaseSource | Mapping[str, Sequence[str]] | None,
                    cache_stats: Callable[[str], Any] | None = None,
                    dispatch: DispatchName = "round_robin",
                    cancel_after_freeze: bool = False) -> StepResult:
    _check_ids(epoch, step)
    resolve_dispatch(dispatch)  # an unknown name fails before anything is written
    if not isinstance(params, GateParams):
        raise TypeError(f"params must be GateParams, got {type(params).__name__}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    guard = guard or GuardParams()
    srid = step_run_id(epoch, step)
    fail_fast_targets(ws)
    base_state, rerun_applied = _input_state(ws, epoch, step)
    case_fn = _case_source(cases, evolver)
    types = ws.task_types
    texts = {t: ws.skill_text(t, base_state) for t in types}
    cooldown = [t for t in types if base_state.in_cooldown(t)]
    step_cases: dict[str, list[str]] = {}
    rollout_errors: dict[str, str] = {}
    for t in types:
        if t not in cooldown:
            try:
                step_cases[t] = list(dict.fromkeys(case_fn(t, epoch, step, texts[t])))
            except CasesUnavailable as exc:
                step_cases[t], rollout_errors[t] = [], str(exc) or "rollout failed"
    ladders = {t: ladder_units(build_ladder(ws.pool[t], ws.seed_record.get(t),
                                            exclude=us, n_max=params.n_max,
                                            seed=_ladder_seed(ws, srid)))
               for t, us in step_cases.items() if us}
    inputs = json.loads(canonical_json({
        "config": {"params": _plain(params), "guard": _plain(guard),
                   "ladder_seed": _ladder_seed(ws, srid),
                   "cooldown_steps": ws.config.cooldown_steps,
                   "rejected_max": ws.config.rejected_max},
        "agent": dict(ws.config.agent),
        "pool_hash": json_hash({t: list(u) for t, u in ws.pool.items()}),
        "seed_record_hash": json_hash(ws.seed_record),
        "base_skills": {t: {"version": base_state.skills[t].version,
                            "hash": base_state.skills[t].hash} for t in types},
        "cooldown": cooldown,
        "cases": step_cases,
        "ladders": ladders,
    }))
    prior = _read_manifest(ws, epoch, step)
    recorded = None
    if prior is not None and not force:
        changes = _diff(prior["inputs"], inputs)
        if changes:
            raise StepRefusedError(
                f"step e{epoch} s{step} was run before with a different manifest "
                f"({ws.manifest_path(epoch, step).relative_to(ws.root)}); refusing to re-run "
                f"it because:\n  - " + "\n  - ".join(changes)
                + "\npass force=True to re-run it anyway (its log rows are replaced)",
                changes)
        recorded = _recorded_candidates(ws, prior)

    # Nothing has been written so far; from here on the step's old rows are replaced.
    cleared = ws.log.clear_step(epoch, step, srid)
    if ws.stale_skills:  # finish an interrupted checkpoint: skills/ follows state.json
        ws.sync_skills()

    # ---- Phase A: evolve concurrently ----
    status: dict[str, str] = {}
    cand: dict[str, str] = {}
    notes: dict[str, str | None] = {}
    for t in types:
        if t in cooldown:
            status[t], notes[t] = "cooldown", (
                f"cooling down until {base_state.cooldown_until[t]} steps are applied "
                f"({base_state.steps_applied} so far)")
        elif t in rollout_errors:
            status[t], notes[t] = "rollout_error", rollout_errors[t]
        elif not step_cases[t]:
            status[t], notes[t] = "no_cases", "no error cases this step"
    todo = [t for t in types if t not in status]
    if recorded is not None:
        for t in todo:
            st, text, note = recorded.get(t, ("evolve_error", None, "not in manifest"))
            status[t], notes[t] = st, note
            if text is not None:
                cand[t] = text
    else:
        proposals = await asyncio.gather(
            *(evolver.evolve(t, texts[t], base_state.rejected_texts(t), epoch, step)
              for t in todo), return_exceptions=True)
        for t, p in zip(todo, proposals, strict=True):
            if isinstance(p, BaseException) and not isinstance(p, Exception):
                raise p
            if isinstance(p, Exception):
                status[t], notes[t] = "evolve_error", f"{type(p).__name__}: {p}"
            elif not isinstance(p, str) or not p.strip():
                status[t], notes[t] = "evolve_error", f"evolver returned {p!r}"
            elif p.strip() == texts[t].strip():
                status[t], notes[t] = "skipped", "no real change"
            else:
                status[t], notes[t] = "gated", None
                cand[t] = p
    gated = [t for t in types if status[t] == "gated"]
    failed = [t for t in types if status[t] in ("rollout_error", "evolve_error")]
    if failed and not gated:  # nothing measured: report why, apply nothing, write no manifest
        for t in types:
            ws.log.write_report(epoch, step, t, status[t], note=notes.get(t),
                                base_version=base_state.skills[t].version,
                                base_hash=base_state.skills[t].hash)
        raise StepUnmeasuredError(
            f"step e{epoch} s{step}: nothing could be measured, so it was not applied ("
            + "; ".join(f"{t}: {status[t]}: {notes[t]}" for t in failed) + ")")

    # ---- Phase B: ladders + candidate dirs + manifest ----
    cand_dirs: dict[str, Path] = {}
    cand_files: dict[str, str] = {}
    for t in gated:
        d, f = _materialise(ws, epoch, step, t, cand[t], texts)
        cand_dirs[t], cand_files[t] = d, str(f.relative_to(ws.root))
    manifest = {
        "format": 1, "epoch": epoch, "step": step, "step_run_id": srid,
        "inputs": inputs,
        "config_hash": json_hash(inputs["config"]),
        "agent_hash": ws.config.agent_hash,
        "concurrency": concurrency,
        "dispatch": dispatch, "cancel_after_freeze": bool(cancel_after_freeze),
        "candidates": {t: {"status": status[t], "note": notes.get(t),
                           **({"hash": content_hash(cand[t]), "file": cand_files[t],
                               "dir": str(cand_dirs[t].relative_to(ws.root))}
                              if t in cand else {})}
                       for t in todo},
    }
    write_json(ws.manifest_path(epoch, step), manifest)
    extra = {t: {"base_version": base_state.skills[t].version,
                 "base_hash": base_state.skills[t].hash,
                 "cand_hash": content_hash(cand[t]) if t in cand else None}
             for t in types}
    for t in types:
        ws.log.write_report(epoch, step, t, status[t], note=notes.get(t), **extra[t])

    # ---- Phase C: the continuous gate ----
    attempt = ws.log.infra_aborts(epoch, step)
    plans = [TypePlan(t, ladders[t], texts[t], cand[t], srid, target_file=ws.target(t),
                      cand_dir=str(cand_dirs[t]), attempt=attempt) for t in gated]
    plans_by = {p.task_type: p for p in plans}
    sink = GateSink(ws.log, epoch, step, extra)
    gate: GateResult | None = None
    if plans:
        try:
            with counting_infra_aborts(ws, epoch, step):
                gate = await run_gate(plans, infer, params, concurrency,
                                      baseline=BaselineCache.for_workspace(ws),
                                      sink=sink, subscribers=subscribers, guard=guard,
                                      dispatch=dispatch,
                                      cancel_after_freeze=cancel_after_freeze)
        except InfraGuardError as exc:
            part = exc.partial
            _report_aborted(ws, epoch, step, gated, extra, str(exc),
                            part.outcomes if part else sink.outcomes,
                            part.counters if part else {})
            raise
        except BaseException as exc:
            _report_aborted(ws, epoch, step, gated, extra,
                            f"{type(exc).__name__}: {exc}".rstrip(": "), sink.outcomes, {})
            raise
        for t in gated:
            ws.log.write_report(epoch, step, t, "gated", outcome=gate.outcomes[t],
                                counters=gate.counters[t],
                                llm_cache=_arm_cache_stats(cache_stats, plans_by[t]),
                                **extra[t])

    # ---- Phase D: the only writer of training state ----
    outcomes = gate.outcomes if gate else {}
    new_state, applied, new_versions = _apply(ws, base_state, epoch, step, outcomes, cand)
    for t, v, text in new_versions:  # write-once history first, then the checkpoint
        atomic_write(ws.history_path(t, v), text)
    ws.save_state(new_state)
    ws.log.set_applied(epoch, step, applied)

    return StepResult(
        epoch, step, srid,
        {t: TypeStep(t, status[t], base_state.skills[t].version, new_state.skills[t].version,
                     outcomes[t].action if t in outcomes else None, applied.get(t),
                     tuple(step_cases.get(t, ())), tuple(ladders.get(t, ()))
                     if t in gated else (), content_hash(cand[t]) if t in cand else None,
                     notes.get(t))
         for t in types},
        gate, ws.manifest_path(epoch, step), recorded is not None, rerun_applied, cleared)


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


def run_step_sync(*args: Any, **kwargs: Any) -> StepResult:
    """`run_step` for scripts and blocking Jupyter cells (via `vtrm_gate._sync.run_sync`)."""
    return run_sync(run_step(*args, **kwargs))


@contextmanager
def counting_infra_aborts(ws: Workspace, epoch: int, step: int) -> Iterator[None]:
    """Count an INFRA-guard abort of (epoch, step)'s gate in the log, so that the next
    attempt's tasks carry ``attempt`` + 1 (see `UnitTask.attempt`)."""
    try:
        yield
    except InfraGuardError as exc:
        ws.log.record_infra_abort(epoch, step, str(exc))
        raise


def _report_aborted(ws: Workspace, epoch: int, step: int, gated: Sequence[str],
                    extra: Mapping[str, Mapping[str, Any]], reason: str,
                    outcomes: Mapping[str, TypeOutcome],
                    counters: Mapping[str, TypeCounters]) -> None:
    """Mark every gated type's report ``aborted`` (with what was done); state is untouched."""
    for t in gated:
        ws.log.write_report(epoch, step, t, "aborted", outcome=outcomes.get(t),
                            counters=counters.get(t), note=reason, **extra[t])


def _apply(ws: Workspace, base: TrainingState, epoch: int, step: int,
           outcomes: Mapping[str, TypeOutcome], cand: Mapping[str, str]
           ) -> tuple[TrainingState, dict[str, str], list[tuple[str, int, str]]]:
    """Phase D minus the writes: (new state, what was applied per type, new versions)."""
    skills = dict(base.skills)
    probation = dict(base.probation)
    cooldown = dict(base.cooldown_until)
    rejected = {t: tuple(rs) for t, rs in base.rejected.items()}
    n = base.steps_applied + 1
    applied: dict[str, str] = {}
    new_versions: list[tuple[str, int, str]] = []
    for t in sorted(outcomes):  # alphabetical: deterministic bookkeeping order
        action, ref = outcomes[t].action, skills[t]
        if action in (Action.ACCEPT, Action.PROVISIONAL):
            v = ref.latest + 1
            # A forced re-run may propose other text: never overwrite a recorded version.
            while (ws.history_path(t, v).is_file()
                   and ws.history_path(t, v).read_text(encoding="utf-8") != cand[t]):
                v += 1
            new_versions.append((t, v, cand[t]))
            skills[t] = SkillRef(v, content_hash(cand[t]), v)
            if action is Action.ACCEPT:
                probation.pop(t, None)
                applied[t] = f"accepted: v{ref.version} -> v{v}"
            else:
                # Stacked bets roll back together to the last settled version.
                prev = probation[t].prev_version if t in probation else ref.version
                probation[t] = Probation(v, prev, epoch, step)
                applied[t] = (f"probation: v{ref.version} -> v{v} (rolled back to v{prev} if "
                              f"it fails at the end of epoch {epoch})")
        elif action in (Action.REJECT, Action.FUTILE):
            entry = Rejected(content_hash(cand[t]), cand[t], epoch, step, action.value)
            rs = (*rejected.get(t, ()), entry)
            keep = ws.config.rejected_max
            rejected[t] = rs[len(rs) - keep:] if keep else ()
            cooldown[t] = n + ws.config.cooldown_steps
            applied[t] = (f"rejected ({action.value}): kept v{ref.version}; cooldown for "
                          f"{ws.config.cooldown_steps} steps")
        else:
            applied[t] = f"kept v{ref.version} ({action.value})"
    state = TrainingState(skills, probation, cooldown, rejected, n, (epoch, step),
                          dataclasses.replace(base, before_last=None), base.settled_epochs)
    return state, applied, new_versions


# ---- probation --------------------------------------------------------------------------


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


@dataclass(frozen=True)
class ProbationResult:
    """The epoch-end settlement: one outcome per type that was on probation."""

    epoch: int
    outcomes: Mapping[str, ProbationOutcome]
    already_settled: bool = False
    gate: GateResult | None = None

    def frame(self) -> pl.DataFrame:
        import polars as pl

        return pl.DataFrame([{**_plain(o), "probe_units": len(o.probe_units)}
                             for o in self.outcomes.values()], infer_schema_length=None)


async def settle_probation(workspace: Workspace | str | Path, epoch: int, *, infer: Infer,
                           concurrency: int = 32, params: GateParams = DEFAULT_PARAMS,
                           guard: GuardParams | None = None,
                           subscribers: Iterable[Subscriber] = ()) -> ProbationResult:
    """Settle every PROVISIONAL version on probation from epochs <= ``epoch`` (epoch end).

    Each type's probe: up to ``probation_units`` units of its pool that the PROVISIONAL
    step neither consumed nor used as evolution cases, in a pre-declared order (a
    deterministic shuffle); base = the version a rollback would restore (BaselineCache),
    cand = the probationary version. All types are settled concurrently through the
    continuous gate (one slot pool, fair dispatch, BaselineCache, INFRA guard, events, the
    log sink), each with the workspace's ``probation_rule`` (`vtrm_gate.harness.probation`):
    keep, or roll back (the text joins the rejected buffer). Rows land in predictions (run
    ids ``e{epoch}_probation_gate_<slug>_<arm>``), gate_evidence and step_report at step 0.
    An INFRA guard abort re-raises `InfraGuardError` with nothing settled (re-runnable).
    The settled epoch's last step can no longer be re-run afterwards.
    """
    with _writer(workspace, f"settle_probation e{epoch}") as ws:
        return await _settle(ws, epoch, infer, concurrency, params, guard or GuardParams(),
                             subscribers)


def _probe_units(ws: Workspace, epoch: int, task_type: str, p: Probation) -> list[str]:
    """Fresh units for the probe of ``p``: not consumed by its step's gate, not its cases."""
    used = {r[0] for r in ws.log.query(
        "SELECT unit_id FROM gate_evidence WHERE epoch = ? AND step = ? AND task_type = ?",
        (p.epoch, p.step, task_type))}
    manifest = _read_manifest(ws, p.epoch, p.step)
    if manifest is not None:
        used.update(manifest["inputs"].get("cases", {}).get(task_type, ()))
    probe = sorted((u for u in ws.pool[task_type] if u not in used),
                   key=lambda u: shuffle_key(f"{ws.config.seed}:probation:{epoch}",
                                             f"{task_type}\x1f{u}"))
    return probe[:ws.config.probation_units]


def _probation_rule(ws: Workspace, task_type: str, p: Probation) -> ProbationRule:
    """The workspace's rule; ``e_continue`` starts from the gate's E+ when that gate compared
    the probationary version with the version a rollback restores (else afresh at 1)."""
    row = ws.log.query("SELECT e_plus, base_version FROM step_report WHERE epoch = ? AND "
                       "step = ? AND task_type = ?", (p.epoch, p.step, task_type))
    e_start = 1.0
    if row and row[0][0] is not None and row[0][1] == p.prev_version:
        e_start = float(row[0][0])
    return probation_rule(ws.config.probation_rule, min_w_net=ws.config.probation_min_w_net,
                          e_start=e_start)


async def _settle(ws: Workspace, epoch: int, infer: Infer, concurrency: int,
                  params: GateParams, guard: GuardParams,
                  subscribers: Iterable[Subscriber]) -> ProbationResult:
    _check_ids(epoch, 1)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    state = ws.state
    log = ws.log
    if epoch in state.settled_epochs:
        rows = log.query("SELECT task_type, W, L, n_used, applied FROM step_report WHERE "
                         "epoch = ? AND step = ?", (epoch, PROBATION_STEP))
        return ProbationResult(epoch, {t: ProbationOutcome(t, 0, 0, (), w or 0, lo or 0,
                                                           n or 0, "rolled back" not in (a or ""),
                                                           a or "")
                                       for t, w, lo, n, a in rows}, already_settled=True)
    srid = f"e{epoch}_probation"
    log.clear_step(epoch, PROBATION_STEP, srid)
    skills = dict(state.skills)
    rejected = {t: tuple(rs) for t, rs in state.rejected.items()}
    probation = dict(state.probation)
    plans: list[TypePlan] = []
    meta: dict[str, tuple[Probation, ProbationRule, str, str]] = {}
    attempt = log.infra_aborts(epoch, PROBATION_STEP)
    for t, p in sorted(state.probation.items()):
        if p.epoch > epoch:
            continue
        if skills[t].version != p.version:  # defensive: Phase D keeps them equal
            probation.pop(t)
            continue
        prev_text, cur_text = ws.version_text(t, p.prev_version), ws.version_text(t, p.version)
        rule = _probation_rule(ws, t, p)
        plans.append(TypePlan(t, _probe_units(ws, epoch, t, p), prev_text, cur_text, srid,
                              target_file=ws.target(t), rule=rule, attempt=attempt))
        meta[t] = (p, rule, prev_text, cur_text)
    extra = {t: {"base_version": p.prev_version, "base_hash": content_hash(prev),
                 "cand_hash": content_hash(cur)} for t, (p, _, prev, cur) in meta.items()}
    gate: GateResult | None = None
    if plans:
        sink = GateSink(log, epoch, PROBATION_STEP, extra)
        try:
            with counting_infra_aborts(ws, epoch, PROBATION_STEP):
                gate = await run_gate(plans, infer, params, concurrency,
                                      baseline=BaselineCache.for_workspace(ws),
                                      sink=sink, subscribers=subscribers, guard=guard)
        except InfraGuardError as exc:
            part = exc.partial
            _report_aborted(ws, epoch, PROBATION_STEP, list(meta), extra, str(exc),
                            part.outcomes if part else sink.outcomes,
                            part.counters if part else {})
            raise
    outcomes: dict[str, ProbationOutcome] = {}
    for plan in plans:
        t = plan.task_type
        p, rule, prev_text, cur_text = meta[t]
        o = gate.outcomes[t]  # type: ignore[union-attr]
        passed = rule.keep(o)
        why = f"{ws.config.probation_rule}: {rule.describe(o)}"
        if passed:
            applied = f"kept v{p.version} ({why})"
        else:
            applied = f"rolled back v{p.version} -> v{p.prev_version} ({why})"
            skills[t] = SkillRef(p.prev_version, content_hash(prev_text), skills[t].latest)
            rs = (*rejected.get(t, ()), Rejected(content_hash(cur_text), cur_text, epoch,
                                                 PROBATION_STEP, "PROBATION_FAILED"))
            keep = ws.config.rejected_max
            rejected[t] = rs[len(rs) - keep:] if keep else ()
        probation.pop(t)
        outcomes[t] = ProbationOutcome(t, p.version, p.prev_version, tuple(plan.units), o.W,
                                       o.L, o.n_used, passed, applied)
        log.write_report(epoch, PROBATION_STEP, t, "probation", outcome=o,
                         counters=gate.counters[t],  # type: ignore[union-attr]
                         applied=applied, note=f"settling v{p.version} from e{p.epoch} "
                                               f"s{p.step}", **extra[t])
        with log.transaction() as cur:
            cur.execute("UPDATE step_report SET action = ? WHERE epoch = ? AND step = ? AND "
                        "task_type = ?", ("PROBATION_PASSED" if passed else "PROBATION_FAILED",
                                          epoch, PROBATION_STEP, t))
    new_state = dataclasses.replace(
        state, skills=skills, probation=probation, rejected=rejected, before_last=None,
        settled_epochs=tuple(sorted({*state.settled_epochs, epoch})))
    ws.save_state(new_state)
    return ProbationResult(epoch, outcomes, gate=gate)


def settle_probation_sync(*args: Any, **kwargs: Any) -> ProbationResult:
    """`settle_probation` for scripts and blocking Jupyter cells."""
    return run_sync(settle_probation(*args, **kwargs))


# ---- replay of a recorded step ----------------------------------------------------------


def replay_step(workspace: Workspace | str | Path, epoch: int, step: int, *,
                block: int = 8) -> pl.DataFrame:
    """Prefix vs block replay of the outcomes a step recorded, one row per gated type.

    Outcomes come from the step's predictions (discarded in-flight results included: they
    are real measurements). Units the live gate never ran are *unknown*: if the block replay
    would need one, its decision is ``UNKNOWN (needs k unrun units)`` with
    ``block_needs_unrun_units=True`` (k counts the unrun units up to the end of the block it
    would have had to finish), never an invented outcome.
    """
    ws = _for_reading(workspace)
    try:
        return _replay(ws, epoch, step, block)
    finally:
        if ws is not workspace:
            ws.close()


def _replay(ws: Workspace, epoch: int, step: int, block: int) -> pl.DataFrame:
    import polars as pl

    manifest = _read_manifest(ws, epoch, step)
    if manifest is None:
        raise WorkspaceError(f"{ws.manifest_path(epoch, step).relative_to(ws.root)}: missing; "
                             f"step e{epoch} s{step} has not been run in this workspace")
    params = GateParams(**manifest["inputs"]["config"]["params"])
    srid = manifest["step_run_id"]
    live = {r[0]: r[1:] for r in ws.log.query(
        "SELECT task_type, status, action, stop_rank FROM step_report WHERE epoch = ? AND "
        "step = ?", (epoch, step))}
    rows = []
    for t, c in sorted(manifest["candidates"].items()):
        if c.get("status") != "gated":
            continue
        ladder = manifest["inputs"]["ladders"][t]
        arms: dict[str, dict[str, tuple[int, int, int]]] = {}
        for arm in ("base", "cand"):
            arms[arm] = {u: (correct, infra, tokens) for u, correct, infra, tokens in
                         ws.log.query("SELECT unit_id, correct, infra, tokens FROM predictions "
                                      "WHERE run_id = ?", (arm_run_id(srid, t, arm),))}
        known: list[bool] = []
        pairs: list[tuple[bool, bool] | None] = []
        tokens: list[int] = []
        for u in ladder:
            b, k = arms["base"].get(u), arms["cand"].get(u)
            infra = bool((b and b[1]) or (k and k[1]))
            known.append(infra or (b is not None and k is not None))
            pairs.append(None if infra or b is None or k is None
                         else (bool(b[0]), bool(k[0])))
            tokens.append((b[2] if b else 0) + (k[2] if k else 0))
        status, live_action, live_stop = live.get(t, (None, None, None))
        prefix = _replay_known(pairs, known, params, None)
        blocks = _replay_known(pairs, known, params, block)
        rows.append({
            "task_type": t, "n_ladder": len(ladder), "status": status,
            "live_action": live_action, "live_stop_rank": live_stop,
            **_replay_columns("prefix", prefix, tokens),
            "prefix_matches_live": prefix["action"] == live_action
            and prefix["stop_rank"] == live_stop,
            **_replay_columns("block", blocks, tokens),
            "block_needs_unrun_units": blocks["needs"] > 0,
            "block_unrun_needed": blocks["needs"],
            "agree": None if blocks["needs"] else prefix["action"] == blocks["action"],
        })
    return pl.DataFrame(rows, infer_schema_length=None)


def _replay_columns(name: str, r: Mapping[str, Any], tokens: Sequence[int]) -> dict[str, Any]:
    """One replay's columns (decision, stats, units and tokens used), prefixed by ``name``."""
    units = r["units"]
    return {f"{name}_{k}": r[k] for k in ("action", "stop_rank", "W", "L", "n_used",
                                           "e_plus", "units")} | {
        f"{name}_tokens": None if units is None else sum(tokens[:units])}


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
            return {"action": f"UNKNOWN (needs {needs} unrun units)", "stop_rank": None,
                    "W": test.state.W, "L": test.state.L, "n_used": test.state.n_used,
                    "e_plus": test.state.e_plus, "units": None, "needs": needs}
        decide = block is None or (rank + 1) % block == 0 or rank == n - 1
        test.consume(rank, pairs[rank], decide=decide)
    return _row(test.outcome(), 0)


def _row(o: TypeOutcome, needs: int) -> dict[str, Any]:
    return {"action": str(o.action), "stop_rank": o.stop_rank, "W": o.W, "L": o.L,
            "n_used": o.n_used, "e_plus": o.e_plus,
            "units": 0 if o.stop_rank is None else o.stop_rank + 1, "needs": needs}
