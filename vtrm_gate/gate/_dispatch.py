"""Cross-type dispatch order (issue 10): which undecided type's next unit takes a free slot.

Decisions depend only on each type's outcomes in ladder order, so the order in which types
get slots changes makespan and wasted calls, never a decision. A policy scores each type's
next unit (higher first; ties go round-robin, the SPEC's fairness rule); an optional
``max_wait`` bounds starvation: a type with units left gets one within
``max_wait + K - 1`` dispatches, K = the types still dispatching.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Generic, Literal, Protocol, TypeVar

from ..errors import is_real, is_whole, plain_fields
from ..stats import (
    Action,
    DecisionRule,
    GateParams,
    GateState,
    Pair,
    SequentialTest,
    stops_early,
)

Priority = tuple[float, ...]
_MEMO_CAP = 100_000  # memoised values kept per (rule, params) table; at most _TABLES tables
_TABLES = 4  # (~160 B an entry: at most ~65 MB; a training run holds ~100,000-200,000)
DispatchName = Literal["round_robin", "need_aware", "expected_need"]
DISPATCH_NAMES: tuple[DispatchName, ...] = ("round_robin", "need_aware", "expected_need")
DEFAULT_DISPATCH: DispatchName = "expected_need"
"""The default order (issue 17): within 2% of the clairvoyant schedule at the median and
10% in the worst seed in every benchmark world, where round-robin is not (1.044 / 1.108 at 50
types x 256 slots); starvation stays bounded (`ExpectedNeed.max_wait`)."""


class Lane(Protocol):
    """What a policy sees of one type: ladder size, its sequential test, prefix, freeze."""

    @property
    def task_type(self) -> str: ...

    @property
    def n(self) -> int: ...

    @property
    def prefix(self) -> int: ...

    @property
    def test(self) -> SequentialTest: ...

    @property
    def frozen(self) -> bool: ...


class DispatchPolicy(Protocol):
    """Scores the unit at ``rank`` of ``lane`` (a tuple of numbers: higher dispatches first,
    ties round-robin); None means never start this lane's remaining units. A score may
    depend only on the lane's state (its prefix and test) and ``rank``: it is reused until
    either moves."""

    def max_wait(self, n_lanes: int) -> int | None: ...

    def priority(self, lane: Lane, rank: int) -> Priority | None: ...


LaneT = TypeVar("LaneT", bound=Lane)


def dispatch_order(lanes: Sequence[LaneT], policy: DispatchPolicy) -> DispatchOrder[LaneT]:
    """Lazily, the next (lane, ladder rank) to start, scored at the moment it is asked for.

    Inside a lane units go in ladder order. A lane whose wait (units dispatched since its
    last one) reaches ``max_wait`` goes first (the longest wait first, ties round-robin), so
    no lane with units left waits more than ``max_wait + K - 1`` dispatches. A lane's
    priority is asked again only when its next rank has moved or it was reported with
    ``order.moved(lane)`` (its prefix advanced; the scheduler reports every advance). A
    frozen or exhausted lane is noticed by itself. O(log K) per dispatch (O(1) amortised
    for `RoundRobin`) instead of a scan of every lane.
    """
    if type(policy) is RoundRobin:
        return _RoundRobinOrder(lanes)
    return _HeapOrder(lanes, policy)


class DispatchOrder(Generic[LaneT]):
    """An iterator over (lane, rank) that is told when a lane's prefix moves."""

    def __init__(self, lanes: Sequence[LaneT]) -> None:
        self.lanes = list(lanes)
        self._index = {id(lane): k for k, lane in enumerate(self.lanes)}
        self.cursor = [0] * len(self.lanes)  # the next ladder rank of each lane

    def __iter__(self) -> DispatchOrder[LaneT]:
        return self

    def __next__(self) -> tuple[LaneT, int]:
        raise NotImplementedError

    def moved(self, lane: LaneT) -> None:
        """``lane``'s prefix (and so its test state) advanced: re-score it before the next
        dispatch. A no-op for orders whose priorities ignore the prefix."""

    def _open(self, k: int) -> bool:
        """Lane ``k`` may still get units: not frozen and ladder not exhausted."""
        lane = self.lanes[k]
        return self.cursor[k] < lane.n and not lane.frozen


