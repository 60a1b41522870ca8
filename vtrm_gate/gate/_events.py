"""Gate events for notebooks and CLIs, delivered off the scheduler's path: callbacks, an async
iterator, and `report_progress` for an ``infer`` to describe its own call.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import warnings
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..stats import (
    Action,
    GateParams,
    TypeOutcome,
)
from ._plan import UnitResult, UnitTask

if TYPE_CHECKING:
    from ._result import GateResult


@dataclass(frozen=True)
class GateEvent:
    """Base of all events; ``t`` is the event loop's clock (virtual under looptime)."""

    t: float


@dataclass(frozen=True)
class GateStarted(GateEvent):
    task_types: tuple[str, ...]
    ladder_sizes: tuple[int, ...]
    concurrency: int
    params: GateParams


@dataclass(frozen=True)
class TaskStarted(GateEvent):
    task: UnitTask
    in_flight: int


@dataclass(frozen=True)
class TaskFinished(GateEvent):
    task: UnitTask
    result: UnitResult
    status: Literal["pending", "discarded", "cache_hit", "cancelled"]


@dataclass(frozen=True)
class TaskProgress(GateEvent):
    """What an in-flight call reports about itself (e.g. an LLM agent ``retrying``)."""

    task: UnitTask
    status: str
    info: dict[str, Any]


# Set inside each inference call's own asyncio task, so `report_progress` reaches the gate
# that started the call (and nothing else): context-scoped, never shared between gates.
_PROGRESS: contextvars.ContextVar[Callable[[str, dict[str, Any]], None] | None] = (
    contextvars.ContextVar("vtrm_gate_progress", default=None))


def report_progress(status: str, /, **info: Any) -> bool:
    """From inside ``infer``: publish a `TaskProgress` event for the running call.

    A no-op (returning False) outside a gate, so backends may call it unconditionally.
    """
    sink = _PROGRESS.get()
    if sink is None:
        return False
    sink(status, info)
    return True


@dataclass(frozen=True)
class PrefixAdvanced(GateEvent):
    """A unit was consumed at the prefix; the stats after it and the rule's verdict."""

    task_type: str
    unit_id: str
    ladder_rank: int
    base: UnitResult | None
    cand: UnitResult | None
    d: int | None
    W: int
    L: int
    n_used: int
    e_plus: float
    e_minus: float
    n_remaining: int
    action: Action


@dataclass(frozen=True)
class TypeDecided(GateEvent):
    task_type: str
    outcome: TypeOutcome


@dataclass(frozen=True)
class GateFinished(GateEvent):
    result: GateResult


@dataclass(frozen=True)
class GateAborted(GateEvent):
    reason: str


Subscriber = Callable[[GateEvent], Any]


class EventStream:
    """An async iterator over gate events; pass it in ``subscribers`` (or use a handle)."""

    def __init__(self) -> None:
        self._q: asyncio.Queue[GateEvent] = asyncio.Queue()
        self._closed = False

    def __call__(self, event: GateEvent) -> None:
        self._q.put_nowait(event)

    def __aiter__(self) -> AsyncIterator[GateEvent]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[GateEvent]:
        while not self._closed:
            ev = await self._q.get()
            yield ev
            if isinstance(ev, GateFinished | GateAborted):
                self._closed = True


class SubscriberWarning(RuntimeWarning):
    """A gate subscriber raised, fell behind or hung; the gate itself went on unaffected."""


def _name(fn: object) -> str:
    return (getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
            or type(fn).__name__)


class _Bus:
    """Fan-out with one queue and one pump task per subscriber.

    Publishing never awaits a subscriber, so a slow one cannot slow the scheduler, and
    delivery is bounded so none can hold up the result: a backlog past ``max_backlog``
    drops its oldest events, and `close` waits at most ``close_timeout_s`` (loop clock) for
    the stragglers before it cancels them. Each drop, hang or first error is one warning.
    """

    def __init__(self, subscribers: Iterable[Subscriber], max_backlog: int = 10_000,
                 close_timeout_s: float = 1.0):
        self._subs = list(subscribers)
        self._queues: list[asyncio.Queue[GateEvent | None]] = []
        self._pumps: list[asyncio.Task[None]] = []
        self.max_backlog, self.close_timeout_s = max_backlog, close_timeout_s
        self.dropped = [0] * len(self._subs)
        self.errors = [0] * len(self._subs)

    def subscribe_first(self, sub: Subscriber) -> None:
        """Add a subscriber ahead of the others (before `start`)."""
        self._subs.insert(0, sub)
        self.dropped.insert(0, 0)
        self.errors.insert(0, 0)

    def start(self) -> None:
        for i, sub in enumerate(self._subs):
            q: asyncio.Queue[GateEvent | None] = asyncio.Queue()
            self._queues.append(q)
            self._pumps.append(asyncio.ensure_future(self._pump(i, sub, q)))

    async def _pump(self, i: int, sub: Subscriber, q: asyncio.Queue[GateEvent | None]) -> None:
        while (ev := await q.get()) is not None:
            try:
                out = sub(ev)
                if inspect.isawaitable(out):
                    await out
            except Exception as exc:  # a broken subscriber must not break the gate
                self.errors[i] += 1
                if self.errors[i] == 1:
                    warnings.warn(
                        f"gate subscriber {_name(sub)} raised {type(exc).__name__}: {exc} "
                        f"(on {type(ev).__name__}); the gate keeps running and later errors "
                        f"of this subscriber are not reported again", SubscriberWarning,
                        stacklevel=1)

    def publish(self, ev: GateEvent) -> None:
        for i, q in enumerate(self._queues):
            if q.qsize() >= self.max_backlog:  # a live view wants the newest events
                q.get_nowait()
                self.dropped[i] += 1
            q.put_nowait(ev)

    async def close(self) -> None:
        """Deliver what is queued within the timeout; then cancel, never wait for ever."""
        for q in self._queues:
            q.put_nowait(None)
        if self._pumps:
            _, late = await asyncio.wait(self._pumps, timeout=self.close_timeout_s)
            for t in late:
                t.cancel()
            if late:
                await asyncio.wait(late)
        for i, (sub, pump) in enumerate(zip(self._subs, self._pumps, strict=True)):
            left = max(self._queues[i].qsize() - 1, 0)
            if pump.cancelled() or self.dropped[i]:
                warnings.warn(
                    f"gate subscriber {_name(sub)} fell behind: {self.dropped[i] + left} "
                    f"events not delivered"
                    + (f" (cancelled {self.close_timeout_s:g} s after the gate ended)"
                       if pump.cancelled() else ""), SubscriberWarning, stacklevel=1)



