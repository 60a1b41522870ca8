"""Continuous concurrent gate (SPEC §3): one slot pool, out-of-order inference, in-order stats.

Every (type, unit, arm) inference shares one pool of ``concurrency`` slots. Results arrive in
any order; each type consumes them strictly along its ladder prefix and freezes the moment
its rule decides. No storage and no Redis here: persistence comes in through a `ResultSink`,
the base-arm cache through a `BaselineStore`, inference through an ``infer`` callable.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import inspect
import re
import time
import warnings
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from .dispatch import DispatchName, DispatchPolicy, dispatch_order, resolve_dispatch
from .ladder import check_unit_ids
from .stats import (
    Action,
    DecisionRule,
    GateParams,
    GateState,
    SequentialTest,
    TypeOutcome,
    check_ladder_length,
)

Arm = Literal["base", "cand"]
ARMS: tuple[Arm, Arm] = ("base", "cand")


def slugify(task_type: str) -> str:
    """'Action Reasoning' -> 'action-reasoning': the skill file stem and run-id component."""
    slug = re.sub(r"[^a-z0-9]+", "-", task_type.lower()).strip("-")
    if not slug:
        raise ValueError(f"task type {task_type!r} has no letters or digits to name it by")
    return slug


def content_hash(text: str) -> str:
    """sha256 of a skill file's content (the BaselineCache key component)."""
    return hashlib.sha256(text.encode()).hexdigest()


def arm_run_id(step_run_id: str, task_type: str, arm: Arm) -> str:
    """One run id per arm: ``{step_run_id}_gate_{slug}_{arm}`` (no block ids)."""
    return f"{step_run_id}_gate_{slugify(task_type)}_{arm}"


@dataclass(frozen=True)
class UnitTask:
    """One inference: a unit of a type, on one arm, with that arm's skill content."""

    task_type: str
    unit_id: str
    arm: Arm
    ladder_rank: int
    run_id: str
    skill: str = ""
    skill_hash: str = ""
    skill_dir: str | None = None
    attempt: int = 0
    """How many times this step's gate was aborted by the INFRA guard before (0: first).
    Not part of any cache key: a backend may use it to model an outage that has ended (the
    simulator redraws its INFRA failures); a real agent asks again anyway."""


@dataclass(frozen=True)
class UnitResult:
    """What an inference returned. ``infra`` marks an infrastructure failure (excluded)."""

    correct: bool = False
    infra: bool = False
    cached: bool = False
    prediction: str | None = None
    latency_s: float = 0.0
    tokens: int = 0
    trace: Any = None
    error: str | None = None


Infer = Callable[[UnitTask], Awaitable[UnitResult]]


@dataclass(frozen=True)
class TypePlan:
    """One type's gate work: its ladder (unit ids in order) and both arms' skills."""

    task_type: str
    units: Sequence[str]
    base_skill: str = ""
    cand_skill: str = ""
    step_run_id: str = "gate"
    base_run_id: str | None = None
    cand_run_id: str | None = None
    target_file: str | None = None
    cand_dir: str | None = None
    rule: DecisionRule | None = field(default=None, compare=False, repr=False)
    """This type's decision rule (default: the gate's); probation probes continue an e-process."""
    attempt: int = 0
    """Passed to every `UnitTask` (see `UnitTask.attempt`)."""

    def __post_init__(self) -> None:
        if not isinstance(self.task_type, str) or not self.task_type.strip():
            raise ValueError(f"TypePlan.task_type must be a non-empty string, "
                             f"got {self.task_type!r}")
        slugify(self.task_type)
        units = check_unit_ids(self.units, f"TypePlan {self.task_type!r}: ")
        object.__setattr__(self, "units", units)

    @property
    def slug(self) -> str:
        return slugify(self.task_type)

    @property
    def target(self) -> str:
        return self.target_file or f"skills/{self.slug}.md"

    def run_id(self, arm: Arm) -> str:
        explicit = self.base_run_id if arm == "base" else self.cand_run_id
        return explicit or arm_run_id(self.step_run_id, self.task_type, arm)

    def task(self, rank: int, arm: Arm) -> UnitTask:
        skill = self.base_skill if arm == "base" else self.cand_skill
        return UnitTask(self.task_type, self.units[rank], arm, rank, self.run_id(arm), skill,
                        content_hash(skill), self.cand_dir if arm == "cand" else None,
                        self.attempt)


