"""Exact operating characteristics by dynamic programming over (consumed, W, L)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._batch import (
    _decide_codes,
    _times_array,
)
from ._params import ACTION_CODES, Action, GateParams, bet_factors
from ._process import (
    _times,
)


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
    n = n_units
    exits, exp_units, exp_pairs, _ = recursion(params, n, p_win, discordance, infra_rate,
                                               n_name="n_units")
    if n == 0:
        exits[Action.INERTIA] = 1.0  # an empty ladder ends INERTIA at once
    return OperatingCharacteristics(
        exits[Action.ACCEPT], exits[Action.REJECT], exits[Action.FUTILE],
        exits[Action.PROVISIONAL], exits[Action.INERTIA], exp_units, exp_pairs,
        p_win, discordance, n, infra_rate)


_OCParts = tuple[dict[Action, float], float, float, list[float]]
"""Exit probabilities, E[units], E[pairs], and P(still undecided after k units), k = 0..n."""

START = (1.0, 1.0, 0)
"""(E+, E-, W - L) before the first unit; `oc_from_state` starts from a type's own."""


def recursion(params: GateParams, n: int, p_win: float, discordance: float,
              infra_rate: float, start: tuple[float, float, int] = START,
              n_name: str = "n") -> _OCParts:
    """The exact recursion over ``n`` i.i.d. units from ``start`` (inputs validated, each
    named in its error); n = 0 gives no exits, nothing consumed."""
    for name, v in (("p_win", p_win), ("discordance", discordance), ("infra_rate", infra_rate)):
        if not (isinstance(v, int | float) and 0.0 <= v <= 1.0):
            raise ValueError(f"{name} must be a probability in [0, 1], got {v!r}")
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"{n_name} must be an integer >= 0, got {n!r}")
    if n == 0:
        return dict.fromkeys(ACTION_CODES[1:], 0.0), 0.0, 0.0, [1.0]
    q = 1.0 - infra_rate
    pw, pl, pt = q * discordance * p_win, q * discordance * (1 - p_win), q * (1 - discordance)
    (fw, gw), (fl, gl), (ft, _) = (bet_factors(params, 1), bet_factors(params, -1),
                                   bet_factors(params, 0))
    tables = (_powers(fw, n), _powers(fl, n), _powers(ft, n), _powers(gw, n), _powers(gl, n))
    dp = _oc_wlt if (infra_rate > 0 and ft != 1.0) else _oc_wl
    return dp(params, n, infra_rate, pw, pl, pt, *tables, start=start)


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
           ML: np.ndarray, start: tuple[float, float, int] = START) -> _OCParts:
    """State (W, L) after k units (counted from ``start``: its E+, E- and W - L);
    ``used`` carries the first moment of n_used per state.

    Only the bounding box of the states still alive is computed on (stopped states hold no
    mass), which keeps W and L to the band the rule leaves open.
    """
    mass = np.zeros((n + 1, n + 1))
    used = np.zeros((n + 1, n + 1))
    mass[0, 0] = 1.0
    exits = dict.fromkeys(ACTION_CODES[1:], 0.0)
    exp_units = exp_pairs = 0.0
    alive = [1.0]
    e0, m0, w0 = start
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
        ep = _product(np.float64(e0), PW[:ew, None], PL[None, :el])
        if PT[1] != 1.0:  # delta > 0, and then no INFRA: T = k - W - L
            ep = _product(ep, PT[np.clip(k - W - L, 0, n)])
        em = _product(np.float64(m0), MW[:ew, None], ML[None, :el])
        codes = _decide_codes(ep, em, w0 + W - L, n - k, params)
        du, dpairs = _settle(codes, new_m, new_u, k, exits)
        mass[:ew, :el], used[:ew, :el] = new_m, new_u
        exp_units += du
        exp_pairs += dpairs
        alive.append(float(new_m.sum()))
        ext = _extent(new_m)
    return exits, exp_units, exp_pairs, alive


def _oc_wlt(params: GateParams, n: int, infra_rate: float, pw: float, pl: float, pt: float,
            PW: np.ndarray, PL: np.ndarray, PT: np.ndarray, MW: np.ndarray,
            ML: np.ndarray, start: tuple[float, float, int] = START) -> _OCParts:
    """State (W, L, T), for delta > 0 with INFRA: a tie moves E+, an INFRA unit does not,
    so ties cannot be told from INFRA by k - W - L. Same bounding-box restriction."""
    mass = np.zeros((n + 1, n + 1, n + 1))
    mass[0, 0, 0] = 1.0
    exits = dict.fromkeys(ACTION_CODES[1:], 0.0)
    exp_units = exp_pairs = 0.0
    alive = [1.0]
    e0, m0, w0 = start
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
        ep = _product(np.float64(e0), PW[:ew, None, None], PL[None, :el, None],
                      PT[None, None, :et])
        em = _product(np.float64(m0), MW[:ew, None, None], ML[None, :el, None])
        codes = _decide_codes(ep, em, w0 + W - L, n - k, params)
        du, dpairs = _settle(codes, new, new * (W + L + T), k, exits)
        mass[:ew, :el, :et] = new
        exp_units += du
        exp_pairs += dpairs
        alive.append(float(new.sum()))
        ext = _extent(new)
    return exits, exp_units, exp_pairs, alive


