"""The paired betting e-processes and the decision rule (SPEC §1), one unit at a time.

Per consumed unit with both arms non-INFRA, ``d = cand_correct - base_correct`` in {-1, 0, +1}.

* accept side: ``E+ <- E+ * (1 + λ (d - δ))`` — a non-negative supermartingale when
  ``E[d | past] <= δ`` (H0+), so ``P(sup E+ >= e_confirm) <= 1/e_confirm`` (Ville).
* harm side:   ``E- <- E- * (1 - λ d)`` — valid when ``E[d | past] >= 0`` (H0-).

INFRA units are consumed (they advance the prefix) but touch neither W, L, n_used nor the
e-values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import ClassVar, Protocol, TypeVar

from ._params import Action, GateParams, Pair, bet_factors

_T = TypeVar("_T")


def _built(cls: type[_T], **fields: object) -> _T:
    """An instance of the frozen dataclass ``cls`` (no ``__post_init__``) from every one of
    its fields, stored without the generated ``__init__``'s ``object.__setattr__`` per field:
    2x faster, for the state built per consumed unit and dropped at the next. Not for what
    is kept: its own dict takes twice the memory of the shared-key layout (a trajectory
    point: 367 vs 184 B)."""
    obj = object.__new__(cls)
    obj.__dict__.update(fields)
    return obj


def _times(e: float, f: float) -> float:
    # 0 * inf is NaN in floats; a zero factor ends a capital process at exactly 0
    return 0.0 if f == 0.0 else e * f


FUTILITY_RTOL = 1e-9
"""Slack of the futility check: n straight wins multiplied one by one may round up to
n * 2**-53 above the closed form, so FUTILE only fires when the best case misses its
threshold by more than this relative margin (lossless for ladders up to ~10**6 units)."""


def best_case_floor(target: float, n_remaining: int, params: GateParams) -> float:
    """Smallest E+ from which ``n_remaining`` straight wins can still reach ``target``.

    Log space, so no ladder length overflows (``win_factor ** n`` raises past ~1,000 units).
    """
    lw = params.log_win_factor
    return math.exp(math.log(target) - n_remaining * lw) * (1.0 - FUTILITY_RTOL)


def _hopeful(e_plus, w_net, n_remaining: int, params: GateParams):  # type: ignore[no-untyped-def]  # floats or arrays
    """Can straight wins still reach ACCEPT or PROVISIONAL? (floats or numpy arrays alike)"""
    w_best = w_net + n_remaining
    acc = ((e_plus >= best_case_floor(params.e_confirm, n_remaining, params))
           & (w_best >= params.w_net_min))
    prov = ((e_plus >= best_case_floor(params.e_provisional, n_remaining, params))
            & (w_best >= params.w_net_min_provisional))
    return (e_plus > 0) & (acc | prov)


def check_ladder_length(n: int, params: GateParams, what: str = "the ladder") -> None:
    """Refuse a ladder longer than ``GateParams.n_max`` (the cap holds everywhere)."""
    if n > params.n_max:
        raise ValueError(f"{what} has {n} units, more than GateParams.n_max = {params.n_max}; "
                         f"truncate it to n_max (build_ladder does) or raise n_max")


@dataclass(frozen=True)
class GateState:
    """Running statistics of one type after its consumed prefix."""

    W: int = 0
    L: int = 0
    n_used: int = 0
    n_consumed: int = 0
    e_plus: float = 1.0
    e_minus: float = 1.0

    @property
    def w_net(self) -> int:
        return self.W - self.L


class DecisionRule(Protocol):
    """A pluggable sequential rule: how a consumed unit updates the state, and what to do."""

    def update(self, state: GateState, pair: Pair, params: GateParams) -> GateState: ...

    def decide(self, state: GateState, n_remaining: int, params: GateParams) -> Action: ...


def stops_early(rule: DecisionRule) -> bool:
    """Whether ``rule`` may decide before a ladder's end (a rule says it may not with a
    ``stops_early = False`` attribute, as `MeasureAll` does; any other may)."""
    return getattr(rule, "stops_early", True) is not False


def update_state(state: GateState, pair: Pair, params: GateParams) -> GateState:
    """Consume one unit in ladder order (INFRA = None only advances n_consumed)."""
    if pair is None:
        return replace(state, n_consumed=state.n_consumed + 1)
    base, cand = pair
    d = int(bool(cand)) - int(bool(base))
    f_plus, f_minus = bet_factors(params, d)
    e_plus, e_minus = _times(state.e_plus, f_plus), _times(state.e_minus, f_minus)
    assert e_plus >= 0.0 and e_minus >= 0.0, "capital process went negative"
    return _built(GateState, W=state.W + (d == 1), L=state.L + (d == -1),
                  n_used=state.n_used + 1, n_consumed=state.n_consumed + 1, e_plus=e_plus,
                  e_minus=e_minus)


def gate_decision(state: GateState, n_remaining: int, params: GateParams) -> Action:
    """The SPEC §1 rule, in order: ACCEPT, REJECT, FUTILE, exhaustion exit, CONTINUE."""
    if n_remaining < 0:
        raise ValueError(f"n_remaining must be >= 0, got {n_remaining}")
    if state.e_plus >= params.e_confirm and state.w_net >= params.w_net_min:
        return Action.ACCEPT
    if state.e_minus >= params.e_reject:
        return Action.REJECT
    if n_remaining > 0:
        # Lossless futility: every remaining unit a win is the best case for both E+ and W-L.
        if not _hopeful(state.e_plus, state.w_net, n_remaining, params):
            return Action.FUTILE
        return Action.CONTINUE
    if state.e_plus >= params.e_provisional and state.w_net >= params.w_net_min_provisional:
        return Action.PROVISIONAL
    return Action.INERTIA


def _factors(params: GateParams) -> dict[int, tuple[float, float]]:
    """`bet_factors` of d = -1, 0, +1, computed once per params (kept on them)."""
    memo: dict[int, tuple[float, float]] | None = params.__dict__.get("_bet_factors")
    if memo is None:
        memo = {d: bet_factors(params, d) for d in (-1, 0, 1)}
        object.__setattr__(params, "_bet_factors", memo)
    return memo


def _floors(params: GateParams, n_remaining: int) -> tuple[float, float]:
    """The futility floors (`best_case_floor`) of ``e_confirm`` and ``e_provisional`` with
    ``n_remaining`` units left, memoised on the params (at most ``n_max`` entries)."""
    memo: dict[int, tuple[float, float]] | None = params.__dict__.get("_futility_floors")
    if memo is None:
        memo = {}
        object.__setattr__(params, "_futility_floors", memo)
    floors = memo.get(n_remaining)
    if floors is None:
        floors = memo[n_remaining] = (
            best_case_floor(params.e_confirm, n_remaining, params),
            best_case_floor(params.e_provisional, n_remaining, params))
    return floors


@dataclass(frozen=True)
class PairedBetting:
    """The default rule of SPEC §1 ("paired betting")."""

    def update(self, state: GateState, pair: Pair, params: GateParams) -> GateState:
        return update_state(state, pair, params)

    def decide(self, state: GateState, n_remaining: int, params: GateParams) -> Action:
        return gate_decision(state, n_remaining, params)


DEFAULT_RULE: DecisionRule = PairedBetting()


@dataclass(frozen=True)
class TrajectoryPoint:
    """State right after consuming the unit at ``ladder_rank`` (d is None for INFRA)."""

    ladder_rank: int
    d: int | None
    W: int
    L: int
    n_used: int
    e_plus: float
    e_minus: float
    action: Action


@dataclass(frozen=True)
class TypeOutcome:
    """How one type ended: decision, statistics at the stop, and the consumed trajectory.

    ``stop_rank`` is the 0-based ladder index of the unit after which the type decided
    (None when the ladder was empty); ``n_consumed`` counts consumed units including INFRA.
    """

    action: Action
    W: int
    L: int
    n_used: int
    e_plus: float
    e_minus: float
    stop_rank: int | None
    trajectory: tuple[TrajectoryPoint, ...] = field(default=(), repr=False)
    n_consumed: int = 0
    n_ladder: int = 0

    @property
    def decided(self) -> bool:
        return self.action is not Action.CONTINUE

    def same_decision(self, other: TypeOutcome) -> bool:
        """Equal on every field that the gate decides (trajectories included)."""
        return (self.action, self.W, self.L, self.n_used, self.e_plus, self.e_minus,
                self.stop_rank, self.n_consumed, self.trajectory) == (
                other.action, other.W, other.L, other.n_used, other.e_plus, other.e_minus,
                other.stop_rank, other.n_consumed, other.trajectory)


def pair_d(pair: Pair) -> int | None:
    return None if pair is None else int(bool(pair[1])) - int(bool(pair[0]))


class SequentialTest:
    """Incremental form of the rule, shared by the replays and the live scheduler.

    Feed units in the order they are consumed; it records the trajectory and stops
    (``decided``) at the first action other than CONTINUE.
    """

    __slots__ = ("_paired", "action", "n_ladder", "params", "points", "rule", "state",
                 "stop_rank")

    def __init__(self, n_ladder: int, params: GateParams, rule: DecisionRule | None = None):
        check_ladder_length(n_ladder, params)
        self.n_ladder = n_ladder
        self.params = params
        self.rule = rule or DEFAULT_RULE
        self._paired = type(self.rule) is PairedBetting  # the default rule's inlined path
        self.state = GateState()
        self.points: list[TrajectoryPoint] = []
        self.stop_rank: int | None = None
        self.action = Action.INERTIA if n_ladder == 0 else Action.CONTINUE

    @property
    def decided(self) -> bool:
        return self.action is not Action.CONTINUE

    def consume(self, ladder_rank: int, pair: Pair, decide: bool = True) -> Action:
        """Count one unit; with ``decide`` evaluate the rule right after it."""
        if self.action is not Action.CONTINUE:
            raise RuntimeError("the test has already decided; nothing more may be consumed")
        if self._paired:
            action = self._consume_paired(ladder_rank, pair, decide)
        else:
            self.state = s = self.rule.update(self.state, pair, self.params)
            action = Action.CONTINUE
            if decide:
                action = self.rule.decide(s, self.n_ladder - s.n_consumed, self.params)
            self.points.append(TrajectoryPoint(ladder_rank, pair_d(pair), s.W, s.L, s.n_used,
                                               s.e_plus, s.e_minus, action))
        if action is not Action.CONTINUE:
            self.action, self.stop_rank = action, ladder_rank
        return action

    def _consume_paired(self, ladder_rank: int, pair: Pair, decide: bool) -> Action:
        """`update_state` then `gate_decision`, inlined (the live gate consumes every unit
        here): the same operations on the same numbers, so bit-identical e-values and the
        same action; futility floors come from the params' memo (`_floors`)."""
        s, params = self.state, self.params
        W, L, n_used, e_plus, e_minus = s.W, s.L, s.n_used, s.e_plus, s.e_minus
        consumed = s.n_consumed + 1
        if pair is None:
            d = None
        else:
            d = (1 if pair[1] else 0) - (1 if pair[0] else 0)
            f_plus, f_minus = _factors(params)[d]
            e_plus = 0.0 if f_plus == 0.0 else e_plus * f_plus
            e_minus = 0.0 if f_minus == 0.0 else e_minus * f_minus
            assert e_plus >= 0.0 and e_minus >= 0.0, "capital process went negative"
            W, L, n_used = W + (d == 1), L + (d == -1), n_used + 1
        self.state = _built(GateState, W=W, L=L, n_used=n_used, n_consumed=consumed,
                            e_plus=e_plus, e_minus=e_minus)
        action = Action.CONTINUE
        if decide:
            n_remaining, w_net = self.n_ladder - consumed, W - L
            if n_remaining <= 0:  # the ladder's end (past it: gate_decision's ValueError)
                action = gate_decision(self.state, n_remaining, params)
            elif e_plus >= params.e_confirm and w_net >= params.w_net_min:
                action = Action.ACCEPT
            elif e_minus >= params.e_reject:
                action = Action.REJECT
            else:
                floor_confirm, floor_provisional = _floors(params, n_remaining)
                w_best = w_net + n_remaining
                if not (e_plus > 0 and (
                        (e_plus >= floor_confirm and w_best >= params.w_net_min)
                        or (e_plus >= floor_provisional
                            and w_best >= params.w_net_min_provisional))):
                    action = Action.FUTILE
        self.points.append(TrajectoryPoint(ladder_rank, d, W, L, n_used, e_plus, e_minus,
                                           action))
        return action

    def outcome(self) -> TypeOutcome:
        s = self.state
        return TypeOutcome(self.action, s.W, s.L, s.n_used, s.e_plus, s.e_minus,
                           self.stop_rank, tuple(self.points), s.n_consumed, self.n_ladder)


@dataclass(frozen=True)
class MeasureAll:
    """A decision rule that never stops early: every held-out unit is measured."""

    stops_early: ClassVar[bool] = False
    """Declared so dispatch policies need not search for a stop that never comes."""

    def update(self, state: GateState, pair: Pair, params: GateParams) -> GateState:
        return update_state(state, pair, params)

    def decide(self, state: GateState, n_remaining: int, params: GateParams) -> Action:
        return Action.CONTINUE if n_remaining else Action.INERTIA