@dataclass(frozen=True)
class GuardParams:
    """INFRA guard: abort when INFRA units / completed calls > max_ratio (calls >= min_calls)."""

    min_calls: int = 10
    max_ratio: float = 0.10

    def __post_init__(self) -> None:
        if not isinstance(self.min_calls, int) or isinstance(self.min_calls, bool) \
                or self.min_calls < 1:
            raise ValueError(f"GuardParams.min_calls must be an integer >= 1, "
                             f"got {self.min_calls!r}")
        if not isinstance(self.max_ratio, int | float) or not 0 <= self.max_ratio <= 1:
            raise ValueError(f"GuardParams.max_ratio must be in [0, 1], got {self.max_ratio!r}")

    def tripped(self, infra_units: int, calls: int) -> bool:
        # infra/calls is correctly rounded, so exactly max_ratio never trips (3/30 == 0.1).
        return calls >= self.min_calls and infra_units / calls > self.max_ratio


class InfraGuardError(RuntimeError):
    """The INFRA guard aborted the gate; ``partial`` holds what was done."""

    def __init__(self, task_type: str, infra_units: int, calls: int, guard: GuardParams,
                 last_errors: Sequence[str] = ()):
        self.task_type, self.infra_units, self.calls, self.guard = (
            task_type, infra_units, calls, guard)
        self.last_errors = tuple(last_errors)
        self.partial: GateResult | None = None
        errors = "; ".join(repr(e) for e in self.last_errors) or "none recorded"
        super().__init__(
            f"INFRA guard tripped for type {task_type!r}: {infra_units} INFRA units out of "
            f"{calls} completed calls ({infra_units / calls:.1%} > {guard.max_ratio:.0%}, "
            f"minimum {guard.min_calls} calls); in-flight calls were cancelled and every "
            f"finished result was persisted; last errors: {errors}")


class BaselineStore(Protocol):
    """Base-arm cache: looked up before a slot is taken; written after a fresh non-INFRA run."""

    async def get(self, task: UnitTask) -> UnitResult | None: ...

    async def put(self, task: UnitTask, result: UnitResult) -> None: ...


class ResultSink(Protocol):
    """Persistence: every finished inference, every consumed unit, every decision.

    Awaited inline (a write must land before the gate moves on); keep it fast.
    """

    async def on_result(self, task: UnitTask, result: UnitResult, counted: bool) -> None: ...

    async def on_consumed(self, event: PrefixAdvanced) -> None: ...

    async def on_decided(self, task_type: str, outcome: TypeOutcome) -> None: ...


# ---- events ---------------------------------------------------------------------------


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


# ---- result ---------------------------------------------------------------------------


@dataclass
class TypeCounters:
    """Per-type work accounting: nothing started, finished or dropped goes unreported."""

    units: int = 0
    started: int = 0
    completed: int = 0
    cache_hits: int = 0
    cancelled_before_start: int = 0
    cancelled_in_flight: int = 0
    discarded_after_freeze: int = 0
    discarded_after_infra: int = 0
    infra_units: int = 0
    tokens: int = 0
    infra_calls: int = 0


@dataclass(frozen=True)
class GateResult:
    """Outcome per type, counters per type, and the gate-wide figures."""

    outcomes: dict[str, TypeOutcome]
    counters: dict[str, TypeCounters]
    peak_in_flight: int
    wall_time_s: float
    concurrency: int
    aborted: str | None = None

    def total(self, name: str) -> int:
        return sum(getattr(c, name) for c in self.counters.values())

    @property
    def tokens(self) -> int:
        return self.total("tokens")

    def decisions(self) -> dict[str, Action]:
        return {t: o.action for t, o in self.outcomes.items()}

    def __repr__(self) -> str:
        tally: dict[str, int] = {}
        for o in self.outcomes.values():
            tally[str(o.action)] = tally.get(str(o.action), 0) + 1
        decided = sum(o.decided for o in self.outcomes.values())
        exits = ", ".join(f"{a} {k}" for a, k in sorted(tally.items()))
        state = f"aborted ({self.aborted})" if self.aborted else "finished"
        return (f"<GateResult {state}: {decided}/{len(self.outcomes)} types decided"
                f"{' (' + exits + ')' if exits else ''}, {self.total('completed')} calls, "
                f"peak {self.peak_in_flight} in flight, {self.wall_time_s:.1f} s>")


