"""Hypothesis strategies shared by the statistics and the gate's property tests."""

from __future__ import annotations

from hypothesis import strategies as st

from vtrm_gate import GateParams


@st.composite
def gate_params(draw: st.DrawFn, n_max: int = 40) -> GateParams:
    """Any valid `GateParams`, its boundaries included: λ at its maximum 1/(1+δ) and just
    under it, δ near 1, thresholds just over 1 and astronomically high, floors from 0."""
    delta = draw(st.sampled_from([0.0, 0.1, 0.5, 0.999]))
    lam_max = 1.0 / (1.0 + delta)
    return GateParams(
        e_confirm=draw(st.sampled_from([1.0000001, 2.0, 20.0, 1e300])),
        lambda_dir=draw(st.sampled_from([lam_max, lam_max * (1 - 1e-12), lam_max / 2, 1e-3])),
        delta_min=delta,
        w_net_min=draw(st.integers(0, 5)),
        e_reject=draw(st.sampled_from([1.0000001, 4.0, 20.0, 1e300])),
        e_provisional=draw(st.sampled_from([1.0, 1.5, 2.0, 1e300])),
        w_net_min_provisional=draw(st.integers(0, 4)),
        n_max=n_max)
