"""The continuous gate as every harness phase runs it (step, settlement, evaluation): one
place maps `RunOptions` onto `run_gate`, counts INFRA-guard aborts, and reports aborts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import InfraGuardError, described
from ..gate import GateResult, Infer, ResultSink, Subscriber, TypeCounters, TypePlan, run_gate
from ..options import RunOptions
from ..stats import GateParams, TypeOutcome, decision_rule
from ._baseline import BaselineCache
from ._files import join_notes
from ._status import StepStatus
from ._workspace import Workspace


async def run_workspace_gate(ws: Workspace, epoch: int, step: int, plans: Sequence[TypePlan],
                             infer: Infer, options: RunOptions, *, sink: ResultSink,
                             subscribers: Iterable[Subscriber] = (),
                             params: GateParams | None = None) -> GateResult:
    """`run_gate` with the workspace's BaselineCache and every gate option of ``options``
    (``params`` overrides ``options.gate``: the evaluation measures a split longer than a
    ladder may be). An INFRA-guard abort is counted in the log before it propagates, so the
    next attempt's tasks carry ``attempt`` + 1 (see `UnitTask.attempt`)."""
    rule = (None if options.decision_rule == "paired_betting"
            else decision_rule(options.decision_rule))  # plans with their own rule keep it
    try:
        return await run_gate(plans, infer, params or options.gate, options.slots,
                              baseline=BaselineCache.for_workspace(ws), sink=sink,
                              subscribers=subscribers, guard=options.guard, rule=rule,
                              dispatch=options.dispatch,
                              cancel_after_freeze=options.cancel_after_freeze,
                              past_stop=options.past_stop)
    except InfraGuardError as exc:
        ws.log.record_infra_abort(epoch, step, str(exc))
        raise


def report_aborted(ws: Workspace, epoch: int, step: int, types: Sequence[str],
                   extra: Mapping[str, Mapping[str, Any]], reason: str,
                   outcomes: Mapping[str, TypeOutcome],
                   counters: Mapping[str, TypeCounters]) -> None:
    """Mark every gated type's report ``aborted`` (with what was done); state is untouched."""
    for t in types:
        row = {**extra[t], "note": join_notes(reason, extra[t].get("note"))}
        ws.log.write_report(epoch, step, t, StepStatus.ABORTED, outcome=outcomes.get(t),
                            counters=counters.get(t), **row)


def abort_reason(exc: BaseException) -> str:
    """One line for a gate that ended in ``exc`` (a guard abort quotes itself)."""
    if isinstance(exc, InfraGuardError):
        return str(exc)
    return described(exc).rstrip(": ")


def partial_of(exc: BaseException, sink_outcomes: Mapping[str, TypeOutcome]
               ) -> tuple[Mapping[str, TypeOutcome], Mapping[str, TypeCounters]]:
    """What an aborted gate had done: the guard's partial result, else the sink's outcomes."""
    part = exc.partial if isinstance(exc, InfraGuardError) else None
    return (part.outcomes, part.counters) if part else (sink_outcomes, {})