class _RoundRobinOrder(DispatchOrder[LaneT]):
    """`RoundRobin`: lanes in a ring, served one unit per turn; closed lanes drop out."""

    def __init__(self, lanes: Sequence[LaneT]) -> None:
        super().__init__(lanes)
        self._ring = deque(k for k, lane in enumerate(self.lanes) if lane.n > 0)

    def __next__(self) -> tuple[LaneT, int]:
        ring = self._ring
        while ring:
            k = ring.popleft()
            if self._open(k):
                rank = self.cursor[k]
                self.cursor[k] = rank + 1
                ring.append(k)
                return self.lanes[k], rank
        raise StopIteration


def _descending(p: Priority, pos: int, k: int, version: int) -> tuple[Any, ...]:
    """A heap entry that sorts priorities highest first: each number negated, and +inf after
    them, so a priority that is a prefix of another (lower, lexicographically) still sorts
    after it; then the ring position, the lane and its version. One flat tuple of numbers:
    it compares in C, element by element, as a nested (key, position, ...) tuple did, with
    one level less per comparison."""
    if len(p) == 2:  # every built-in policy but RoundRobin: no list built
        return (-p[0], -p[1], math.inf, pos, k, version)
    return (*[-x for x in p], math.inf, pos, k, version)


class _HeapOrder(DispatchOrder[LaneT]):
    """Any policy: a heap of lanes by (priority, ring position) and, with ``max_wait``, a
    heap by last service; entries are invalidated lazily (a version per lane; in the wait
    heap, the lane's last service, read when its entry surfaces).

    Ring positions are absolute (lane k sits at k, k + K, k + 2K, ...): ties go to the
    first position at or after ``turn``, the one after the lane served last, exactly as a
    scan from ``turn`` would find them. An entry passed by ``turn`` is moved on by K when
    it surfaces, which keeps every comparison of equal priorities right.
    """

    def __init__(self, lanes: Sequence[LaneT], policy: DispatchPolicy) -> None:
        super().__init__(lanes)
        k_all = len(self.lanes)
        self.policy = policy
        self._dead = [lane.n == 0 for lane in self.lanes]
        self.max_wait = policy.max_wait(sum(not d for d in self._dead))
        self._count = 0
        self._turn = 0  # absolute ring position after the lane served last
        self._scored: list[tuple[int, int] | None] = [None] * k_all  # (prefix, rank) scored
        self._version = [0] * k_all
        # (`_descending` priority..., ring position, lane, version): flat
        self._by_priority: list[tuple[Any, ...]] = []
        # (dispatch count at the lane's last unit or before, ring position, lane, 0): one
        # entry per lane, brought up to date when it surfaces (not a push per dispatch)
        self._by_wait: list[tuple[int, int, int, int]] = []
        self._last = [0] * k_all  # dispatch count at each lane's last unit
        self._stale = {k for k in range(k_all) if not self._dead[k]}
        if self.max_wait is not None:
            self._by_wait = [(0, k, k, 0) for k in range(k_all) if not self._dead[k]]

    def moved(self, lane: LaneT) -> None:
        k = self._index[id(lane)]
        if not self._dead[k]:
            self._stale.add(k)

    def _position(self, k: int) -> int:
        """Lane k's first ring position at or after ``turn``."""
        return self._turn + (k - self._turn) % len(self.lanes)

    def _rescore(self) -> None:
        dead, lanes, cursor, scored, version = (self._dead, self.lanes, self.cursor,
                                                self._scored, self._version)
        priority, turn, k_all = self.policy.priority, self._turn, len(lanes)
        for k in self._stale:
            if dead[k]:
                continue
            lane, rank = lanes[k], cursor[k]
            if rank >= lane.n or lane.frozen:  # closed (`_open`, inlined: the hot loop)
                dead[k] = True
                continue
            state = (lane.prefix, rank)
            if scored[k] == state:
                continue
            scored[k] = state
            prio = priority(lane, rank)
            version[k] += 1
            if prio is None:
                dead[k] = True
                continue
            # ring position: lane k's first at or after ``turn`` (`_position`, inlined)
            heapq.heappush(self._by_priority,
                           _descending(prio, turn + (k - turn) % k_all, k, version[k]))
        self._stale.clear()

    def _top(self) -> tuple[Any, ...] | None:
        """The priority heap's best live entry (stale, closed and passed-over ones fixed
        first)."""
        heap, current, dead, lanes, cursor = (self._by_priority, self._version, self._dead,
                                              self.lanes, self.cursor)
        while heap:
            entry = heap[0]
            pos, k, version = entry[-3:]
            if version != current[k] or dead[k]:
                heapq.heappop(heap)
            elif cursor[k] >= lanes[k].n or lanes[k].frozen:  # closed (`_open`, inlined)
                dead[k] = True
                heapq.heappop(heap)
            elif pos < self._turn:
                heapq.heapreplace(heap, (*entry[:-3], self._position(k), k, version))
            else:
                return entry
        return None

    def _top_wait(self) -> tuple[int, int, int, int] | None:
        """The wait heap's best live entry. An entry's count is at most its lane's last
        service, so a lane served since is moved to its real count when it surfaces: the
        same order as a fresh entry per dispatch (counts past 0 are unique; positions are
        fixed on surfacing either way)."""
        heap, last = self._by_wait, self._last
        while heap:
            count, pos, k, _ = entry = heap[0]
            if self._dead[k]:
                heapq.heappop(heap)
            elif not self._open(k):
                self._dead[k] = True
                heapq.heappop(heap)
            elif count != last[k] or pos < self._turn:
                heapq.heapreplace(heap, (last[k], self._position(k), k, 0))
            else:
                return entry
        return None

    def __next__(self) -> tuple[LaneT, int]:
        if self._stale:
            self._rescore()
        best = None
        waits, max_wait = self._by_wait, self.max_wait
        # the oldest entry (stale ones are older still) not yet due: nobody is (no heap walk);
        # ``waits`` holds entries only when max_wait is set (not None)
        if waits and max_wait is not None and self._count - waits[0][0] >= max_wait:
            top = self._top_wait()
            if top is not None and self._count - top[0] >= max_wait:
                best = top
        if best is None:
            best = self._top()
            if best is None:
                raise StopIteration
            heapq.heappop(self._by_priority)
        pos, k = best[-3], best[-2]
        rank = self.cursor[k]
        self.cursor[k] = rank + 1
        self._count += 1
        self._turn = pos + 1
        self._stale.add(k)
        self._last[k] = self._count
        return self.lanes[k], rank


