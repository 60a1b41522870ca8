"""Gate events for notebooks and CLIs, delivered off the scheduler's path: callbacks, an async
iterator, and `report_progress` for an ``infer`` to describe its own call.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import warnings
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .._ids import check_run_id
from ..errors import described
from ..stats import (
    Action,
    GateParams,
    TypeOutcome,
)
from ._plan import UnitResult, UnitTask
from ._slots import slot_builder

if TYPE_CHECKING:
    from ._result import GateResult


@dataclass(frozen=True, slots=True)
class GateEvent:
    """Base of all events; ``t`` is the event loop's clock (virtual under looptime)."""

    t: float


@dataclass(frozen=True, slots=True)
class GateStarted(GateEvent):
    task_types: tuple[str, ...]
    ladder_sizes: tuple[int, ...]
    concurrency: int
    params: GateParams


@dataclass(frozen=True, slots=True)
class TaskStarted(GateEvent):
    task: UnitTask
    in_flight: int


@dataclass(frozen=True, slots=True)
class TaskFinished(GateEvent):
    task: UnitTask
    result: UnitResult
    status: Literal["pending", "discarded", "cache_hit", "cancelled"]


@dataclass(frozen=True, slots=True)
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


# The run id of the call being answered: set by the gate inside each inference call's own
# asyncio task (the arm's run id), and by `run_scope` for calls made outside a gate (the
# rollout's, the evolver's), so a cached client salts its keys without the agent passing it.
_RUN_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("vtrm_gate_run_id",
                                                                     default=None)


def current_run_id() -> str | None:
    """The run id of the call being answered (the arm's, inside ``infer``), or None."""
    return _RUN_ID.get()


@contextlib.contextmanager
def run_scope(run_id: str) -> Iterator[None]:
    """Calls made inside the block belong to ``run_id`` (`current_run_id`), then the outer
    run id is back."""
    token = _RUN_ID.set(check_run_id(run_id, "run_scope"))
    try:
        yield
    finally:
        _RUN_ID.reset(token)


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class TypeDecided(GateEvent):
    task_type: str
    outcome: TypeOutcome


@dataclass(frozen=True, slots=True)
class GateFinished(GateEvent):
    result: GateResult


@dataclass(frozen=True, slots=True)
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


EVENT_KINDS: tuple[type[GateEvent], ...] = (GateStarted, TaskStarted, TaskFinished,
                                             TaskProgress, PrefixAdvanced, TypeDecided,
                                             GateFinished, GateAborted)

# the events built per call or per consumed unit, their slots set directly (`slot_builder`)
_task_started = slot_builder(TaskStarted)
_task_finished = slot_builder(TaskFinished)
_prefix_advanced = slot_builder(PrefixAdvanced)


def wanted_events(sub: object) -> tuple[type[GateEvent], ...]:
    """The event classes a subscriber takes: its ``gate_events`` attribute if it declares
    one (a listener that needs no per-call events then costs the gate none), else all."""
    kinds = getattr(sub, "gate_events", None)
    if kinds is None:
        return EVENT_KINDS
    if not isinstance(kinds, tuple | list | frozenset | set) or not all(
            isinstance(k, type) and issubclass(k, GateEvent) for k in kinds):
        raise TypeError(f"{_name(sub)}.gate_events must be a tuple of GateEvent classes "
                        f"(e.g. (PrefixAdvanced, TypeDecided)), got {kinds!r}")
    return tuple(k for k in EVENT_KINDS if issubclass(k, tuple(kinds)))


CUT_OFF = "vtrm_gate: a late subscriber cut off at the gate's end"
"""The message of the cancel `_Bus.close` cuts a late subscriber off with."""

_DELIVERING: contextvars.ContextVar[_Bus | None] = contextvars.ContextVar(
    "vtrm_gate_delivering", default=None)
"""The bus whose subscriber the running code is (`_Bus.delivering`)."""


