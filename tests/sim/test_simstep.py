"""One seed, one step: `sim_step(seed)` gates what `run_step` (the demo, the CLI) gates."""

from __future__ import annotations

import pytest

from vtrm_gate import GateParams, run_gate
from vtrm_gate.errors import ConfigError
from vtrm_gate.harness import run_step
from vtrm_gate.sim import (
    SimConfig,
    continuous_schedule,
    init_simulated,
    run_virtual,
    sim_step,
    simulated_backend,
)


@pytest.mark.parametrize("seed", [11, 3])
def test_sim_step_gates_what_run_step_gates(tmp_path, seed):
    ws = init_simulated(tmp_path / "ws", SimConfig(seed=seed))
    backend = simulated_backend(ws)
    res = run_virtual(run_step(ws, 1, 1, infer=backend.infer, evolver=backend.evolver,
                               cases=backend.cases))
    ws.close()
    st = sim_step(seed, wall_seconds=None)
    gated = {t for t, ts in res.types.items() if ts.status == "gated"}
    assert {p.task_type for p in st.plans} == gated
    assert st.skipped == {t: ts.status for t, ts in res.types.items() if t not in gated}
    for p in st.plans:
        assert tuple(p.units) == res.types[p.task_type].ladder
    gate = run_virtual(run_gate(list(st.plans), st.infer, GateParams()))
    assert gate.decisions() == res.gate.decisions()
    for t, o in gate.outcomes.items():
        assert o.same_decision(res.gate.outcomes[t])


def test_wall_seconds_scales_the_clock_to_the_step():
    st = sim_step(11)  # interactive by default: ~30 s of real time
    assert st.world.config.time_scale < 0.01
    assert st.virtual_makespan_s and st.virtual_makespan_s > 3600
    assert st.world.config.time_scale == pytest.approx(30.0 / st.virtual_makespan_s)
    # outcomes do not depend on the clock
    virtual = continuous_schedule(sim_step(11, wall_seconds=None).world, list(st.plans))
    assert virtual["outcomes"].keys() == {p.task_type for p in st.plans}


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "30", True])
def test_wall_seconds_must_be_a_finite_positive_number(bad):
    """``wall_seconds="30"`` was a TypeError ("'>' not supported"), and ``inf`` was told as a
    bad ``SimConfig.time_scale``, a value the researcher never gave."""
    with pytest.raises(ConfigError) as err:
        sim_step(1, wall_seconds=bad)
    assert str(err.value) == f"wall_seconds must be a finite number of seconds > 0, got {bad!r}"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"epoch": True}, "epoch must be an integer >= 1, got True"),
    ({"epoch": 1.0}, "epoch must be an integer >= 1, got 1.0"),
    ({"step": 0}, "step must be an integer >= 1, got 0"),
    ({"epoch": -3}, "epoch must be an integer >= 1, got -3"),
    ({"time_scale": 5}, "time_scale applies only with wall_seconds=None (wall_seconds picks "
                        "it), got time_scale=5 and wall_seconds=30.0"),
])
def test_a_step_that_run_step_would_not_gate_is_refused(kwargs, message):
    """``sim_step(1, epoch=True)`` gated step "eTrue_s1" and ``epoch=1.0`` "e1.0_s1" (other
    ladders, other candidates), not what ``run_step`` gates at (1, 1); a ``time_scale``
    beside the default ``wall_seconds`` was dropped without a word."""
    with pytest.raises(ConfigError) as err:
        sim_step(1, **kwargs)
    assert str(err.value) == message
