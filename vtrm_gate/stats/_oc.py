"""Exact operating characteristics by dynamic programming over (consumed, W, L)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

from ..errors import is_real, is_whole, plain_number
from ._batch import (
    _decide_codes,
    _times_array,
)
from ._params import ACTION_CODES, Action, GateParams, as_params, bet_factors
from ._process import (
    _times,
    best_case_floor,
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


def _product(first: np.ndarray | np.float64, *factors: np.ndarray) -> np.ndarray:
    """Elementwise product of capital factors where any zero factor gives exactly 0."""
    out = cast(np.ndarray, first)  # a float64 multiplies like a 0-d array
    for f in factors:
        out = _times_array(out, f)
    return out


def operating_characteristics(params: GateParams | None, p_win: float, discordance: float,
                              n_units: int, infra_rate: float = 0.0) -> OperatingCharacteristics:
    """Exact P(each exit) and E[units consumed] for the prefix rule on i.i.d. units
    (``params`` None: the defaults).

    Each unit is INFRA with probability ``infra_rate``; otherwise discordant with
    probability ``discordance``, and a discordant unit is a win with probability ``p_win``.
    E+ and E- are products of the same factors the live update multiplies (no logs, so
    lambda = 1/(1+delta), where a loss zeroes E+, and thresholds equal to an attainable E+
    are exact). The state after k consumed units is (W, L): ties only matter through
    T = k - W - L, or not at all when delta = 0, so the cost is O(n^3). With delta > 0 and
    INFRA a tie moves E+ and an INFRA unit does not, so the state is (W, L, T) at each of n
    units, O(n^4) as a plain recursion; `_oc_chain` gets the same numbers in O(n^3) from the
    non-INFRA units alone and a binomial table for where the INFRA units fall.
    """
    n, p_win, discordance, infra_rate = (plain_number(v) for v in (n_units, p_win, discordance,
                                                                    infra_rate))
    exits, exp_units, exp_pairs, _ = recursion(as_params(params), n, p_win, discordance,
                                               infra_rate, n_name="n_units")
    if n == 0:
        exits[Action.INERTIA] = 1.0  # an empty ladder ends INERTIA at once
    return OperatingCharacteristics(
        exits[Action.ACCEPT], exits[Action.REJECT], exits[Action.FUTILE],
        exits[Action.PROVISIONAL], exits[Action.INERTIA], exp_units, exp_pairs,
        p_win, discordance, n, infra_rate)


_OCParts = tuple[dict[Action, float], float, float, list[float]]
"""Exit probabilities, E[units], E[pairs], and P(still undecided after k units), k = 0..n."""

MAX_OC_UNITS = 10_000
"""The longest ladder the exact recursion takes: each of its arrays holds (n+1)² floats,
0.75 GiB at 10,000 units (a gate's ladder is `GateParams.n_max`, 40 by default)."""

START = (1.0, 1.0, 0)
"""(E+, E-, W - L) before the first unit; `oc_from_state` starts from a type's own."""


def recursion(params: GateParams, n: int, p_win: float, discordance: float,
              infra_rate: float, start: tuple[float, float, int] = START,
              n_name: str = "n") -> _OCParts:
    """The exact recursion over ``n`` i.i.d. units from ``start`` (inputs validated, each
    named in its error); n = 0 gives no exits, nothing consumed."""
    n, p_win, discordance, infra_rate = (plain_number(v) for v in (n, p_win, discordance,
                                                                    infra_rate))
    for name, v in (("p_win", p_win), ("discordance", discordance), ("infra_rate", infra_rate)):
        if not (is_real(v) and 0.0 <= v <= 1.0):  # True is no probability
            raise ValueError(f"{name} must be a probability in [0, 1], got {v!r}")
    if not is_whole(n) or n < 0:
        raise ValueError(f"{n_name} must be an integer >= 0, got {n!r}")
    if n > MAX_OC_UNITS:
        raise ValueError(f"{n_name} must be at most {MAX_OC_UNITS:,} (the exact recursion "
                         f"keeps (n+1)² states), got {n:,}: {8 * (n + 1) ** 2 / 2**30:,.0f} "
                         f"GiB an array")
    if n == 0:
        return dict.fromkeys(ACTION_CODES[1:], 0.0), 0.0, 0.0, [1.0]
    q = 1.0 - infra_rate
    pw, pl, pt = q * discordance * p_win, q * discordance * (1 - p_win), q * (1 - discordance)
    (fw, gw), (fl, gl), (ft, _) = (bet_factors(params, 1), bet_factors(params, -1),
                                   bet_factors(params, 0))
    tables = (_powers(fw, n), _powers(fl, n), _powers(ft, n), _powers(gw, n), _powers(gl, n))
    if infra_rate == 0 or ft == 1.0:
        return _oc_wl(params, n, infra_rate, pw, pl, pt, *tables, start=start)
    if q > 0 and start == START:  # O(n^3): the chain over the non-INFRA units
        return _oc_chain(params, n, infra_rate, pw, pl, pt, *tables)
    return _oc_wlt(params, n, infra_rate, pw, pl, pt, *tables, start=start)


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


def _oc_chain(params: GateParams, n: int, infra_rate: float, pw: float, pl: float, pt: float,
              PW: np.ndarray, PL: np.ndarray, PT: np.ndarray, MW: np.ndarray,
              ML: np.ndarray) -> _OCParts:
    """delta > 0 with INFRA in O(n^3): a recursion over the non-INFRA units only.

    INFRA units leave (W, L, T) alone, and ACCEPT and REJECT depend on (W, L, T) only, so the
    chain of non-INFRA units (j of them: state (W, L), T = j - W - L) absorbs those exits by
    itself. FUTILE also depends on the units left: a state s is hopeful with r units left iff
    r >= r*(s), and once futile a type stays futile (its best case only shrinks). So "never
    futile before clock k" is "hopeful at clock k - 1", which asks for the state just before
    k and the clock alone; the clock is independent of the chain (J non-INFRA units among k
    is Binomial(k, 1 - infra_rate)). Per chain level: the mass by r* (histogram), the mass
    leaving for REJECT by its parent's r*, the ACCEPT mass, the PROVISIONAL-eligible mass;
    then every exit and both expectations are sums over (level, clock). Lossless futility
    means ACCEPT and PROVISIONAL need no futility check at all.
    """
    q = 1.0 - infra_rate
    cw, cl, ct = pw / q, pl / q, pt / q  # a non-INFRA unit's law
    # the live check's floors, non-increasing in r (a win factor > 1): r* is a search
    floors = {t: np.array([best_case_floor(t, r, params) for r in range(n + 1)])
              for t in (params.e_confirm, params.e_provisional)}
    H = np.zeros((n + 1, n + 2))  # chain-alive mass at level j by r* (n + 1: never hopeful)
    Rh = np.zeros((n + 1, n + 2))  # mass entering REJECT at level j, by its parent's r*
    f_acc = np.zeros(n + 1)
    prov = np.zeros(n + 1)
    mass = np.ones((1, 1))
    rstar = _r_star(*_e_plus(mass.shape, PW, PL, PT, 0, n), n, params, floors)
    H[0] = np.bincount(rstar.ravel(), mass.ravel(), n + 2)
    prov[0] = _prov_mass(mass, *_e_plus(mass.shape, PW, PL, PT, 0, n), params)
    for j in range(1, n + 1):
        ew, el = mass.shape
        new = np.zeros((min(ew + 1, n + 1), min(el + 1, n + 1)))
        new[:ew, :el] += ct * mass
        new[1:ew + 1, :el] += cw * mass[:new.shape[0] - 1, :]
        new[:ew, 1:el + 1] += cl * mass[:, :new.shape[1] - 1]
        ep, wnet = _e_plus(new.shape, PW, PL, PT, j, n)
        em = _product(MW[:new.shape[0], None], ML[None, :new.shape[1]])
        acc = (ep >= params.e_confirm) & (wnet >= params.w_net_min)
        rej = ~acc & (em >= params.e_reject)
        f_acc[j] = float(new[acc].sum())
        pad = np.zeros((ew + 1, el + 1), dtype=bool)
        pad[:rej.shape[0], :rej.shape[1]] = rej
        to_reject = ct * pad[:ew, :el] + cw * pad[1:, :el] + cl * pad[:ew, 1:]
        Rh[j] = np.bincount(rstar.ravel(), (mass * to_reject).ravel(), n + 2)
        new[acc | rej] = 0.0
        rstar = _r_star(ep, wnet, n, params, floors)
        prov[j] = _prov_mass(new, ep, wnet, params)
        if j < n:  # hopeless at every clock still to come: so are all its descendants
            new[rstar > n - j] = 0.0
        H[j] = np.bincount(rstar.ravel(), new.ravel(), n + 2)
        mass = _trimmed(new)
        rstar = rstar[:mass.shape[0], :mass.shape[1]]
        if not mass.any():
            break
    return _chain_sums(n, q, infra_rate, H, Rh, f_acc, prov)


def _e_plus(shape: tuple[int, ...], PW: np.ndarray, PL: np.ndarray, PT: np.ndarray, j: int,
            n: int) -> tuple[np.ndarray, np.ndarray]:
    """E+ and W - L of every (W, L) at chain level j (T = j - W - L)."""
    ew, el = shape
    W, L = np.arange(ew)[:, None], np.arange(el)[None, :]
    return (_product(_product(PW[:ew, None], PL[None, :el]), PT[np.clip(j - W - L, 0, n)]),
            W - L)


def _r_star(ep: np.ndarray, wnet: np.ndarray, n: int, params: GateParams,
            floors: dict[float, np.ndarray]) -> np.ndarray:
    """Per state, the fewest units left (1..n) with which it is hopeful; n + 1 if none.

    The same comparisons as the live futility check, against the same floors."""
    best = np.full(ep.shape, n + 1)
    for target, w_min in ((params.e_confirm, params.w_net_min),
                          (params.e_provisional, params.w_net_min_provisional)):
        f = floors[target]  # f[r], non-increasing in r: the first r with ep >= f[r]
        first = 1 + np.searchsorted(-f[1:], -ep, side="left")
        r = np.maximum(first, np.maximum(w_min - wnet, 1))
        best = np.minimum(best, np.where(r <= n, r, n + 1))
    return np.where(ep > 0, best, n + 1)


def _prov_mass(mass: np.ndarray, ep: np.ndarray, wnet: np.ndarray, params: GateParams
               ) -> float:
    """Mass of the states that would end PROVISIONAL if the ladder ended here."""
    ok = (ep >= params.e_provisional) & (wnet >= params.w_net_min_provisional)
    return float(mass[ok].sum())


def _trimmed(mass: np.ndarray) -> np.ndarray:
    ext = _extent(mass)
    return mass[:1, :1] * 0.0 if ext is None else mass[:ext[0], :ext[1]]


def _chain_sums(n: int, q: float, infra_rate: float, H: np.ndarray, Rh: np.ndarray,
                f_acc: np.ndarray, prov: np.ndarray) -> _OCParts:
    """Exits and expectations from the per-level masses and the INFRA clock's law.

    B[k, J] = P(J non-INFRA units among the first k); the j-th non-INFRA unit is at clock
    <= K with probability Ge[K, j] = P(Binomial(K) >= j). A REJECT entered at level j from
    a parent with r* = r, and the j-th unit consumed at all (expected_pairs), need clock
    k_j <= n and "hopeful just before": k_j = 1 or n - (k_j - 1) >= r.
    """
    B = np.zeros((n + 1, n + 1))
    B[0, 0] = 1.0
    for k in range(1, n + 1):
        B[k] = infra_rate * B[k - 1]
        B[k, 1:] += q * B[k - 1, :-1]
    Ge = np.cumsum(B[:, ::-1], axis=1)[:, ::-1]  # Ge[K, j] = P(Binomial(K, q) >= j)
    r = np.arange(n + 2)
    K = np.minimum(n, np.maximum(1, n + 1 - r))  # the latest clock allowed for k_j
    G = Ge[K].T  # G[j, r] = P(k_j <= K(r))
    C = np.cumsum(H, axis=1)  # C[J, x]: mass at level J hopeful with x units left
    p_accept = float(f_acc @ Ge[n])
    p_reject = float((Rh[1:] * G[1:]).sum())
    exp_pairs = float((H[:-1] * G[1:]).sum())
    alive = [1.0] + [float(B[k, :k + 1] @ C[:k + 1, n - k]) for k in range(1, n)]
    exp_units = float(sum(alive))
    last = q * B[n - 1, :n]  # P(the j-th non-INFRA unit is the n-th unit), index j - 1
    at_n = float(f_acc[1:] @ last) + float((Rh[1:, 1] if n > 1 else Rh[1:].sum(axis=1)) @ last)
    p_prov = float(B[n] @ prov)
    p_inertia = alive[-1] - at_n - p_prov
    exits = {Action.ACCEPT: p_accept, Action.REJECT: p_reject,
             Action.PROVISIONAL: p_prov, Action.INERTIA: p_inertia,
             Action.FUTILE: 1.0 - p_accept - p_reject - p_prov - p_inertia}
    return exits, exp_units, exp_pairs, [*alive, 0.0]  # every type has decided after n units
