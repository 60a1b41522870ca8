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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from .dispatch import DispatchName, DispatchPolicy, dispatch_order, resolve_dispatch
from .ladder import check_unit_ids
from .stats import Action, DecisionRule, GateParams, GateState, SequentialTest, TypeOutcome

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
                        content_hash(skill), self.cand_dir if arm == "cand" else None)


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

    def __init__(self, task_type: str, infra_units: int, calls: int, guard: GuardParams):
        self.task_type, self.infra_units, self.calls, self.guard = (
            task_type, infra_units, calls, guard)
        self.partial: GateResult | None = None
        super().__init__(
            f"INFRA guard tripped for type {task_type!r}: {infra_units} INFRA units out of "
            f"{calls} completed calls ({infra_units / calls:.1%} > {guard.max_ratio:.0%}, "
            f"minimum {guard.min_calls} calls); in-flight calls were cancelled and every "
            f"finished result was persisted")


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


class _Bus:
    """Fan-out with one unbounded queue and one pump task per subscriber.

    Publishing never awaits a subscriber, so a slow one cannot slow the scheduler.
    """

    def __init__(self, subscribers: Iterable[Subscriber]):
        self._queues: list[asyncio.Queue[GateEvent | None]] = []
        self._pumps: list[asyncio.Task[None]] = []
        for sub in subscribers:
            q: asyncio.Queue[GateEvent | None] = asyncio.Queue()
            self._queues.append(q)
            self._pumps.append(asyncio.ensure_future(self._pump(sub, q)))
        self.errors: list[BaseException] = []

    async def _pump(self, sub: Subscriber, q: asyncio.Queue[GateEvent | None]) -> None:
        while (ev := await q.get()) is not None:
            try:
                out = sub(ev)
                if inspect.isawaitable(out):
                    await out
            except Exception as exc:  # a broken subscriber must not break the gate
                self.errors.append(exc)

    def publish(self, ev: GateEvent) -> None:
        for q in self._queues:
            q.put_nowait(ev)

    async def close(self) -> None:
        for q in self._queues:
            q.put_nowait(None)
        if self._pumps:
            await asyncio.gather(*self._pumps, return_exceptions=True)


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


# ---- the scheduler --------------------------------------------------------------------


class _TypeRun:
    """Mutable per-type state owned by one gate run."""

    def __init__(self, plan: TypePlan, params: GateParams, rule: DecisionRule | None):
        self.plan = plan
        self.n = len(plan.units)
        self.test = SequentialTest(self.n, params, rule)
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


def _validate(plans: Sequence[TypePlan], concurrency: int) -> None:
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    names: set[str] = set()
    targets: dict[str, str] = {}
    for p in plans:
        if not isinstance(p, TypePlan):
            raise TypeError(f"plans must be TypePlan objects, got {type(p).__name__}")
        if p.task_type in names:
            raise ValueError(f"duplicate task type in plans: {p.task_type!r}")
        names.add(p.task_type)
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
                 concurrency: int, baseline: BaselineStore | None, sink: ResultSink | None,
                 subscribers: Iterable[Subscriber], rule: DecisionRule | None,
                 guard: GuardParams, dispatch: DispatchPolicy,
                 cancel_after_freeze: bool = False):
        self.infer, self.params, self.concurrency = infer, params, concurrency
        self.dispatch, self.cancel_after_freeze = dispatch, cancel_after_freeze
        # in-flight calls cancelled because their type froze (cancel_after_freeze)
        self.freeze_cancelled: set[asyncio.Future[None]] = set()
        self.baseline, self.sink, self.guard = baseline, sink, guard
        self.runs = [_TypeRun(p, params, rule) for p in sorted(plans, key=lambda p: p.task_type)]
        self.by_type = {r.plan.task_type: r for r in self.runs}
        self.bus = _Bus(subscribers)
        self.loop = asyncio.get_running_loop()
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
            res = await self.infer(task)
            if not isinstance(res, UnitResult):
                raise TypeError(f"infer returned {type(res).__name__}, expected UnitResult")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a broken backend is INFRA for that arm, text kept
            res = UnitResult(infra=True, error=f"{type(exc).__name__}: {exc}",
                             latency_s=self.now() - t)
        self.done.put_nowait((task, res))

    async def run(self) -> GateResult:
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
            await self._abort(reason)
            if isinstance(exc, InfraGuardError):
                exc.partial = self._result(aborted=reason)
            raise
        result = self._result()
        self.bus.publish(GateFinished(self.now(), result))
        await self.bus.close()
        return result

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
        if self.guard.tripped(c.infra_units, c.completed):  # before pairing
            raise InfraGuardError(task.task_type, c.infra_units, c.completed, self.guard)
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


