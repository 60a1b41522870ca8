"""Empirical Bayes over gates: the distribution of candidate effects behind many paired
sequences, from each gate's discordant pairs (wins W, losses L of the candidate).

Scale: ``theta = logit P(candidate right | exactly one arm right)``, which equals the
candidate's logit shift on every unit when the two arms are independent given the unit.
Each gate's conditional likelihood ``sigmoid(theta)^W sigmoid(-theta)^L`` does not depend on
the units' difficulties, nor on the stopping rule (which multiplies the likelihood by an
indicator of the data only). Prior: a three-part mixture, ``theta = 0`` (neutral) with
weight ``p_neutral``, ``Uniform(a, b)`` (helpful) and ``Uniform(-b, -a)`` (harmful); the
weights and ``(a, b)`` by maximum likelihood over grids (shares: steps of 0.02).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._env import DEFAULT_BOOT, MAX_BOOT

Counts = Sequence[int] | np.ndarray
"""Per-gate counts (W or L): a sequence or an integer array (a frame's column)."""
THETA_GRID: tuple[float, ...] = tuple(round(0.25 * i, 2) for i in range(1, 13))
"""Candidate bounds ``a < b`` of |theta| for the helpful and harmful parts (0.25 .. 3)."""
REFERENCE: tuple[float, float] = (0.57, 1.71)
"""|theta| bounds assumed unless the data reject them: the simulator's default sizes 0.3..0.9
(logit) times its ``logit_per_theta`` (1.9)."""
LR_THRESHOLD = 5.99
"""chi-square(2 df) 95% point: the profile must beat the reference by this much (2 log LR)."""
SHARE_STEP = 0.02
"""Resolution of the fitted shares (a grid over the simplex: the exact maximum on it)."""
_NODES = 12


@dataclass(frozen=True)
class EffectsFit:
    """The fitted mixture: shares (harmful, neutral, helpful), |theta| bounds, and each gate's
    posterior class probabilities (rows: gates; columns: harmful, neutral, helpful)."""

    p_harmful: float
    p_neutral: float
    p_helpful: float
    theta_min: float
    theta_max: float
    log_likelihood: float
    posterior: np.ndarray
    n_gates: int


def _component_likelihoods(w: np.ndarray, l: np.ndarray,
                           pairs: np.ndarray) -> np.ndarray:
    """Per (a, b) pair: each gate's likelihood under (harmful, neutral, helpful) relative to
    the neutral one (a common factor per gate), shape (K, G, 3)."""
    u = (np.arange(_NODES) + 0.5) / _NODES
    theta = pairs[:, :1] + (pairs[:, 1:] - pairs[:, :1]) * u  # (K, nodes)
    log_up = -np.logaddexp(0.0, -theta)  # log sigmoid(theta)
    log_down = -np.logaddexp(0.0, theta)
    shift = (w + l) * np.log(2.0)  # divide by the neutral likelihood 2^-(W+L)
    up = w[None, :, None] * log_up[:, None, :] + l[None, :, None] * log_down[:, None, :]
    down = w[None, :, None] * log_down[:, None, :] + l[None, :, None] * log_up[:, None, :]
    return np.stack([np.exp(down + shift[None, :, None]).mean(axis=2),
                     np.ones((len(pairs), len(w))),
                     np.exp(up + shift[None, :, None]).mean(axis=2)], axis=2)


def _simplex(step: float = SHARE_STEP) -> np.ndarray:
    """Every (p_harmful, p_neutral, p_helpful) on a grid of ``step``, shape (P, 3)."""
    m = round(1 / step)
    return np.array([(i, j, m - i - j) for i in range(m + 1) for j in range(m + 1 - i)],
                    dtype=float) / m


def _log_mix(f: np.ndarray) -> np.ndarray:
    """log of each gate's mixture likelihood at every grid pair and share point (K, G, P)."""
    out: np.ndarray = np.log(np.einsum("kgc,pc->kgp", f, _simplex()))
    return out


def _best(log_mix: np.ndarray, weight: np.ndarray) -> tuple[int, int, float]:
    """(grid pair, share point, log-likelihood) of the maximum for these gate counts; pair 0
    (the reference sizes) unless another pair beats it by more than `LR_THRESHOLD` / 2."""
    ll = np.einsum("kgp,g->kp", log_mix, weight)
    k, p = np.unravel_index(int(np.argmax(ll)), ll.shape)
    p0 = int(np.argmax(ll[0]))
    if ll[k, p] - ll[0, p0] <= LR_THRESHOLD / 2:
        return 0, p0, float(ll[0, p0])
    return int(k), int(p), float(ll[k, p])


def _grid(bounds: tuple[float, float] | None, reference: tuple[float, float]) -> np.ndarray:
    """(a, b) pairs to profile: the reference first, then the grid (only ``bounds`` when
    given)."""
    if bounds is not None:
        return np.array([bounds], dtype=float)
    g = np.array(THETA_GRID)
    return np.array([reference, *((a, b) for i, a in enumerate(g) for b in g[i + 1:])])


def _counts(wins: Counts, losses: Counts) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                   np.ndarray]:
    """Distinct (W, L) rows, their counts, and each gate's row index."""
    w = np.asarray(wins, dtype=np.int64)
    l = np.asarray(losses, dtype=np.int64)
    if w.shape != l.shape or w.ndim != 1 or len(w) == 0:
        raise ValueError("wins and losses must be equal-length, non-empty sequences")
    if np.any(w < 0) or np.any(l < 0):
        raise ValueError("wins and losses must be >= 0")
    rows, index, counts = np.unique(np.stack([w, l], axis=1), axis=0, return_inverse=True,
                                    return_counts=True)
    return rows[:, 0].astype(float), rows[:, 1].astype(float), counts.astype(float), \
        index.reshape(-1)


