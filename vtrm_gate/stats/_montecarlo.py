"""Monte Carlo helpers for the design review: seeded paired outcomes, latencies, rates.

Pure numpy on top of the vectorised replays of `vtrm_gate.stats`. Every function takes an
explicit seed and every result states its replicate count, so a figure can be reproduced
and its noise judged. Results are frozen dataclasses whose ``columns()`` is a plain
column dict (``pl.DataFrame(result.columns())`` in the faces; no polars here).

Outcome model (one unit, i.i.d. across units and replicates): the pair is discordant with
probability ``discordance``; a discordant pair is a win (base wrong, candidate right) with
probability ``p_win``, else a loss; a concordant pair is both-right with probability
``p_both_correct``, else both-wrong. ``E[d] = discordance * (2 p_win - 1)``, so
``p_win = 0.5`` is the boundary of H0+ (for ``delta_min = 0``).

Latency model (the bias of SPEC §6): the base arm is cached, so it completes instantly;
the candidate arm's log-latency is ``sigma * (rho * w_std + sqrt(1 - rho^2) * z)``, where
``w_std`` is the standardised indicator "candidate wrong" and ``z`` is standard normal.
``rho`` is then exactly the population correlation between log-latency and wrongness: at
``rho = 0`` completion order is independent of correctness, at ``rho -> 1`` every right
answer arrives before every wrong one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._batch import replay_arrival_batch, replay_blocks_batch, replay_prefix_batch
from ._oc import operating_characteristics
from ._params import ACTION_CODES, Action, GateParams

_ACCEPT = ACTION_CODES.index(Action.ACCEPT)

Z95 = 1.959963984540054
"""Two-sided 95% normal quantile (Wilson intervals)."""


def _prob(name: str, v: float) -> float:
    if not (isinstance(v, int | float) and not isinstance(v, bool) and 0.0 <= v <= 1.0):
        raise ValueError(f"{name} must be a probability in [0, 1], got {v!r}")
    return float(v)


def _positive_int(name: str, v: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    return int(v)


def wilson_interval(k: np.ndarray | int, n: int, z: float = Z95) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval for a binomial proportion ``k / n`` (vectorised over ``k``).

    It always contains ``k / n``: at k = 0 (or n) rounding would otherwise leave the lower
    end a hair above 0 (the upper a hair below 1)."""
    k = np.asarray(k, dtype=float)
    p = k / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return np.minimum(centre - half, p), np.maximum(centre + half, p)


@dataclass(frozen=True)
class PairedSample:
    """``n_rep`` replicate ladders of ``n_units`` paired outcomes, with completion times.

    ``base``/``cand`` are boolean (R, n) arrays in ladder order; ``completion`` holds each
    unit's completion time (the candidate arm's, since the base arm is a cache hit).
    """

    base: np.ndarray
    cand: np.ndarray
    completion: np.ndarray
    correlation: float
    seed: int | None

    @property
    def n_rep(self) -> int:
        return int(self.base.shape[0])

    @property
    def n_units(self) -> int:
        return int(self.base.shape[1])


def cand_wrong_probability(discordance: float, p_win: float, p_both_correct: float) -> float:
    """Marginal P(candidate wrong) under the outcome model of this module."""
    return discordance * (1 - p_win) + (1 - discordance) * (1 - p_both_correct)


