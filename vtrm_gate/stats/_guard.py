"""The INFRA guard's statistics: an anytime-valid test of "the INFRA rate exceeds
``max_ratio``", and the exact probability that a guard trips.

Sequential rule. Each completed call is INFRA (x = 1) or not. Under H0 the conditional INFRA
probability is at most ``p0 = max_ratio`` given the past; against an alternative ``q > p0``
the likelihood ratio ``prod (q/p0)^x ((1-q)/(1-p0))^(1-x)`` is then a non-negative
supermartingale, and so is the average over a few alternatives. Ville: the mixture ever
reaches ``1/alpha`` with probability ``<= alpha``, however long the gate runs. The
alternatives sit a fixed share of the way from ``p0`` to 1 (`ALTERNATIVES`), so a dead
endpoint (every call INFRA) reaches the threshold in a few calls while a few unlucky
failures never do.

Exact operating characteristics: calls are i.i.d. Bernoulli(rate); dynamic programming over
(calls, INFRA calls) gives P(the guard trips within N calls) and the expected calls to the
trip, for any guard that decides from those two counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

ALTERNATIVES = (0.1, 0.25, 0.5, 0.75)
"""Alternatives of the sequential guard: ``q = p0 + f (1 - p0)`` for each share ``f``."""


def infra_e_value(infra_calls: int, calls: int, max_ratio: float,
                  alternatives: tuple[float, ...] = ALTERNATIVES) -> float:
    """The mixture e-value against "INFRA rate <= max_ratio" after ``calls`` completed calls,
    ``infra_calls`` of them INFRA (log space: no overflow on long gates)."""
    p0 = max_ratio
    if not 0 < p0 < 1:
        raise ValueError(f"max_ratio must be in (0, 1) for the sequential guard, got {p0!r}")
    if not 0 <= infra_calls <= calls:
        raise ValueError(f"need 0 <= infra_calls <= calls, got {infra_calls}, {calls}")
    logs = []
    for f in alternatives:
        q = p0 + f * (1 - p0)
        logs.append(infra_calls * math.log(q / p0)
                    + (calls - infra_calls) * math.log((1 - q) / (1 - p0)))
    top = max(logs)
    return math.exp(top) * sum(math.exp(v - top) for v in logs) / len(logs)


@dataclass(frozen=True)
class GuardOC:
    """Exact fate of one type's gate of ``n_calls`` calls at a per-call INFRA ``rate``."""

    rate: float
    n_calls: int
    p_trip: float
    """P(the guard trips within ``n_calls`` calls)."""
    expected_calls_to_trip: float
    """E[calls at the trip | it trips] (NaN when it cannot trip)."""


def guard_oc(tripped: Callable[[int, int], bool], rate: float, n_calls: int) -> GuardOC:
    """P(trip within ``n_calls`` i.i.d. calls, each INFRA with probability ``rate``) and the
    mean calls at the trip, for a guard ``tripped(infra_calls, calls)`` (exact DP)."""
    if not 0 <= rate <= 1 or n_calls < 0:
        raise ValueError(f"rate must be in [0, 1] and n_calls >= 0, got {rate!r}, {n_calls!r}")
    live = {0: 1.0}
    p_trip = weighted = 0.0
    for n in range(1, n_calls + 1):
        nxt: dict[int, float] = {}
        for k, p in live.items():
            for k2, q in ((k + 1, p * rate), (k, p * (1 - rate))):
                if q > 0:
                    nxt[k2] = nxt.get(k2, 0.0) + q
        live = {}
        for k, p in nxt.items():
            if tripped(k, n):
                p_trip += p
                weighted += p * n
            else:
                live[k] = p
    return GuardOC(rate, n_calls, p_trip, weighted / p_trip if p_trip > 0 else math.nan)


def run_abort_probability(tripped: Callable[[int, int], bool], rate: float,
                          gate_calls: list[int]) -> float:
    """P(at least one of a run's gates trips), its gates independent with the given call
    counts: ``1 - prod(1 - p_trip)`` (a guard counting INFRA *units*, at most one per pair of
    calls, trips no more often than this call-level bound)."""
    memo: dict[int, float] = {}
    log_ok = 0.0
    for n in gate_calls:
        if n not in memo:
            memo[n] = guard_oc(tripped, rate, n).p_trip
        log_ok += math.log1p(-min(memo[n], 1.0)) if memo[n] < 1 else -math.inf
    return -math.expm1(log_ok)
