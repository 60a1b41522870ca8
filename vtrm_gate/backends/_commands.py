"""Step, train and settle a workspace with its own agent: the one code path that the
``vtrm-gate`` commands and the Python API share (`open_backend`, then the harness).

The async functions run in the caller's loop (``await`` them in a Jupyter cell); the
``*_sync`` wrappers pick the clock: the simulator's virtual clock for a simulated workspace
without ``time_scale``, else real time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .._sync import run_sync
from ..gate import Subscriber
from ..harness import (
    ProbationResult,
    TrainEvent,
    TrainResult,
    Workspace,
    check_agent_unchanged,
    evaluation_summary,
    loop_clock,
    run_step,
    settle_probation,
    train,
    workspace_lock,
)
from ..llm import AgentEvent
from ..options import RunOptions
from ..sim import (
    SimConfig,
    init_simulated,
    record_ground_truth,
    run_virtual,
    training_summary,
)
from ._open import Backend, open_backend, uses_virtual_clock

T = TypeVar("T")
DEFAULT_OPTIONS = RunOptions()


@dataclass(frozen=True)
class WorkspaceRun:
    """What a command did: the harness's result, the backend's counters, and (training on
    a simulated workspace) the summary against the ground truth."""

    result: Any
    kind: str
    options: RunOptions
    report: Mapping[str, Any] = field(default_factory=dict)
    summary: Mapping[str, Any] | None = None
    clock: str = "real"
    """The loop's clock the command ran on (`loop_clock`): its times are simulated only when
    ``virtual``."""


def _opened(workspace: Workspace | str | Path) -> tuple[Workspace, bool]:
    if isinstance(workspace, Workspace):
        return workspace, False
    return Workspace.open(Path(workspace)), True


def _report(be: Backend) -> dict[str, Any]:
    return be.report() if be.report is not None else {}


async def step_workspace(workspace: Workspace | str | Path, epoch: int, step: int,
                         options: RunOptions = DEFAULT_OPTIONS, *, force: bool = False,
                         subscribers: Iterable[Subscriber] = (),
                         on_agent_event: Callable[[AgentEvent], Any] | None = None,
                         command: str | None = None) -> WorkspaceRun:
    """Run (or re-run) step ``(epoch, step)``: the agent opens (refusing a bad setting before
    anything is written), then the rollout (its evolution cases) and `run_step` under one
    hold of the writer lock (the rollout reads the state the step replaces)."""
    ws, mine = _opened(workspace)
    try:
        # The agent opens (and refuses a bad setting) before the lock file is written.
        async with open_backend(ws, options, on_agent_event=on_agent_event) as be:
            with workspace_lock(ws.root, command or f"step e{epoch} s{step}"):
                ws.reload_state()
                check_agent_unchanged(ws, epoch, step, force)  # before the rollout's calls
                res = await run_step(ws, epoch, step, infer=be.infer, evolver=be.evolver,
                                     cases=await be.step_cases(epoch, step),
                                     cache_stats=be.cache_stats, options=be.options,
                                     force=force, subscribers=subscribers)
            return WorkspaceRun(res, be.kind, be.options, _report(be), clock=loop_clock())
    finally:
        if mine:
            ws.close()


async def train_workspace(workspace: Workspace | str | Path, epochs: int, steps_per_epoch: int,
                          options: RunOptions = DEFAULT_OPTIONS, *,
                          evaluate: bool | None = None,
                          subscribers: Iterable[Subscriber] = (),
                          on_event: Callable[[TrainEvent], Any] | None = None,
                          on_agent_event: Callable[[AgentEvent], Any] | None = None,
                          command: str = "train") -> WorkspaceRun:
    """Run (or resume) a training run (`vtrm_gate.harness.train`) with the workspace's
    agent (opened first, then the writer lock for the whole run); on a simulated workspace
    the ground truth is recorded and summarised."""
    ws, mine = _opened(workspace)
    try:
        async with open_backend(ws, options, on_agent_event=on_agent_event) as be:
            with workspace_lock(ws.root, command):
                ws.reload_state()
                return await _train(ws, epochs, steps_per_epoch, be, evaluate, subscribers,
                                    on_event)
    finally:
        if mine:
            ws.close()


async def _train(ws: Workspace, epochs: int, steps_per_epoch: int, be: Backend,
                 evaluate: bool | None, subscribers: Iterable[Subscriber],
                 on_event: Callable[[TrainEvent], Any] | None) -> WorkspaceRun:
    world = be.world
    res = await train(ws, epochs, steps_per_epoch, infer=be.infer, evolver=be.evolver,
                      rollout=be.rollout, cases=be.cases, options=be.options,
                      evaluate=evaluate, subscribers=subscribers, on_event=on_event,
                      after=None if world is None else lambda w: record_ground_truth(w, world))
    clock = loop_clock()
    summary = (training_summary(ws, world, res) | {"evaluation": last_evaluation(res)}
               if world is not None else plain_summary(res)) | {"clock": clock}
    if clock == "real":  # the old gate's hours are simulated: no ratio with real seconds
        summary = {k: v for k, v in summary.items() if k not in ("old_phases_s", "old_total_s")}
    return WorkspaceRun(res, be.kind, be.options, _report(be), summary, clock)


def plain_summary(res: TrainResult) -> dict[str, Any]:
    """A training run's summary without ground truth: sizes, loop-clock time per phase and
    the last epoch's held-out gain with its intervals."""
    return {"epochs": res.epochs, "steps_per_epoch": res.steps_per_epoch,
            "done_before": res.done_before, "v3_phases_s": dict(res.phases),
            "v3_total_s": res.total_s, "evaluation": last_evaluation(res)}


