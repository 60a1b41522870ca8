"""Vectorised replays for Monte Carlo: arrays of shape (R, n), a loop over n, vectors over R."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._params import (
    _CODE,
    ACTION_CODES,
    Action,
    GateParams,
    as_correct_array,
    as_params,
    as_times_array,
    bet_factors,
    check_block,
)
from ._process import (
    _hopeful,
    check_ladder_length,
)


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
    base = as_correct_array(base, "base")
    cand = as_correct_array(cand, "cand")
    if base.shape != cand.shape or base.ndim != 2:
        raise ValueError(f"base and cand must be 2-D arrays of one shape (R, n), got "
                         f"{base.shape} and {cand.shape}")
    d = cand.astype(np.int8) - base.astype(np.int8)
    ok = np.ones(base.shape, dtype=bool)
    if infra is not None:
        infra = as_correct_array(infra, "infra")
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
    params = as_params(params)
    d, ok = _as_batch(base, cand, infra)
    return _replay_batch(d, ok, params, None, np.ones(d.shape[1], dtype=bool))


def replay_blocks_batch(base: np.ndarray, cand: np.ndarray, params: GateParams | None = None,
                        block: int = 8, infra: np.ndarray | None = None) -> BatchOutcome:
    """Vectorised `replay_blocks`."""
    check_block(block)
    params = as_params(params)
    d, ok = _as_batch(base, cand, infra)
    n = d.shape[1]
    k = np.arange(n)
    return _replay_batch(d, ok, params, None, ((k + 1) % block == 0) | (k == n - 1))


def replay_arrival_batch(base: np.ndarray, cand: np.ndarray, completion_times: np.ndarray,
                         params: GateParams | None = None,
                         infra: np.ndarray | None = None) -> BatchOutcome:
    """Vectorised `replay_arrival` (completion order, ties by ladder rank)."""
    params = as_params(params)
    d, ok = _as_batch(base, cand, infra)
    t = as_times_array(completion_times, d.shape)
    order = np.argsort(t, axis=1, kind="stable")
    return _replay_batch(d, ok, params, order, np.ones(d.shape[1], dtype=bool))



