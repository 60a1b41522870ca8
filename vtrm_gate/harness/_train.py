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
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._ids import EVAL_STEP, PROBATION_STEP
from .._sync import run_sync
from ..errors import (
    ConfigError,
    StepRefusedError,
    TrainRefusedError,
    WorkspaceError,
    is_whole,
    shown,
)
from ..gate import (
    Infer,
    Subscriber,
    hours,
)
from ..options import RunOptions
from ..stats import Action
from ._access import writer
from ._evaluate import (
    HELDOUT_FILE,
    EvalResult,
    evaluate_epoch,
    evaluation_summary,
    gain_text,
    read_heldout,
)
from ._files import write_json
from ._manifest import FORCE_ADVICE, check_agent_unchanged, diff_inputs, recorded_manifests
from ._order import TRAIN_FILE, train_record
from ._results import StepResult
from ._settle import ProbationResult, settle_probation
from ._status import StepStatus
from ._step import DEFAULT_OPTIONS, CaseSource, Evolver, never_accepted, run_step
from ._workspace import Workspace

PHASES = ("rollout", "evolution", "gate", "settlement", "evaluation")


Rollout = Callable[[int, int], Awaitable[Mapping[str, Sequence[str]]]]
"""``rollout(epoch, step) -> {type: error cases}``: a step's rollout, awaited before it."""


# ---- the run ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainEvent:
    """One line of training progress: a step, a settlement or an evaluation finished (or
    was found done by an earlier run)."""

    kind: str
    """step | settle | evaluate | resume | finished | notice (before the first step: a type
    no step can accept, `never_accepted`; no held-out split, so no evaluation)"""
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

        return Timed()

    def take_evolution(self) -> tuple[float, float]:
        """The step's evolution: its span, and its calls' summed time (one after another)."""
        spans, self.evolve_spans = self.evolve_spans, []
        serial = sum(e - s for s, e in spans)
        self.serial_evolution += serial
        return (max(e for _, e in spans) - min(s for s, _ in spans) if spans else 0.0), serial


def _train_config(steps_per_epoch: int, options: RunOptions, evaluate: bool,
                  ws: Workspace) -> dict[str, Any]:
    return json.loads(json.dumps({
        "steps_per_epoch": steps_per_epoch, **options.decision_inputs(),
        "evaluate": evaluate, "probation_rule": ws.config.probation_rule,
        "probation_units": ws.config.probation_units,
        "probation_min_w_net": ws.config.probation_min_w_net,
        # the agent as this run's backend made it (token limits, model, version): a resume
        # without a flag the run began with measured another agent, silently
        "agent": dict(ws.config.agent),
        # present only when not the default, so older train.json files compare equal
        **({"probation_order": ws.config.probation_order}
           if ws.config.probation_order != "shuffle" else {})}))


def _check_train_config(ws: Workspace, epochs: int, config: Mapping[str, Any]) -> bool:
    """Refuse a changed configuration; True when ``train.json`` is to be (re)written."""
    prior = train_record(ws)
    if prior is not None:
        mine = dict(config)
        if "agent" not in prior["config"]:  # a train.json from before the agent was recorded
            del mine["agent"]
        changes = diff_inputs(prior["config"], mine)
        if changes:
            raise TrainRefusedError(
                f"{ws.root}: the training configuration changed since the last run ("
                + "; ".join(changes) + "); run with the recorded configuration (train.json) "
                "or start a new workspace", changes)
        return bool(prior.get("epochs") != epochs)
    return True


def _check_positive(name: str, v: object) -> None:
    if not is_whole(v) or v < 1:
        raise ConfigError(f"{name} must be a positive integer, got {shown(v)}")


