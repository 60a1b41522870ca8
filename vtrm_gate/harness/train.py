"""The training run: epochs of gate steps, epoch-end probation settlement and evaluation,
resumable after a crash anywhere.

``train(ws, epochs, steps_per_epoch, ...)`` walks (e1 s1 .. e1 sS, settle e1, evaluate e1,
e2 s1, ...) and does only what is not done yet: a step is done when ``state.json`` has applied
it (and its report rows say what was applied), a settlement when its epoch is in
``settled_epochs``, an evaluation when its rows are in the ``evaluation`` table (written in one
transaction). Each of those is one atomic checkpoint, and every step is re-runnable from its
manifest and the caches, so killing the run at any instant and running it again ends in the
state an uninterrupted run reaches. The run's configuration is recorded in ``train.json``; a
resume with another configuration is refused with the list of changes (``epochs`` may change:
it only says how far to go). The workspace lock is held for the whole run.

The evaluation (optional; on when the workspace declares a held-out split, ``heldout.json``)
runs every type's current skill against its initial skill on units never used for ladders,
rollouts or probes, through the same slot pool and BaselineCache: the training curve.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._sync import run_sync
from ..scheduler import (
    GateResult,
    GuardParams,
    Infer,
    Subscriber,
    TypePlan,
    UnitResult,
    UnitTask,
)
from ..stats import Action, GateParams, GateState, Pair, update_state
from .baseline import BaselineCache
from .step import (
    DEFAULT_PARAMS,
    CaseSource,
    Evolver,
    ProbationResult,
    StepRefusedError,
    StepResult,
    _diff,
    _plain,
    _writer,
    counting_infra_aborts,
    run_step,
    settle_probation,
)
from .workspace import Workspace, WorkspaceError, read_json, write_json

if TYPE_CHECKING:
    import polars as pl

EVAL_STEP = -1
"""Evaluation predictions are logged at step -1 of their epoch (run ids ``eE_eval_gate_*``)."""
HELDOUT_FILE = "heldout.json"
TRAIN_FILE = "train.json"
PHASES = ("rollout", "evolution", "gate", "settlement", "evaluation")

Rollout = Callable[[int, int], Awaitable[Mapping[str, Sequence[str]]]]
"""``rollout(epoch, step) -> {type: error cases}``: a step's rollout, awaited before it."""


class TrainRefusedError(StepRefusedError):
    """The run may not go on as asked (its configuration changed since the last run)."""


# ---- held-out split ---------------------------------------------------------------------


def read_heldout(ws: Workspace) -> dict[str, list[str]]:
    """The workspace's held-out split ``{type: [unit ids]}`` (empty if none was declared).

    Validated: known types, unit ids not in the type's pool (never used for ladders,
    rollouts or probes), no duplicates.
    """
    path = ws.root / HELDOUT_FILE
    if not path.is_file():
        return {}
    raw = read_json(path, ws.root)
    if not isinstance(raw, dict):
        raise WorkspaceError(f"{HELDOUT_FILE}: must be an object {{type: [unit ids]}}")
    out: dict[str, list[str]] = {}
    for t, us in raw.items():
        if t not in ws.pool:
            raise WorkspaceError(f"{HELDOUT_FILE}: type {t!r} is not in pool.json")
        if not isinstance(us, list) or not all(isinstance(u, str) for u in us) \
                or len(set(us)) != len(us):
            raise WorkspaceError(f"{HELDOUT_FILE}: {t!r} must be a list of distinct unit ids")
        clash = sorted(set(us) & set(ws.pool[t]))
        if clash:
            raise WorkspaceError(f"{HELDOUT_FILE}: {t!r} units {clash[:3]} are also in "
                                 f"pool.json; held-out units must never be gated")
        out[t] = list(us)
    return out


# ---- evaluation ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MeasureAll:
    """A decision rule that never stops early: every held-out unit is measured."""

    def update(self, state: GateState, pair: Pair, params: GateParams) -> GateState:
        return update_state(state, pair, params)

    def decide(self, state: GateState, n_remaining: int, params: GateParams) -> Action:
        return Action.CONTINUE if n_remaining else Action.INERTIA


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
                         params: GateParams = DEFAULT_PARAMS, concurrency: int = 32,
                         guard: GuardParams | None = None,
                         subscribers: Iterable[Subscriber] = ()) -> EvalResult:
    """Measure every type's current skill and its initial skill (v1) on the held-out split,
    through the continuous gate (one slot pool, BaselineCache for the initial skill)."""
    with _writer(workspace, f"evaluate e{epoch}") as ws:
        return await _evaluate(ws, epoch, infer, params, concurrency, guard, subscribers)


