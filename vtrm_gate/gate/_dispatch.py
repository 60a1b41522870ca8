"""Cross-type dispatch order (issue 10): which undecided type's next unit takes a free slot.

Decisions depend only on each type's outcomes in ladder order, so the order in which types
get slots changes makespan and wasted calls, never a decision. A policy scores each type's
next unit (higher first; ties go round-robin, the SPEC's fairness rule); an optional
``max_wait`` bounds starvation: a type with units left gets one within
``max_wait + K - 1`` dispatches, K = the types still dispatching.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar

from ..stats import Action, DecisionRule, GateParams, GateState, Pair, SequentialTest

Priority = tuple[float, ...]
_MEMO_CAP = 1_000_000  # memoised survival probabilities kept per (rule, params)
DispatchName = Literal["round_robin", "need_aware"]


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
    """Scores the unit at ``rank`` of ``lane`` (higher dispatches first, ties round-robin);
    None means never start this lane's remaining units. A score may depend only on the
    lane's state (its prefix and test) and ``rank``: it is reused until either moves."""

    def max_wait(self, n_lanes: int) -> int | None: ...

    def priority(self, lane: Lane, rank: int) -> Priority | None: ...


LaneT = TypeVar("LaneT", bound=Lane)


def dispatch_order(lanes: Sequence[LaneT], policy: DispatchPolicy) -> Iterator[tuple[LaneT, int]]:
    """Lazily, the next (lane, ladder rank) to start, scored at the moment it is asked for.

    Inside a lane units go in ladder order. A lane whose wait (units dispatched since its
    last one) reaches ``max_wait`` goes first (the longest wait first, ties round-robin), so
    no lane with units left waits more than ``max_wait + K - 1`` dispatches. A lane's
    priority is asked again only when its prefix or its next rank has moved.
    """
    k_all = len(lanes)
    cursor = [0] * k_all
    last = [0] * k_all  # dispatch count when the lane last got a unit
    dead = [lane.n == 0 for lane in lanes]
    max_wait = policy.max_wait(sum(not d for d in dead))
    count = 0
    turn = 0  # round-robin position: the lane after the one served last
    scored: list[tuple[int, int, Priority | None] | None] = [None] * k_all
    while True:
        best, best_key = -1, None
        for j in range(k_all):
            k = (turn + j) % k_all
            if dead[k]:
                continue
            lane = lanes[k]
            if lane.frozen or cursor[k] >= lane.n:
                dead[k] = True
                continue
            seen = scored[k]
            if seen is not None and seen[0] == lane.prefix and seen[1] == cursor[k]:
                prio = seen[2]
            else:
                prio = policy.priority(lane, cursor[k])
                scored[k] = (lane.prefix, cursor[k], prio)
            if prio is None:
                dead[k] = True
                continue
            wait = count - last[k]
            starving = max_wait is not None and wait >= max_wait
            key = (1.0, wait) if starving else (0.0, *prio)
            if best_key is None or key > best_key:  # strict: ties keep round-robin order
                best, best_key = k, key
        if best < 0:
            return
        rank = cursor[best]
        cursor[best] += 1
        last[best] = count = count + 1
        turn = (best + 1) % k_all
        yield lanes[best], rank


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

    def __post_init__(self) -> None:
        for name in ("p_win", "discordance", "infra_rate"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1:
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

    def p_needed(self, rule: DecisionRule, params: GateParams, state: GateState,
                 n_ladder: int, ahead: int) -> float:
        """P(no decision in the next ``ahead`` consumed units) from ``state``, memoised on
        the counts (W, L, n_used, n_consumed), which fix the state under the default rule."""
        if ahead <= 0:
            return 1.0
        # one table per (rule, params) pair, found by identity: hashing them per call is slow
        ids = (id(rule), id(params))
        entry = self._memo.get(ids)
        if entry is None or entry[0] is not rule or entry[1] is not params:
            if len(self._memo) >= 16:  # a new rule or params per gate: keep the memo small
                self._memo.clear()
            entry = self._memo[ids] = (rule, params, {})
        if len(entry[2]) > _MEMO_CAP:  # a long session: start over rather than grow forever
            entry[2].clear()
        return self._survival(rule, params, entry[2], state, n_ladder, ahead)

    def _survival(self, rule: DecisionRule, params: GateParams,
                  table: dict[tuple[int, ...], float], state: GateState, n_ladder: int,
                  ahead: int) -> float:
        if ahead == 0:
            return 1.0
        key = (n_ladder, state.W, state.L, state.n_used, state.n_consumed, ahead)
        hit = table.get(key)
        if hit is not None:
            return hit
        total = 0.0
        for pair, p in self.outcomes():
            if p <= 0.0:
                continue
            nxt = rule.update(state, pair, params)
            if rule.decide(nxt, n_ladder - nxt.n_consumed, params) is Action.CONTINUE:
                total += p * self._survival(rule, params, table, nxt, n_ladder, ahead - 1)
        table[key] = total
        return total


_NEED_AWARE = NeedAware()  # shared, so its memo carries over from one gate to the next


def resolve_dispatch(dispatch: DispatchName | DispatchPolicy) -> DispatchPolicy:
    """A policy from its name (``round_robin``, ``need_aware``) or the policy itself."""
    if isinstance(dispatch, str):
        if dispatch == "round_robin":
            return RoundRobin()
        if dispatch == "need_aware":
            return _NEED_AWARE
        raise ValueError(f"dispatch must be 'round_robin', 'need_aware' or a DispatchPolicy, "
                         f"got {dispatch!r}")
    if not (callable(getattr(dispatch, "priority", None))
            and callable(getattr(dispatch, "max_wait", None))):
        raise TypeError(f"dispatch must be 'round_robin', 'need_aware' or an object with "
                        f"priority(lane, rank) and max_wait(n_lanes), got "
                        f"{type(dispatch).__name__}")
    return dispatch
