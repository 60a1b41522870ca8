"""The simulated world (SPEC §6): determinism, realism knobs, virtual time, validation."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest

from vtrm_gate._ids import arm_run_id, content_hash
from vtrm_gate.gate import TypePlan, UnitTask, run_gate
from vtrm_gate.sim import (
    DEFAULT_POOL_SIZES,
    EFFECTS,
    TASK_TYPES,
    SimConfig,
    SimEvolver,
    SimWorld,
    block_serial_schedule,
    continuous_schedule,
    gate_plans,
    ladder_outcomes,
    no_early_stop,
    run_virtual,
)
from vtrm_gate.stats import GateParams, replay_blocks, replay_prefix

SMALL = {"Counting Problem": 60, "OCR Problems": 40, "Spatial Perception": 9}


def _task(world: SimWorld, task_type: str, unit: str, run_id: str,
          skill: str | None = None, rank: int = 0) -> UnitTask:
    skill = world.initial_skill(task_type) if skill is None else skill
    return UnitTask(task_type, unit, "base", rank, run_id, skill, content_hash(skill))


def _pairs(world: SimWorld, plan: TypePlan):
    return [None if b.infra or c.infra else (b.correct, c.correct)
            for b, c in ladder_outcomes(world, plan)]


def test_task_types_are_the_twelve_video_mme_types_in_order():
    assert len(TASK_TYPES) == 12
    assert tuple(sorted(TASK_TYPES)) == TASK_TYPES
    assert SimWorld().task_types == TASK_TYPES


def test_default_pool_sizes_span_tiny_to_hundreds():
    world = SimWorld()
    sizes = {t: len(world.pool(t)) for t in world.task_types}
    assert sizes == dict(DEFAULT_POOL_SIZES)
    assert min(sizes.values()) == 9
    assert max(sizes.values()) >= 200
    ids = [u for t in world.task_types for u in world.pool(t)]
    assert len(ids) == len(set(ids))


def test_same_seed_same_world_different_seed_different_world():
    a, b, c = SimWorld(SimConfig(seed=7)), SimWorld(SimConfig(seed=7)), SimWorld(SimConfig(seed=8))
    t = "Counting Problem"
    assert a.pool(t) == b.pool(t)
    assert a.seed_record(t) == b.seed_record(t)
    assert a.error_cases(t, 1, 2) == b.error_cases(t, 1, 2)
    assert a.question(t, a.pool(t)[0]) == b.question(t, b.pool(t)[0])
    task = _task(a, t, a.pool(t)[3], "e1_s1_gate_counting-problem_base")
    assert a.outcome(task) == b.outcome(task)
    assert a.outcome(task) == a.outcome(task)
    assert a.seed_record(t) != c.seed_record(t)
    ev_a, ev_b = SimEvolver(a), SimEvolver(b)
    assert ev_a.propose(t, a.initial_skill(t), (), 1, 1) == ev_b.propose(t, b.initial_skill(t),
                                                                         (), 1, 1)


def test_infer_returns_outcome_and_sleeps_its_latency_on_the_loop_clock():
    world = SimWorld(SimConfig(seed=1, pool_sizes=SMALL))
    task = _task(world, "OCR Problems", world.pool("OCR Problems")[5], "r1")

    async def call():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        res = await world.infer(task)
        return res, loop.time() - t0

    res, elapsed = run_virtual(call())
    assert res == world.outcome(task)
    assert res.latency_s == world.latency(task, res)
    assert elapsed == pytest.approx(res.latency_s, abs=1e-5)


def test_seed_record_is_independent_of_the_base_arm():
    """Measured agreement is high (shared difficulty) but it is not identity."""
    world = SimWorld(SimConfig(seed=2, infra_rate=0.0))
    agree = total = 0
    for t in ("Object Reasoning", "Object Recognition", "Counting Problem"):
        record = world.seed_record(t)
        run_id = arm_run_id("e1_s1", t, "base")
        for rank, u in enumerate(world.pool(t)):
            res = world.outcome(_task(world, t, u, run_id, rank=rank))
            agree += res.correct == record[u]
            total += 1
    rate = agree / total
    assert 0.6 < rate < 0.97, rate


def test_seed_record_omits_units_whose_seed_call_was_infra():
    world = SimWorld(SimConfig(seed=0, infra_rate=0.2, pool_sizes=SMALL))
    record = world.seed_record("Counting Problem")
    assert 0 < len(record) < 60


def test_wrong_answers_are_slower_and_use_more_steps_and_tokens():
    world = SimWorld(SimConfig(seed=3, infra_rate=0.0))
    by: dict[bool, list] = {True: [], False: []}
    for t in ("Action Reasoning", "Object Reasoning"):
        for rank, u in enumerate(world.pool(t)):
            by[(r := world.outcome(_task(world, t, u, "run-x", rank=rank))).correct].append(r)
    right, wrong = by[True], by[False]
    assert len(right) > 50 and len(wrong) > 50

    def mean(rs, f):
        return sum(f(r) for r in rs) / len(rs)

    assert mean(wrong, lambda r: r.latency_s) > 1.5 * mean(right, lambda r: r.latency_s)
    assert mean(wrong, lambda r: r.trace["agent_steps"]) > mean(right,
                                                                lambda r: r.trace["agent_steps"])
    for r in right + wrong:
        assert 1 <= r.trace["agent_steps"] <= 40
        assert r.tokens >= 900 * r.trace["agent_steps"]
    # minutes per inference at the default scale
    assert 60 < mean(right + wrong, lambda r: r.latency_s) < 600


def test_infra_rate_within_binomial_tolerance():
    rate = 0.05
    world = SimWorld(SimConfig(seed=4, infra_rate=rate))
    n = infra = 0
    for t in world.task_types:
        for rank, u in enumerate(world.pool(t)):
            res = world.outcome(_task(world, t, u, "run-infra", rank=rank))
            n += 1
            if res.infra:
                infra += 1
                assert res.error.startswith("503") and res.prediction is None
                # an INFRA result comes after the retry budget: a partial call plus backoff
                assert res.tokens == 0
                assert 30 + 0.5 * 120 <= res.latency_s <= 30 + 1.5 * 120
    sd = math.sqrt(rate * (1 - rate) / n)
    assert abs(infra / n - rate) < 4 * sd, (infra, n)


def _discordant(effect: str, seed: int = 5) -> tuple[int, int, int]:
    world = SimWorld(SimConfig(seed=seed, no_change_rate=0.0, infra_rate=0.0,
                               effects=dict.fromkeys(TASK_TYPES, effect)))
    W = L = T = 0
    for plan in gate_plans(world, n_max=400):
        for pair in _pairs(world, plan):
            d = pair[1] - pair[0]
            W, L, T = W + (d == 1), L + (d == -1), T + (d == 0)
    return W, L, T


def test_helpful_candidates_win_more_discordant_pairs_than_harmful_ones():
    """Over ~2,400 pairs per effect: win share of discordant pairs, with wide margins."""
    share = {}
    for effect in EFFECTS:
        W, L, T = _discordant(effect)
        share[effect] = W / (W + L)
        assert (W + L) / (W + L + T) < 0.4  # most pairs are concordant
    assert share["helpful"] > 0.65
    assert share["harmful"] < 0.35
    assert abs(share["neutral"] - 0.5) < 0.08


def test_skill_ability_is_read_from_the_text():
    world = SimWorld()
    assert world.skill_ability(world.initial_skill("OCR Problems")) == 0.0
    assert world.skill_ability("# x\n<!-- sim: ability=+0.350 effect=helpful -->\n") == 0.35
    assert world.skill_ability("<!-- sim: rev=v2 ability=-1.25 -->") == -1.25
    assert world.skill_ability("a hand-written skill with no marker") == 0.0


def test_evolver_no_change_path_returns_the_text_unchanged():
    world = SimWorld(SimConfig(no_change_rate=1.0))
    t = "Temporal Reasoning"
    skill = world.initial_skill(t)
    assert run_virtual(SimEvolver(world).evolve(t, skill, (), 1, 1)) == skill


def test_evolver_writes_its_true_effect_into_the_candidate():
    for effect, sign in (("helpful", 1), ("neutral", 0), ("harmful", -1)):
        world = SimWorld(SimConfig(seed=9, no_change_rate=0.0, effects={"OCR Problems": effect}))
        v0 = world.initial_skill("OCR Problems")
        cand = SimEvolver(world).propose("OCR Problems", v0, (), 2, 3)
        assert cand != v0 and cand.count("<!-- sim:") == 1
        shift = world.skill_ability(cand) - world.skill_ability(v0)
        assert (shift > 0.25) if sign > 0 else (shift < -0.25) if sign < 0 else shift == 0
        again = SimEvolver(world).propose("OCR Problems", cand, [cand], 2, 4)
        assert again.count("<!-- sim:") == 1  # the marker is replaced, not stacked
        step2 = world.skill_ability(again) - world.skill_ability(cand)
        assert math.copysign(1, step2) == math.copysign(1, shift) or step2 == shift == 0


def test_evolver_seeds_on_rejected_count():
    world = SimWorld(SimConfig(seed=1, no_change_rate=0.5))
    t = "Counting Problem"
    v0 = world.initial_skill(t)
    outs = {SimEvolver(world).propose(t, v0, ["x"] * k, 1, 1) for k in range(12)}
    assert v0 in outs and len(outs) > 2  # some no-change, several distinct candidates


def test_error_cases_are_wrong_rollout_units_and_sometimes_empty():
    world = SimWorld(SimConfig(seed=0, pool_sizes=SMALL))
    seen_empty = False
    for step in range(1, 30):
        cases = world.error_cases("Counting Problem", 1, step)
        assert set(cases) <= set(world.pool("Counting Problem")) and len(cases) <= 6
        seen_empty |= not cases
    assert seen_empty


def test_gate_on_a_twelve_type_world_takes_hours_of_loop_time():
    world = SimWorld(SimConfig(seed=0))
    plans = gate_plans(world)
    result = run_virtual(run_gate(plans, world.infer, GateParams(), 32))
    assert result.wall_time_s > 3600  # loop clock: simulated seconds
    assert result.peak_in_flight == 32
    for plan in plans:
        ref = replay_prefix(_pairs(world, plan))
        assert result.outcomes[plan.task_type].same_decision(ref)


def test_scaled_real_time_gives_the_same_decisions():
    fast = SimWorld(SimConfig(seed=3, pool_sizes=SMALL, time_scale=1e-6, infra_rate=0.0))
    plans = gate_plans(fast)
    result = asyncio.run(run_gate(plans, fast.infer, GateParams(), 8))
    for plan in plans:
        assert result.outcomes[plan.task_type].same_decision(replay_prefix(_pairs(fast, plan)))


def test_run_virtual_works_inside_a_running_loop():
    async def outer():
        return run_virtual(asyncio.sleep(3600, result="done"))

    assert asyncio.run(outer()) == "done"


def test_block_serial_schedule_matches_a_virtual_clock_run_of_the_old_gate():
    world = SimWorld(SimConfig(seed=4, pool_sizes=SMALL))
    plans = gate_plans(world)
    params = GateParams()
    old = block_serial_schedule(world, plans, params)

    async def old_gate():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for plan in sorted(plans, key=lambda p: p.task_type):
            n = len(plan.units)
            stop = replay_blocks(_pairs(world, plan), params).stop_rank
            for start in range(0, stop + 1, 8):
                ranks = range(start, min(start + 8, n, stop + 1))
                for arm in ("base", "cand"):
                    await asyncio.gather(*(world.infer(plan.task(r, arm)) for r in ranks))
        return loop.time() - t0

    assert old["makespan_s"] == pytest.approx(run_virtual(old_gate()), rel=1e-6)
    for plan in plans:
        assert old["outcomes"][plan.task_type].same_decision(
            replay_blocks(_pairs(world, plan), params))
    assert old["calls"] == 2 * old["units"] <= no_early_stop(world, plans)["calls"]


def test_continuous_schedule_reports_makespan_against_the_lower_bound():
    world = SimWorld(SimConfig(seed=0))
    plans = gate_plans(world)
    cont = continuous_schedule(world, plans)
    assert cont["matches_replay_prefix"]
    assert cont["makespan_s"] >= cont["lower_bound_s"]
    assert cont["busy_s"] >= cont["needed_busy_s"]
    assert 0 < cont["slot_utilisation"] <= 1
    old = block_serial_schedule(world, plans)
    assert old["makespan_s"] > 3 * cont["makespan_s"]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"seed": 1.5}, "seed"),
    ({"seed": True}, "seed"),
    ({"pool_sizes": {}}, "pool_sizes"),
    ({"pool_sizes": {"OCR Problems": -1}}, "pool_sizes"),
    ({"pool_sizes": {"": 3}}, "pool_sizes"),
    ({"infra_rate": 1.0}, "infra_rate"),
    ({"infra_rate": -0.1}, "infra_rate"),
    ({"time_scale": -1}, "time_scale"),
    ({"time_scale": math.inf}, "time_scale"),
    ({"mean_latency_s": 0}, "mean_latency_s"),
    ({"no_change_rate": 2}, "no_change_rate"),
    ({"effects": {"OCR Problems": "great"}}, "effects"),
    ({"effects": {"Cooking": "helpful"}}, "effects"),
    ({"unit_correlation": 1.0}, "unit_correlation"),
])
def test_config_validation_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"SimConfig\.{field}\b"):
        SimConfig(**kwargs)


def test_config_is_a_plain_value():
    """asdict / replace / == work (the harness hashes configs into step manifests)."""
    import dataclasses

    pools = {"OCR Problems": 12}
    cfg = SimConfig(seed=3, pool_sizes=pools, effects={"OCR Problems": "helpful"})
    pools["OCR Problems"] = 99  # the config keeps its own copy
    assert dataclasses.asdict(cfg)["pool_sizes"] == {"OCR Problems": 12}
    assert cfg == SimConfig(seed=3, pool_sizes={"OCR Problems": 12},
                            effects={"OCR Problems": "helpful"})
    assert dataclasses.replace(SimConfig(), pool_sizes=SMALL).resolved_pool_sizes() == SMALL
    assert set(SimConfig().resolved_effects().values()) <= set(EFFECTS)


def test_unknown_type_or_unit_is_a_clear_error():
    world = SimWorld(SimConfig(pool_sizes=SMALL))
    with pytest.raises(ValueError, match="unknown task type 'Cooking'"):
        world.pool("Cooking")
    with pytest.raises(ValueError, match="unknown unit 'nope'"):
        world.outcome(_task(world, "OCR Problems", "nope", "r"))


def test_infra_is_drawn_again_per_attempt_and_a_success_sticks():
    """`UnitTask.attempt` (earlier INFRA-guard aborts of the step): a call that failed may
    succeed at the next attempt; one that succeeded stays the same result."""
    world = SimWorld(SimConfig(seed=4, infra_rate=0.3))
    t = max(world.task_types, key=lambda name: len(world.pool(name)))  # 320 units
    skill = world.initial_skill(t)
    tasks = [UnitTask(t, u, "base", r, "e1_s1_gate_x_base", skill, content_hash(skill))
             for r, u in enumerate(world.pool(t))]
    results = [[world.outcome(dataclasses.replace(k, attempt=a)) for k in tasks]
               for a in range(3)]
    failed = [{k.unit_id for k, r in zip(tasks, rs, strict=True) if r.infra}
              for rs in results]
    n = len(tasks)
    assert n >= 200 and abs(len(failed[0]) / n - 0.3) < 0.1  # the configured rate
    assert failed[2] <= failed[1] <= failed[0]  # only what failed is drawn again
    assert len(failed[1]) < 0.5 * len(failed[0]) and len(failed[2]) < len(failed[1])
    for rs in results[1:]:
        for r0, r in zip(results[0], rs, strict=True):
            if not r0.infra:
                assert (r.correct, r.prediction, r.tokens) == \
                    (r0.correct, r0.prediction, r0.tokens)


def test_the_old_gates_times_replay_each_step_with_its_own_parameters(tmp_path):
    # A run with n_max 60 has 60-unit ladders: the old-gate replay used the default
    # GateParams (n_max 40) and refused them (ValueError), so such a run had no summary.
    from vtrm_gate.backends import run_simulated_training
    from vtrm_gate.options import RunOptions
    from vtrm_gate.sim import SimConfig
    from vtrm_gate.stats import GateParams

    sim = SimConfig(seed=2, pool_sizes={"Action Reasoning": 120, "OCR Problems": 90},
                    infra_rate=0.0)
    ws, res, summary = run_simulated_training(tmp_path / "ws", sim, 1, 2,
                                              RunOptions(gate=GateParams(n_max=60)))
    longest = max(len(s.ladder) for r in res.steps.values() for s in r.types.values())
    assert longest > 40
    assert summary["old_phases_s"]["gate"] > summary["v3_phases_s"]["gate"] > 0
    ws.close()


@pytest.mark.parametrize("ability", [40.0, -40.0, 1e308, -1e308])
def test_an_ability_far_past_the_logit_scale_is_right_or_wrong_every_time_not_an_error(
        ability: float) -> None:
    """sigmoid(40) is 1.0 in floats and inv_cdf(1.0) raised StatisticsError (an exp of 1e308,
    OverflowError): a world with huge sizes (`init --world` took size_max 1e308) or a skill
    marker far past the scale made every call INFRA and tripped the guard."""
    world = SimWorld()
    skill = f"# x\n<!-- sim: ability={ability:+} effect=helpful -->\n"
    assert world.skill_ability(skill) == ability
    units = world.pool("OCR Problems")[:30]
    results = [world.outcome(_task(world, "OCR Problems", u, "r1", skill)) for u in units]
    assert not any(r.infra for r in results)
    assert {r.correct for r in results} == {ability > 0}
    p = world.unit_p_correct("OCR Problems", units[0], skill)
    assert (p > 1 - 1e-9) if ability > 0 else (p < 1e-9)


def test_a_type_of_no_units_is_refused():
    """``pool_sizes={..., "Temporal Perception": 0}`` was taken: notebook 06 then printed
    "initial nan | this gate nan | ..." for every mean of the run."""
    from vtrm_gate.errors import ConfigError

    with pytest.raises(ConfigError, match=r"pool_sizes.*integers >= 1 \(type 'Temporal "
                                          r"Perception'\)"):
        SimConfig(pool_sizes={"OCR Problems": 40, "Temporal Perception": 0})
