"""A forecast while the gate runs: each type's exits from where it stands and the step's ETA.

`GateForecast` is fed the gate's events (a subscriber, or called by a view) and answers
`forecast()`: per undecided type, the exact OC recursion from its current state
(`stats.oc_from_state`) under the rates it showed so far shrunk toward a prior
(`stats.forecast_rates`); the expected calls still to start (each ladder unit past the
prefix weighted by P(the type is still undecided when it gets there), arms already started
or served by the BaselineCache not counted again); and, with the mean call latency observed
so far and the slot count, a time: the work before the last wave of calls spread over the
slots, plus the expected slowest of that last wave (an order statistic of the latencies
seen so far: the gate's end waits for its slowest call). A forecast under stated
assumptions, not a guarantee; docs/performance.md gives its error against the simulator.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..stats import (
    Action,
    ForecastPrior,
    GateParams,
    GateState,
    StateOC,
    forecast_rates,
    oc_from_state,
)
from ._events import GateEvent, GateStarted, PrefixAdvanced, TaskFinished, TaskStarted, TypeDecided

MIN_LATENCIES = 3
"""A type's own mean latency is used once it has this many finished calls."""
KEEP_LATENCIES = 4096
"""The latencies kept for the last wave's order statistic (the most recent ones)."""


@dataclass(frozen=True)
class TypeForecast:
    """One undecided type: its exits from here (``oc``) and the calls it is expected to
    start still (``expected_calls``)."""

    task_type: str
    oc: StateOC
    expected_calls: float
    latency_s: float | None

    def likeliest(self) -> tuple[Action, float]:
        """The exit this type most likely ends in, from where it stands, and its chance."""
        return max(self.oc.probabilities().items(), key=lambda kv: kv[1])

    def label(self) -> str:
        """Short text for a panel: the likeliest exit and the units expected still."""
        a, p = self.likeliest()
        chance = ">99%" if p > 0.995 else f"{p:.0%}"
        return f"forecast: {a} {chance}, ~{self.oc.expected_units:.0f} to go"


@dataclass(frozen=True)
class Forecast:
    """The step's ETA (None until a call latency has been observed) and per-type forecasts."""

    t: float
    eta_s: float | None
    expected_calls: float
    types: Mapping[str, TypeForecast]
    assumption: str = ("i.i.d. units at each type's observed discordance and win rate, "
                       "shrunk toward the prior")

    def text(self) -> str:
        """The ETA as a short phrase, e.g. ``"ETA ~14 min (forecast)"``."""
        return "ETA unknown" if self.eta_s is None else f"ETA ~{duration(self.eta_s)} (forecast)"


def hours(seconds: float) -> str:
    """Seconds in hours to 0.01 h (1.24 h), or in seconds below 0.1 h: a scaled or tiny run
    printed "makespan 0.00 h"."""
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds:.1f} s"