def _eval_rows(ws: Workspace, epoch: int) -> tuple[dict[str, Any], ...]:
    df = ws.log.frame("evaluation", "epoch = ?", (epoch,))
    return tuple(df.sort("task_type").to_dicts())


async def _evaluate(ws: Workspace, epoch: int, infer: Infer, params: GateParams,
                    concurrency: int, guard: GuardParams | None,
                    subscribers: Iterable[Subscriber]) -> EvalResult:
    from ..scheduler import run_gate

    heldout = read_heldout(ws)
    if ws.log.count("evaluation", "epoch = ?", (epoch,)):
        return EvalResult(epoch, _eval_rows(ws, epoch), already_done=True)
    srid = f"e{epoch}_eval"
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
    if longest > params.n_max:
        params = dataclasses.replace(params, n_max=longest)
    sink = _EvalSink(ws, epoch)
    with counting_infra_aborts(ws, epoch, EVAL_STEP):
        gate = await run_gate(plans, infer, params, concurrency,
                              baseline=BaselineCache.for_workspace(ws), sink=sink,
                              subscribers=subscribers, guard=guard)
    rows = []
    for p in plans:
        t = p.task_type
        ni, ci = sink.correct.get((t, "base"), [0, 0])
        nc, cc = sink.correct.get((t, "cand"), [0, 0])
        rows.append((epoch, t, state.skills[t].version, state.skills[t].hash, len(p.units),
                     ni, ci, nc, cc, ci / ni if ni else None, cc / nc if nc else None))
    ws.log.upsert("evaluation", rows)  # one transaction: the evaluation's checkpoint
    return EvalResult(epoch, _eval_rows(ws, epoch), gate)


# ---- the run ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainEvent:
    """One line of training progress: a step, a settlement or an evaluation finished (or
    was found done by an earlier run)."""

    kind: str
    """step | settle | evaluate | resume | finished"""
    epoch: int
    step: int | None
    line: str
    seconds: float = 0.0
    """Loop-clock duration (virtual seconds under the simulator's virtual clock)."""
    done_before: bool = False
    data: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class TrainResult:
    """What one ``train`` call did (and found done), with loop-clock time per phase."""

    epochs: int
    steps_per_epoch: int
    steps: Mapping[tuple[int, int], StepResult]
    settlements: Mapping[int, ProbationResult]
    evaluations: Mapping[int, EvalResult]
    phases: Mapping[str, float]
    done_before: int
    """Steps, settlements and evaluations an earlier run had finished (not repeated)."""
    events: tuple[TrainEvent, ...] = ()
    serial_evolution_s: float = 0.0
    """The evolver calls' summed time: what evolving the types one after another costs."""

    @property
    def total_s(self) -> float:
        return sum(self.phases.values())


class _PhaseClock:
    """Loop-clock time per phase; evolution is timed from the evolver's own calls."""

    def __init__(self) -> None:
        self.phases = dict.fromkeys(PHASES, 0.0)
        self.evolve_spans: list[tuple[float, float]] = []
        self.serial_evolution = 0.0

    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()

    def wrap(self, evolver: Evolver) -> Evolver:
        clock = self

        class Timed:
            world = getattr(evolver, "world", None)

            async def evolve(self, *args: Any, **kwargs: Any) -> str:
                t0 = clock.now()
                try:
                    return await evolver.evolve(*args, **kwargs)
                finally:
                    clock.evolve_spans.append((t0, clock.now()))

        return Timed()  # type: ignore[return-value]

    def take_evolution(self) -> float:
        spans, self.evolve_spans = self.evolve_spans, []
        self.serial_evolution += sum(e - s for s, e in spans)
        return max(e for _, e in spans) - min(s for s, _ in spans) if spans else 0.0


def _train_config(steps_per_epoch: int, params: GateParams, guard: GuardParams,
                  evaluate: bool, ws: Workspace) -> dict[str, Any]:
    return json.loads(json.dumps({
        "steps_per_epoch": steps_per_epoch, "params": _plain(params), "guard": _plain(guard),
        "evaluate": evaluate, "probation_rule": ws.config.probation_rule,
        "probation_units": ws.config.probation_units,
        "probation_min_w_net": ws.config.probation_min_w_net}))


