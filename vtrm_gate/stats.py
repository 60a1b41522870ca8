"""Statistical kernel: the paired betting e-processes, the gate decision and offline replays.

Pure functions over values; numpy is the only dependency (for batch replays and the exact
operating characteristics). Nothing here knows about asyncio, storage or plotting.

Per consumed unit with both arms non-INFRA, ``d = cand_correct - base_correct`` in {-1, 0, +1}.

* accept side: ``E+ <- E+ * (1 + λ (d - δ))`` — a non-negative supermartingale when
  ``E[d | past] <= δ`` (H0+), so ``P(sup E+ >= e_confirm) <= 1/e_confirm`` (Ville).
* harm side:   ``E- <- E- * (1 - λ d)`` — valid when ``E[d | past] >= 0`` (H0-).

INFRA units are consumed (they advance the prefix) but touch neither W, L, n_used nor the
e-values.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

Pair = tuple[bool, bool] | None
"""One unit's outcome in ladder order: ``(base_correct, cand_correct)``, or None for INFRA."""


class Action(enum.StrEnum):
    """What the gate says after a consumed unit."""

    ACCEPT = "ACCEPT"
    REJECT = "REJECT"
    FUTILE = "FUTILE"
    PROVISIONAL = "PROVISIONAL"
    INERTIA = "INERTIA"
    CONTINUE = "CONTINUE"

    def __str__(self) -> str:
        return self.value


Decision = Action
"""`gate_decision` returns one Action; the alias keeps the SPEC's wording."""

# Stable integer codes for the vectorised replays (index into ACTION_CODES).
ACTION_CODES: tuple[Action, ...] = (
    Action.CONTINUE,
    Action.ACCEPT,
    Action.REJECT,
    Action.FUTILE,
    Action.PROVISIONAL,
    Action.INERTIA,
)
_CODE = {a: i for i, a in enumerate(ACTION_CODES)}


def _check(cond: bool, name: str, allowed: str, value: object) -> None:
    if not cond:
        raise ValueError(f"GateParams.{name} must be {allowed}, got {value!r}")


@dataclass(frozen=True)
class GateParams:
    """Decision-rule parameters (SPEC §1); every field is validated on construction."""

    e_confirm: float = 20.0
    lambda_dir: float = 0.5
    delta_min: float = 0.0
    w_net_min: int = 3
    e_reject: float = 20.0
    e_provisional: float = 2.0
    w_net_min_provisional: int = 2
    n_max: int = 40

    def __post_init__(self) -> None:
        def real(x: object) -> bool:
            return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)

        def whole(x: object) -> bool:
            return isinstance(x, int) and not isinstance(x, bool)

        _check(real(self.e_confirm) and self.e_confirm > 1, "e_confirm", "a number > 1",
               self.e_confirm)
        _check(real(self.delta_min) and 0 <= self.delta_min < 1, "delta_min",
               "a number in [0, 1)", self.delta_min)
        lam_max = 1.0 / (1.0 + (self.delta_min if real(self.delta_min) else 0.0))
        _check(real(self.lambda_dir) and 0 < self.lambda_dir <= lam_max, "lambda_dir",
               f"in (0, 1/(1+delta_min)] = (0, {lam_max:.6g}]", self.lambda_dir)
        _check(whole(self.w_net_min) and self.w_net_min >= 0, "w_net_min",
               "an integer >= 0", self.w_net_min)
        _check(real(self.e_reject) and self.e_reject > 1, "e_reject", "a number > 1",
               self.e_reject)
        _check(real(self.e_provisional) and self.e_provisional >= 1, "e_provisional",
               "a number >= 1", self.e_provisional)
        _check(whole(self.w_net_min_provisional) and self.w_net_min_provisional >= 0,
               "w_net_min_provisional", "an integer >= 0", self.w_net_min_provisional)
        _check(whole(self.n_max) and self.n_max >= 1, "n_max", "an integer >= 1", self.n_max)

    @property
    def win_factor(self) -> float:
        """E+ multiplier of a win (d=+1): the best case used by the futility check."""
        return bet_factors(self, 1)[0]


