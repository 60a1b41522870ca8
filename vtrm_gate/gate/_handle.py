"""A gate running in the background of a Jupyter kernel's loop: `launch` and `GateHandle`."""

from __future__ import annotations

import asyncio
import sys
import time
from array import array
from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import replace
from typing import Any

from .._env import DEFAULT_CONCURRENCY
from .._sync import run_sync
from ..errors import is_whole, plain_number, shown
from ..stats import (
    GateParams,
)
from ._events import (
    EventStream,
    GateAborted,
    GateEvent,
    GateFinished,
    GateStarted,
    PrefixAdvanced,
    TypeDecided,
)
from ._plan import Infer, TypePlan
from ._result import GateResult
from ._scheduler import (
    _Gate,
    _new_gate,
    _TypeRun,
    run_gate,
)

HISTORY_LIMIT = 1_000
"""Events a `GateHandle` keeps whole (the newest); before them it keeps a summary."""


class GateHandle:
    """A gate running in the background of the current loop (a Jupyter kernel's, say).

    ``await handle`` (or ``handle.result()`` once done) for the `GateResult`;
    ``handle.cancel()`` stops it, and the result then has ``aborted`` set and the outcomes
    so far (``handle.partial()`` gives them at any time); ``handle.events()`` is an async
    iterator over every event, those already emitted included.

    Memory stays bounded however long the gate runs: the newest ``history_limit`` events are
    kept whole; older ones are kept as a summary that `history` and `events` replay in
    order: the gate's start and end, every decision, and every type's whole trajectory (each
    `PrefixAdvanced`, rebuilt from the type's test with its time; its ``base`` and ``cand``
    results are None). Older task events (started, finished, progress) are not replayed.
    """

    def __init__(self, gate: _Gate, history_limit: int = HISTORY_LIMIT) -> None:
        history_limit = plain_number(history_limit)
        if not is_whole(history_limit) or not 1 <= history_limit <= sys.maxsize:
            raise ValueError(f"history_limit must be an integer from 1 to {sys.maxsize} "
                             f"(sys.maxsize), got {shown(history_limit)}")
        self._gate = gate
        gate.bus.subscribe_inline(self._record)
        self._recent: deque[tuple[int, GateEvent]] = deque(maxlen=history_limit)
        self._kept: list[tuple[int, GateEvent]] = []  # start, decisions, end
        self._points: dict[str, array[float]] = {}  # per type: (seq, t) of each PrefixAdvanced
        self._seq = 0
        self._streams: list[EventStream] = []
        self.started_at = time.monotonic()
        self._cancel_requested = False
        self._running = False
        self.task: asyncio.Task[GateResult] = gate.loop.create_task(self._main())
        self.task.add_done_callback(self._end_streams)

    async def _main(self) -> GateResult:
        self._running = True
        if self._cancel_requested:  # cancelled before it first ran
            return await self._gate.abort_unstarted("cancelled before it started")
        try:
            return await self._gate.run()
        except asyncio.CancelledError:
            if self._cancel_requested:  # handle.cancel(): a result, not an exception
                return self._snapshot(running=False)
            raise

    def _record(self, ev: GateEvent) -> None:
        seq = self._seq = self._seq + 1
        self._recent.append((seq, ev))
        if isinstance(ev, PrefixAdvanced):
            self._points.setdefault(ev.task_type, array("d")).extend((seq, ev.t))
        elif isinstance(ev, GateStarted | TypeDecided | GateFinished | GateAborted):
            self._kept.append((seq, ev))
        for s in self._streams:
            s(ev)

    @property
    def history(self) -> list[GateEvent]:
        """Every event so far in order: the newest ``history_limit`` whole, the older ones
        as the summary described in the class docstring."""
        if self._seq <= len(self._recent):
            return [ev for _, ev in self._recent]
        oldest = self._recent[0][0]
        older = [(seq, ev) for seq, ev in self._kept if seq < oldest]
        for task_type, marks in self._points.items():
            run = self._gate.by_type[task_type]
            for j in range(0, len(marks), 2):
                if marks[j] >= oldest:
                    break
                older.append((int(marks[j]), _replayed(run, j // 2, marks[j + 1])))
        older.sort(key=lambda item: item[0])
        return [ev for _, ev in older] + [ev for _, ev in self._recent]

    def _end_streams(self, task: asyncio.Task[GateResult]) -> None:
        # a task cancelled from outside before it ran published nothing; end the iterators
        last = self._recent[-1][1] if self._recent else None
        if not isinstance(last, GateFinished | GateAborted):
            self._record(GateAborted(self._gate.now(), "cancelled"))
        self._streams.clear()

    def __await__(self) -> Generator[Any, None, GateResult]:
        return self._wait().__await__()

    async def _wait(self) -> GateResult:
        """The result. As awaiting any asyncio task: a waiter cancelled (Jupyter's Stop on
        ``await handle``, an ``asyncio.wait_for`` timeout) cancels the gate, so a stopped
        cell stops its calls; ``asyncio.wait([handle.task], timeout=...)`` waits without.
        A subscriber of this gate that awaits it (directly, in ``wait_for`` or ``gather``)
        is shielded: its cut-off at the gate's end must not cancel the gate it is part of
        (one awaiting ``handle.task`` passes the cut-off's marked cancel, which the gate
        undoes: `_to_the_end`)."""
        me = asyncio.current_task()
        inside = self._gate.bus.delivering()
        try:
            return await (asyncio.shield(self.task) if inside else self.task)
        except asyncio.CancelledError:
            if self.task.cancelled() and not (me and me.cancelling()):
                return self.partial()  # the gate was cancelled, not this await
            raise

    def done(self) -> bool:
        return self.task.done()

    def cancel(self) -> bool:
        """Stop the gate; in-flight calls are cancelled, finished results persisted."""
        if self.task.done():
            return False
        self._cancel_requested = True
        if self._running:
            self.task.cancel()
        return True

    def result(self) -> GateResult:
        """The result of a finished gate (raises `asyncio.InvalidStateError` while running)."""
        if self.task.cancelled():
            return self.partial()
        if not self.task.done():
            raise asyncio.InvalidStateError(
                "the gate is still running: await the handle for its result (or read "
                "handle.partial() for what has finished so far)")
        return self.task.result()

    def partial(self) -> GateResult:
        """The outcomes and counters so far (the final result once the gate has ended)."""
        return self._snapshot(running=not self.task.done())

    def _snapshot(self, running: bool) -> GateResult:
        g = self._gate
        if g.final is not None:
            return g.final
        res = g._result(aborted=g.aborted or ("cancelled" if self.task.cancelled() else None))
        return replace(res, outcomes=dict(res.outcomes),
                       counters={t: replace(c) for t, c in res.counters.items()},
                       running=running)

    def events(self) -> EventStream:
        """An async iterator: the `history` so far, then every new event to the end."""
        stream = EventStream()
        for ev in self.history:
            stream(ev)
        if not self.task.done():
            self._streams.append(stream)
        return stream

    def __repr__(self) -> str:
        g = self._gate
        decided = sum(r.frozen for r in g.runs)
        state = ("cancelling" if self._cancel_requested and not self.task.done() else
                 "running" if not self.task.done() else
                 "aborted" if (g.aborted or self.task.cancelled()) else "finished")
        elapsed = g.final.wall_time_s if g.final is not None else g.now() - g.t0
        return (f"<GateHandle {state}: {decided}/{len(g.runs)} types decided, "
                f"{g.n_in_flight} calls in flight, {elapsed:.1f} s elapsed>")


def launch(plans: Sequence[TypePlan], infer: Infer, params: GateParams | None = None,
           concurrency: int = DEFAULT_CONCURRENCY, *, history_limit: int = HISTORY_LIMIT,
           **kwargs: Any) -> GateHandle:
    """Start `run_gate` as a task on the running loop and return its handle at once.

    Needs a running event loop (a Jupyter cell, or inside a coroutine); in a script, call
    `run_gate_sync` instead. Bad input fails here, not later in the background.
    ``history_limit``: how many of the newest events the handle keeps whole (`GateHandle`).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            "launch() needs a running event loop (a Jupyter cell or a coroutine); in a "
            "script use vtrm_gate.run_gate_sync(...) (or asyncio.run(run_gate(...)))") from None
    return GateHandle(_new_gate(plans, infer, params, concurrency, **kwargs), history_limit)


def _replayed(run: _TypeRun, j: int, t: float) -> PrefixAdvanced:
    """The ``j``-th `PrefixAdvanced` of ``run`` again, from its test's trajectory."""
    p = run.test.points[j]
    return PrefixAdvanced(t, run.plan.task_type, run.plan.units[p.ladder_rank], p.ladder_rank,
                          None, None, p.d, p.W, p.L, p.n_used, p.e_plus, p.e_minus,
                          run.n - (j + 1), p.action)




def run_gate_sync(*args: Any, **kwargs: Any) -> GateResult:
    """`run_gate` for scripts and blocking Jupyter cells (see `vtrm_gate._sync`)."""
    return run_sync(run_gate(*args, **kwargs))
