"""A gate running in the background of a Jupyter kernel's loop: `launch` and `GateHandle`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .._sync import run_sync
from ..stats import (
    GateParams,
)
from ._events import (
    EventStream,
    GateAborted,
    GateEvent,
    GateFinished,
)
from ._plan import Infer, TypePlan
from ._result import GateResult
from ._scheduler import (
    _Gate,
    _new_gate,
    run_gate,
)


class GateHandle:
    """A gate running in the background of the current loop (a Jupyter kernel's, say).

    ``await handle`` (or ``handle.result()`` once done) for the `GateResult`;
    ``handle.cancel()`` stops it, and the result then has ``aborted`` set and the outcomes
    so far (``handle.partial()`` gives them at any time); ``handle.events()`` is an async
    iterator over every event, those already emitted included.
    """

    def __init__(self, gate: _Gate) -> None:
        self._gate = gate
        gate.bus.subscribe_first(self._record)
        self.history: list[GateEvent] = []
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
                return self.partial()
            raise

    def _record(self, ev: GateEvent) -> None:
        self.history.append(ev)
        for s in self._streams:
            s(ev)

    def _end_streams(self, task: asyncio.Task[GateResult]) -> None:
        # a task cancelled from outside before it ran published nothing; end the iterators
        if not any(isinstance(ev, GateFinished | GateAborted) for ev in self.history[-1:]):
            self._record(GateAborted(self._gate.now(), "cancelled"))
        self._streams.clear()

    def __await__(self):  # type: ignore[no-untyped-def]
        return self._wait().__await__()

    async def _wait(self) -> GateResult:
        try:
            return await self.task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self.task.cancelled() and not (current and current.cancelling()):
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
        return self.task.result()

    def partial(self) -> GateResult:
        """The outcomes and counters so far (the final result once the gate has ended)."""
        g = self._gate
        if g.final is not None:
            return g.final
        res = g._result(aborted=g.aborted or ("cancelled" if self.task.cancelled() else None))
        return replace(res, outcomes=dict(res.outcomes),
                       counters={t: replace(c) for t, c in res.counters.items()})

    def events(self) -> EventStream:
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
        return (f"<GateHandle {state}: {decided}/{len(g.runs)} types decided, "
                f"{g.n_in_flight} calls in flight, {g.now() - g.t0:.1f} s elapsed>")


def launch(plans: Sequence[TypePlan], infer: Infer, params: GateParams | None = None,
           concurrency: int = 32, **kwargs: Any) -> GateHandle:
    """Start `run_gate` as a task on the running loop and return its handle at once.

    Needs a running event loop (a Jupyter cell, or inside a coroutine); in a script, call
    `run_gate_sync` instead. Bad input fails here, not later in the background.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            "launch() needs a running event loop (a Jupyter cell or a coroutine); in a "
            "script use vtrm_gate.run_gate_sync(...) (or asyncio.run(run_gate(...)))") from None
    return GateHandle(_new_gate(plans, infer, params, concurrency, **kwargs))




def run_gate_sync(*args: Any, **kwargs: Any) -> GateResult:
    """`run_gate` for scripts and blocking Jupyter cells (see `vtrm_gate._sync`)."""
    return run_sync(run_gate(*args, **kwargs))