def bet_factors(params: GateParams, d: int) -> tuple[float, float]:
    """(E+ factor, E- factor) of one paired unit with difference ``d``.

    The one place the factors are computed, so the live update, the batch replays and the
    exact operating characteristics multiply bit-identical numbers.
    """
    return 1.0 + params.lambda_dir * (d - params.delta_min), 1.0 - params.lambda_dir * d


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
    lw = math.log(params.win_factor)
    return math.exp(math.log(target) - n_remaining * lw) * (1.0 - FUTILITY_RTOL)


def _hopeful(e_plus, w_net, n_remaining: int, params: GateParams):  # type: ignore[no-untyped-def]
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


def update_state(state: GateState, pair: Pair, params: GateParams) -> GateState:
    """Consume one unit in ladder order (INFRA = None only advances n_consumed)."""
    if pair is None:
        return replace(state, n_consumed=state.n_consumed + 1)
    base, cand = pair
    d = int(bool(cand)) - int(bool(base))
    f_plus, f_minus = bet_factors(params, d)
    e_plus, e_minus = _times(state.e_plus, f_plus), _times(state.e_minus, f_minus)
    assert e_plus >= 0.0 and e_minus >= 0.0, "capital process went negative"
    return GateState(
        W=state.W + (d == 1),
        L=state.L + (d == -1),
        n_used=state.n_used + 1,
        n_consumed=state.n_consumed + 1,
        e_plus=e_plus,
        e_minus=e_minus,
    )


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

    __slots__ = ("action", "n_ladder", "params", "points", "rule", "state", "stop_rank")

    def __init__(self, n_ladder: int, params: GateParams, rule: DecisionRule | None = None):
        check_ladder_length(n_ladder, params)
        self.n_ladder = n_ladder
        self.params = params
        self.rule = rule or DEFAULT_RULE
        self.state = GateState()
        self.points: list[TrajectoryPoint] = []
        self.stop_rank: int | None = None
        self.action = Action.INERTIA if n_ladder == 0 else Action.CONTINUE

    @property
    def decided(self) -> bool:
        return self.action is not Action.CONTINUE

    def consume(self, ladder_rank: int, pair: Pair, decide: bool = True) -> Action:
        """Count one unit; with ``decide`` evaluate the rule right after it."""
        if self.decided:
            raise RuntimeError("the test has already decided; nothing more may be consumed")
        self.state = self.rule.update(self.state, pair, self.params)
        action = Action.CONTINUE
        if decide:
            action = self.rule.decide(self.state, self.n_ladder - self.state.n_consumed,
                                      self.params)
        s = self.state
        self.points.append(TrajectoryPoint(ladder_rank, pair_d(pair), s.W, s.L, s.n_used,
                                           s.e_plus, s.e_minus, action))
        if action is not Action.CONTINUE:
            self.action, self.stop_rank = action, ladder_rank
        return action

    def outcome(self) -> TypeOutcome:
        s = self.state
        return TypeOutcome(self.action, s.W, s.L, s.n_used, s.e_plus, s.e_minus,
                           self.stop_rank, tuple(self.points), s.n_consumed, self.n_ladder)


def _as_pairs(outcomes: Sequence[Pair]) -> list[Pair]:
    pairs: list[Pair] = []
    for i, p in enumerate(outcomes):
        if p is None:
            pairs.append(None)
            continue
        if not (isinstance(p, tuple | list) and len(p) == 2):
            raise ValueError(
                f"outcome {i} must be (base_correct, cand_correct) or None, got {p!r}")
        pairs.append((bool(p[0]), bool(p[1])))
    return pairs


def replay_prefix(outcomes: Sequence[Pair], params: GateParams | None = None,
                  rule: DecisionRule | None = None) -> TypeOutcome:
    """v3 semantics: consume in ladder order, decide after every unit."""
    params = params or GateParams()
    pairs = _as_pairs(outcomes)
    test = SequentialTest(len(pairs), params, rule)
    for rank, pair in enumerate(pairs):
        if test.decided:
            break
        test.consume(rank, pair)
    return test.outcome()