def _step_done(ws: Workspace, epoch: int, step: int) -> bool:
    """Applied, and its report says what was applied (Phase D finished writing); a step
    behind the last applied one that has no manifest never ran, and is refused."""
    last = ws.state.last_step
    if last is None or last < (epoch, step):
        return False
    if not ws.manifest_path(epoch, step).is_file():
        e, s = last
        raise TrainRefusedError(
            f"step e{epoch} s{step} never ran (no manifest) but later steps were applied (up "
            f"to e{e} s{s}); this run cannot go on in order: start a new workspace", [])
    if last > (epoch, step):
        return True
    return not ws.log.unapplied(epoch, step)


def _check_done_parts(ws: Workspace, steps_per_epoch: int, evaluate: bool) -> None:
    """What an earlier run left is read before ``train.json`` is written, so a refusal (an
    applied step without its manifest, a damaged ``evaluation`` row) writes nothing."""
    last = ws.state.last_step
    e, s = 1, 1
    while last is not None and (e, s) <= last:
        _step_done(ws, e, s)
        e, s = (e, s + 1) if s < steps_per_epoch else (e + 1, 1)
    if e in ws.state.settled_epochs and last is not None:  # settled by hand, fewer steps
        raise TrainRefusedError(
            f"train would run e{e} s{s} next, but epoch {e} was settled after "
            f"e{last[0]} s{last[1]}: train with --steps-per-epoch {last[1]} (the steps the "
            f"settled epoch had), or go on by hand from e{e + 1} s1", [])
    if evaluate:
        ws.log.frame("evaluation")


def _check_reach(ws: Workspace, epochs: int) -> None:
    """Refuse a run that would stop short of steps already applied (their bets would stay
    on probation)."""
    last = ws.state.last_step
    if last is not None and last[0] > epochs:
        raise TrainRefusedError(f"steps of epoch {last[0]} were applied (up to e{last[0]} "
                                f"s{last[1]}); --epochs must be at least {last[0]}", [])


def _check_nothing_pending(ws: Workspace, epochs: int) -> None:
    """The run ends with every bet settled (SPEC amendment); say so loudly if not."""
    left = sorted(t for t, p in ws.state.probation.items() if p.epoch <= epochs)
    if left:
        raise TrainRefusedError(f"{len(left)} types are still on probation after epoch "
                                f"{epochs} was settled ({', '.join(left)}): run vtrm-gate "
                                f"settle --epoch {epochs}", left)


def _step_line(res: StepResult, seconds: float, evolve_s: float) -> str:
    counts: dict[str, int] = {}
    for s in res.types.values():
        key = str(s.action) if s.action is not None else s.status
        counts[key] = counts.get(key, 0) + 1
    order = [*map(str, Action), *map(str, (StepStatus.SKIPPED, StepStatus.COOLDOWN,
                                            StepStatus.NO_CASES, StepStatus.EVOLVE_ERROR))]
    what = ", ".join(f"{k} {counts[k]}" for k in order if counts.get(k))
    changed = [f"{t} v{s.base_version}->v{s.version}" for t, s in sorted(res.types.items())
               if s.version != s.base_version]
    gate_s = res.gate.wall_time_s if res.gate else 0.0
    return (f"e{res.epoch} s{res.step}  {what or 'nothing gated'}  | gate {hours(gate_s)},"
            f" evolve {evolve_s / 60:.1f} min" + (f" | {', '.join(changed)}" if changed else ""))


def _settle_line(res: ProbationResult, seconds: float) -> str:
    if not res.outcomes:
        return f"e{res.epoch} settle  nothing on probation"
    parts = [f"{t}: {o.line}" for t, o in sorted(res.outcomes.items())]
    return f"e{res.epoch} settle  {'; '.join(parts)}  | {hours(seconds)}"


def _eval_line(res: EvalResult, seconds: float) -> str:
    s = evaluation_summary(res.rows)
    if s is None:
        return f"e{res.epoch} evaluate  no held-out units"
    return (f"e{res.epoch} evaluate  held-out accuracy {s['acc_current']:.1%} (initial skills "
            f"{s['acc_initial']:.1%}, {s['units']} units): {gain_text(s)}  | "
            f"{hours(seconds)}")


