"""Probation rules: how the epoch-end settlement decides to keep or roll back a PROVISIONAL
version from its probe (fresh units of the type's pool, in a pre-declared order).

Each rule is a `DecisionRule` run by the continuous gate on the probe (one slot pool for all
types on probation): ACCEPT means *keep*, anything else means *roll back*. The rule is a
workspace setting (``probation_rule`` in ``workspace.json``):

- ``w_net`` (the original bet): run the whole probe, keep if ``W - L >= probation_min_w_net``.
  No error guarantee: a neutral candidate passes a 40-unit probe about half the time.
- ``e_continue`` (anytime-valid): continue the type's accept-side e-process from the value
  the gate left it at (``E+`` of the PROVISIONAL exit) over the probe; keep as soon as
  ``E+ >= e_confirm``, roll back on harm evidence (``E- >= e_reject`` on the probe), on
  futility, or at exhaustion. Under H0 (``E[d | past] <= delta``) the gate's units followed
  by the probe form one e-process, so a neutral-or-worse candidate is ever kept with
  probability ``<= 1/e_confirm`` (Ville): the ACCEPT guarantee, extended to PROVISIONAL.
- ``e_harm`` (anytime-valid the other way): keep unless the harm-side e-process on the probe
  reaches ``e_reject``; a candidate that is not worse is rolled back with probability
  ``<= 1/e_reject``; it bounds no leak (most neutral candidates stay).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._params import Action, GateParams, Pair, as_params
from ._process import GateState, PairedBetting, TypeOutcome, update_state

PROBATION_RULES = ("w_net", "e_continue", "e_harm")

GUARANTEES = {
    "w_net": "none (a bet: keeps a neutral candidate ~50% of the time)",
    "e_continue": "P(keep a neutral-or-worse candidate) <= 1/e_confirm (Ville, gate + probe)",
    "e_harm": "P(roll back a not-worse candidate) <= 1/e_reject (Ville, probe)",
}


@dataclass(frozen=True)
class WNetRule:
    """Run the whole probe; keep (ACCEPT) if ``W - L >= min_w_net``, else REJECT."""

    min_w_net: int = 0
    name: str = "w_net"

    def update(self, state: GateState, pair: Pair, params: GateParams) -> GateState:
        return update_state(state, pair, params)

    def decide(self, state: GateState, n_remaining: int, params: GateParams) -> Action:
        if n_remaining > 0:
            return Action.CONTINUE
        return Action.ACCEPT if state.w_net >= self.min_w_net else Action.REJECT

    def keep(self, outcome: TypeOutcome) -> bool:
        if outcome.n_ladder == 0:  # empty probe: W - L = 0
            return self.min_w_net <= 0
        return outcome.action is Action.ACCEPT

    def describe(self, outcome: TypeOutcome) -> str:
        op = ">=" if self.keep(outcome) else "<"
        return (f"probe W-L {outcome.W - outcome.L} {op} {self.min_w_net} on "
                f"{outcome.n_used} units")


@dataclass(frozen=True)
class EContinueRule:
    """Continue the gate's E+ (``e_start``) on the probe; keep at ``e_start * E+ >=
    e_confirm``; roll back on ``E- >= e_reject``, on futility, or at exhaustion."""

    e_start: float = 1.0
    name: str = "e_continue"

    def update(self, state: GateState, pair: Pair, params: GateParams) -> GateState:
        return update_state(state, pair, params)

    def decide(self, state: GateState, n_remaining: int, params: GateParams) -> Action:
        e_plus = self.e_start * state.e_plus
        if e_plus >= params.e_confirm:
            return Action.ACCEPT
        if state.e_minus >= params.e_reject:
            return Action.REJECT
        if e_plus * params.win_factor ** n_remaining < params.e_confirm:
            return Action.FUTILE if n_remaining else Action.INERTIA
        return Action.CONTINUE

    def keep(self, outcome: TypeOutcome) -> bool:
        return outcome.action is Action.ACCEPT

    def describe(self, outcome: TypeOutcome) -> str:
        e = self.e_start * outcome.e_plus
        return (f"E+ {self.e_start:.3g} from the gate -> {e:.3g} after {outcome.n_used} probe "
                f"units, " + ("confirmed" if self.keep(outcome)
                              else f"not confirmed ({outcome.action})"))


@dataclass(frozen=True)
class EHarmRule:
    """Keep unless the probe's harm-side e-process reaches ``e_reject`` (then REJECT);
    stop early (INERTIA = keep) once that is out of reach."""

    name: str = "e_harm"

    def update(self, state: GateState, pair: Pair, params: GateParams) -> GateState:
        return update_state(state, pair, params)

    def decide(self, state: GateState, n_remaining: int, params: GateParams) -> Action:
        if state.e_minus >= params.e_reject:
            return Action.REJECT
        if state.e_minus * (1.0 + params.lambda_dir) ** n_remaining < params.e_reject:
            return Action.INERTIA
        return Action.CONTINUE

    def keep(self, outcome: TypeOutcome) -> bool:
        return outcome.action is not Action.REJECT

    def describe(self, outcome: TypeOutcome) -> str:
        return (f"probe E- {outcome.e_minus:.3g} after {outcome.n_used} units"
                + (": harm, rolled back" if not self.keep(outcome) else ": no harm shown"))


ProbationRule = WNetRule | EContinueRule | EHarmRule
DecisionRuleLike = Any


def probation_rule(name: str, *, min_w_net: int = 0, e_start: float = 1.0) -> ProbationRule:
    """The rule called ``name`` (one of `PROBATION_RULES`)."""
    if name == "w_net":
        return WNetRule(min_w_net)
    if name == "e_continue":
        return EContinueRule(float(e_start))
    if name == "e_harm":
        return EHarmRule()
    raise ValueError(f"probation_rule must be one of {list(PROBATION_RULES)}, got {name!r}")


@dataclass(frozen=True)
class ProbeOC:
    """Exact operating characteristics of a probation rule on an i.i.d. probe."""

    p_keep: float
    expected_units: float


def _terminals(rule: DecisionRuleLike, params: GateParams, p_win: float, discordance: float,
               n_units: int) -> tuple[list[tuple[TypeOutcome, float]], float]:
    """Every way a rule can stop on ``n_units`` i.i.d. units, with its probability (dynamic
    programming over W, L; ties advance the count), and the expected units consumed."""
    if not (0 <= p_win <= 1 and 0 <= discordance <= 1) or n_units < 0:
        raise ValueError("p_win and discordance must be probabilities, n_units >= 0")
    if n_units == 0:
        return [(TypeOutcome(Action.INERTIA, 0, 0, 0, 1.0, 1.0, None, n_ladder=0), 1.0)], 0.0
    steps = ((1 - discordance, (True, True)), (discordance * p_win, (False, True)),
             (discordance * (1 - p_win), (True, False)))
    live: dict[tuple[int, int], tuple[GateState, float]] = {(0, 0): (GateState(), 1.0)}
    out: list[tuple[TypeOutcome, float]] = []
    units = 0.0
    for k in range(n_units):
        nxt: dict[tuple[int, int], tuple[GateState, float]] = {}
        for state, pr in live.values():
            units += pr
            for q, pair in steps:
                if q == 0:
                    continue
                s = rule.update(state, pair, params)
                a = rule.decide(s, n_units - k - 1, params)
                if a is Action.CONTINUE:
                    prev = nxt.get((s.W, s.L))
                    nxt[(s.W, s.L)] = (s, (prev[1] if prev else 0.0) + pr * q)
                else:
                    out.append((TypeOutcome(a, s.W, s.L, s.n_used, s.e_plus, s.e_minus, k,
                                            n_consumed=k + 1, n_ladder=n_units), pr * q))
        live = nxt
    return out, units


def probe_oc(rule: ProbationRule, p_win: float, discordance: float, n_units: int,
             params: GateParams | None = None) -> ProbeOC:
    """P(keep) and expected probe units, exactly (dynamic programming over W, L, ties).

    Each probe unit is discordant with probability ``discordance``; a discordant unit is a
    win with probability ``p_win`` (0.5 = a neutral candidate).
    """
    ends, units = _terminals(rule, as_params(params), p_win, discordance, n_units)
    return ProbeOC(sum(pr for o, pr in ends if rule.keep(o)), units)


@dataclass(frozen=True)
class SettledOC:
    """Exact fate of one candidate through gate + probation (i.i.d. units)."""

    p_accept: float
    p_provisional: float
    p_kept: float
    """P(PROVISIONAL and kept by probation)."""
    p_applied: float
    """P(applied after settlement) = p_accept + p_kept."""
    expected_probe_units: float
    """Probe units spent per candidate (0 unless PROVISIONAL)."""


def settled_oc(rule_name: str, p_win: float, discordance: float, n_gate: int = 40,
               n_probe: int = 40, params: GateParams | None = None,
               min_w_net: int = 0, probe_discordance: float | None = None) -> SettledOC:
    """Exact end-to-end operating characteristics of the gate followed by probation with
    ``rule_name`` (``e_continue`` starts from the gate's E+ at its PROVISIONAL exit).

    ``probe_discordance`` (default: ``discordance``): the probe's own discordance. A ladder
    takes the units the seed baseline got wrong first, so the fresh units left for the probe
    are less discordant (in the simulator 0.09-0.13 against the ladder's 0.23)."""
    params = as_params(params)
    probe_disc = discordance if probe_discordance is None else probe_discordance
    ends, _ = _terminals(PairedBetting(), params, p_win, discordance, n_gate)
    acc = sum(pr for o, pr in ends if o.action is Action.ACCEPT)
    by_start: dict[float, float] = {}  # PROVISIONAL exits grouped by the gate's E+
    for o, pr in ends:
        if o.action is Action.PROVISIONAL:
            e = round(o.e_plus, 9) if rule_name == "e_continue" else 1.0
            by_start[e] = by_start.get(e, 0.0) + pr
    prov = kept = units = 0.0
    for e_start, pr in by_start.items():
        rule = probation_rule(rule_name, min_w_net=min_w_net, e_start=e_start)
        oc = probe_oc(rule, p_win, probe_disc, n_probe, params)
        prov += pr
        kept += pr * oc.p_keep
        units += pr * oc.expected_units
    return SettledOC(acc, prov, kept, acc + kept, units)