# ---- the scheduler --------------------------------------------------------------------


class _TypeRun:
    """Mutable per-type state owned by one gate run."""

    def __init__(self, plan: TypePlan, params: GateParams, rule: DecisionRule | None):
        self.plan = plan
        self.n = len(plan.units)
        self.test = SequentialTest(self.n, params, plan.rule or rule)
        self.results: list[dict[str, UnitResult]] = [{} for _ in range(self.n)]
        self.resolved = [False] * self.n
        self.infra_marked = [False] * self.n
        self.prefix = 0
        self.counters = TypeCounters(units=self.n)

    @property
    def frozen(self) -> bool:
        return self.test.decided

    @property
    def task_type(self) -> str:
        return self.plan.task_type


def _validate(plans: Sequence[TypePlan], infer: Infer, params: GateParams,
              concurrency: int) -> None:
    """Everything that can be refused is refused here, before any inference or write."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    if not callable(infer):
        raise TypeError(f"infer must be an async function (UnitTask -> UnitResult), "
                        f"got {type(infer).__name__}")
    if not isinstance(params, GateParams):
        raise TypeError(f"params must be GateParams, got {type(params).__name__}")
    names: set[str] = set()
    slugs: dict[str, str] = {}
    targets: dict[str, str] = {}
    for p in plans:
        if not isinstance(p, TypePlan):
            raise TypeError(f"plans must be TypePlan objects, got {type(p).__name__}")
        if p.task_type in names:
            raise ValueError(f"duplicate task type in plans: {p.task_type!r}")
        names.add(p.task_type)
        if p.slug in slugs:
            raise ValueError(
                f"task types {slugs[p.slug]!r} and {p.task_type!r} differ only in case or "
                f"punctuation: both are named {p.slug!r} in run ids and skill files; "
                f"rename one")
        slugs[p.slug] = p.task_type
        check_ladder_length(len(p.units), params, f"the ladder of type {p.task_type!r}")
        if p.target in targets:
            raise RuntimeError(
                f"types {targets[p.target]!r} and {p.task_type!r} map to the same target "
                f"skill file {p.target!r}; one step may not evolve one file twice")
        targets[p.target] = p.task_type


def _emission(runs: list[_TypeRun], policy: DispatchPolicy
              ) -> Iterator[tuple[_TypeRun, int, Arm]]:
    """Lazy order: the policy picks the type (round-robin by default, types sorted by
    name), one unit per pick, base then cand adjacent; inside a type, ladder order."""
    for r, i in dispatch_order(runs, policy):
        yield r, i, "base"
        yield r, i, "cand"


class _Gate:
    def __init__(self, plans: Sequence[TypePlan], infer: Infer, params: GateParams,
                 concurrency: int, *, baseline: BaselineStore | None = None,
                 sink: ResultSink | None = None, subscribers: Iterable[Subscriber] = (),
                 rule: DecisionRule | None = None, guard: GuardParams,
                 dispatch: DispatchPolicy, cancel_after_freeze: bool = False,
                 subscriber_timeout_s: float = 1.0):
        self.infer, self.params, self.concurrency = infer, params, concurrency
        self.dispatch, self.cancel_after_freeze = dispatch, cancel_after_freeze
        # in-flight calls cancelled because their type froze (cancel_after_freeze)
        self.freeze_cancelled: set[asyncio.Future[None]] = set()
        self.baseline, self.sink, self.guard = baseline, sink, guard
        self.runs = [_TypeRun(p, params, rule) for p in sorted(plans, key=lambda p: p.task_type)]
        self.by_type = {r.plan.task_type: r for r in self.runs}
        self.bus = _Bus(subscribers, close_timeout_s=subscriber_timeout_s)
        self.loop = asyncio.get_running_loop()
        self.aborted: str | None = None
        self.final: GateResult | None = None
        self.last_errors: dict[str, deque[str]] = {r.plan.task_type: deque(maxlen=3)
                                                   for r in self.runs}
        self.done: asyncio.Queue[tuple[UnitTask, UnitResult]] = asyncio.Queue()
        # A slot is held from dispatch until its result is taken off ``done``.
        self.n_in_flight = 0
        self.fatal: BaseException | None = None
        self.in_flight: dict[asyncio.Future[None], UnitTask] = {}
        self.peak = 0
        self.t0 = self.loop.time()

    def now(self) -> float:
        return self.loop.time()

    async def _call(self, task: UnitTask) -> None:
        t = self.now()
        _PROGRESS.set(lambda status, info: self.bus.publish(
            TaskProgress(self.now(), task, status, info)))
        try:
            out = self.infer(task)
            if not inspect.isawaitable(out):
                raise TypeError(
                    f"infer must be an async function (async def infer(task) -> UnitResult); "
                    f"{_name(self.infer)} returned {type(out).__name__}, which cannot be "
                    f"awaited (wrap a blocking call in asyncio.to_thread)")
            res = await out
            if not isinstance(res, UnitResult):
                raise TypeError(f"infer returned {type(res).__name__}, expected UnitResult")
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                raise  # the gate cancelled this call
            # raised by infer itself: the call failed, it was not stopped
            res = UnitResult(infra=True, error="CancelledError: raised by infer (the gate did "
                             "not cancel this call)", latency_s=self.now() - t)
        except _PROGRAMMING_ERRORS as exc:
            exc.add_note(f"raised by infer for type {task.task_type!r}, unit {task.unit_id!r} "
                         f"({task.arm} arm): a programming error fails the gate (other "
                         f"exceptions count as INFRA)")
            raise
        except Exception as exc:  # a broken backend is INFRA for that arm, text kept
            res = UnitResult(infra=True, error=f"{type(exc).__name__}: {exc}",
                             latency_s=self.now() - t)
        self.done.put_nowait((task, res))

    async def run(self) -> GateResult:
        self.bus.start()
        self.bus.publish(GateStarted(self.now(), tuple(r.plan.task_type for r in self.runs),
                                     tuple(r.n for r in self.runs), self.concurrency,
                                     self.params))
        try:
            for r in self.runs:
                if r.n == 0:
                    await self._decided(r)
            jobs = _emission(self.runs, self.dispatch)
            exhausted = False
            while True:
                # Everything that has arrived is consumed before a free slot is refilled.
                await self._drain()
                while not exhausted and self.n_in_flight < self.concurrency:
                    job = next(jobs, None)
                    if job is None:
                        exhausted = True
                        break
                    await self._dispatch(*job)
                    await self._drain()
                if self.n_in_flight == 0:
                    if exhausted:
                        break
                    continue
                await self._finish(*await self.done.get())
        except BaseException as exc:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self.aborted = reason
            # a second cancel() while aborting must not skip the cleanup
            await _to_the_end(self._abort(reason), reraise_cancel=False)
            self.final = self._result(aborted=reason)
            if isinstance(exc, InfraGuardError):
                exc.partial = self.final
            raise
        result = self.final = self._result()
        self.bus.publish(GateFinished(self.now(), result))
        await _to_the_end(self.bus.close())
        return result

    async def abort_unstarted(self, reason: str) -> GateResult:
        """Cancelled before it ran: nothing started; announce the start and the abort."""
        self.bus.start()
        self.bus.publish(GateStarted(self.now(), tuple(r.plan.task_type for r in self.runs),
                                     tuple(r.n for r in self.runs), self.concurrency,
                                     self.params))
        self.aborted = reason
        await _to_the_end(self._abort(reason), reraise_cancel=False)
        self.final = self._result(aborted=reason)
        return self.final

    async def _drain(self) -> None:
        while not self.done.empty():
            await self._finish(*self.done.get_nowait())

    async def _dispatch(self, run: _TypeRun, rank: int, arm: Arm) -> None:
        if run.frozen:  # checked at dispatch time: a frozen type starts nothing new
            return
        task = run.plan.task(rank, arm)
        if arm == "base" and self.baseline is not None:
            hit = await self.baseline.get(task)
            if run.frozen:
                return
            if hit is not None:
                run.counters.cache_hits += 1
                await self._finish(task, _as_cached(hit), cache_hit=True)
                return
        run.counters.started += 1
        fut = asyncio.ensure_future(self._call(task))
        self.in_flight[fut] = task
        fut.add_done_callback(self._forget)
        self.n_in_flight += 1
        self.peak = max(self.peak, self.n_in_flight)
        self.bus.publish(TaskStarted(self.now(), task, self.n_in_flight))

    def _forget(self, fut: asyncio.Future[None]) -> None:
        task = self.in_flight.pop(fut, None)
        if task is not None and fut in self.freeze_cancelled and fut.cancelled():
            # the slot frees once the call has really stopped; wake the coordinator
            self.done.put_nowait((task, None))
            return
        if task is not None and not fut.cancelled() and fut.exception() is not None:
            # a BaseException escaped infer (not an Exception: those are INFRA); re-raise it
            # in the coordinator instead of waiting forever for a result that never comes
            self.fatal = fut.exception()
            self.done.put_nowait((task, UnitResult(infra=True, error=repr(self.fatal))))

    async def _finish(self, task: UnitTask, res: UnitResult | None,
                      cache_hit: bool = False) -> None:
        if self.fatal is not None:
            raise self.fatal
        run = self.by_type[task.task_type]
        c = run.counters
        if res is None:  # cancelled after its type froze (cancel_after_freeze)
            self.n_in_flight -= 1
            c.cancelled_in_flight += 1
            self.bus.publish(TaskFinished(self.now(), task, UnitResult(
                error="cancelled after freeze"), "cancelled"))
            return
        rank = task.ladder_rank
        if not cache_hit:
            self.n_in_flight -= 1
            _count_completion(c, res)
        counted = not run.frozen and not run.resolved[rank]
        if self.sink is not None:
            await self.sink.on_result(task, res, counted)
        if (task.arm == "base" and not cache_hit and not res.infra
                and self.baseline is not None):
            await self.baseline.put(task, res)
        status = "cache_hit" if cache_hit else ("pending" if counted else "discarded")
        self.bus.publish(TaskFinished(self.now(), task, res, status))
        if run.frozen:
            c.discarded_after_freeze += 1
            return
        if res.infra and not run.infra_marked[rank]:
            run.infra_marked[rank] = True
            c.infra_units += 1
        if res.infra and res.error:
            self.last_errors[task.task_type].append(res.error)
        if self.guard.tripped(c.infra_units, c.completed):  # before pairing
            raise InfraGuardError(task.task_type, c.infra_units, c.completed, self.guard,
                                  self.last_errors[task.task_type])
        if run.resolved[rank]:  # the other arm already made this unit INFRA
            c.discarded_after_infra += 1
            return
        arms = run.results[rank]
        arms[task.arm] = res
        if res.infra or len(arms) == 2:
            run.resolved[rank] = True
            await self._advance(run)

    async def _advance(self, run: _TypeRun) -> None:
        """Walk the prefix pointer over every resolved unit, deciding after each."""
        while run.prefix < run.n and run.resolved[run.prefix] and not run.frozen:
            rank = run.prefix
            arms = run.results[rank]
            base, cand = arms.get("base"), arms.get("cand")
            infra = run.infra_marked[rank]
            pair = None if infra else (base.correct, cand.correct)  # type: ignore[union-attr]
            action = run.test.consume(rank, pair)
            run.prefix += 1
            s: GateState = run.test.state
            p = run.test.points[-1]
            ev = PrefixAdvanced(self.now(), run.plan.task_type, run.plan.units[rank], rank,
                                base, cand, p.d, s.W, s.L, s.n_used, s.e_plus, s.e_minus,
                                run.n - s.n_consumed, action)
            if self.sink is not None:
                await self.sink.on_consumed(ev)
            self.bus.publish(ev)
            if action is not Action.CONTINUE:
                await self._decided(run)

    async def _decided(self, run: _TypeRun) -> None:
        if self.cancel_after_freeze:
            for fut, task in list(self.in_flight.items()):
                if task.task_type == run.plan.task_type and fut.cancel():
                    self.freeze_cancelled.add(fut)
        outcome = run.test.outcome()
        if self.sink is not None:
            await self.sink.on_decided(run.plan.task_type, outcome)
        self.bus.publish(TypeDecided(self.now(), run.plan.task_type, outcome))

    async def _abort(self, reason: str) -> None:
        """Cancel in-flight calls, persist what already finished, close the bus."""
        pending = dict(self.in_flight)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        for t, task in pending.items():
            if t.cancelled() and t not in self.freeze_cancelled:  # those: counted below
                self.by_type[task.task_type].counters.cancelled_in_flight += 1
        try:
            while not self.done.empty():
                task, res = self.done.get_nowait()
                if res is None:  # cancelled after its type froze
                    self.by_type[task.task_type].counters.cancelled_in_flight += 1
                    continue
                _count_completion(self.by_type[task.task_type].counters, res)
                if self.sink is not None:
                    await asyncio.shield(self.sink.on_result(task, res, False))
        finally:
            self.bus.publish(GateAborted(self.now(), reason))
            await self.bus.close()

    def _result(self, aborted: str | None = None) -> GateResult:
        for r in self.runs:
            c = r.counters
            c.cancelled_before_start = (2 * r.n - c.started - c.cache_hits
                                        if r.frozen or aborted else 0)
        return GateResult(
            outcomes={r.plan.task_type: r.test.outcome() for r in self.runs},
            counters={r.plan.task_type: r.counters for r in self.runs},
            peak_in_flight=self.peak, wall_time_s=self.now() - self.t0,
            concurrency=self.concurrency, aborted=aborted)


_PROGRAMMING_ERRORS = (TypeError, AttributeError, NameError)
"""Raised by ``infer``, these are bugs, not infrastructure: the gate fails at once."""


async def _to_the_end(coro: Awaitable[None], reraise_cancel: bool = True) -> None:
    """Await ``coro`` to completion even when the caller is cancelled (again) meanwhile.

    The cancel is not lost: with ``reraise_cancel`` one CancelledError follows the end.
    """
    task = asyncio.ensure_future(coro)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    task.result()
    if cancelled and reraise_cancel:
        raise asyncio.CancelledError


def _count_completion(c: TypeCounters, res: UnitResult) -> None:
    c.completed += 1
    c.tokens += res.tokens
    c.infra_calls += res.infra


def _as_cached(res: UnitResult) -> UnitResult:
    return res if res.cached else UnitResult(res.correct, res.infra, True, res.prediction, 0.0,
                                             0, res.trace, res.error)


def _new_gate(plans: Iterable[TypePlan], infer: Infer, params: GateParams | None,
              concurrency: int, *, guard: GuardParams | None = None,
              dispatch: DispatchName | DispatchPolicy = "round_robin", **kw: Any) -> _Gate:
    """Validate, then build (not start) a gate; ``kw`` are `run_gate`'s keyword options."""
    plans = list(plans)
    params = params or GateParams()
    _validate(plans, infer, params, concurrency)
    return _Gate(plans, infer, params, concurrency, guard=guard or GuardParams(),
                 dispatch=resolve_dispatch(dispatch), **kw)