def replay_blocks(outcomes: Sequence[Pair], params: GateParams | None = None, block: int = 8,
                  rule: DecisionRule | None = None) -> TypeOutcome:
    """Old semantics: a block's units are all counted, then one decision at the block end."""
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be an integer >= 1, got {block!r}")
    params = params or GateParams()
    pairs = _as_pairs(outcomes)
    test = SequentialTest(len(pairs), params, rule)
    n = len(pairs)
    for rank, pair in enumerate(pairs):
        if test.decided:
            break
        test.consume(rank, pair, decide=(rank + 1) % block == 0 or rank == n - 1)
    return test.outcome()


def replay_arrival(outcomes: Sequence[Pair], completion_times: Sequence[float],
                   params: GateParams | None = None,
                   rule: DecisionRule | None = None) -> TypeOutcome:
    """The rejected alternative: consume units in completion order (ties by ladder rank).

    Kept only to show why it is wrong: when wrong answers are slower, early arrivals are
    enriched in wins and E+ is inflated.
    """
    params = params or GateParams()
    pairs = _as_pairs(outcomes)
    if len(completion_times) != len(pairs):
        raise ValueError(f"completion_times has {len(completion_times)} entries, "
                         f"outcomes has {len(pairs)}")
    order = sorted(range(len(pairs)), key=lambda i: (completion_times[i], i))
    test = SequentialTest(len(pairs), params, rule)
    for rank in order:
        if test.decided:
            break
        test.consume(rank, pairs[rank])
    return test.outcome()


# --------------------------------------------------------------------------------------
# Vectorised replays (Monte Carlo): arrays of shape (R, n), loop over n, vector over R.


@dataclass(frozen=True)
class BatchOutcome:
    """Per-replicate results of a batch replay; ``action`` holds codes into ACTION_CODES."""

    action: np.ndarray
    W: np.ndarray
    L: np.ndarray
    n_used: np.ndarray
    n_consumed: np.ndarray
    e_plus: np.ndarray
    e_minus: np.ndarray
    stop_rank: np.ndarray  # -1 where nothing was consumed

    def rate(self, action: Action) -> float:
        return float(np.mean(self.action == _CODE[action]))

    def actions(self) -> list[Action]:
        return [ACTION_CODES[c] for c in self.action.tolist()]