async def train(workspace: Workspace | str | Path, epochs: int, steps_per_epoch: int, *,
                infer: Infer, evolver: Evolver,
                cases: CaseSource | None = None, rollout: Rollout | None = None,
                options: RunOptions = DEFAULT_OPTIONS, evaluate: bool | None = None,
                subscribers: Iterable[Subscriber] = (),
                on_event: Callable[[TrainEvent], Any] | None = None,
                after: Callable[[Workspace], Any] | None = None) -> TrainResult:
    """Run (or resume) ``epochs`` x ``steps_per_epoch`` gate steps with epoch-end probation
    settlement and (``evaluate``, default: if a held-out split exists) evaluation.

    ``options`` (`RunOptions`) goes whole to every step, settlement and evaluation.
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
    with writer(workspace, "train", check_log=True) as ws:  # the lock, for the whole run
        recorded_manifests(ws)  # every manifest valid before the first step trusts one
        heldout = read_heldout(ws)
        if evaluate is None:
            evaluate = bool(heldout)
        if evaluate and not heldout:
            raise WorkspaceError(f"{ws.root}: evaluation needs a held-out split "
                                 f"({HELDOUT_FILE}, declared at init); run with "
                                 f"evaluate=False")
        _check_reach(ws, epochs)
        config = _train_config(steps_per_epoch, options, evaluate, ws)
        record = _check_train_config(ws, epochs, config)
        _check_done_parts(ws, steps_per_epoch, evaluate)
        if record:  # after every check: a refused run writes nothing
            write_json(ws.root / TRAIN_FILE, {"format": 1, "epochs": epochs, "config": config})
        if ws.stale_skills:
            ws.sync_skills()
        run = _Run(ws, infer, evolver, cases, rollout, options, tuple(subscribers), on_event)
        if not heldout:  # an --llm workspace's default: say it once, not by omission
            run.emit(TrainEvent("notice", 1, None, (
                f"note: {ws.root} declares no held-out split ({HELDOUT_FILE}): train does "
                f"not evaluate; init with --heldout-fraction 0.2 to measure each epoch")))
        for t, (most, need) in never_accepted(ws, options).items():
            run.emit(TrainEvent("notice", 1, None, (
                f"note: {t} has {len(ws.pool[t])} gate units, so at most {most} on a ladder "
                f"(a step leaves its error cases out); ACCEPT needs {need}: no step can "
                f"accept its candidates, it changes only through probation")))
        for e in range(1, epochs + 1):
            for s in range(1, steps_per_epoch + 1):
                await run.step(e, s)
            await run.settle(e)
            if evaluate:
                await run.evaluate(e)
        _check_nothing_pending(ws, epochs)
        if after is not None:
            after(ws)
        return run.finish(epochs, steps_per_epoch)


class _Run:
    """One ``train`` call's progress: what it ran, what it found done, time per phase."""

    def __init__(self, ws: Workspace, infer: Infer, evolver: Evolver,
                 cases: CaseSource | None, rollout: Rollout | None, options: RunOptions,
                 subscribers: tuple[Subscriber, ...],
                 on_event: Callable[[TrainEvent], Any] | None):
        self.ws, self.infer, self.cases, self.rollout = ws, infer, cases, rollout
        self.options, self.subscribers, self.on_event = options, subscribers, on_event
        self.clock = _PhaseClock()
        self.evolver = self.clock.wrap(evolver)
        self.events: list[TrainEvent] = []
        self.steps: dict[tuple[int, int], StepResult] = {}
        self.settlements: dict[int, ProbationResult] = {}
        self.evaluations: dict[int, EvalResult] = {}
        self.done_before = 0

    def emit(self, ev: TrainEvent) -> None:
        self.events.append(ev)
        if ev.done_before:
            self.done_before += 1
        if self.on_event is not None:
            self.on_event(ev)

    async def step(self, e: int, s: int) -> None:
        if _step_done(self.ws, e, s):
            self.emit(TrainEvent("step", e, s, f"e{e} s{s}  done before (not repeated)",
                                 done_before=True))
            return
        clock = self.clock
        t0 = clock.now()
        step_cases: Any = self.cases
        try:
            check_agent_unchanged(self.ws, e, s)  # before the rollout's calls, as step does
            if self.rollout is not None:
                step_cases = dict(await self.rollout(e, s))
            t1 = clock.now()
            clock.phases["rollout"] += t1 - t0
            res = await run_step(self.ws, e, s, infer=self.infer, evolver=self.evolver,
                                 cases=step_cases, options=self.options,
                                 subscribers=self.subscribers)
        except StepRefusedError as exc:  # train has no override: the step command has
            if FORCE_ADVICE not in str(exc):
                raise
            raise StepRefusedError(str(exc).replace(FORCE_ADVICE, (
                f"train has no override: re-run it with `vtrm-gate step --epoch {e} --step "
                f"{s} --force` and the settings you want, then train again")),
                exc.changes) from None
        evolve_s, serial_s = clock.take_evolution()
        gate_s = max(0.0, clock.now() - t1 - evolve_s)
        clock.phases["evolution"] += evolve_s
        clock.phases["gate"] += gate_s
        self.ws.log.record_timings(e, s, {"rollout": t1 - t0, "evolution": (evolve_s, serial_s),
                                          "gate": gate_s})
        self.steps[(e, s)] = res
        self.emit(TrainEvent("step", e, s, _step_line(res, clock.now() - t0, evolve_s),
                             clock.now() - t0, data=res))

    async def settle(self, e: int) -> None:
        if e in self.ws.state.settled_epochs:
            self.emit(TrainEvent("settle", e, None, f"e{e} settle  done before (not repeated)",
                                 done_before=True))
            return
        t0 = self.clock.now()
        pr = await settle_probation(self.ws, e, infer=self.infer, options=self.options,
                                    subscribers=self.subscribers)
        seconds = self.clock.now() - t0
        self.clock.phases["settlement"] += seconds
        self.ws.log.record_timings(e, PROBATION_STEP, {"settlement": seconds})
        self.settlements[e] = pr
        self.emit(TrainEvent("settle", e, None, _settle_line(pr, seconds), seconds, data=pr))

    async def evaluate(self, e: int) -> None:
        t0 = self.clock.now()
        ev = await evaluate_epoch(self.ws, e, infer=self.infer, options=self.options,
                                  subscribers=self.subscribers)
        seconds = self.clock.now() - t0
        if not ev.already_done:
            self.clock.phases["evaluation"] += seconds
            self.ws.log.record_timings(e, EVAL_STEP, {"evaluation": seconds})
        self.evaluations[e] = ev
        line = (f"e{e} evaluate  done before (not repeated)" if ev.already_done
                else _eval_line(ev, seconds))
        self.emit(TrainEvent("evaluate", e, None, line, seconds, ev.already_done, data=ev))

    def finish(self, epochs: int, steps_per_epoch: int) -> TrainResult:
        result = TrainResult(epochs, steps_per_epoch, self.steps, self.settlements,
                             self.evaluations, dict(self.clock.phases), self.done_before,
                             tuple(self.events), self.clock.serial_evolution)
        self.emit(TrainEvent("finished", epochs, None,
                             f"finished {epochs} epochs x {steps_per_epoch} steps "
                             f"({self.done_before} parts done before) in "
                             f"{result.total_s / 3600:.2f} h of loop clock",
                             result.total_s, data=result))
        return result


def train_sync(*args: Any, **kwargs: Any) -> TrainResult:
    """`train` for scripts and blocking Jupyter cells."""
    return run_sync(train(*args, **kwargs))


def train_started(ws: Workspace) -> dict[str, Any] | None:
    """The recorded training configuration (``train.json``), or None before the first run."""
    return train_record(ws)




