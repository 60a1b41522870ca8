"""Values from a numpy sweep are taken as the Python numbers they stand for.

``for n in np.arange(20, 121, 20): GateParams(n_max=n)`` was refused with "n_max must be an
integer >= 1, got np.int64(20)"; ``np.float32`` time scales and thresholds the same
(np.float64 passed, as a float subclass, and was kept as one in reprs and records).
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from vtrm_gate import GateParams, TypePlan, UnitResult, launch, run_gate
from vtrm_gate.gate import GuardParams, build_ladder
from vtrm_gate.options import RunOptions
from vtrm_gate.sim import SimConfig


def test_gate_params_from_numpy_equal_the_literal_ones_and_hold_python_numbers():
    swept = [GateParams(n_max=n) for n in np.arange(20, 61, 20)]
    assert [g.n_max for g in swept] == [20, 40, 60]
    g = GateParams(e_confirm=np.float32(20), lambda_dir=np.float64(0.5), n_max=np.int64(40),
                   w_net_min=np.int32(3), delta_min=np.float16(0))
    assert g == GateParams() and hash(g) == hash(GateParams())
    assert all(type(v) in (int, float) for v in vars(g).values() if not isinstance(v, str))
    assert repr(g) == repr(GateParams())  # no "np.float64(20.0)" in a record or a figure
    assert GuardParams(min_calls=np.int64(10), max_ratio=np.float32(0.25)).max_ratio == 0.25


def test_run_options_and_sim_config_take_numpy_scalars():
    o = RunOptions(time_scale=np.float32(0.5), concurrency=np.int64(8),
                   timeout=np.float32(30))
    assert (o.time_scale, o.concurrency, o.timeout) == (0.5, 8, 30.0)
    json.dumps(o.execution())  # plain numbers: a record can be written
    assert SimConfig(seed=np.int64(3)) == SimConfig(seed=3)


@pytest.mark.parametrize("bad", [np.bool_(True), np.float64("nan"), np.int64(0), True])
def test_what_a_literal_is_refused_for_its_numpy_twin_is_too(bad):
    with pytest.raises(ValueError, match="n_max must be an integer >= 1"):
        GateParams(n_max=bad)


def test_run_gate_launch_and_the_ladder_take_numpy_counts():
    async def infer(task):
        return UnitResult(correct=task.arm == "cand")

    units = [f"u{i}" for i in range(12)]
    assert build_ladder(units, {}, n_max=np.int64(10), seed=1) == build_ladder(
        units, {}, n_max=10, seed=1)
    plans = [TypePlan("T", units)]

    async def main():
        res = await run_gate(plans, infer, GateParams(), np.int64(4),
                             subscriber_timeout_s=np.float32(0.5))
        handle = launch(plans, infer, GateParams(), np.int32(4), history_limit=np.int64(10))
        return res, await handle

    res, launched = asyncio.run(main())
    assert res.outcomes["T"].action == launched.outcomes["T"].action == "ACCEPT"
    assert res.concurrency == 4 and type(res.concurrency) is int


def test_operating_characteristics_take_numpy_numbers_and_refuse_bools():
    """``p_win=True`` was taken as 1.0 and ``n_units=True`` as one unit (h12)."""
    from vtrm_gate import operating_characteristics

    oc = operating_characteristics(GateParams(), np.float32(0.7), np.float64(0.5), np.int64(40))
    assert oc == operating_characteristics(GateParams(), float(np.float32(0.7)), 0.5, 40)
    assert type(oc.p_win) is float and type(oc.n_units) is int
    with pytest.raises(ValueError, match=r"p_win must be a probability in \[0, 1\], got True"):
        operating_characteristics(GateParams(), True, 0.5, 40)
    with pytest.raises(ValueError, match=r"n_units must be an integer >= 0, got True"):
        operating_characteristics(GateParams(), 0.8, 0.5, True)


@pytest.mark.parametrize("make", [
    lambda v: RunOptions(timeout=v), lambda v: RunOptions(deadline=v),
    lambda v: GateParams(n_max=v), lambda v: SimConfig(seed=v)])
def test_a_numpy_duration_or_date_is_no_number_here(make):
    """np.timedelta64 poses as an Integral: 30 ns became a timeout of 30 seconds, and 2
    minutes a raw TypeError naming no field (h14)."""
    for v in (np.timedelta64(30, "ns"), np.timedelta64(2, "m"), np.datetime64("2026-12-07")):
        with pytest.raises(ValueError, match=r"got np\.(timedelta|datetime)64"):
            make(v)


def test_an_int_past_every_float_is_refused_naming_the_field():
    """10**400 for a float field raised OverflowError (h14); its message quotes it cut."""
    with pytest.raises(ValueError, match=r"GateParams\.e_confirm must be a number > 1, got "
                                         r"1000.*\(401 characters as text\)"):
        GateParams(e_confirm=10**400)
    with pytest.raises(ValueError, match=r"timeout must be a number of seconds > 0"):
        RunOptions(timeout=10**400)