@dataclass(frozen=True)
class RoundRobin:
    """The SPEC's fair order: types in name order, one unit per turn."""

    def max_wait(self, n_lanes: int) -> int | None:
        return None

    def priority(self, lane: Lane, rank: int) -> Priority | None:
        return ()


@dataclass(frozen=True)
class NeedAware:
    """First the unit most likely to be needed: P(the type has not decided before reaching
    it), by the exact operating-characteristics recursion from the type's current state
    under i.i.d. units (``p_win`` of discordant pairs, ``discordance``, ``infra_rate``).

    Ties go to the longest remaining ladder, then round-robin. ``max_wait`` (default
    ``2 * K``) bounds starvation: every type with units left gets one within
    ``max_wait + K - 1`` dispatches.
    """

    p_win: float = 0.5
    discordance: float = 0.3
    infra_rate: float = 0.0
    wait: int | None = None
    _memo: dict[tuple[int, int], tuple[DecisionRule, GateParams, dict[tuple[int, ...], float]]] = (
        field(default_factory=dict, compare=False, repr=False))
    _tables: list[tuple[DecisionRule, GateParams, dict[tuple[int, ...], float]]] = (
        field(default_factory=list, compare=False, repr=False))

    def __post_init__(self) -> None:
        plain_fields(self)
        for name in ("p_win", "discordance", "infra_rate"):
            v = getattr(self, name)
            if not (is_real(v) and 0 <= v <= 1):
                raise ValueError(f"NeedAware.{name} must be a probability in [0, 1], got {v!r}")
        if self.wait is not None and (isinstance(self.wait, bool)
                                      or not isinstance(self.wait, int) or self.wait < 1):
            raise ValueError(f"NeedAware.wait must be an integer >= 1 or None, got {self.wait!r}")

    def max_wait(self, n_lanes: int) -> int | None:
        return self.wait if self.wait is not None else max(1, 2 * n_lanes)

    def priority(self, lane: Lane, rank: int) -> Priority | None:
        t = lane.test
        ahead = rank - lane.prefix  # units to consume before the one at ``rank``
        return (self.p_needed(t.rule, t.params, t.state, t.n_ladder, ahead), lane.n - rank)

    def outcomes(self) -> tuple[tuple[Pair, float], ...]:
        """The next unit's law: win, loss, tie, INFRA."""
        q = 1.0 - self.infra_rate
        dis = q * self.discordance
        return (((False, True), dis * self.p_win), ((True, False), dis * (1 - self.p_win)),
                ((True, True), q - dis), (None, self.infra_rate))

    @cached_property
    def _law(self) -> tuple[tuple[Pair, float], ...]:
        """`outcomes` without the impossible ones, computed once (the sweep's inner loop)."""
        return tuple((pair, p) for pair, p in self.outcomes() if p > 0.0)

    def p_needed(self, rule: DecisionRule, params: GateParams, state: GateState,
                 n_ladder: int, ahead: int) -> float:
        """P(no decision in the next ``ahead`` consumed units) from ``state``, memoised on
        the counts (W, L, n_used, n_consumed), which fix the state under the default rule."""
        if ahead <= 0 or not stops_early(rule):  # a rule that cannot stop: every unit needed
            return 1.0
        return self._sweep(rule, params, self._table(rule, params), state, n_ladder, ahead, 0)

    def _table(self, rule: DecisionRule, params: GateParams) -> dict[tuple[int, ...], float]:
        """The memo of one (rule, params) pair: found by identity first (hashing them is
        slow), then by equality, so equal rules and params built anew for every plan and
        gate (an evaluation's `MeasureAll` per type) share one memo instead of refilling."""
        ids = (id(rule), id(params))
        entry = self._memo.get(ids)
        if entry is None or entry[0] is not rule or entry[1] is not params:
            tables = self._tables
            table = next((t for r, p, t in tables if r == rule and p == params), None)
            if table is None:
                if len(tables) >= _TABLES:  # a new rule or params per gate: keep it small
                    self._evict()
                table = {}
                tables.append((rule, params, table))
            if len(self._memo) >= 256:  # identity aliases only: the tables stay
                self._memo.clear()
            # the alias holds rule and params, so their ids are not reused while it lives
            entry = self._memo[ids] = (rule, params, table)
        if len(entry[2]) > _MEMO_CAP:  # a long session: start over rather than grow forever
            entry[2].clear()
        return entry[2]

    def _evict(self) -> None:
        """Drop the smallest memo table (the cheapest to rebuild) and every identity alias to
        it: an alias kept a dropped table alive and growing, so a training run's memory grew
        every epoch (issue 29); now at most ``_TABLES`` tables of ``_MEMO_CAP`` entries live."""
        tables = self._tables
        dead = tables.pop(min(range(len(tables)), key=lambda i: len(tables[i][2])))[2]
        for ids in [ids for ids, entry in self._memo.items() if entry[2] is dead]:
            del self._memo[ids]

    def _sweep(self, rule: DecisionRule, params: GateParams,
               table: dict[tuple[int, ...], float], state: GateState, n_ladder: int, m: int,
               count: int) -> float:
        """f(state, m) = count + sum over the next unit's outcomes that do not decide of
        p * f(next, m - 1), with f(., 0) = 1 - count: survival (count 0) or the expected units
        consumed (count 1), memoised on the counts, which fix the state under the default
        rule."""
        if m <= 0:
            return 1.0 - count
        key = (count, n_ladder, state.W, state.L, state.n_used, state.n_consumed, m)
        hit = table.get(key)
        if hit is not None:
            return hit
        total = float(count)
        for pair, p in self._law:
            nxt = rule.update(state, pair, params)
            if rule.decide(nxt, n_ladder - nxt.n_consumed, params) is Action.CONTINUE:
                total += p * self._sweep(rule, params, table, nxt, n_ladder, m - 1, count)
        table[key] = total
        return total