def _as_batch(base: np.ndarray, cand: np.ndarray,
              infra: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    base = np.asarray(base, dtype=bool)
    cand = np.asarray(cand, dtype=bool)
    if base.shape != cand.shape or base.ndim != 2:
        raise ValueError(f"base and cand must be 2-D arrays of one shape (R, n), got "
                         f"{base.shape} and {cand.shape}")
    d = cand.astype(np.int8) - base.astype(np.int8)
    ok = np.ones(base.shape, dtype=bool)
    if infra is not None:
        infra = np.asarray(infra, dtype=bool)
        if infra.shape != base.shape:
            raise ValueError(f"infra must have shape {base.shape}, got {infra.shape}")
        ok = ~infra
    return d, ok


def _decide_codes(ep: np.ndarray, em: np.ndarray, wnet: np.ndarray, n_rem: int,
                  params: GateParams) -> np.ndarray:
    """`gate_decision` over arrays of states: action codes (0 = CONTINUE)."""
    acc = (ep >= params.e_confirm) & (wnet >= params.w_net_min)
    rej = ~acc & (em >= params.e_reject)
    code = np.where(acc, _CODE[Action.ACCEPT], np.where(rej, _CODE[Action.REJECT], 0))
    rest = ~acc & ~rej
    if n_rem > 0:
        futile = rest & ~_hopeful(ep, wnet, n_rem, params)
        return np.where(futile, _CODE[Action.FUTILE], code).astype(np.int8)
    prov = (ep >= params.e_provisional) & (wnet >= params.w_net_min_provisional)
    return np.where(rest, np.where(prov, _CODE[Action.PROVISIONAL], _CODE[Action.INERTIA]),
                    code).astype(np.int8)


def _times_array(e: np.ndarray, f: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.where((e == 0.0) | (f == 0.0), 0.0, e * f)


def _replay_batch(d: np.ndarray, ok: np.ndarray, params: GateParams,
                  order: np.ndarray | None, decide_at: np.ndarray) -> BatchOutcome:
    """Core loop. ``order[r, k]`` is the ladder rank consumed k-th (None: ladder order);
    ``decide_at[k]`` says whether the rule is evaluated after the k-th consumed unit."""
    R, n = d.shape
    check_ladder_length(n, params, "each sequence")
    # The same scalar factors as update_state, so batch and scalar replays agree bit for bit.
    f_plus = {v: bet_factors(params, v)[0] for v in (-1, 0, 1)}
    f_minus = {v: bet_factors(params, v)[1] for v in (-1, 0, 1)}
    W = np.zeros(R, np.int64)
    L = np.zeros(R, np.int64)
    used = np.zeros(R, np.int64)
    consumed = np.zeros(R, np.int64)
    ep = np.ones(R)
    em = np.ones(R)
    action = np.zeros(R, np.int8)
    stop = np.full(R, -1, np.int64)
    if n == 0:
        action[:] = _CODE[Action.INERTIA]
    rows = np.arange(R)
    for k in range(n):
        live = action == 0
        if not live.any():
            break
        rank = order[:, k] if order is not None else np.full(R, k)
        dk = d[rows, rank]
        okk = ok[rows, rank] & live
        fp = np.where(dk == 1, f_plus[1], np.where(dk == -1, f_plus[-1], f_plus[0]))
        fm = np.where(dk == 1, f_minus[1], np.where(dk == -1, f_minus[-1], f_minus[0]))
        ep = np.where(okk, _times_array(ep, fp), ep)
        em = np.where(okk, _times_array(em, fm), em)
        W += okk & (dk == 1)
        L += okk & (dk == -1)
        used += okk
        consumed += live
        if not decide_at[k]:
            continue
        code = np.where(live, _decide_codes(ep, em, W - L, n - (k + 1), params), 0)
        newly = code != 0
        action = np.where(newly, code, action).astype(np.int8)
        stop = np.where(newly, rank, stop)
    # the capital processes are never negative and never NaN (NaN fails both comparisons)
    assert bool(np.all(ep >= 0)) and bool(np.all(em >= 0)), "capital process invalid"
    return BatchOutcome(action, W, L, used, consumed, ep, em, stop)


def replay_prefix_batch(base: np.ndarray, cand: np.ndarray, params: GateParams | None = None,
                        infra: np.ndarray | None = None) -> BatchOutcome:
    """Vectorised `replay_prefix` over R sequences: arrays of shape (R, n) in ladder order."""
    params = params or GateParams()
    d, ok = _as_batch(base, cand, infra)
    return _replay_batch(d, ok, params, None, np.ones(d.shape[1], dtype=bool))


def replay_blocks_batch(base: np.ndarray, cand: np.ndarray, params: GateParams | None = None,
                        block: int = 8, infra: np.ndarray | None = None) -> BatchOutcome:
    """Vectorised `replay_blocks`."""
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be an integer >= 1, got {block!r}")
    params = params or GateParams()
    d, ok = _as_batch(base, cand, infra)
    n = d.shape[1]
    k = np.arange(n)
    return _replay_batch(d, ok, params, None, ((k + 1) % block == 0) | (k == n - 1))


def replay_arrival_batch(base: np.ndarray, cand: np.ndarray, completion_times: np.ndarray,
                         params: GateParams | None = None,
                         infra: np.ndarray | None = None) -> BatchOutcome:
    """Vectorised `replay_arrival` (completion order, ties by ladder rank)."""
    params = params or GateParams()
    d, ok = _as_batch(base, cand, infra)
    t = np.asarray(completion_times, dtype=float)
    if t.shape != d.shape:
        raise ValueError(f"completion_times must have shape {d.shape}, got {t.shape}")
    order = np.argsort(t, axis=1, kind="stable")
    return _replay_batch(d, ok, params, order, np.ones(d.shape[1], dtype=bool))


# --------------------------------------------------------------------------------------
# Exact operating characteristics by dynamic programming over (consumed, W, L).


@dataclass(frozen=True)
class OperatingCharacteristics:
    """Exact exit probabilities and expected units for i.i.d. units (SPEC §1)."""

    p_accept: float
    p_reject: float
    p_futile: float
    p_provisional: float
    p_inertia: float
    expected_units: float
    expected_pairs: float
    p_win: float
    discordance: float
    n_units: int
    infra_rate: float

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _powers(f: float, n: int) -> np.ndarray:
    """``f**0 .. f**n`` multiplied one by one, as the live update does along a run of equal d."""
    out = np.empty(n + 1)
    acc = 1.0
    for i in range(n + 1):
        out[i] = acc
        acc = _times(acc, f)
    return out


def _product(*factors: np.ndarray) -> np.ndarray:
    """Elementwise product of capital factors where any zero factor gives exactly 0."""
    out = factors[0]
    for f in factors[1:]:
        out = _times_array(out, f)
    return out


def operating_characteristics(params: GateParams, p_win: float, discordance: float,
                              n_units: int, infra_rate: float = 0.0) -> OperatingCharacteristics:
    """Exact P(each exit) and E[units consumed] for the prefix rule on i.i.d. units.

    Each unit is INFRA with probability ``infra_rate``; otherwise discordant with
    probability ``discordance``, and a discordant unit is a win with probability ``p_win``.
    E+ and E- are products of the same factors the live update multiplies (no logs, so
    lambda = 1/(1+delta), where a loss zeroes E+, and thresholds equal to an attainable E+
    are exact). The state after k consumed units is (W, L): ties only matter through
    T = k - W - L, or not at all when delta = 0, so the cost is O(n^3). Only delta > 0 with
    INFRA needs T itself: (W, L, T), O(n^4).
    """
    for name, v in (("p_win", p_win), ("discordance", discordance), ("infra_rate", infra_rate)):
        if not (isinstance(v, int | float) and 0.0 <= v <= 1.0):
            raise ValueError(f"{name} must be a probability in [0, 1], got {v!r}")
    if not isinstance(n_units, int) or n_units < 0:
        raise ValueError(f"n_units must be an integer >= 0, got {n_units!r}")
    n = n_units
    if n == 0:
        return OperatingCharacteristics(0, 0, 0, 0, 1.0, 0.0, 0.0, p_win, discordance, 0,
                                        infra_rate)
    q = 1.0 - infra_rate
    pw, pl, pt = q * discordance * p_win, q * discordance * (1 - p_win), q * (1 - discordance)
    (fw, gw), (fl, gl), (ft, _) = bet_factors(params, 1), bet_factors(params, -1), \
        bet_factors(params, 0)
    PW, PL, PT = _powers(fw, n), _powers(fl, n), _powers(ft, n)
    MW, ML = _powers(gw, n), _powers(gl, n)
    dp = _oc_wlt if (infra_rate > 0 and ft != 1.0) else _oc_wl
    exits, exp_units, exp_pairs = dp(params, n, infra_rate, pw, pl, pt, PW, PL, PT, MW, ML)
    return OperatingCharacteristics(
        exits[Action.ACCEPT], exits[Action.REJECT], exits[Action.FUTILE],
        exits[Action.PROVISIONAL], exits[Action.INERTIA], exp_units, exp_pairs,
        p_win, discordance, n, infra_rate)


_OCParts = tuple[dict[Action, float], float, float]


def _settle(codes: np.ndarray, mass: np.ndarray, used_mass: np.ndarray, k: int,
            exits: dict[Action, float]) -> tuple[float, float]:
    """Book the mass of every state that stops after unit k; zero it in place."""
    units = pairs = 0.0
    for c in np.unique(codes[codes != 0]).tolist():
        m = codes == c
        pm = float(mass[m].sum())
        exits[ACTION_CODES[c]] += pm
        units += k * pm
        pairs += float(used_mass[m].sum())
        mass[m] = 0.0
        used_mass[m] = 0.0
    return units, pairs


def _extent(mass: np.ndarray) -> tuple[int, ...] | None:
    """Per axis, one past the last index holding mass (None when no mass is left)."""
    nz = mass != 0.0
    if not nz.any():
        return None
    axes = range(mass.ndim)
    return tuple(int(np.flatnonzero(nz.any(axis=tuple(a for a in axes if a != ax)))[-1]) + 1
                 for ax in axes)


def _oc_wl(params: GateParams, n: int, infra_rate: float, pw: float, pl: float, pt: float,
           PW: np.ndarray, PL: np.ndarray, PT: np.ndarray, MW: np.ndarray,
           ML: np.ndarray) -> _OCParts:
    """State (W, L) after k units; ``used`` carries the first moment of n_used per state.

    Only the bounding box of the states still alive is computed on (stopped states hold no
    mass), which keeps W and L to the band the rule leaves open.
    """
    mass = np.zeros((n + 1, n + 1))
    used = np.zeros((n + 1, n + 1))
    mass[0, 0] = 1.0
    exits = dict.fromkeys(ACTION_CODES[1:], 0.0)
    exp_units = exp_pairs = 0.0
    stay = infra_rate + pt
    ext: tuple[int, ...] | None = (1, 1)
    for k in range(1, n + 1):
        if ext is None:
            break
        ew, el = (min(e + 1, n + 1) for e in ext)
        m, u = mass[:ew, :el], used[:ew, :el]
        moved = m + u  # n_used grows by one on every non-INFRA unit
        new_m, new_u = stay * m, infra_rate * u + pt * (u + m)
        new_m[1:, :] += pw * m[:-1, :]
        new_m[:, 1:] += pl * m[:, :-1]
        new_u[1:, :] += pw * moved[:-1, :]
        new_u[:, 1:] += pl * moved[:, :-1]
        W, L = np.arange(ew)[:, None], np.arange(el)[None, :]
        ep = _product(PW[:ew, None], PL[None, :el])
        if PT[1] != 1.0:  # delta > 0, and then no INFRA: T = k - W - L
            ep = _product(ep, PT[np.clip(k - W - L, 0, n)])
        em = _product(MW[:ew, None], ML[None, :el])
        codes = _decide_codes(ep, em, W - L, n - k, params)
        du, dpairs = _settle(codes, new_m, new_u, k, exits)
        mass[:ew, :el], used[:ew, :el] = new_m, new_u
        exp_units += du
        exp_pairs += dpairs
        ext = _extent(new_m)
    return exits, exp_units, exp_pairs


def _oc_wlt(params: GateParams, n: int, infra_rate: float, pw: float, pl: float, pt: float,
            PW: np.ndarray, PL: np.ndarray, PT: np.ndarray, MW: np.ndarray,
            ML: np.ndarray) -> _OCParts:
    """State (W, L, T), for delta > 0 with INFRA: a tie moves E+, an INFRA unit does not,
    so ties cannot be told from INFRA by k - W - L. Same bounding-box restriction."""
    mass = np.zeros((n + 1, n + 1, n + 1))
    mass[0, 0, 0] = 1.0
    exits = dict.fromkeys(ACTION_CODES[1:], 0.0)
    exp_units = exp_pairs = 0.0
    ext: tuple[int, ...] | None = (1, 1, 1)
    for k in range(1, n + 1):
        if ext is None:
            break
        ew, el, et = (min(e + 1, n + 1) for e in ext)
        m = mass[:ew, :el, :et]
        new = infra_rate * m
        new[1:, :, :] += pw * m[:-1, :, :]
        new[:, 1:, :] += pl * m[:, :-1, :]
        new[:, :, 1:] += pt * m[:, :, :-1]
        W, L = np.arange(ew)[:, None, None], np.arange(el)[None, :, None]
        T = np.arange(et)[None, None, :]
        ep = _product(PW[:ew, None, None], PL[None, :el, None], PT[None, None, :et])
        em = _product(MW[:ew, None, None], ML[None, :el, None])
        codes = _decide_codes(ep, em, W - L, n - k, params)
        du, dpairs = _settle(codes, new, new * (W + L + T), k, exits)
        mass[:ew, :el, :et] = new
        exp_units += du
        exp_pairs += dpairs
        ext = _extent(new)
    return exits, exp_units, exp_pairs