async def run_gate(plans: Sequence[TypePlan], infer: Infer, params: GateParams | None = None,
                   concurrency: int = 32, *, baseline: BaselineStore | None = None,
                   sink: ResultSink | None = None, subscribers: Iterable[Subscriber] = (),
                   rule: DecisionRule | None = None, guard: GuardParams | None = None,
                   dispatch: DispatchName | DispatchPolicy = "round_robin",
                   cancel_after_freeze: bool = False,
                   subscriber_timeout_s: float = 1.0) -> GateResult:
    """Run the continuous concurrent gate over ``plans`` and return every type's outcome.

    Decisions equal `replay_prefix` on the same outcomes whatever the completion order and
    whichever ``dispatch`` policy picks the next type (`vtrm_gate.dispatch`). With
    ``cancel_after_freeze`` a frozen type's in-flight calls are cancelled (counted as
    ``cancelled_in_flight``) instead of finishing.
    Raises `InfraGuardError` (with ``.partial``) if a type's INFRA ratio trips the guard;
    before any inference, `ValueError` for bad input (ladders longer than ``params.n_max``,
    two types with one slug) and `RuntimeError` if two types share one target skill file;
    a TypeError, AttributeError or NameError raised by ``infer`` fails the gate at once.
    Subscribers get at most ``subscriber_timeout_s`` after the gate ends to catch up.
    """
    gate = _new_gate(plans, infer, params, concurrency, baseline=baseline, sink=sink,
                     subscribers=subscribers, rule=rule, guard=guard, dispatch=dispatch,
                     cancel_after_freeze=cancel_after_freeze,
                     subscriber_timeout_s=subscriber_timeout_s)
    return await gate.run()


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
