"""Paired accuracy differences with intervals: the held-out evaluation's gain.

Both skills answer the same units, so the gain ``acc_first - acc_second`` is a difference of
paired proportions: with ``wins`` units only the first answered right and ``losses`` only the
second, it is ``(wins - losses) / n``. Its interval is Newcombe's (1998) method 10, the
square-and-add of the two Wilson score intervals with the continuity-corrected correlation
(Fagerland, Lydersen & Laake 2014 recommend it for paired proportions): well inside [-1, 1]
and close to nominal coverage down to small n. A mean over independent types combines the
per-type limits the same way (MOVER, Zou & Donner 2008).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from ..errors import is_whole
from ._montecarlo import wilson_interval

NEWCOMBE = "Newcombe (1998) method 10, paired"
MOVER = "MOVER mean of per-type Newcombe intervals"
SAME_SKILL = "same skill: one measurement, no difference"


@dataclass(frozen=True)
class PairedDiff:
    """A paired difference of proportions and its confidence interval."""

    estimate: float
    lo: float
    hi: float
    n: int
    """Units (pairs) it is computed on."""
    wins: int
    losses: int
    method: str
    level: float = 0.95

    def points(self, signed: bool = True) -> str:
        """``+8.1 points [+5.2, +11.0]``: the estimate and interval in accuracy points."""
        if not math.isfinite(self.estimate):
            return "n/a"
        f = "{:+.1f}" if signed else "{:.1f}"
        return (f"{f.format(100 * self.estimate)} points [{f.format(100 * self.lo)}, "
                f"{f.format(100 * self.hi)}]")


def _z(level: float) -> float:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    return NormalDist().inv_cdf(0.5 + level / 2)


def _wilson(k: int, n: int, z: float) -> tuple[float, float]:
    lo, hi = wilson_interval(k, n, z)
    return float(lo), float(hi)


def _check_counts(*counts: int) -> None:
    for c in counts:
        if not is_whole(c) or c < 0:
            raise ValueError(f"counts must be integers >= 0, got {counts!r}")


def paired_difference(both: int, wins: int, losses: int, neither: int,
                      level: float = 0.95) -> PairedDiff:
    """``acc_first - acc_second`` over paired units and Newcombe's method-10 interval.

    ``both``: units both got right; ``wins``: only the first; ``losses``: only the second;
    ``neither``: both wrong. No units: NaN estimate and interval.
    """
    _check_counts(both, wins, losses, neither)
    n = both + wins + losses + neither
    if n == 0:
        return PairedDiff(math.nan, math.nan, math.nan, 0, 0, 0, NEWCOMBE, level)
    z = _z(level)
    p1, p2 = (both + wins) / n, (both + losses) / n
    l1, u1 = _wilson(both + wins, n, z)
    l2, u2 = _wilson(both + losses, n, z)
    margins = (both + wins) * (losses + neither) * (both + losses) * (wins + neither)
    a = both * neither - wins * losses
    if margins == 0:
        phi = 0.0
    elif a > n / 2:
        phi = (a - n / 2) / math.sqrt(margins)
    elif a >= 0:
        phi = 0.0
    else:
        phi = a / math.sqrt(margins)
    est = p1 - p2
    lo = est - math.sqrt(max(0.0, (p1 - l1) ** 2 + (u2 - p2) ** 2
                             - 2 * phi * (p1 - l1) * (u2 - p2)))
    hi = est + math.sqrt(max(0.0, (p2 - l2) ** 2 + (u1 - p1) ** 2
                             - 2 * phi * (p2 - l2) * (u1 - p1)))
    return PairedDiff(est, max(-1.0, lo), min(1.0, hi), n, wins, losses, NEWCOMBE, level)


def same_skill(n: int, level: float = 0.95) -> PairedDiff:
    """The difference of a skill with itself measured once: exactly 0, no interval width."""
    return PairedDiff(0.0, 0.0, 0.0, n, 0, 0, SAME_SKILL, level)


def mover_mean(diffs: Sequence[PairedDiff]) -> PairedDiff:
    """The unweighted mean of independent differences (one per type) and its MOVER interval:
    ``mean -/+ sqrt(sum of squared per-difference half-widths) / K``."""
    ok = [d for d in diffs if math.isfinite(d.estimate)]
    level = ok[0].level if ok else 0.95
    if not ok:
        return PairedDiff(math.nan, math.nan, math.nan, 0, 0, 0, MOVER, level)
    k = len(ok)
    est = sum(d.estimate for d in ok) / k
    lo = est - math.sqrt(sum((d.estimate - d.lo) ** 2 for d in ok)) / k
    hi = est + math.sqrt(sum((d.hi - d.estimate) ** 2 for d in ok)) / k
    return PairedDiff(est, lo, hi, sum(d.n for d in ok), sum(d.wins for d in ok),
                      sum(d.losses for d in ok), MOVER, level)