def duration(seconds: float) -> str:
    """Seconds as a short duration: 45 s, 14 min, 2.3 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass
class _Lane:
    """What the forecast tracks per type (mutable, owned by one `GateForecast`)."""

    n_ladder: int
    state: GateState = field(default_factory=GateState)
    decided: bool = False
    begun: dict[int, int] = field(default_factory=dict)  # ladder_rank -> arms started or hit,
    # for the units past the prefix only (a consumed unit's entry goes: O(in flight), not O(n))
    base_started: int = 0
    base_hits: int = 0
    latency_sum: float = 0.0
    latency_n: int = 0


class OCMemo:
    """`oc_from_state` memoised on (W, L, n_used, n_consumed, E+, E-, units left): each
    state is computed once, from whichever thread asks first (a lock guards the table)."""

    def __init__(self, params: GateParams, prior: ForecastPrior, cap: int = 4096) -> None:
        self.params, self.prior, self.cap = params, prior, cap
        self._table: dict[tuple[float, ...], StateOC] = {}
        self._lock = threading.Lock()

    def get(self, state: GateState, n_remaining: int) -> StateOC:
        key = (state.W, state.L, state.n_used, state.n_consumed, state.e_plus, state.e_minus,
               n_remaining)
        with self._lock:
            hit = self._table.get(key)
        if hit is None:
            p_win, disc, infra = forecast_rates(state, self.prior)
            hit = oc_from_state(self.params, state, n_remaining, p_win, disc, infra)
            with self._lock:
                if len(self._table) >= self.cap:  # a long session: start over, never grow
                    self._table.clear()
                self._table[key] = hit
        return hit


@dataclass(frozen=True)
class ForecastInput:
    """A frozen copy of what a `GateForecast` has seen (cheap to take on the event loop);
    `forecast` does the exact recursions, so it may run in a worker thread."""

    t: float
    concurrency: int
    lanes: tuple[tuple[str, _Lane], ...]
    started: tuple[tuple[str, float], ...]  # (task_type, start time) of calls in flight
    latencies: tuple[float, ...]
    memo: OCMemo

    def _latency(self, lane: _Lane) -> float | None:
        if lane.latency_n >= MIN_LATENCIES:
            return lane.latency_sum / lane.latency_n
        n = sum(ln.latency_n for _, ln in self.lanes)
        return sum(ln.latency_sum for _, ln in self.lanes) / n if n else None

    def expected_max(self, m: int) -> float:
        """E[the slowest of ``m`` calls] under the latencies seen so far (empirical order
        statistic: Σ x_(i) ((i/n)^m - ((i-1)/n)^m))."""
        return expected_max(self.latencies, m)

    def forecast(self, now: float | None = None) -> Forecast:
        """The forecast at ``now`` (default: the last event's time)."""
        now = self.t if now is None else now
        types: dict[str, TypeForecast] = {}
        work = calls = 0.0
        for name, lane in self.lanes:
            if lane.decided:
                continue
            oc = self.memo.get(lane.state, max(lane.n_ladder - lane.state.n_consumed, 0))
            lat = self._latency(lane)
            n = _expected_calls(lane, oc)
            types[name] = TypeForecast(name, oc, n, lat)
            calls += n
            work += n * (lat or 0.0)
        lanes = dict(self.lanes)
        flying = 0
        for name, start in self.started:
            running = lanes.get(name)
            lat = (self._latency(running) if running is not None and not running.decided
                   else None)
            if lat is not None:
                work += max(lat - (now - start), 0.1 * lat)  # its expected rest
                flying += 1
        if not self.latencies:
            return Forecast(now, None, calls, types)
        if not types:
            return Forecast(now, 0.0, 0.0, types)
        mean = sum(self.latencies) / len(self.latencies)
        wave = min(self.concurrency, max(round(calls) + flying, 1))
        eta = max(work - wave * mean, 0.0) / self.concurrency + self.expected_max(wave)
        return Forecast(now, eta, calls, types)


def expected_max(latencies: Sequence[float], m: int) -> float:
    """E[max of ``m`` draws] from the empirical distribution of ``latencies``."""
    xs = sorted(latencies)
    n = len(xs)
    if not n or m <= 0:
        return 0.0
    return sum(x * ((i / n) ** m - ((i - 1) / n) ** m) for i, x in enumerate(xs, 1))


def _expected_calls(lane: _Lane, oc: StateOC) -> float:
    """Σ over the units past the prefix: P(still needed) × arms not begun yet (a base arm
    weighted by the share of this type's base arms the BaselineCache missed)."""
    seen = lane.base_hits + lane.base_started
    base_cost = 1.0 - lane.base_hits / seen if seen else 1.0
    prefix = lane.state.n_consumed
    total = 0.0
    for k, p in enumerate(oc.survival[:-1]):
        begun = lane.begun.get(prefix + k, 0)
        total += p * (max(1 - begun, 0) * base_cost + (1 if begun < 2 else 0))
    return total


class GateForecast:
    """Per-type exits from where each type stands, and the step's ETA, from gate events.

    ``update`` only records (cheap, never blocks); ``freeze()`` copies what it has seen and
    ``forecast()`` = ``freeze().forecast()`` computes (the exact recursions, memoised)."""

    def __init__(self, prior: ForecastPrior | None = None) -> None:
        self.prior = prior or ForecastPrior()
        self.params = GateParams()
        self.concurrency = 1
        self.lanes: dict[str, _Lane] = {}
        self.t = 0.0
        self.memo = OCMemo(self.params, self.prior)
        self._started: dict[tuple[str, int, str], float] = {}  # in flight: start time
        self._latencies: list[float] = []

    def __call__(self, ev: GateEvent) -> None:
        self.update(ev)

    def update(self, ev: GateEvent) -> None:
        if ev.t > self.t:
            self.t = ev.t
        handler = _FORECAST_HANDLERS.get(type(ev))
        if handler is not None:
            handler(self, ev)

    def _gate_started(self, ev: GateStarted) -> None:
        self.params, self.concurrency = ev.params, max(ev.concurrency, 1)
        self.memo = OCMemo(self.params, self.prior)
        self.lanes = {t: _Lane(n) for t, n in zip(ev.task_types, ev.ladder_sizes, strict=True)}

    def _started_task(self, ev: TaskStarted) -> None:
        task = ev.task
        self._begin(task.task_type, task.ladder_rank, task.arm, hit=False)
        self._started[(task.task_type, task.ladder_rank, task.arm)] = ev.t

    def _advanced(self, ev: PrefixAdvanced) -> None:
        lane = self.lanes.get(ev.task_type)
        if lane is not None:
            lane.state = GateState(ev.W, ev.L, ev.n_used, ev.ladder_rank + 1, ev.e_plus,
                                   ev.e_minus)
            lane.begun.pop(ev.ladder_rank, None)  # only units past the prefix are read
            lane.decided = ev.action is not Action.CONTINUE

    def _decided(self, ev: TypeDecided) -> None:
        lane = self.lanes.get(ev.task_type)
        if lane is not None:
            lane.decided = True

    def _finished(self, ev: TaskFinished) -> None:
        key = (ev.task.task_type, ev.task.ladder_rank, ev.task.arm)
        if ev.status == "cache_hit":
            self._begin(*key, hit=True)
        start = self._started.pop(key, None)
        lane = self.lanes.get(ev.task.task_type)
        if start is not None and lane is not None and ev.status != "cancelled":
            lane.latency_sum += ev.t - start
            lane.latency_n += 1
            self._latencies.append(ev.t - start)
            if len(self._latencies) > 2 * KEEP_LATENCIES:
                del self._latencies[:KEEP_LATENCIES]

    def _begin(self, task_type: str, rank: int, arm: str, *, hit: bool) -> None:
        lane = self.lanes.get(task_type)
        if lane is None:
            return
        lane.begun[rank] = lane.begun.get(rank, 0) + 1
        if arm == "base":
            lane.base_hits += hit
            lane.base_started += not hit

    def freeze(self) -> ForecastInput:
        """A frozen copy of what has been seen: take it on the event loop, forecast anywhere."""
        lanes = tuple((name, replace(lane, begun=dict(lane.begun)))
                      for name, lane in self.lanes.items())
        return ForecastInput(self.t, self.concurrency, lanes,
                             tuple((k[0], t) for k, t in self._started.items()),
                             tuple(self._latencies[-KEEP_LATENCIES:]), self.memo)

    def forecast(self, now: float | None = None) -> Forecast:
        """The forecast at ``now`` (default: the last event's time)."""
        return self.freeze().forecast(now)

    def expected_max(self, m: int) -> float:
        """E[the slowest of ``m`` calls] under the latencies seen so far."""
        return expected_max(self._latencies[-KEEP_LATENCIES:], m)


_FORECAST_HANDLERS: dict[type, Callable[[GateForecast, Any], None]] = {
    GateStarted: GateForecast._gate_started, TaskStarted: GateForecast._started_task,
    TaskFinished: GateForecast._finished, PrefixAdvanced: GateForecast._advanced,
    TypeDecided: GateForecast._decided}
"""One method per event class the forecast reads (a dict lookup per event)."""