def last_evaluation(res: TrainResult) -> dict[str, Any] | None:
    """`evaluation_summary` of the last evaluated epoch (None without evaluation)."""
    if not res.evaluations:
        return None
    return evaluation_summary(res.evaluations[max(res.evaluations)].rows)


async def settle_workspace(workspace: Workspace | str | Path, epoch: int,
                           options: RunOptions = DEFAULT_OPTIONS, *,
                           subscribers: Iterable[Subscriber] = (),
                           on_agent_event: Callable[[AgentEvent], Any] | None = None
                           ) -> WorkspaceRun:
    """Settle epoch ``epoch``'s probation (`vtrm_gate.harness.settle_probation`)."""
    ws, mine = _opened(workspace)
    try:
        async with open_backend(ws, options, on_agent_event=on_agent_event) as be:
            with workspace_lock(ws.root, f"settle e{epoch}"):
                res: ProbationResult = await settle_probation(
                    ws, epoch, infer=be.infer, options=be.options, subscribers=subscribers)
            return WorkspaceRun(res, be.kind, be.options, _report(be), clock=loop_clock())
    finally:
        if mine:
            ws.close()


# ---- sync wrappers: the clock is chosen here, once ----------------------------------------


def run_on_clock(workspace: Workspace | str | Path, options: RunOptions,
                 make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``make()`` on the virtual clock (simulated, no ``time_scale``) or on real time."""
    ws, mine = _opened(workspace)
    try:
        virtual = uses_virtual_clock(ws, options)
    finally:
        if mine:
            ws.close()
    return run_virtual(make()) if virtual else run_sync(make())


def step_workspace_sync(workspace: Workspace | str | Path, epoch: int, step: int,
                        options: RunOptions = DEFAULT_OPTIONS, **kwargs: Any) -> WorkspaceRun:
    """`step_workspace` for scripts and blocking cells, on the workspace's clock."""
    return run_on_clock(workspace, options,
                        lambda: step_workspace(workspace, epoch, step, options, **kwargs))


def train_workspace_sync(workspace: Workspace | str | Path, epochs: int, steps_per_epoch: int,
                         options: RunOptions = DEFAULT_OPTIONS, **kwargs: Any) -> WorkspaceRun:
    """`train_workspace` for scripts and blocking cells, on the workspace's clock."""
    return run_on_clock(workspace, options, lambda: train_workspace(
        workspace, epochs, steps_per_epoch, options, **kwargs))


def settle_workspace_sync(workspace: Workspace | str | Path, epoch: int,
                          options: RunOptions = DEFAULT_OPTIONS, **kwargs: Any) -> WorkspaceRun:
    """`settle_workspace` for scripts and blocking cells, on the workspace's clock."""
    return run_on_clock(workspace, options,
                        lambda: settle_workspace(workspace, epoch, options, **kwargs))


def run_simulated_training(path: str | Path, sim_config: SimConfig, epochs: int,
                           steps_per_epoch: int, options: RunOptions = DEFAULT_OPTIONS, *,
                           heldout_fraction: float = 0.2,
                           on_event: Callable[[TrainEvent], Any] | None = None,
                           **config: Any) -> tuple[Workspace, TrainResult, dict[str, Any]]:
    """Create a simulated workspace at ``path`` and train it on the virtual clock (seconds of
    wall time); returns (workspace, `TrainResult`, training summary). ``config`` sets
    `WorkspaceConfig` fields such as ``probation_rule``."""
    ws = init_simulated(path, dataclasses.replace(sim_config, time_scale=1.0),
                        heldout_fraction=heldout_fraction, **config)
    run = train_workspace_sync(ws, epochs, steps_per_epoch, options, on_event=on_event)
    assert run.summary is not None
    return ws, run.result, dict(run.summary)