def _check_train_config(ws: Workspace, epochs: int, config: Mapping[str, Any]) -> None:
    path = ws.root / TRAIN_FILE
    if path.is_file():
        prior = read_json(path, ws.root)
        changes = _diff(prior.get("config", {}), dict(config)) if isinstance(prior, dict) \
            else ["train.json: malformed"]
        if changes:
            raise TrainRefusedError(
                f"{ws.root}: the training configuration changed since the last run ("
                + "; ".join(changes) + "); run with the recorded configuration (train.json) "
                "or start a new workspace", changes)
        if prior.get("epochs") == epochs:
            return
    write_json(path, {"format": 1, "epochs": epochs, "config": dict(config)})


def _check_positive(name: str, v: object) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be a positive integer, got {v!r}")


def _step_done(ws: Workspace, epoch: int, step: int) -> bool:
    """Applied, and its report says what was applied (Phase D finished writing)."""
    last = ws.state.last_step
    if last is None or last < (epoch, step):
        return False
    if last > (epoch, step):
        return True
    return not ws.log.count("step_report", "epoch = ? AND step = ? AND status = 'gated' AND "
                                           "applied IS NULL", (epoch, step))


def _step_line(res: StepResult, seconds: float, evolve_s: float) -> str:
    counts: dict[str, int] = {}
    for s in res.types.values():
        key = str(s.action) if s.action is not None else s.status
        counts[key] = counts.get(key, 0) + 1
    order = [str(a) for a in Action] + ["skipped", "cooldown", "no_cases", "evolve_error"]
    what = ", ".join(f"{k} {counts[k]}" for k in order if counts.get(k))
    changed = [f"{t} v{s.base_version}->v{s.version}" for t, s in sorted(res.types.items())
               if s.version != s.base_version]
    gate_s = res.gate.wall_time_s if res.gate else 0.0
    return (f"e{res.epoch} s{res.step}  {what or 'nothing gated'}  | gate {gate_s / 3600:.2f} h,"
            f" evolve {evolve_s / 60:.1f} min" + (f" | {', '.join(changed)}" if changed else ""))


def _settle_line(res: ProbationResult, seconds: float) -> str:
    if not res.outcomes:
        return f"e{res.epoch} settle  nothing on probation"
    parts = [f"{t}: {'kept' if o.passed else 'rolled back'} v{o.version} "
             f"(W-L {o.W - o.L} on {o.n_used})" for t, o in sorted(res.outcomes.items())]
    return f"e{res.epoch} settle  {'; '.join(parts)}  | {seconds / 3600:.2f} h"


def _eval_line(res: EvalResult, seconds: float) -> str:
    rows = [r for r in res.rows if r["acc_current"] is not None]
    if not rows:
        return f"e{res.epoch} evaluate  no held-out units"
    cur = sum(r["correct_current"] for r in rows) / max(1, sum(r["n_current"] for r in rows))
    ini = sum(r["correct_initial"] for r in rows) / max(1, sum(r["n_initial"] for r in rows))
    return (f"e{res.epoch} evaluate  held-out accuracy {cur:.1%} (initial skills {ini:.1%}, "
            f"{sum(r['n_units'] for r in rows)} units)  | {seconds / 3600:.2f} h")


async def train(workspace: Workspace | str | Path, epochs: int, steps_per_epoch: int, *,
                infer: Infer, evolver: Evolver,
                cases: CaseSource | None = None, rollout: Rollout | None = None,
                params: GateParams = DEFAULT_PARAMS, concurrency: int = 32,
                guard: GuardParams | None = None, evaluate: bool | None = None,
                subscribers: Iterable[Subscriber] = (),
                on_event: Callable[[TrainEvent], Any] | None = None,
                after: Callable[[Workspace], Any] | None = None) -> TrainResult:
    """Run (or resume) ``epochs`` x ``steps_per_epoch`` gate steps with epoch-end probation
    settlement and (``evaluate``, default: if a held-out split exists) evaluation.

    ``rollout(epoch, step)`` (awaited before each step, timed as the rollout phase) or
    ``cases`` give the steps' evolution cases. ``on_event`` gets a `TrainEvent` per step,
    settlement and evaluation; ``subscribers`` get every gate event. ``after(ws)`` runs at the
    end (e.g. recording the simulator's ground truth; it must be idempotent). Raises
    `TrainRefusedError` if the configuration changed since the last run, ValueError on
    non-positive sizes, `WorkspaceLockedError` if another process holds the workspace, and
    re-raises `InfraGuardError` with every finished step and settlement kept.
    """
    _check_positive("epochs", epochs)
    _check_positive("steps_per_epoch", steps_per_epoch)
    with _writer(workspace, "train") as ws:  # the writer lock, for the whole run
        return await _train(ws, epochs, steps_per_epoch, infer=infer, evolver=evolver,
                            cases=cases, rollout=rollout, params=params,
                            concurrency=concurrency, guard=guard or GuardParams(),
                            evaluate=evaluate, subscribers=tuple(subscribers),
                            on_event=on_event, after=after)