@dataclass(frozen=True)
class ExpectedNeed(NeedAware):
    """First the type expected to need the most units from this one on: the clairvoyant's
    rule (most needed units left first) in expectation, under `NeedAware`'s model.

    Within ``horizon`` units of its ladder's end, the score of the unit at ``rank`` is
    E[units consumed from ``rank`` until the type decides] = the sum over a >= ahead of
    P(no decision in the next a units); further out it is every unit left from ``rank`` (a
    type that far from its end is scored as if it needed all of them). Ties go to the
    longest remaining ladder, then round-robin. Scores are memoised on the counts toward the
    ladder's end, so one search of at most O(horizon^3) rule steps serves every later state
    of the ladder (and every lane and gate with the same rule, params and ladder length);
    a search that restarted at every unit made a never-deciding 4 x 100-unit gate cost 34 s.
    ``max_wait`` (default ``8 * K``) bounds starvation: every type with units left gets one
    within ``max_wait + K - 1`` dispatches (a longer wait than NeedAware's 2K lets long types
    start their units early, which is what shortens the step).
    """

    horizon: int = 48

    def __post_init__(self) -> None:
        super().__post_init__()
        if not is_whole(self.horizon) \
                or self.horizon < 1:
            raise ValueError(f"ExpectedNeed.horizon must be an integer >= 1, "
                             f"got {self.horizon!r}")

    def max_wait(self, n_lanes: int) -> int | None:
        return self.wait if self.wait is not None else max(1, 8 * n_lanes)

    def priority(self, lane: Lane, rank: int) -> Priority | None:
        t = lane.test
        n, prefix = lane.n, lane.prefix
        ahead, left = rank - prefix, n - prefix
        if left > self.horizon or not stops_early(t.rule):
            # far from its ladder's end (or a rule that cannot stop): every unit counts
            return (float(left - ahead), float(n - rank))
        rule, params, state, n_ladder = t.rule, t.params, t.state, t.n_ladder
        table = self._table(rule, params)
        # both sums straight from the memo when there (every 40-unit ladder's score is a
        # search, so its two lookups skip the calls down to `_sweep`); the same values
        W, L, used, consumed = state.W, state.L, state.n_used, state.n_consumed
        e_left = table.get((1, n_ladder, W, L, used, consumed, left)) if left > 0 else 0.0
        if e_left is None:
            e_left = self._expected(rule, params, table, state, n_ladder, left)
        e_ahead = table.get((1, n_ladder, W, L, used, consumed, ahead)) if ahead > 0 else 0.0
        if e_ahead is None:
            e_ahead = self._expected(rule, params, table, state, n_ladder, ahead)
        return (e_left - e_ahead, float(n - rank))

    def _expected(self, rule: DecisionRule, params: GateParams,
                  table: dict[tuple[int, ...], float], state: GateState, n_ladder: int,
                  m: int) -> float:
        """E[units consumed among the next m] = sum over a < m of P(no decision in a)."""
        return self._sweep(rule, params, table, state, n_ladder, m, 1)


_NEED_AWARE = NeedAware()  # shared, so its memo carries over from one gate to the next
_EXPECTED_NEED = ExpectedNeed()


def resolve_dispatch(dispatch: DispatchName | DispatchPolicy) -> DispatchPolicy:
    """A policy from its name (``round_robin``, ``need_aware``, ``expected_need``) or the
    policy itself."""
    if isinstance(dispatch, str):
        if dispatch == "round_robin":
            return RoundRobin()
        if dispatch == "need_aware":
            return _NEED_AWARE
        if dispatch == "expected_need":
            return _EXPECTED_NEED
        raise ValueError(f"dispatch must be 'round_robin', 'need_aware', 'expected_need' or a "
                         f"DispatchPolicy, got {dispatch!r}")
    if not (callable(getattr(dispatch, "priority", None))
            and callable(getattr(dispatch, "max_wait", None))):
        raise TypeError(f"dispatch must be 'round_robin', 'need_aware', 'expected_need' or "
                        f"an object with priority(lane, rank) and max_wait(n_lanes), got "
                        f"{type(dispatch).__name__}")
    return dispatch