class _Bus:
    """Fan-out with one queue and one pump task per subscriber.

    Publishing never awaits a subscriber, so a slow one cannot slow the scheduler, and
    delivery is bounded so none can hold up the result: a backlog past ``max_backlog``
    drops its oldest events, and `close` waits at most ``close_timeout_s`` (loop clock) for
    the stragglers before it cancels them. Each drop, hang or first error is one warning.
    A pump delivers everything queued before it sleeps again (one wake-up per burst, not
    per event). A subscriber gets only the classes it declares (`wanted_events`), and the
    scheduler builds a per-call event only if someone takes it (`wants`). ``inline``
    recorders (the handle's history) take everything, inside `publish`: they must be cheap
    and must not raise.
    """

    def __init__(self, subscribers: Iterable[Subscriber], max_backlog: int = 10_000,
                 close_timeout_s: float = 1.0):
        self._subs = list(subscribers)
        self._kinds = [wanted_events(sub) for sub in self._subs]  # refused before any call
        self._inline: list[Subscriber] = []
        self._queues: list[deque[GateEvent | None]] = []
        self._waiters: list[asyncio.Future[None] | None] = []
        self._pumps: list[asyncio.Task[None]] = []
        self._routes: dict[type, tuple[int, ...]] = {}  # event class -> subscriber indices
        self.max_backlog, self.close_timeout_s = max_backlog, close_timeout_s
        self.dropped = [0] * len(self._subs)
        self.errors = [0] * len(self._subs)

    def wants(self, kind: type[GateEvent]) -> bool:
        """Does anyone take events of ``kind`` (an inline recorder takes all)?"""
        return bool(self._inline) or any(kind in k for k in self._kinds)

    def subscribe_inline(self, record: Callable[[GateEvent], None]) -> None:
        """Call ``record(event)`` inside `publish` (before `start`): for cheap recorders."""
        self._inline.append(record)

    def start(self) -> None:
        self._routes = {kind: tuple(i for i, k in enumerate(self._kinds) if kind in k)
                        for kind in EVENT_KINDS}
        for i, sub in enumerate(self._subs):
            q: deque[GateEvent | None] = deque()
            self._queues.append(q)
            self._waiters.append(None)
            self._pumps.append(asyncio.ensure_future(self._pump(i, sub, q)))

    async def _pump(self, i: int, sub: Subscriber, q: deque[GateEvent | None]) -> None:
        _DELIVERING.set(self)  # this pump's own context: the tasks it starts copy it
        loop = asyncio.get_running_loop()
        while True:
            while q:
                ev = q.popleft()
                if ev is None:
                    return
                try:
                    out = sub(ev)
                    if out is not None and inspect.isawaitable(out):
                        await out
                except Exception as exc:  # a broken subscriber must not break the gate
                    self._raised(i, sub, ev, exc)
                except asyncio.CancelledError as exc:
                    me = asyncio.current_task()
                    if me is None or me.cancelling():  # close() cut this subscriber off
                        raise
                    self._raised(i, sub, ev, exc)  # the subscriber's own, not ours
            waiter = self._waiters[i] = loop.create_future()
            await waiter

    def _raised(self, i: int, sub: Subscriber, ev: GateEvent, exc: BaseException) -> None:
        """One warning for a subscriber's first error; the gate keeps running."""
        self.errors[i] += 1
        if self.errors[i] == 1:
            warnings.warn(
                f"gate subscriber {_name(sub)} raised {described(exc)} (on "
                f"{type(ev).__name__}); the gate keeps running and later errors of this "
                f"subscriber are not reported again", SubscriberWarning, stacklevel=1)

    def delivering(self) -> bool:
        """Does the running code belong to one of this bus's subscribers (its pump, or a task
        it started: ``wait_for``, ``gather``)? A context variable the pump sets, which the
        tasks it starts inherit."""
        return _DELIVERING.get() is self

    def publish(self, ev: GateEvent) -> None:
        for record in self._inline:
            record(ev)
        route = self._routes.get(type(ev))
        if route is None:  # a subclass of an event class (not built by the scheduler)
            route = tuple(i for i, k in enumerate(self._kinds) if isinstance(ev, k))
        for i in route:
            q = self._queues[i]
            if len(q) >= self.max_backlog:  # a live view wants the newest events
                q.popleft()
                self.dropped[i] += 1
            q.append(ev)
            waiter = self._waiters[i]
            if waiter is not None:
                self._waiters[i] = None
                if not waiter.done():
                    waiter.set_result(None)

    async def close(self) -> None:
        """Deliver what is queued within the timeout; then cancel, never wait for ever."""
        for i, q in enumerate(self._queues):
            q.append(None)
            waiter = self._waiters[i]
            if waiter is not None and not waiter.done():
                self._waiters[i] = None
                waiter.set_result(None)
        if self._pumps:
            _, late = await asyncio.wait(self._pumps, timeout=self.close_timeout_s)
            for t in late:
                t.cancel(msg=CUT_OFF)  # marked: a subscriber awaiting the gate's own task
                # passes this cancel to the gate, which knows it for its own (`_to_the_end`)
            if late:  # bounded again: a subscriber may swallow the cancellation
                await asyncio.wait(late, timeout=self.close_timeout_s)
        for i, (sub, pump) in enumerate(zip(self._subs, self._pumps, strict=True)):
            left = sum(ev is not None for ev in self._queues[i])
            cut = pump.cancelled() or not pump.done()  # not done: it ignored the cancel
            if cut or self.dropped[i]:
                warnings.warn(
                    f"gate subscriber {_name(sub)} fell behind: {self.dropped[i] + left} "
                    f"events not delivered"
                    + (f" (cancelled {self.close_timeout_s:g} s after the gate ended)"
                       if cut else ""), SubscriberWarning, stacklevel=1)