def _count_completion(c: TypeCounters, res: UnitResult) -> None:
    c.completed += 1
    c.tokens += res.tokens
    c.infra_calls += res.infra


def _as_cached(res: UnitResult) -> UnitResult:
    return res if res.cached else UnitResult(res.correct, res.infra, True, res.prediction, 0.0,
                                             0, res.trace, res.error)


async def run_gate(plans: Sequence[TypePlan], infer: Infer, params: GateParams | None = None,
                   concurrency: int = 32, *, baseline: BaselineStore | None = None,
                   sink: ResultSink | None = None, subscribers: Iterable[Subscriber] = (),
                   rule: DecisionRule | None = None,
                   guard: GuardParams | None = None,
                   dispatch: DispatchName | DispatchPolicy = "round_robin",
                   cancel_after_freeze: bool = False) -> GateResult:
    """Run the continuous concurrent gate over ``plans`` and return every type's outcome.

    Decisions equal `replay_prefix` on the same outcomes whatever the completion order and
    whichever ``dispatch`` policy picks the next type (`vtrm_gate.dispatch`). With
    ``cancel_after_freeze`` a frozen type's in-flight calls are cancelled (counted as
    ``cancelled_in_flight``) instead of finishing.
    Raises `InfraGuardError` (with ``.partial``) if a type's INFRA ratio trips the guard,
    and `RuntimeError` before any inference if two types share one target skill file.
    """
    plans = list(plans)
    _validate(plans, concurrency)
    gate = _Gate(plans, infer, params or GateParams(), concurrency, baseline, sink,
                 subscribers, rule, guard or GuardParams(), resolve_dispatch(dispatch),
                 cancel_after_freeze)
    return await gate.run()


@dataclass
class GateHandle:
    """A gate running in the background of the current loop (a Jupyter kernel's, say).

    ``await handle`` for the result, ``handle.cancel()`` to stop it, ``handle.events()`` for
    an async iterator over every event (including those already emitted).
    """

    task: asyncio.Task[GateResult]
    history: list[GateEvent] = field(default_factory=list)
    _streams: list[EventStream] = field(default_factory=list)
    started_at: float = field(default_factory=time.monotonic)

    def _record(self, ev: GateEvent) -> None:
        self.history.append(ev)
        for s in self._streams:
            s(ev)

    def __await__(self):  # type: ignore[no-untyped-def]
        return self.task.__await__()

    def done(self) -> bool:
        return self.task.done()

    def cancel(self) -> bool:
        return self.task.cancel()

    def result(self) -> GateResult:
        return self.task.result()

    def events(self) -> EventStream:
        stream = EventStream()
        for ev in self.history:
            stream(ev)
        if not self.task.done():
            self._streams.append(stream)
        return stream


def launch(plans: Sequence[TypePlan], infer: Infer, params: GateParams | None = None,
           concurrency: int = 32, **kwargs: Any) -> GateHandle:
    """Start `run_gate` as a task on the running loop and return at once."""
    loop = asyncio.get_event_loop()
    subs = list(kwargs.pop("subscribers", ()))
    plans = list(plans)
    _validate(plans, concurrency)  # bad input fails here, not later in the background
    kwargs["dispatch"] = resolve_dispatch(kwargs.get("dispatch", "round_robin"))
    handle = GateHandle(task=None)  # type: ignore[arg-type]
    coro = run_gate(plans, infer, params, concurrency, subscribers=[handle._record, *subs],
                    **kwargs)
    handle.task = loop.create_task(coro)
    return handle