async def _train(ws: Workspace, epochs: int, steps_per_epoch: int, *, infer: Infer,
                 evolver: Evolver, cases: CaseSource | None, rollout: Rollout | None,
                 params: GateParams, concurrency: int, guard: GuardParams,
                 evaluate: bool | None, subscribers: tuple[Subscriber, ...],
                 on_event: Callable[[TrainEvent], Any] | None,
                 after: Callable[[Workspace], Any] | None) -> TrainResult:
    heldout = read_heldout(ws)
    if evaluate is None:
        evaluate = bool(heldout)
    if evaluate and not heldout:
        raise WorkspaceError(f"{ws.root}: evaluation needs a held-out split ({HELDOUT_FILE}, "
                             f"declared at init); run with evaluate=False")
    _check_train_config(ws, epochs, _train_config(steps_per_epoch, params, guard, evaluate, ws))
    if ws.stale_skills:
        ws.sync_skills()
    clock = _PhaseClock()
    timed = clock.wrap(evolver)
    events: list[TrainEvent] = []
    steps: dict[tuple[int, int], StepResult] = {}
    settlements: dict[int, ProbationResult] = {}
    evaluations: dict[int, EvalResult] = {}
    done_before = 0

    def emit(ev: TrainEvent) -> None:
        events.append(ev)
        if on_event is not None:
            on_event(ev)

    common = {"params": params, "concurrency": concurrency, "guard": guard,
              "subscribers": subscribers}
    for e in range(1, epochs + 1):
        for s in range(1, steps_per_epoch + 1):
            if _step_done(ws, e, s):
                done_before += 1
                emit(TrainEvent("step", e, s, f"e{e} s{s}  done before (not repeated)",
                                done_before=True))
                continue
            t0 = clock.now()
            step_cases: Any = cases
            if rollout is not None:
                step_cases = dict(await rollout(e, s))
            t1 = clock.now()
            clock.phases["rollout"] += t1 - t0
            res = await run_step(ws, e, s, infer=infer, evolver=timed, cases=step_cases,
                                 **common)
            evolve_s = clock.take_evolution()
            clock.phases["evolution"] += evolve_s
            clock.phases["gate"] += max(0.0, clock.now() - t1 - evolve_s)
            steps[(e, s)] = res
            emit(TrainEvent("step", e, s, _step_line(res, clock.now() - t0, evolve_s),
                            clock.now() - t0, data=res))
        if e in ws.state.settled_epochs:
            done_before += 1
            emit(TrainEvent("settle", e, None, f"e{e} settle  done before (not repeated)",
                            done_before=True))
        else:
            t0 = clock.now()
            pr = await settle_probation(ws, e, infer=infer, **common)
            clock.phases["settlement"] += clock.now() - t0
            settlements[e] = pr
            emit(TrainEvent("settle", e, None, _settle_line(pr, clock.now() - t0),
                            clock.now() - t0, data=pr))
        if evaluate:
            t0 = clock.now()
            ev = await evaluate_epoch(ws, e, infer=infer, **common)
            if ev.already_done:
                done_before += 1
            else:
                clock.phases["evaluation"] += clock.now() - t0
            evaluations[e] = ev
            emit(TrainEvent("evaluate", e, None,
                            f"e{e} evaluate  done before (not repeated)" if ev.already_done
                            else _eval_line(ev, clock.now() - t0), clock.now() - t0,
                            ev.already_done, data=ev))
    if after is not None:
        after(ws)
    result = TrainResult(epochs, steps_per_epoch, steps, settlements, evaluations,
                         dict(clock.phases), done_before, tuple(events),
                         clock.serial_evolution)
    emit(TrainEvent("finished", epochs, None,
                    f"finished {epochs} epochs x {steps_per_epoch} steps ({done_before} parts "
                    f"done before) in {result.total_s / 3600:.2f} h of loop clock",
                    result.total_s, data=result))
    return result


def train_sync(*args: Any, **kwargs: Any) -> TrainResult:
    """`train` for scripts and blocking Jupyter cells."""
    return run_sync(train(*args, **kwargs))


def train_started(ws: Workspace) -> dict[str, Any] | None:
    """The recorded training configuration (``train.json``), or None before the first run."""
    path = ws.root / TRAIN_FILE
    return read_json(path, ws.root) if path.is_file() else None