def fit_effects(wins: Counts, losses: Counts,
                bounds: tuple[float, float] | None = None,
                reference: tuple[float, float] = REFERENCE) -> EffectsFit:
    """Fit the mixture to gates' discordant wins and losses (one entry per gate). (a, b):
    ``reference`` unless the profile over `THETA_GRID` beats it (likelihood ratio test at
    5%, 2 df); ``bounds`` fixes them."""
    w, l, count, index = _counts(wins, losses)
    pairs = _grid(bounds, reference)
    f = _component_likelihoods(w, l, pairs)
    k, p, ll = _best(_log_mix(f), count)
    pi = _simplex()[p]
    mix = f[k] * pi
    post = (mix / mix.sum(axis=1, keepdims=True))[index]
    neutral_ll = float(-((w + l) * count).sum() * np.log(2.0))
    return EffectsFit(float(pi[0]), float(pi[1]), float(pi[2]), float(pairs[k, 0]),
                      float(pairs[k, 1]), ll + neutral_ll, post, int(count.sum()))


BOOT_CHUNK = 25
"""Replicates refitted per task of a bootstrap run on an executor."""
BOOT_GROUP = 40 * BOOT_CHUNK
"""Replicates drawn, refitted and reported at a time: memory is bounded by this, not n_boot."""


def check_n_boot(n_boot: object) -> int:
    """``n_boot`` if it is a whole number from 1 to `MAX_BOOT`, else ValueError naming it."""
    if isinstance(n_boot, bool) or not isinstance(n_boot, int | np.integer) \
            or not 1 <= n_boot <= MAX_BOOT:
        raise ValueError(f"n_boot must be a whole number from 1 to {MAX_BOOT:,} (bootstrap "
                         f"resamples), got {n_boot!r}")
    return int(n_boot)


def bootstrap_effects(wins: Counts, losses: Counts, n_boot: int = DEFAULT_BOOT,
                      seed: int = 0, bounds: tuple[float, float] | None = None,
                      reference: tuple[float, float] = REFERENCE,
                      map_fn: Callable[[Callable[[Any], Any], list[Any]], list[Any]] | None = None,
                      progress: Callable[[int], None] | None = None) -> np.ndarray:
    """Shares (harmful, neutral, helpful) refitted on ``n_boot`` resamples of the gates
    (seeded; the choice of (a, b) redone each time), shape (n_boot, 3). The resamples are
    drawn here, `BOOT_GROUP` at a time; ``map_fn(fn, items)`` (e.g. `vtrm_gate.sim.sweep_map`
    on an executor) refits them in chunks of `BOOT_CHUNK`, with the same result as serially
    (the default); ``progress(done)`` hears after each group."""
    n_boot = check_n_boot(n_boot)
    w, l, _, index = _counts(wins, losses)
    rng = np.random.default_rng(seed)
    pairs = _grid(bounds, reference)
    parts: list[np.ndarray] = []
    for start in range(0, n_boot, BOOT_GROUP):
        size = min(BOOT_GROUP, n_boot - start)
        weights = np.array([np.bincount(index[rng.integers(0, len(index), len(index))],
                                        minlength=len(w)) for _ in range(size)], dtype=float)
        chunks = [(w, l, pairs, weights[i:i + BOOT_CHUNK]) for i in range(0, size, BOOT_CHUNK)]
        parts.extend((map_fn or _serial)(refit_shares, chunks))
        if progress is not None:
            progress(start + size)
    return np.concatenate(parts)


def refit_shares(chunk: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """The fitted shares for each row of gate weights in ``(w, l, pairs, weights)``: one
    independent piece of `bootstrap_effects` (a top-level function, so a worker can run it)."""
    w, l, pairs, weights = chunk
    log_mix = _log_mix(_component_likelihoods(w, l, pairs))
    shares = _simplex()
    return np.array([shares[_best(log_mix, row)[1]] for row in weights]).reshape(-1, 3)


def _serial(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    return [fn(x) for x in items]