def paired_outcomes(rng: np.random.Generator, n_rep: int, n_units: int, discordance: float,
                    p_win: float, p_both_correct: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Boolean (R, n) arrays ``(base, cand)`` drawn from the outcome model."""
    n_rep, n_units = _positive_int("n_rep", n_rep), _positive_int("n_units", n_units)
    discordance, p_win = _prob("discordance", discordance), _prob("p_win", p_win)
    p_both_correct = _prob("p_both_correct", p_both_correct)
    shape = (n_rep, n_units)
    disc = rng.random(shape) < discordance
    win = rng.random(shape) < p_win
    both_right = rng.random(shape) < p_both_correct
    base = np.where(disc, ~win, both_right)
    cand = np.where(disc, win, both_right)
    return base, cand


def correlated_latency(rng: np.random.Generator, cand: np.ndarray, correlation: float,
                       p_wrong: float, sigma: float = 1.0,
                       z: np.ndarray | None = None) -> np.ndarray:
    """Candidate-arm latencies whose log has correlation ``correlation`` with wrongness.

    ``p_wrong`` is the model's marginal P(candidate wrong), used to standardise the
    indicator so that ``correlation`` is exact in the population. Pass ``z`` to reuse the
    same noise across correlations (common random numbers make curves smoother).
    """
    rho = _prob("correlation", correlation)
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be a finite number > 0, got {sigma!r}")
    if z is None:
        z = rng.standard_normal(cand.shape)
    wrong = (~np.asarray(cand, dtype=bool)).astype(float)
    sd = math.sqrt(p_wrong * (1 - p_wrong))
    w_std = (wrong - p_wrong) / sd if sd > 0 else np.zeros_like(wrong)
    return np.exp(sigma * (rho * w_std + math.sqrt(1 - rho * rho) * z))


def paired_sample(n_rep: int, n_units: int, discordance: float, p_win: float, *,
                  correlation: float = 0.0, p_both_correct: float = 0.5, sigma: float = 1.0,
                  seed: int | None = 0) -> PairedSample:
    """One seeded `PairedSample`: outcomes plus correlated completion times."""
    rng = np.random.default_rng(seed)
    base, cand = paired_outcomes(rng, n_rep, n_units, discordance, p_win, p_both_correct)
    p_wrong = cand_wrong_probability(discordance, p_win, p_both_correct)
    t = correlated_latency(rng, cand, correlation, p_wrong, sigma)
    return PairedSample(base, cand, t, float(correlation), seed)


@dataclass(frozen=True)
class FalseAcceptCurve:
    """False-accept rates of prefix vs arrival-order consumption, per correlation.

    ``prefix`` does not look at latencies, so its rate is the same at every correlation
    (the same outcomes are reused: common random numbers); ``exact_prefix`` is the exact
    P(ACCEPT) from `operating_characteristics` for the same i.i.d. model.
    """

    correlations: tuple[float, ...]
    prefix_accepts: int
    arrival_accepts: tuple[int, ...]
    n_rep: int
    seed: int | None
    e_confirm: float
    exact_prefix: float
    n_units: int
    discordance: float
    p_win: float

    @property
    def bound(self) -> float:
        """Ville's bound on the false-accept rate of a valid (prefix) test."""
        return 1.0 / self.e_confirm

    @property
    def prefix_rate(self) -> float:
        return self.prefix_accepts / self.n_rep

    @property
    def arrival_rates(self) -> tuple[float, ...]:
        return tuple(k / self.n_rep for k in self.arrival_accepts)

    def columns(self) -> dict[str, list[Any]]:
        """Long format: one row per (consumption order, correlation)."""
        k = len(self.correlations)
        accepts = [self.prefix_accepts] * k + list(self.arrival_accepts)
        lo, hi = wilson_interval(np.array(accepts), self.n_rep)
        return {
            "order": ["prefix"] * k + ["arrival"] * k,
            "correlation": list(self.correlations) * 2,
            "false_accept": [a / self.n_rep for a in accepts],
            "ci_low": lo.tolist(),
            "ci_high": hi.tolist(),
            "accepts": accepts,
            "n_rep": [self.n_rep] * (2 * k),
            "bound": [self.bound] * (2 * k),
            "exact_prefix": [self.exact_prefix] * (2 * k),
            "n_units": [self.n_units] * (2 * k),
            "discordance": [self.discordance] * (2 * k),
            "p_win": [self.p_win] * (2 * k),
            "seed": [self.seed] * (2 * k),
        }


def false_accept_curve(params: GateParams, correlations: Sequence[float], n_rep: int,
                       seed: int | None = 0, *, n_units: int | None = None,
                       discordance: float = 0.5, p_win: float = 0.5,
                       p_both_correct: float = 0.5, sigma: float = 1.0) -> FalseAcceptCurve:
    """Monte Carlo P(ACCEPT) under H0 for ladder-prefix vs arrival-order consumption.

    Under H0 (default ``p_win = 0.5``: no improvement) the prefix test accepts with
    probability <= 1/e_confirm. Consuming in completion order, when wrong answers are
    slower, front-loads wins and inflates E+; the rate grows with the correlation.
    """
    n_rep = _positive_int("n_rep", n_rep)
    n = _positive_int("n_units", params.n_max if n_units is None else n_units)
    corrs = tuple(_prob("correlation", float(c)) for c in correlations)
    rng = np.random.default_rng(seed)
    base, cand = paired_outcomes(rng, n_rep, n, discordance, p_win, p_both_correct)
    z = rng.standard_normal(base.shape)
    p_wrong = cand_wrong_probability(discordance, p_win, p_both_correct)
    prefix = int(np.sum(replay_prefix_batch(base, cand, params).action == _ACCEPT))
    arrival = []
    for rho in corrs:
        t = correlated_latency(rng, cand, rho, p_wrong, sigma, z=z)
        arrival.append(int(np.sum(replay_arrival_batch(base, cand, t, params).action == _ACCEPT)))
    exact = operating_characteristics(params, p_win, discordance, n).p_accept
    return FalseAcceptCurve(corrs, prefix, tuple(arrival), n_rep, seed, params.e_confirm,
                            exact, n, discordance, p_win)


@dataclass(frozen=True)
class UnitsCurve:
    """Mean units consumed and P(ACCEPT), prefix vs block replay vs no early stop, per p_win.

    Tokens are proportional to units (two arms per unit), so ``1 - prefix/no_stop`` is the
    token saving of early stopping.
    """

    p_wins: tuple[float, ...]
    prefix_units: tuple[float, ...]
    block_units: tuple[float, ...]
    prefix_accept: tuple[float, ...]
    block_accept: tuple[float, ...]
    n_units: int
    block: int
    discordance: float
    n_rep: int
    seed: int | None

    def columns(self) -> dict[str, list[Any]]:
        k = len(self.p_wins)
        return {
            "p_win": list(self.p_wins),
            "no_stop_units": [float(self.n_units)] * k,
            "prefix_units": list(self.prefix_units),
            "block_units": list(self.block_units),
            "prefix_saving": [1 - u / self.n_units for u in self.prefix_units],
            "block_saving": [1 - u / self.n_units for u in self.block_units],
            "prefix_accept": list(self.prefix_accept),
            "block_accept": list(self.block_accept),
            "n_units": [self.n_units] * k,
            "block": [self.block] * k,
            "discordance": [self.discordance] * k,
            "n_rep": [self.n_rep] * k,
            "seed": [self.seed] * k,
        }


def units_curve(params: GateParams, p_wins: Sequence[float], n_rep: int, seed: int | None = 0,
                *, n_units: int | None = None, discordance: float = 0.5, block: int = 8,
                p_both_correct: float = 0.5) -> UnitsCurve:
    """Monte Carlo units consumed by the prefix rule and the old block rule, per p_win."""
    n_rep = _positive_int("n_rep", n_rep)
    n = _positive_int("n_units", params.n_max if n_units is None else n_units)
    rng = np.random.default_rng(seed)
    pu, bu, pa, ba = [], [], [], []
    for p in p_wins:
        base, cand = paired_outcomes(rng, n_rep, n, discordance, float(p), p_both_correct)
        pre = replay_prefix_batch(base, cand, params)
        blk = replay_blocks_batch(base, cand, params, block=block)
        pu.append(float(pre.n_consumed.mean()))
        bu.append(float(blk.n_consumed.mean()))
        pa.append(float(np.mean(pre.action == _ACCEPT)))
        ba.append(float(np.mean(blk.action == _ACCEPT)))
    return UnitsCurve(tuple(float(p) for p in p_wins), tuple(pu), tuple(bu), tuple(pa),
                      tuple(ba), n, block, discordance, n_rep, seed)
