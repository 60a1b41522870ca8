"""Continuous concurrent gate (SPEC §3): one slot pool, out-of-order inference, in-order stats.

Every (type, unit, arm) inference shares one pool of ``concurrency`` slots. Results arrive in
any order; each type consumes them strictly along its ladder prefix and freezes the moment
its rule decides. No storage and no Redis here: persistence comes in through a `ResultSink`,
the base-arm cache through a `BaselineStore`, inference through an ``infer`` callable.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from types import CoroutineType
from typing import Any, Literal, NamedTuple

from .._env import DEFAULT_CONCURRENCY
from .._ids import Arm
from ..errors import (
    InfraGuardError,
    TargetClashError,
    described,
    is_real,
    is_whole,
    plain_number,
    safe_str,
)
from ..stats import (
    Action,
    DecisionRule,
    GateParams,
    GateState,
    SequentialTest,
    TypeOutcome,
    as_params,
    check_ladder_length,
)
from ._dispatch import (
    DEFAULT_DISPATCH,
    DispatchName,
    DispatchOrder,
    DispatchPolicy,
    dispatch_order,
    resolve_dispatch,
)
from ._events import (
    _DELIVERING,
    _PROGRESS,
    _RUN_ID,
    CUT_OFF,
    GateAborted,
    GateFinished,
    GateStarted,
    PrefixAdvanced,
    Subscriber,
    TaskFinished,
    TaskProgress,
    TaskStarted,
    TypeDecided,
    _Bus,
    _name,
    _prefix_advanced,
    _task_finished,
    _task_started,
)
from ._plan import (
    Admission,
    BaselineStore,
    GuardParams,
    Infer,
    ResultSink,
    TypePlan,
    UnitResult,
    UnitTask,
    checked_result,
)
from ._result import GateResult, TypeCounters

PastStop = Literal["cancel", "wait"]
"""What happens to the calls still in flight once every type has decided (SPEC amendment):
``cancel`` them (the default: none can change a decision) or ``wait`` for them."""
PAST_STOP_POLICIES: tuple[PastStop, ...] = ("cancel", "wait")


class _Completed(NamedTuple):
    """A call returned (or failed as INFRA): its result, to record and consume."""

    task: UnitTask
    result: UnitResult


class _Stopped(NamedTuple):
    """A call cancelled after its type froze has really stopped: its slot is free now."""

    task: UnitTask


class _Crashed(NamedTuple):
    """A BaseException escaped ``infer`` (not an Exception: those are INFRA); the
    coordinator re-raises it instead of waiting forever for a result that never comes."""

    task: UnitTask
    exc: BaseException


_Signal = _Completed | _Stopped | _Crashed
"""What the calls tell the coordinator through its queue, one tagged type per kind."""


class _TypeRun:
    """Mutable per-type state owned by one gate run.

    Results are held only from arrival to consumption (or the freeze), so a long gate keeps
    O(in flight + out of order) of them, not one per call.
    """

    def __init__(self, plan: TypePlan, params: GateParams, rule: DecisionRule | None):
        self.plan = plan
        self.n = len(plan.units)
        self.test = SequentialTest(self.n, params, plan.rule or rule)
        self.results: dict[int, dict[str, UnitResult]] = {}
        self.resolved = bytearray(self.n)
        self.infra_marked = bytearray(self.n)
        self.prefix = 0
        self.counters = TypeCounters(units=self.n)
        self.frozen = self.test.decided  # kept equal to test.decided (set where it consumes)

    @property
    def task_type(self) -> str:
        return self.plan.task_type


def _validate(plans: Sequence[TypePlan], infer: Infer, params: GateParams,
              concurrency: int) -> None:
    """Everything that can be refused is refused here, before any inference or write."""
    if not is_whole(concurrency) or concurrency < 1:
        raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    if not callable(infer):
        raise TypeError(f"infer must be an async function (UnitTask -> UnitResult), "
                        f"got {type(infer).__name__}")
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
            raise TargetClashError(
                f"types {targets[p.target]!r} and {p.task_type!r} map to the same target "
                f"skill file {p.target!r}; one step may not evolve one file twice")
        targets[p.target] = p.task_type


def _emission(order: DispatchOrder[_TypeRun]) -> Iterator[tuple[_TypeRun, int, Arm]]:
    """Lazy order: the policy picks the type (`ExpectedNeed` by default; `RoundRobin`, the
    SPEC's fair order, goes by name), one unit per pick, base then cand adjacent; inside a
    type, ladder order."""
    for r, i in order:
        yield r, i, "base"
        yield r, i, "cand"


class _Gate:
    def __init__(self, plans: Sequence[TypePlan], infer: Infer, params: GateParams,
                 concurrency: int, *, baseline: BaselineStore | None = None,
                 sink: ResultSink | None = None, subscribers: Iterable[Subscriber] = (),
                 rule: DecisionRule | None = None, guard: GuardParams,
                 dispatch: DispatchPolicy, cancel_after_freeze: bool = True,
                 past_stop: PastStop = "cancel", subscriber_timeout_s: float = 1.0,
                 admission: Admission | None = None):
        self.infer, self.params, self.concurrency = infer, params, concurrency
        self.admission = admission if admission is not None else getattr(
            infer, "admission", None)
        self.dispatch, self.cancel_after_freeze = dispatch, cancel_after_freeze
        self.past_stop = past_stop
        self.n_decided = 0
        self.baseline, self.sink, self.guard = baseline, sink, guard
        self.runs = [_TypeRun(p, params, rule) for p in sorted(plans, key=lambda p: p.task_type)]
        self.by_type = {r.plan.task_type: r for r in self.runs}
        self.order = dispatch_order(self.runs, dispatch)
        self.bus = _Bus(subscribers, close_timeout_s=subscriber_timeout_s)
        # which per-call events someone takes (set at the start: a handle subscribes late)
        self.started_events = self.finished_events = self.progress_events = False
        self.prefix_events = self.recording = False
        self.loop = asyncio.get_running_loop()
        self.aborted: str | None = None
        self.final: GateResult | None = None
        self.last_errors: dict[str, deque[str]] = {r.plan.task_type: deque(maxlen=3)
                                                   for r in self.runs}
        # What the calls tell the coordinator, and the coordinator's wake-up while it waits.
        self.signals: deque[_Signal] = deque()
        self.waiter: asyncio.Future[None] | None = None
        # A slot is held from dispatch until its signal is taken off ``signals``.
        self.n_in_flight = 0
        self.fatal: BaseException | None = None
        # Long-lived per-slot workers (no task per call): the call each one holds, the
        # idle ones with the future that hands them their next call, the ones inside
        # ``infer`` and the ones whose call is being stopped (cancel_after_freeze).
        self.workers: list[asyncio.Task[None]] = []
        self.in_flight: dict[asyncio.Task[None], UnitTask] = {}
        self.idle: list[tuple[asyncio.Task[None], asyncio.Future[UnitTask | None]]] = []
        self.running: set[asyncio.Task[None]] = set()
        self.stopping: set[asyncio.Task[None]] = set()
        self.detached: set[asyncio.Task[None]] = set()  # stopped, ignored it: left behind
        self.aborting = False
        self.peak = 0
        self.t0 = self.loop.time()

    def now(self) -> float:
        return self.loop.time()

    async def _worker(self, task: UnitTask | None) -> None:
        """One slot's long-lived loop (no task per call): run the call it is handed, tell
        the coordinator (a result; a stop: the gate cancelled the call after its type froze;
        a crash), wait for the next call (None: the gate is over)."""
        me = asyncio.current_task()
        assert me is not None
        running, stopping, in_flight = self.running, self.stopping, self.in_flight
        now, create_future, infer = self.loop.time, self.loop.create_future, self.infer
        while task is not None:
            signal: _Signal
            if me in stopping:  # stopped before it started: infer is never called
                stopping.discard(me)
                signal = _Stopped(task)
            else:
                running.add(me)
                t = now()
                _RUN_ID.set(task.run_id)  # this call's worker: a cached client salts with it
                if self.progress_events:
                    _PROGRESS.set(self._progress(task))
                try:
                    out = infer(task)
                    if type(out) is not CoroutineType and not inspect.isawaitable(out):
                        raise TypeError(
                            f"infer must be an async function (async def infer(task) -> "
                            f"UnitResult); {_name(infer)} returned {type(out).__name__}, "
                            f"which cannot be awaited (wrap a blocking call in "
                            f"asyncio.to_thread)")
                    # an invalid result is a bug: InvalidResultError, a TypeError
                    signal = _Completed(task, checked_result(task, await out))
                except BaseException as exc:  # INFRA, a stop or a crash: `_failed` says
                    signal = self._failed(me, task, exc, t)
                running.discard(me)
                if me in stopping:  # cancelled, but infer returned (or failed) all the same
                    stopping.discard(me)
                    if me.cancelling():
                        me.uncancel()
                elif me in self.detached:  # the gate stopped waiting for this call
                    self.detached.discard(me)
                    return
            del in_flight[me]
            self._signal(signal)
            if self.aborting:
                return
            fut: asyncio.Future[UnitTask | None] = create_future()
            self.idle.append((me, fut))
            task = await fut

    def _progress(self, task: UnitTask) -> Callable[[str, dict[str, Any]], None]:
        """Where `report_progress` inside ``task``'s call goes: a `TaskProgress` event."""
        return lambda status, info: self.bus.publish(TaskProgress(self.now(), task, status,
                                                                  info))

    def _failed(self, me: asyncio.Task[None], task: UnitTask, exc: BaseException,
                t: float) -> _Signal:
        """What a call that raised tells the coordinator: an INFRA result for an Exception (a
        CancelledError the gate did not cause included: a backend's own), a stop when the
        gate cancelled it after its type froze (re-raised when the gate aborts), and a crash
        that fails the gate for a programming error or a BaseException."""
        if isinstance(exc, asyncio.CancelledError):
            if me.cancelling():  # the gate cancelled this call
                if self.aborting or me not in self.stopping:
                    raise exc
                me.uncancel()
                self.stopping.discard(me)
                return _Stopped(task)
            return _Completed(task, UnitResult(
                infra=True, error="CancelledError: raised by infer (the gate did not cancel "
                "this call)", latency_s=self.now() - t))
        if _is_programming_error(exc):
            exc.add_note(f"raised by infer for type {task.task_type!r}, unit {task.unit_id!r} "
                         f"({task.arm} arm): a programming error fails the gate (other "
                         f"exceptions count as INFRA)")
        elif isinstance(exc, Exception):  # a broken backend is INFRA for that arm, text kept
            return _Completed(task, UnitResult(infra=True, error=described(exc),
                                               latency_s=self.now() - t))
        self.fatal = exc
        return _Crashed(task, exc)

    def _signal(self, signal: _Signal) -> None:
        self.signals.append(signal)
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def _wait(self) -> None:
        """Wait until a call tells the coordinator something (one wake-up per batch)."""
        while not self.signals:
            self.waiter = self.loop.create_future()
            await self.waiter

    async def _wait_for_stops(self) -> None:
        """Every call in flight is one the gate stopped: wait for them at most `STOP_GRACE_S`.
        An ``infer`` that ignores its cancellation (a retry-on-anything loop) is then left
        to run detached, its call counted as cancelled and its slot freed: a gate whose
        types have decided must return."""
        try:
            await asyncio.wait_for(self._wait(), STOP_GRACE_S)
        except TimeoutError:
            self.waiter = None
            for worker in list(self.stopping):
                self._detach(worker)

    def _detach(self, worker: asyncio.Task[None]) -> None:
        """Leave ``worker`` behind (cancelled, still running): it tells the gate nothing."""
        task = self.in_flight.pop(worker, None)
        self.stopping.discard(worker)
        self.detached.add(worker)
        if worker in self.workers:
            self.workers.remove(worker)
        if task is not None:
            self.n_in_flight -= 1
            self.by_type[task.task_type].counters.cancelled_in_flight += 1

    def _stop(self, worker: asyncio.Task[None]) -> None:
        """Stop ``worker``'s call (it serves nothing now): cancelled inside ``infer``, or
        never started; its slot frees once it has stopped (a `_Stopped` signal)."""
        if worker not in self.stopping:
            self.stopping.add(worker)
            if worker in self.running:
                worker.cancel()

    async def _release_workers(self) -> None:
        """The gate is over: every worker is idle; let them end."""
        for _, fut in self.idle:
            fut.set_result(None)
        self.idle.clear()
        await asyncio.gather(*self.workers)

    def _start_bus(self) -> None:
        bus = self.bus
        bus.start()
        self.started_events = bus.wants(TaskStarted)
        self.finished_events = bus.wants(TaskFinished)
        self.progress_events = bus.wants(TaskProgress)
        self.prefix_events = self.sink is not None or bus.wants(PrefixAdvanced)
        # whether a result is handed to something awaited (the sink, the baseline store)
        self.recording = self.sink is not None or self.baseline is not None
        bus.publish(GateStarted(self.now(), tuple(r.plan.task_type for r in self.runs),
                                tuple(r.n for r in self.runs), self.concurrency,
                                self.params))

    async def run(self) -> GateResult:
        """Run the gate to its end. Its own code and tasks are no subscriber of another gate
        even when one started it: the mark (`_Bus.delivering`) stays outside (h19)."""
        token = _DELIVERING.set(None)
        try:
            return await self._run()
        finally:
            _DELIVERING.reset(token)

    async def _run(self) -> GateResult:
        self._start_bus()
        try:
            for r in self.runs:
                if r.n == 0:
                    await self._decided(r)
            jobs = _emission(self.order)
            exhausted = False
            while True:
                # Everything that has arrived is consumed before a free slot is refilled.
                if self.signals:
                    await self._drain()
                while not exhausted and self.n_in_flight < self._room():
                    job = next(jobs, None)
                    if job is None:
                        exhausted = True
                        break
                    run, rank, arm = job
                    if arm == "base" and self.baseline is not None:
                        await self._dispatch_base(run, rank)
                    elif not run.frozen:  # a frozen type starts nothing new
                        self._start(run, run.plan.task(rank, arm))
                    if self.signals:
                        await self._drain()
                if self.n_in_flight == 0:
                    if exhausted:
                        self._check_all_decided()
                        break
                    continue
                if len(self.stopping) >= self.n_in_flight:  # only stopped calls are left
                    await self._wait_for_stops()
                else:
                    await self._wait()
            await self._release_workers()
        except BaseException as exc:
            reason = described(exc) if safe_str(exc) else type(exc).__name__
            self.aborted = reason
            # a second cancel() while aborting must not skip the cleanup
            await _to_the_end(self._abort(reason), reraise_cancel=False)
            self.final = self._result(aborted=reason)
            if isinstance(exc, InfraGuardError):
                exc.partial = self.final
            raise
        result = self.final = self._result()
        self.bus.publish(GateFinished(self.now(), result))
        await _to_the_end(self.bus.close(), absorb=CUT_OFF)
        return result

    def _room(self) -> int:
        """Calls that may be in flight now: the slot count, or less while the admission
        (an adaptive limit) says so (at least 1, so the gate always makes progress)."""
        if self.admission is None:
            return self.concurrency
        return max(1, min(self.concurrency, int(self.admission.limit())))

    async def abort_unstarted(self, reason: str) -> GateResult:
        """Cancelled before it ran: nothing started; announce the start and the abort."""
        self._start_bus()
        self.aborted = reason
        await _to_the_end(self._abort(reason), reraise_cancel=False)
        self.final = self._result(aborted=reason)
        return self.final

    async def _drain(self) -> None:
        """Take every signal off the queue: a result, a stopped call's free slot, a crash."""
        signals = self.signals
        while signals:
            if self.fatal is not None:
                raise self.fatal
            signal = signals.popleft()
            if type(signal) is _Completed:
                task, res = signal
                if self.recording:
                    await self._finish(task, res)
                else:  # `_finish` with nothing to await (no sink, no baseline store): no
                    run = self._count(task, res, False)  # coroutine per result
                    if self.finished_events:
                        self._announce(task, res, not run.frozen
                                       and not run.resolved[task.ladder_rank], False)
                    if self._file(run, task, res):
                        self._advance_now(run)
            elif type(signal) is _Stopped:
                self._stopped(signal.task)
            else:
                raise signal.exc  # type: ignore[union-attr]  # _Crashed, the one kind left

    def _check_all_decided(self) -> None:
        """Dispatch ran out with nothing in flight: every type must have decided. A policy
        that scores an undecided type's units None starved it: a bug, never a result."""
        for run in self.runs:
            if not run.frozen:
                raise RuntimeError(
                    f"dispatch policy {type(self.dispatch).__name__} left type "
                    f"{run.task_type!r} undecided after {run.prefix} of its {run.n} ladder "
                    f"units (priority None means never start a lane's units: only for a "
                    f"decided type)")

    async def _dispatch_base(self, run: _TypeRun, rank: int) -> None:
        """A base-arm unit with a baseline store: its stored answer if any, else a call."""
        if run.frozen:  # checked at dispatch time: a frozen type starts nothing new
            return
        task = run.plan.task(rank, "base")
        hit = await self.baseline.get(task)  # type: ignore[union-attr]  # set by the caller
        if run.frozen:
            return
        if hit is not None:  # checked as infer's results are: "False" must not count
            hit = checked_result(task, hit, "the baseline store")
            run.counters.cache_hits += 1
            await self._finish(task, _as_cached(hit), cache_hit=True)
            return
        self._start(run, task)

    def _start(self, run: _TypeRun, task: UnitTask) -> None:
        """Start ``task``: an idle worker takes it, or a new one while there are fewer than
        the calls in flight (so at most ``concurrency`` workers)."""
        run.counters.started += 1
        if self.idle:
            worker, fut = self.idle.pop()
            fut.set_result(task)
        else:
            worker = self.loop.create_task(self._worker(task))
            self.workers.append(worker)
        self.in_flight[worker] = task
        n = self.n_in_flight = self.n_in_flight + 1
        if n > self.peak:
            self.peak = n
        if self.started_events:
            self.bus.publish(_task_started(self.now(), task, n))

    def _stopped(self, task: UnitTask) -> None:
        """A call cancelled after its type froze (cancel_after_freeze, past_stop) stopped."""
        self.n_in_flight -= 1
        self.by_type[task.task_type].counters.cancelled_in_flight += 1
        if self.finished_events:
            self.bus.publish(TaskFinished(self.now(), task, UnitResult(
                error="cancelled after freeze"), "cancelled"))

    async def _finish(self, task: UnitTask, res: UnitResult, cache_hit: bool = False) -> None:
        """A result: counted, recorded (a sink or a baseline store is there: `recording`),
        filed; the prefix advances over a resolved unit."""
        run = self._count(task, res, cache_hit)
        await self._record(task, res, not run.frozen and not run.resolved[task.ladder_rank],
                           cache_hit)
        if self._file(run, task, res):
            await self._advance(run)

    def _count(self, task: UnitTask, res: UnitResult, cache_hit: bool) -> _TypeRun:
        """Count a result on its type (a call's: its slot is free now)."""
        if self.fatal is not None:
            raise self.fatal
        run = self.by_type[task.task_type]
        if not cache_hit:
            self.n_in_flight -= 1
            _count_completion(run.counters, res)
        return run

    def _file(self, run: _TypeRun, task: UnitTask, res: UnitResult) -> bool:
        """File a result unless its type froze or the other arm already made the unit INFRA;
        a unit with both arms (or one INFRA) is resolved. True: the unit at the head of the
        prefix was resolved (the prefix may advance)."""
        c = run.counters
        rank = task.ladder_rank
        if run.frozen:
            c.discarded_after_freeze += 1
            return False
        if res.infra:
            self._note_infra(run, task, res)
        if c.infra_units or c.infra_calls:  # on every result (min_calls), before pairing;
            self._check_guard(run, task)  # with no INFRA yet no guard rule can trip
        if run.resolved[rank]:  # the other arm already made this unit INFRA
            c.discarded_after_infra += 1
            return False
        arms = run.results.get(rank)
        if arms is None:
            run.results[rank] = {task.arm: res}
            if not res.infra:
                return False
        else:
            arms[task.arm] = res
        run.resolved[rank] = True
        return rank == run.prefix

    async def _record(self, task: UnitTask, res: UnitResult, counted: bool,
                      cache_hit: bool) -> None:
        """Hand a result to the sink, a fresh base-arm answer to the baseline store, and
        announce it."""
        if self.sink is not None:
            await self.sink.on_result(task, res, counted)
        if (task.arm == "base" and not cache_hit and not res.infra
                and self.baseline is not None):
            await self.baseline.put(task, res)
        self._announce(task, res, counted, cache_hit)

    def _announce(self, task: UnitTask, res: UnitResult, counted: bool,
                  cache_hit: bool) -> None:
        """A `TaskFinished` event, when someone takes them."""
        if self.finished_events:
            status: Literal["cache_hit", "pending", "discarded"] = (
                "cache_hit" if cache_hit else "pending" if counted else "discarded")
            self.bus.publish(_task_finished(self.now(), task, res, status))

    def _note_infra(self, run: _TypeRun, task: UnitTask, res: UnitResult) -> None:
        """Mark the unit INFRA and keep the error for the guard's message."""
        rank = task.ladder_rank
        if not run.infra_marked[rank]:
            run.infra_marked[rank] = True
            run.counters.infra_units += 1
        if res.error:
            self.last_errors[task.task_type].append(res.error)

    def _check_guard(self, run: _TypeRun, task: UnitTask) -> None:
        """Abort the gate when the type's INFRA guard trips."""
        c = run.counters
        if self.guard.tripped(c.infra_units, c.completed, c.infra_calls):
            raise InfraGuardError(task.task_type, c.infra_units, c.completed, self.guard,
                                  self.last_errors[task.task_type], c.infra_calls)

    async def _advance(self, run: _TypeRun) -> None:
        """Walk the prefix pointer over every resolved unit, deciding after each; with a
        sink each consumed unit and the decision land before the next unit is consumed."""
        sink = self.sink
        if sink is None:
            return self._advance_now(run)
        start = run.prefix
        while run.prefix < run.n and run.resolved[run.prefix] and not run.frozen:
            ev = self._consume_head(run)
            assert ev is not None  # a sink sets prefix_events
            await sink.on_consumed(ev)
            self.bus.publish(ev)
            if run.frozen:
                outcome = self._close(run)
                await sink.on_decided(run.plan.task_type, outcome)
                self.bus.publish(TypeDecided(self.now(), run.plan.task_type, outcome))
        if run.prefix != start and not run.frozen:
            self.order.moved(run)  # its priority may depend on the new state

    def _advance_now(self, run: _TypeRun) -> None:
        """`_advance` without a sink: nothing to await (no coroutine per consumed pair)."""
        start = run.prefix
        while run.prefix < run.n and run.resolved[run.prefix] and not run.frozen:
            ev = self._consume_head(run)
            if ev is not None:
                self.bus.publish(ev)
            if run.frozen:
                outcome = self._close(run)
                self.bus.publish(TypeDecided(self.now(), run.plan.task_type, outcome))
        if run.prefix != start and not run.frozen:
            self.order.moved(run)

    def _consume_head(self, run: _TypeRun) -> PrefixAdvanced | None:
        """Consume the unit at the head of ``run``'s prefix (INFRA: no pair) and move the
        prefix past it; the event that announces it, when someone takes it."""
        rank = run.prefix
        arms = run.results.pop(rank)
        base, cand = arms.get("base"), arms.get("cand")
        pair = None if run.infra_marked[rank] else (
            base.correct, cand.correct)  # type: ignore[union-attr]  # both arms
        action = run.test.consume(rank, pair)
        run.prefix += 1
        run.frozen = action is not Action.CONTINUE
        if not self.prefix_events:
            return None
        s: GateState = run.test.state
        return _prefix_advanced(self.now(), run.plan.task_type, run.plan.units[rank], rank,
                                base, cand, run.test.points[-1].d, s.W, s.L, s.n_used,
                                s.e_plus, s.e_minus, run.n - s.n_consumed, action)

    async def _decided(self, run: _TypeRun) -> None:
        """``run`` decided (an empty ladder, before any call): close it and announce it."""
        outcome = self._close(run)
        if self.sink is not None:
            await self.sink.on_decided(run.plan.task_type, outcome)
        self.bus.publish(TypeDecided(self.now(), run.plan.task_type, outcome))

    def _close(self, run: _TypeRun) -> TypeOutcome:
        """A type decided: drop what it still held and stop its calls that serve nothing now
        (every call once the last type decides, unless ``past_stop="wait"``)."""
        run.results.clear()  # never counted now
        self.n_decided += 1
        outcome = run.test.outcome()
        every = self.n_decided == len(self.runs) and self.past_stop == "cancel"
        if every or self.cancel_after_freeze:
            # no result in flight can change a decision now (past every stop, or this type's)
            for worker, task in list(self.in_flight.items()):
                if every or (task.task_type == run.plan.task_type
                             and not self._worth_keeping(task, outcome)):
                    self._stop(worker)
        return outcome

    def _worth_keeping(self, task: UnitTask, outcome: TypeOutcome) -> bool:
        """A frozen type's call whose answer still serves: a base-arm call whose baseline
        survives the decision (not ACCEPT) fills the BaselineCache for the next step. A
        candidate's answer never does (only fresh base-arm runs may fill it, SPEC §2)."""
        return (task.arm == "base" and self.baseline is not None
                and outcome.action is not Action.ACCEPT)

    async def _abort(self, reason: str) -> None:
        """Cancel in-flight calls, persist what already finished, close the bus."""
        self.aborting = True
        workers = [w for w in self.workers if not w.done()]
        for w in workers:
            w.cancel()
        if workers:  # a call that ignores its cancellation is left behind after the grace
            _, stuck = await asyncio.wait(workers, timeout=STOP_GRACE_S)
            self.detached.update(stuck)
        for task in self.in_flight.values():  # stopped by the abort (or by a freeze before)
            self.by_type[task.task_type].counters.cancelled_in_flight += 1
        self.in_flight.clear()
        self.n_in_flight = 0  # every call has stopped; its signal, if any, is counted below
        try:
            while self.signals:
                signal = self.signals.popleft()
                task = signal.task
                if isinstance(signal, _Stopped):  # cancelled after its type froze
                    self.by_type[task.task_type].counters.cancelled_in_flight += 1
                    continue
                res = (signal.result if isinstance(signal, _Completed)
                       else UnitResult(infra=True, error=repr(signal.exc)))
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


def _is_programming_error(exc: BaseException) -> bool:
    """One of `_PROGRAMMING_ERRORS`, or a group holding one (a TaskGroup inside ``infer``
    wraps its children's errors in an ExceptionGroup)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(_PROGRAMMING_ERRORS) is not None
    return isinstance(exc, _PROGRAMMING_ERRORS)


STOP_GRACE_S = 10.0
"""How long (loop clock) a gate waits for calls it cancelled to stop: one whose ``infer``
ignores its cancellation is then left running detached, counted as cancelled."""


async def _to_the_end(coro: Awaitable[None], reraise_cancel: bool = True,
                      absorb: str | None = None) -> None:
    """Await ``coro`` to completion even when the caller is cancelled (again) meanwhile.

    The cancel is not lost: with ``reraise_cancel`` one CancelledError follows the end. A
    cancel whose message is ``absorb`` is undone instead: the gate's own cut-off of a late
    subscriber, reaching it through that subscriber awaiting the gate's task.
    """
    task = asyncio.ensure_future(coro)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            if task.done():
                raise
            me = asyncio.current_task()
            if absorb is not None and exc.args[:1] == (absorb,) and me is not None:
                me.uncancel()
                continue
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
              dispatch: DispatchName | DispatchPolicy = DEFAULT_DISPATCH, **kw: Any) -> _Gate:
    """Validate, then build (not start) a gate; ``kw`` are `run_gate`'s keyword options."""
    if isinstance(plans, TypePlan):
        raise TypeError(f"plans must be a list of TypePlan, got one TypePlan "
                        f"({plans.task_type!r}): pass [plan]")
    plans = list(plans)
    params = as_params(params)
    concurrency = plain_number(concurrency)  # np.int64 from a sweep, as 32 is
    _validate(plans, infer, params, concurrency)
    wait = kw["subscriber_timeout_s"] = plain_number(kw.get("subscriber_timeout_s", 1.0))
    if not (is_real(wait) and wait >= 0):
        raise ValueError(f"subscriber_timeout_s must be a finite number of seconds >= 0, "
                         f"got {wait!r}")
    if kw.get("past_stop", "cancel") not in PAST_STOP_POLICIES:
        raise ValueError(f"past_stop must be one of {', '.join(PAST_STOP_POLICIES)}, "
                         f"got {kw['past_stop']!r}")
    if not isinstance(kw.get("cancel_after_freeze", True), bool):  # "False" is truthy
        raise ValueError(f"cancel_after_freeze must be True or False, got "
                         f"{kw['cancel_after_freeze']!r}")
    return _Gate(plans, infer, params, concurrency, guard=guard or GuardParams(),
                 dispatch=resolve_dispatch(dispatch), **kw)


async def run_gate(plans: Sequence[TypePlan], infer: Infer, params: GateParams | None = None,
                   concurrency: int = DEFAULT_CONCURRENCY, *, baseline: BaselineStore | None = None,
                   sink: ResultSink | None = None, subscribers: Iterable[Subscriber] = (),
                   rule: DecisionRule | None = None, guard: GuardParams | None = None,
                   dispatch: DispatchName | DispatchPolicy = DEFAULT_DISPATCH,
                   cancel_after_freeze: bool = True, past_stop: PastStop = "cancel",
                   subscriber_timeout_s: float = 1.0,
                   admission: Admission | None = None) -> GateResult:
    """Run the continuous concurrent gate over ``plans`` and return every type's outcome.

    Decisions equal `replay_prefix` on the same outcomes whatever the completion order and
    whichever ``dispatch`` policy picks the next type (`ExpectedNeed`, the default;
    `RoundRobin`, `NeedAware`). With ``cancel_after_freeze`` a frozen type's in-flight
    calls whose answers serve nothing more are cancelled (counted as
    ``cancelled_in_flight``) instead of finishing: every candidate
    call, and the base-arm calls unless a ``baseline`` store is given and the baseline
    survives (not ACCEPT): those finish and fill it for the next step. Once every type has
    decided, the calls still in flight are past every stop: ``past_stop="cancel"`` (the
    default) cancels them all the same way, so the gate returns when its last type decides;
    ``"wait"`` lets them finish (stored, never counted) before it returns.
    Raises `InfraGuardError` (with ``.partial``) if a type's INFRA ratio trips the guard;
    before any inference, `ValueError` for bad input (ladders longer than ``params.n_max``,
    two types with one slug) and `RuntimeError` if two types share one target skill file;
    a TypeError, AttributeError or NameError raised by ``infer`` fails the gate at once.
    Subscribers get at most ``subscriber_timeout_s`` after the gate ends to catch up.
    ``admission`` (default: ``infer.admission`` if it has one) may hold fewer than
    ``concurrency`` calls in flight (`Admission`: an LLM agent's adaptive limit).
    """
    gate = _new_gate(plans, infer, params, concurrency, baseline=baseline, sink=sink,
                     subscribers=subscribers, rule=rule, guard=guard, dispatch=dispatch,
                     cancel_after_freeze=cancel_after_freeze, past_stop=past_stop,
                     subscriber_timeout_s=subscriber_timeout_s, admission=admission)
    return await gate.run()


