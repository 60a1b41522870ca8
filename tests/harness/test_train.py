"""The training run (issue 9): train over epochs, resume after kill -9 at random points (real
processes), concurrent settlement through one slot pool, the held-out evaluation, the
simulator's ground truth and the CLI's bad-input / fault behaviour."""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vtrm_gate.errors import InfraGuardError, StepRefusedError, WorkspaceError
from vtrm_gate.gate import GuardParams, UnitResult, UnitTask
from vtrm_gate.harness import (
    HELDOUT_FILE,
    TrainRefusedError,
    Workspace,
    evaluate_epoch,
    read_heldout,
    run_step,
    settle_probation,
    train,
    workspace_lock,
)
from vtrm_gate.options import UNSET, RunOptions
from vtrm_gate.sim import (
    SimConfig,
    SimWorld,
    init_simulated,
    quality_report,
    record_ground_truth,
    run_virtual,
    simulate_policy,
    simulated_backend,
)
from vtrm_gate.stats import Action, update_state
from vtrm_gate.views import TrainView

ROOT = Path(__file__).resolve().parents[2]

CONFIG = SimConfig(
    seed=5,
    pool_sizes={"Action Reasoning": 90, "Counting Problem": 70, "OCR Problems": 60,
                "Spatial Reasoning": 23},
    effects={"Action Reasoning": "helpful", "Counting Problem": "harmful",
             "OCR Problems": "neutral", "Spatial Reasoning": "helpful"},
    infra_rate=0.0,
)
EPOCHS, STEPS = 2, 3


def _init(path: Path, **config) -> Workspace:
    return init_simulated(path, CONFIG, heldout_fraction=0.2, **config)


def _train(ws: Workspace, epochs: int = EPOCHS, steps: int = STEPS, infer=None, **kw):
    be = simulated_backend(ws)
    options = kw.pop("options", RunOptions())
    if options.concurrency is UNSET:
        options = options.replace(concurrency=16)
    return run_virtual(train(ws, epochs, steps, infer=infer or be.infer, evolver=be.evolver,
                             rollout=be.rollout(ws), options=options, **kw))


def _rows(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


# Everything a training run leaves behind that must not depend on crashes and resumes.
END_STATE_SQL = {
    "gate_evidence": "SELECT * FROM gate_evidence ORDER BY epoch, step, task_type, ladder_rank",
    "step_report": "SELECT epoch, step, task_type, status, action, W, L, n_used, e_plus, "
                   "e_minus, stop_rank, base_version, base_hash, cand_hash, applied, note "
                   "FROM step_report ORDER BY epoch, step, task_type",
    "evaluation": "SELECT * FROM evaluation ORDER BY epoch, task_type",
    "ground_truth": "SELECT * FROM ground_truth ORDER BY epoch, step, task_type",
    # The measurements the decisions used (consumed units) and every evaluation answer.
    # Which in-flight calls a frozen type discards depends on timing (a resumed step serves
    # its base arm from the BaselineCache at once), so those are not compared.
    "used_predictions": "SELECT p.run_id, p.unit_id, p.correct, p.infra FROM predictions p "
                        "JOIN gate_evidence g ON p.epoch = g.epoch AND p.step = g.step AND "
                        "p.task_type = g.task_type AND p.unit_id = g.unit_id UNION ALL "
                        "SELECT run_id, unit_id, correct, infra FROM predictions WHERE step = -1 "
                        "ORDER BY 1, 2",
}


def end_state(root: Path) -> dict[str, object]:
    db = root / "harness.sqlite"
    out: dict[str, object] = {k: _rows(db, q) for k, q in END_STATE_SQL.items()}
    out["state.json"] = (root / "state.json").read_text()
    for sub in ("skills", "history", "manifests"):
        out[sub] = {str(p.relative_to(root)): p.read_text()
                    for p in sorted((root / sub).rglob("*")) if p.is_file()}
    out["duplicates"] = _rows(db, "SELECT run_id, unit_id, COUNT(*) c FROM predictions "
                                  "GROUP BY run_id, unit_id HAVING c > 1")
    return out


# ---- the run --------------------------------------------------------------------------------


def test_train_runs_every_step_settles_each_epoch_and_evaluates(tmp_path):
    ws = _init(tmp_path / "ws")
    lines = []
    res = _train(ws, on_event=lambda ev: lines.append(ev))
    state = Workspace.open(ws.root).state
    assert state.last_step == (EPOCHS, STEPS) and state.settled_epochs == (1, 2)
    assert not state.probation
    assert [(e.kind, e.epoch, e.step) for e in lines if e.kind != "finished"] == [
        *[("step", 1, s) for s in (1, 2, 3)], ("settle", 1, None), ("evaluate", 1, None),
        *[("step", 2, s) for s in (1, 2, 3)], ("settle", 2, None), ("evaluate", 2, None)]
    assert res.done_before == 0 and len(res.steps) == EPOCHS * STEPS
    assert set(res.phases) == {"rollout", "evolution", "gate", "settlement", "evaluation"}
    assert all(v >= 0 for v in res.phases.values()) and res.phases["gate"] > 0
    # Evaluation: one row per type and epoch; the initial skill's arm is served from the
    # BaselineCache in epoch 2 (measured in epoch 1).
    ev = ws.log.frame("evaluation")
    assert ev.height == EPOCHS * len(ws.task_types)
    assert res.evaluations[2].gate.total("cache_hits") == sum(
        len(u) for u in read_heldout(ws).values())


def test_heldout_units_are_never_gated_rolled_out_or_probed(tmp_path):
    ws = _init(tmp_path / "ws")
    heldout = read_heldout(ws)
    assert heldout and all(not set(u) & set(ws.pool[t]) for t, u in heldout.items())
    _train(ws)
    held = {u for us in heldout.values() for u in us}
    used = {u for (u,) in ws.log.query("SELECT unit_id FROM predictions WHERE run_id NOT "
                                       "LIKE 'e%\\_eval\\_gate\\_%' ESCAPE '\\'")}
    assert used and not used & held
    evald = {u for (u,) in ws.log.query("SELECT unit_id FROM predictions WHERE run_id LIKE "
                                        "'e1\\_eval\\_gate\\_%' ESCAPE '\\'")}
    assert evald == held
    world = SimWorld(CONFIG)
    be = simulated_backend(ws)
    for t in ws.task_types:  # rollouts draw from the pool only
        for s in range(1, 6):
            assert not set(be.cases(t, 1, s, world.initial_skill(t))) & held


def test_resume_skips_finished_parts_and_reaches_the_same_end_state(tmp_path):
    a, b = _init(tmp_path / "a"), _init(tmp_path / "b")
    _train(a)
    first = _train(b, 1, STEPS)  # a shorter run, then the full one resumes it
    assert first.done_before == 0
    again = _train(b)
    assert again.done_before == STEPS + 2  # e1's steps, settlement and evaluation
    assert sorted(again.steps) == [(2, s) for s in range(1, STEPS + 1)]
    assert end_state(a.root) == end_state(b.root)
    done = _train(b)  # nothing left: every part found done, nothing changes
    assert done.done_before == EPOCHS * (STEPS + 2) and not done.steps
    assert end_state(a.root) == end_state(b.root)


def test_changed_configuration_is_refused_with_the_changes(tmp_path):
    from vtrm_gate.stats import GateParams

    ws = _init(tmp_path / "ws")
    _train(ws, 1, 1)
    with pytest.raises(TrainRefusedError) as err:
        _train(ws, 1, 2)
    assert "steps_per_epoch: 1 -> 2" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(TrainRefusedError, match=r"params\.e_confirm: 20\.0 -> 10\.0"):
        _train(ws, 1, 1, options=RunOptions(gate=GateParams(e_confirm=10.0)))
    _train(ws, 2, 1)  # more epochs: the same run, continued


def test_train_past_an_epoch_settled_by_hand_is_refused_writing_nothing(tmp_path):
    """Hostile pass (h24): after ``step e1 s1`` and ``settle --epoch 1`` by hand, ``train
    --steps-per-epoch 2`` wrote train.json, then was refused at e1 s2 ("epoch 1 was
    settled"), and every later train was refused as a changed configuration."""
    ws = _init(tmp_path / "ws")
    _train(ws, 1, 1)  # e1 s1 and epoch 1's settlement, as a hand-run step and settle leave
    (ws.root / "train.json").unlink()
    with pytest.raises(TrainRefusedError, match=r"e1 s2 .*epoch 1 was settled after e1 s1.*"
                                                r"--steps-per-epoch 1"):
        _train(ws, 2, 2)
    assert not (ws.root / "train.json").exists()
    _train(ws, 2, 1)  # the steps per epoch the settled epoch had


@pytest.mark.parametrize("epochs, steps", [(0, 1), (1, 0), (-1, 2), (1.5, 1), (True, 1)])
def test_sizes_must_be_positive_integers(tmp_path, epochs, steps):
    ws = _init(tmp_path / "ws")
    with pytest.raises(ValueError, match="must be a positive integer"):
        _train(ws, epochs, steps)
    assert not (ws.root / "train.json").exists()


def test_train_holds_the_workspace_lock(tmp_path):
    ws = _init(tmp_path / "ws")
    seen = []

    def probe(ev):  # another writer in this process is fine (re-entrant) ...
        if ev.kind == "step" and not seen:
            code = ("import sys\nfrom vtrm_gate.harness import workspace_lock, "
                    "WorkspaceLockedError\ntry:\n    workspace_lock(sys.argv[1]).acquire()\n"
                    "except WorkspaceLockedError as e:\n    print(e)\n")
            seen.append(subprocess.run([sys.executable, "-c", code, str(ws.root)],
                                       capture_output=True, text=True).stdout)

    _train(ws, 1, 1, on_event=probe)
    assert "locked by pid" in seen[0] and "train" in seen[0]  # ... another process is not
    with workspace_lock(ws.root, "someone else"):
        pass


def test_infra_abort_keeps_finished_steps_and_the_next_run_resumes_there(tmp_path):
    a, b = _init(tmp_path / "a"), _init(tmp_path / "b")
    _train(a)
    be = simulated_backend(b)
    broken = {"on": True}

    async def flaky(task: UnitTask) -> UnitResult:  # the endpoint fails during e1 s2
        if broken["on"] and task.run_id.startswith("e1_s2_gate_"):
            return UnitResult(infra=True, error="503 Service Unavailable")
        return await be.infer(task)

    with pytest.raises(InfraGuardError):
        _train(b, infer=flaky)
    state = Workspace.open(b.root).state
    assert state.last_step == (1, 1)  # e1 s1 kept, e1 s2 not applied
    rep = b.log.query("SELECT DISTINCT status FROM step_report WHERE epoch = 1 AND step = 2 "
                      "AND status != 'cooldown' AND status != 'no_cases' AND "
                      "status != 'skipped'")
    assert ("aborted",) in rep
    broken["on"] = False
    res = _train(b, infer=flaky)
    assert res.done_before == 1 and min(res.steps) == (1, 2)
    assert end_state(a.root) == end_state(b.root)


def test_a_recorded_step_whose_agent_changed_is_refused_before_its_rollout(tmp_path):
    """Hostile pass (h26): ``train`` ran a step's rollout (its LLM calls) before run_step
    refused the step for a changed agent config, as ``step`` does before any call; its
    message said "pass --force", which train does not take."""
    ws = _init(tmp_path / "ws")
    be = simulated_backend(ws)

    async def down(task: UnitTask) -> UnitResult:  # e1 s1 recorded, never applied
        return UnitResult(infra=True, error="503")

    with pytest.raises(InfraGuardError):
        _train(ws, 1, 1, infer=down)
    (ws.root / "train.json").unlink()  # as a hand-run step leaves it: no train.json yet
    cfg = json.loads((ws.root / "workspace.json").read_text())
    cfg["agent"] = {**cfg["agent"], "model": "another-model"}
    (ws.root / "workspace.json").write_text(json.dumps(cfg))
    w = Workspace.open(ws.root)
    rollouts: list[tuple[int, int]] = []
    inner = be.rollout(w)

    async def counted(e, s):
        rollouts.append((e, s))
        return await inner(e, s)

    with pytest.raises(StepRefusedError, match=r"(?s)agent\.model.*vtrm-gate step --epoch 1 "
                                               r"--step 1 --force") as err:
        run_virtual(train(w, 1, 1, infer=be.infer, evolver=be.evolver, rollout=counted,
                          options=RunOptions(concurrency=16)))
    assert rollouts == [] and "force=True" not in str(err.value)


def test_a_resume_with_another_agent_config_is_refused_naming_it(tmp_path):
    """Hostile pass (h26): token limits given on the command line were not in train.json,
    so ``train`` resumed without them went on with the defaults (think 48 -> 512), silently:
    the run's later steps measured another agent. The agent config now joins train.json."""
    ws = _init(tmp_path / "ws")
    _train(ws, 1, 1)
    cfg = json.loads((ws.root / "workspace.json").read_text())
    cfg["agent"] = {**cfg["agent"], "max_tokens": {"think": 48}}
    (ws.root / "workspace.json").write_text(json.dumps(cfg))
    w = Workspace.open(ws.root)
    with pytest.raises(TrainRefusedError, match=r"agent\.max_tokens"):
        _train(w, 2, 1)
    assert w.state.last_step == (1, 1)


def test_a_train_json_from_before_the_agent_was_recorded_still_resumes(tmp_path):
    ws = _init(tmp_path / "ws")
    _train(ws, 1, 1)
    record = json.loads((ws.root / "train.json").read_text())
    del record["config"]["agent"]
    (ws.root / "train.json").write_text(json.dumps(record))
    _train(ws, 2, 1)


def test_a_run_without_a_held_out_split_says_it_will_not_evaluate(tmp_path):
    """Hostile pass (h26): an --llm workspace has no held-out split by default; train then
    never evaluated and nothing said so (the docs said evaluation was on by default)."""
    ws = init_simulated(tmp_path / "ws", CONFIG, heldout_fraction=0.0)
    events = []
    _train(ws, 1, 1, on_event=events.append)
    notes = [e.line for e in events if e.kind == "notice"]
    assert any("declares no held-out split" in n and "--heldout-fraction" in n for n in notes)
    with_split = []
    _train(_init(tmp_path / "other"), 1, 1, on_event=with_split.append)
    assert not any("held-out split" in e.line for e in with_split if e.kind == "notice")


# ---- kill -9 at random points, real processes -------------------------------------------------


CHILD = ["-m", "vtrm_gate", "train", "--epochs", str(EPOCHS), "--steps-per-epoch",
         str(STEPS), "--concurrency", "16", "--json", "--workspace"]


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_killed_at_random_points_then_resumed_matches_an_uninterrupted_run(tmp_path):
    ws = _init(tmp_path / "ws")
    root = ws.root
    ws.close()
    twin = shutil.copytree(root, tmp_path / "twin")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, *CHILD, str(twin)], capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    span = time.monotonic() - t0  # only to place the kills inside a run (never asserted)
    rng = random.Random(20261201)
    part = span / (EPOCHS * (STEPS + 2))  # a step, settlement or evaluation, roughly
    kills = 0
    marks: list[tuple] = []  # how far each killed run had got
    for _ in range(12):
        proc = subprocess.Popen([sys.executable, *CHILD, str(root)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=ROOT, text=True)
        # Kill after a random number (0-2) of newly finished parts, a random way into the next.
        target, fresh = rng.randint(0, 2), 0
        while fresh < target:
            line = proc.stdout.readline()
            if not line:
                break
            fresh += not json.loads(line).get("done_before", True)
        time.sleep(rng.uniform(0.0, 1.0) * part)
        if proc.poll() is not None:
            _, err = proc.communicate()
            assert proc.returncode == 0, err
            break
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        kills += 1
        state = json.loads((root / "state.json").read_text())
        marks.append((state["last_step"], state["settled_epochs"],
                      _rows(root / "harness.sqlite", "SELECT COUNT(*) FROM evaluation")[0][0]))
    else:
        r = subprocess.run([sys.executable, *CHILD, str(root)], capture_output=True,
                           text=True, cwd=ROOT, timeout=300)
        assert r.returncode == 0, r.stderr
    assert kills >= 2, "the run finished before it could be killed twice"
    assert len(set(map(repr, marks))) >= 2, marks  # killed at different points of the run
    print("kills at", marks)
    summary = json.loads(r.stdout.splitlines()[-1]) if kills == 12 else None
    assert summary is None or summary["event"] == "summary"
    assert end_state(root) == end_state(twin)


# ---- concurrent settlement ----------------------------------------------------------------


class AlwaysProvisional:
    """A gate rule that ends PROVISIONAL after 3 units: puts every gated type on probation."""

    def update(self, state, pair, params):
        return update_state(state, pair, params)

    def decide(self, state, n_remaining, params):
        return Action.PROVISIONAL if state.n_consumed >= 3 else Action.CONTINUE


@pytest.fixture
def on_probation(tmp_path, monkeypatch):
    """A workspace after e1 s1 with types A, B, C all on probation."""
    import vtrm_gate.harness._gating as step_mod  # where the harness calls run_gate

    ws = init_simulated(tmp_path / "ws", SimConfig(
        seed=3, pool_sizes={"A": 120, "B": 120, "C": 120}, infra_rate=0.0,
        effects={"A": "helpful", "B": "helpful", "C": "neutral"}, no_change_rate=0.0))
    be = simulated_backend(ws)
    orig = step_mod.run_gate

    async def provisional_gate(plans, *a, **kw):
        return await orig(plans, *a, **{**kw, "rule": AlwaysProvisional()})

    with monkeypatch.context() as m:
        m.setattr(step_mod, "run_gate", provisional_gate)
        run_virtual(run_step(ws, 1, 1, infer=be.infer, evolver=be.evolver, cases=be.cases))
    assert set(ws.state.probation) == {"A", "B", "C"}
    return ws, be


def test_settlement_runs_every_type_through_one_slot_pool(on_probation):
    ws, be = on_probation
    in_flight: dict[str, int] = {}
    overlap = []
    peak = [0]

    async def watched(task: UnitTask) -> UnitResult:
        in_flight[task.task_type] = in_flight.get(task.task_type, 0) + 1
        peak[0] = max(peak[0], sum(in_flight.values()))
        overlap.append(sum(1 for v in in_flight.values() if v))
        try:
            return await be.infer(task)
        finally:
            in_flight[task.task_type] -= 1

    res = run_virtual(settle_probation(ws, 1, infer=watched, options=RunOptions(concurrency=6)))
    assert set(res.outcomes) == {"A", "B", "C"}
    assert max(overlap) == 3  # all three types in flight at once: not one after another
    assert peak[0] <= 6 and res.gate.peak_in_flight <= 6  # one pool of 6 slots
    # The base arm (the version a rollback restores, v1) was measured by the step's gate on
    # other units; the probe's own base calls are written back to the BaselineCache.
    assert res.gate.total("started") > 0
    ev = ws.log.query("SELECT COUNT(*) FROM gate_evidence WHERE epoch = 1 AND step = 0")
    assert ev[0][0] == sum(o.n_used for o in res.outcomes.values())  # no INFRA here
    assert all(len(o.probe_units) == 40 for o in res.outcomes.values())


def test_settlement_guard_abort_settles_nothing_and_can_be_rerun(on_probation):
    ws, be = on_probation
    before = (ws.root / "state.json").read_text()

    async def down(task: UnitTask) -> UnitResult:
        return UnitResult(infra=True, error="503")

    with pytest.raises(InfraGuardError):
        run_virtual(settle_probation(ws, 1, infer=down,
                                     options=RunOptions(guard=GuardParams(min_calls=2))))
    assert (ws.root / "state.json").read_text() == before
    assert ("aborted",) in ws.log.query("SELECT status FROM step_report WHERE step = 0")
    res = run_virtual(settle_probation(ws, 1, infer=be.infer))
    assert set(res.outcomes) == {"A", "B", "C"}
    assert 1 in Workspace.open(ws.root).state.settled_epochs


def test_a_hand_edit_of_the_version_a_rollback_restores_is_refused(on_probation):
    """Hostile pass (h24): appending a line to history/<type>/v1.md while v2 is on
    probation was adopted: the settlement probed against it, a rollback wrote its hash into
    state.json as "v1", and later steps gated against it. An edit of the current version
    was already refused."""
    ws, be = on_probation
    v1 = ws.history_path("A", 1)
    v1.write_text(v1.read_text() + "- HAND EDIT: always answer A.\n")
    before = (ws.root / "state.json").read_text()
    w = Workspace.open(ws.root)
    with pytest.raises(WorkspaceError, match=r"history/a/v1\.md: content does not match the "
                                             r"hash step e1 s1 gated it at"):
        run_virtual(settle_probation(w, 1, infer=be.infer))
    with pytest.raises(WorkspaceError, match=r"history/a/v1\.md"):
        run_virtual(run_step(w, 1, 2, infer=be.infer, evolver=be.evolver, cases=be.cases))
    assert (ws.root / "state.json").read_text() == before


def test_a_probe_with_no_record_of_what_its_step_used_is_refused(on_probation):
    """Hostile pass (h24): with manifests/e1_s1.json deleted, the probe drew the step's own
    evolution cases; with harness.sqlite restored from an older backup, the units the gate
    had consumed (and e_continue restarted at 1). Either probe is not fresh: refused."""
    ws, be = on_probation
    manifest = ws.manifest_path(1, 1)
    kept = manifest.read_bytes()
    manifest.unlink()
    with pytest.raises(WorkspaceError, match=r"manifests/e1_s1\.json.* is missing"):
        run_virtual(settle_probation(Workspace.open(ws.root), 1, infer=be.infer))
    manifest.write_bytes(kept)
    with contextlib.closing(sqlite3.connect(ws.root / "harness.sqlite")) as con, con:
        con.execute("DELETE FROM gate_evidence WHERE epoch = 1 AND step = 1")
    with pytest.raises(WorkspaceError, match=r"harness\.sqlite holds no gate rows of step "
                                             r"e1 s1 for 'A'"):
        run_virtual(settle_probation(Workspace.open(ws.root), 1, infer=be.infer))


@pytest.mark.parametrize("rule", ["w_net", "e_continue", "e_harm"])
def test_each_probation_rule_settles_through_the_pool(on_probation, rule):
    ws, be = on_probation
    cfg = json.loads((ws.root / "workspace.json").read_text())
    (ws.root / "workspace.json").write_text(json.dumps({**cfg, "probation_rule": rule}))
    w = Workspace.open(ws.root)
    res = run_virtual(settle_probation(w, 1, infer=be.infer))
    assert set(res.outcomes) == {"A", "B", "C"}
    for o in res.outcomes.values():
        assert o.applied.startswith("kept" if o.passed else "rolled back")
        assert f"({rule}: " in o.applied
    if rule == "e_continue":  # stops as soon as it decides: fewer units than the probe
        assert any(o.n_used < len(o.probe_units) for o in res.outcomes.values())


# ---- ground truth ---------------------------------------------------------------------------


def test_true_effect_classes_match_the_evolvers_effects():
    world = SimWorld(CONFIG)
    from vtrm_gate.sim import SimEvolver

    ev = SimEvolver(world)
    for t, effect in CONFIG.effects.items():
        base = world.initial_skill(t)
        cand = ev.propose(t, base, (), 1, 2)
        if cand == base:
            continue
        tr = world.true_effect(t, base, cand)
        assert tr.true_class == {"helpful": "better", "neutral": "neutral",
                                 "harmful": "worse"}[effect], t
        assert (tr.p_win > 0.5) == (tr.effect > 0)
        assert abs(tr.cand_acc - tr.base_acc - tr.effect) < 1e-9
    neutral = world.true_effect("OCR Problems", world.initial_skill("OCR Problems"),
                                world.initial_skill("OCR Problems") + "\n- restated\n")
    assert neutral.effect == 0 and neutral.p_win == 0.5 and neutral.true_class == "neutral"


def test_oracle_applies_only_better_candidates_and_accept_all_applies_every_one():
    world = SimWorld(CONFIG)
    oracle = simulate_policy(world, 2, 3, "oracle")
    every = simulate_policy(world, 2, 3, "accept_all")
    assert oracle.decisions and all(on == (tr.true_class == "better")
                                    for *_, on, tr in oracle.decisions)
    assert every.decisions and all(on for *_, on, _ in every.decisions)
    acc_o, acc_e = oracle.final_accuracy(world), every.final_accuracy(world)
    init = {t: world.true_accuracy(t, world.initial_skill(t)) for t in world.task_types}
    assert all(acc_o[t] >= init[t] - 1e-12 for t in init)
    assert acc_e["Counting Problem"] < init["Counting Problem"]  # harmful edits all applied


def test_ground_truth_is_recorded_for_every_gated_candidate_and_reported(tmp_path):
    ws = _init(tmp_path / "ws")
    _train(ws)
    world = SimWorld(CONFIG)
    n = record_ground_truth(ws, world)
    gated = ws.log.query("SELECT COUNT(*) FROM step_report WHERE step >= 1 AND "
                         "status = 'gated'")[0][0]
    assert n == gated == ws.log.count("ground_truth")
    q = quality_report(ws, world, EPOCHS, STEPS)
    assert sum(q["gated"].values()) == gated
    assert q["leak"] == q["applied"]["neutral"] + q["applied"]["worse"]
    assert {r["task_type"] for r in q["accuracy"]} == set(ws.task_types)
    assert q["mean_accuracy"]["oracle"] >= q["mean_accuracy"]["initial"]


def test_a_world_other_than_the_workspaces_is_refused_and_its_truth_kept(tmp_path):
    """`quality_report(ws, world)` with a world of another seed (notebook 06 builds it by
    hand) reported that world's accuracies and rewrote every ground-truth row."""
    import dataclasses

    from vtrm_gate.harness import WorkspaceError
    from vtrm_gate.sim import serial_phase_times, training_curve

    ws = _init(tmp_path / "ws")
    _train(ws)
    record_ground_truth(ws, SimWorld(CONFIG))
    truth = ws.log.query("SELECT * FROM ground_truth ORDER BY 1, 2, 3")
    curve = training_curve(ws, SimWorld(CONFIG))
    for change, shown in (({"seed": 6}, "seed 6, the workspace's 5"),
                          ({"infra_rate": 0.01}, "infra_rate 0.01, the workspace's 0.0"),
                          ({"pool_sizes": None}, "pool_sizes None")):
        other = SimWorld(dataclasses.replace(CONFIG, **change))
        for call, args in ((record_ground_truth, ()), (quality_report, (EPOCHS, STEPS)),
                           (training_curve, ()), (serial_phase_times, ([(1, 1)],))):
            with pytest.raises(WorkspaceError, match=f"not the world this workspace was "
                                                     f"created from: {shown}"):
                call(ws, other, *args)
    assert ws.log.query("SELECT * FROM ground_truth ORDER BY 1, 2, 3") == truth
    faster = SimWorld(dataclasses.replace(CONFIG, time_scale=1e-4))  # latency only: the same
    assert training_curve(ws, faster).equals(curve)
    assert training_curve(ws, simulated_backend(ws).world).equals(curve)


def test_ground_truth_only_for_simulated_workspaces(tmp_path):
    from test_harness_toy import make_workspace

    from vtrm_gate.harness import WorkspaceError

    ws = make_workspace(tmp_path / "toy", {"A": 10})
    with pytest.raises(WorkspaceError, match="only for simulated"):
        record_ground_truth(ws, SimWorld(CONFIG))


def test_heldout_file_is_validated(tmp_path):
    from vtrm_gate.harness import WorkspaceError

    ws = _init(tmp_path / "ws")
    t = ws.task_types[0]
    (ws.root / HELDOUT_FILE).write_text(json.dumps({t: [ws.pool[t][0]]}))
    with pytest.raises(WorkspaceError, match=r"also in pool\.json"):
        read_heldout(ws)


# ---- the command line -----------------------------------------------------------------------


def cli(*args: str, timeout: float = 300):
    return subprocess.run([sys.executable, "-m", "vtrm_gate", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=timeout)


def test_cli_train_prints_steps_and_a_summary_then_resumes_nothing(tmp_path):
    ws = _init(tmp_path / "ws")
    r = cli("train", "--workspace", str(ws.root), "--epochs", "1", "--steps-per-epoch", "2")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "e1 s1 " in out and "e1 s2 " in out and "e1 settle" in out and "e1 evaluate" in out
    assert "old serial" in out and "changes applied after settlement" in out
    assert "oracle gate" in out
    # progress while each gate runs (a step of an LLM workspace can take hours): stderr
    # had nothing; each gate's counts start over
    blocks = r.stderr.split("] gate started: ")[1:]
    assert len(blocks) >= 3 and r.stderr.count("] gate finished") == len(blocks)
    for block in blocks:
        n = int(block.split(" types")[0])
        decided = [(int(k), int(m)) for k, m in re.findall(r"(\d+)/(\d+) decided", block)]
        ks = [k for k, _ in decided]  # a line too long for the width may leave its count out
        assert {m for _, m in decided} <= {n} and ks == sorted(set(ks)) and ks[-1:] <= [n]
    r = cli("train", "--workspace", str(ws.root), "--epochs", "1", "--steps-per-epoch", "2",
            "--json")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # --json: machine output only
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert [e["done_before"] for e in events if e["event"] in ("step", "settle")] == [
        True, True, True]
    assert events[-1]["event"] == "summary" and events[-1]["done_before"] == 4


def test_cli_train_on_real_time_claims_no_speed_up_over_the_simulated_old_gate(tmp_path):
    """``train --time-scale 0`` on a simulated workspace printed "time per phase (simulated
    hours)" and a total "18.69 0.00 (77822.4x)": real seconds of v3 against the old gate's
    simulated hours. On real time v3's phases are printed alone, in wall units, and the
    summary names its clock; the decision quality (ground truth) is still reported."""
    ws = _init(tmp_path / "ws")
    r = cli("train", "--workspace", str(ws.root), "--epochs", "1", "--steps-per-epoch", "1",
            "--time-scale", "0")
    assert r.returncode == 0, r.stderr
    assert "old serial" not in r.stdout and "x)" not in r.stdout
    assert "time per phase (wall seconds)   v3" in r.stdout and "oracle gate" in r.stdout
    other = _init(tmp_path / "other")
    r = cli("train", "--workspace", str(other.root), "--epochs", "1", "--steps-per-epoch",
            "1", "--time-scale", "0", "--json")
    assert r.returncode == 0, r.stderr
    summary = [json.loads(line) for line in r.stdout.splitlines()][-1]
    assert summary["event"] == "summary" and summary["clock"] == "real"
    assert "old_phases_s" not in summary and "old_total_s" not in summary
    virtual = _init(tmp_path / "virtual")
    r = cli("train", "--workspace", str(virtual.root), "--epochs", "1", "--steps-per-epoch",
            "1", "--json")
    summary = [json.loads(line) for line in r.stdout.splitlines()][-1]
    assert summary["clock"] == "virtual" and summary["old_total_s"] > summary["v3_total_s"]


@pytest.mark.parametrize("args, msg", [
    (("--epochs", "0", "--steps-per-epoch", "5"), "--epochs must be a positive integer"),
    (("--epochs", "3", "--steps-per-epoch", "x"), "--steps-per-epoch must be a positive"),
])
def test_cli_train_bad_sizes_exit_2_with_one_line(tmp_path, args, msg):
    ws = _init(tmp_path / "ws")
    r = cli("train", "--workspace", str(ws.root), *args)
    assert r.returncode == 2 and msg in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not r.stdout


def test_cli_train_locked_or_changed_exit_2_with_one_line(tmp_path):
    ws = _init(tmp_path / "ws")
    with workspace_lock(ws.root, "step"):
        r = cli("train", "--workspace", str(ws.root), "--epochs", "1", "--steps-per-epoch", "1")
    assert r.returncode == 2 and "locked by pid" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (ws.root / "train.json").exists()
    assert cli("train", "--workspace", str(ws.root), "--epochs", "1", "--steps-per-epoch",
               "1").returncode == 0
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"gate": {"e_confirm": 10.0}}))
    before = end_state(ws.root)
    r = cli("train", "--workspace", str(ws.root), "--epochs", "1", "--steps-per-epoch", "1",
            "--config", str(cfg))
    assert r.returncode == 2 and "params.e_confirm: 20.0 -> 10.0" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert end_state(ws.root) == before  # nothing written


def test_cli_infra_guard_abort_exits_3_and_running_train_again_gets_past_it(tmp_path):
    # The simulator's INFRA failures are transient: a re-run after the guard aborted a step
    # asks again only what failed (it used to fail identically, so the run never finished).
    ws = init_simulated(tmp_path / "ws", SimConfig(**{**CONFIG.__dict__, "infra_rate": 0.2}),
                        heldout_fraction=0.2)
    args = ("train", "--workspace", str(ws.root), "--epochs", "1", "--steps-per-epoch", "2")
    r = cli(*args)
    assert r.returncode == 3, r.stderr
    err = r.stderr.strip().splitlines()[-1]
    assert "INFRA guard tripped" in err and "run the same command again" in err
    codes = [r.returncode]
    while codes[-1] == 3 and len(codes) < 6:
        codes.append(cli(*args).returncode)
    assert codes[-1] == 0, codes  # 0.2 ** (attempt + 1) of the calls fail: it gets through
    aborts = _rows(ws.root / "harness.sqlite", "SELECT SUM(aborts) FROM infra_aborts")[0][0]
    assert aborts == len(codes) - 1
    assert 1 in Workspace.open(ws.root).state.settled_epochs


def test_a_step_aborted_by_the_infra_guard_redraws_only_what_failed(tmp_path):
    ws = init_simulated(tmp_path / "ws", SimConfig(**{**CONFIG.__dict__, "infra_rate": 0.2}),
                        heldout_fraction=0.2)
    be = simulated_backend(ws)
    cases = be.cases
    seen: list[dict[tuple[str, str], UnitResult]] = []
    for attempt in range(6):
        calls: dict[tuple[str, str], UnitResult] = {}

        async def infer(task: UnitTask, calls=calls, attempt=attempt) -> UnitResult:
            res = await be.infer(task)
            calls[(task.run_id, task.unit_id)] = res
            assert task.attempt == attempt  # the log's count of earlier aborts
            return res

        seen.append(calls)
        try:
            run_virtual(run_step(ws, 1, 1, infer=infer, evolver=be.evolver, cases=cases))
            break
        except InfraGuardError:
            assert ws.log.infra_aborts(1, 1) == attempt + 1
    assert 0 < attempt < 5, attempt  # aborted at first, then got through
    for before, after in itertools.pairwise(seen):
        for key in before.keys() & after.keys():
            if not before[key].infra:  # a success is never taken back
                assert not after[key].infra and after[key].correct == before[key].correct
    infra = [sum(r.infra for r in calls.values()) / len(calls) for calls in seen]
    assert infra[-1] < infra[0], infra


def test_cli_settle_settles_one_epoch(tmp_path):
    ws = _init(tmp_path / "ws")
    be = simulated_backend(ws)
    run_virtual(run_step(ws, 1, 1, infer=be.infer, evolver=be.evolver, cases=be.cases))
    ws.close()
    r = cli("settle", "--workspace", str(ws.root), "--epoch", "1", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["epoch"] == 1 and not out["already_settled"]
    assert 1 in Workspace.open(ws.root).state.settled_epochs
    r = cli("settle", "--workspace", str(ws.root), "--epoch", "1")
    assert r.returncode == 0 and "settled before" in r.stdout
    r = cli("settle", "--workspace", str(ws.root), "--epoch", "0")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1



def test_train_is_cancellable_and_resumes_to_the_same_end_state(tmp_path):
    a, b = _init(tmp_path / "a"), _init(tmp_path / "b")
    _train(a)
    be = simulated_backend(b)
    out = io.StringIO()
    view = TrainView(stream=out)

    async def cancel_after_two_steps():
        task = asyncio.ensure_future(train(b, EPOCHS, STEPS, infer=be.infer,
                                           evolver=be.evolver, rollout=be.rollout(b),
                                           options=RunOptions(concurrency=16), on_event=view))
        while len(view.lines) < 2:
            await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run_virtual(cancel_after_two_steps())
    assert out.getvalue().splitlines()[:2] == view.lines[:2]
    assert Workspace.open(b.root).state.last_step >= (1, 2)
    with workspace_lock(b.root, "after cancel"):  # the run released the lock
        pass
    res = _train(b)
    assert res.done_before >= 2
    assert end_state(a.root) == end_state(b.root)


def test_a_step_killed_between_its_checkpoint_and_its_report_is_rerun(tmp_path):
    # Phase D writes state.json, then the report's `applied` column: a crash in between
    # leaves the step applied but its report incomplete; the next train re-runs that step.
    a, b = _init(tmp_path / "a"), _init(tmp_path / "b")
    _train(a, 1, 2)

    class Stop(Exception):
        pass

    def stop_after_first_step(ev):
        if ev.kind == "step":
            raise Stop

    with pytest.raises(Stop):
        _train(b, 1, 2, on_event=stop_after_first_step)
    assert Workspace.open(b.root).state.last_step == (1, 1)
    with b.log.transaction() as cur:
        cur.execute("UPDATE step_report SET applied = NULL WHERE epoch = 1 AND step = 1")
    res = _train(b, 1, 2)
    assert sorted(res.steps) == [(1, 1), (1, 2)] and res.steps[(1, 1)].rerun_of_applied
    assert end_state(a.root) == end_state(b.root)


# ---- an llm workspace: the same run over the chat endpoint and the Redis response cache ----


def test_llm_training_run_settles_and_a_resume_makes_zero_requests(tmp_path, chat_server,
                                                                   redis_target):
    from tests.llm.test_backends import FAST, SECRET, make_ws
    from vtrm_gate.cache import ResponseCache
    from vtrm_gate.llm import llm_backend, rollout_cases

    ws = make_ws(tmp_path, chat_server)

    def run(epochs: int):
        be = llm_backend(ws, RunOptions(),
                         cache=ResponseCache(redis_target.url, prefix=redis_target.prefix),
                         api_key=SECRET, env={}, retry=FAST)

        async def go():
            try:
                return await train(ws, epochs, 2, infer=be.infer, evolver=be.evolver,
                                   rollout=lambda e, s: rollout_cases(be, ws, e, s),
                                   options=RunOptions(concurrency=64))
            finally:
                await be.aclose()

        return asyncio.run(go())

    first = run(1)
    assert sorted(first.steps) == [(1, 1), (1, 2)] and 1 in first.settlements
    assert not first.evaluations  # no held-out split declared: no evaluation
    n = len(chat_server.requests)
    again = run(1)
    assert again.done_before == 3 and not again.steps
    assert len(chat_server.requests) == n  # nothing repeated, nothing re-requested
    assert 1 in Workspace.open(ws.root).state.settled_epochs


def test_a_heldout_split_longer_than_n_max_is_evaluated_whole(tmp_path):
    # `vtrm-gate init` holds out 20% of each pool: 56 units of a 280-unit type, more than the
    # gate's n_max of 40. The evaluation measures every held-out unit (it is not a gate ladder).
    ws = init_simulated(tmp_path / "ws", SimConfig(seed=3, pool_sizes={"Action Reasoning": 280},
                                                    infra_rate=0.0), heldout_fraction=0.2)
    n = len(read_heldout(ws)["Action Reasoning"])
    assert n > 40
    be = simulated_backend(ws)
    res = run_virtual(evaluate_epoch(ws, 1, infer=be.infer))
    [row] = res.rows
    assert row["n_units"] == n and row["n_initial"] == n and row["n_current"] == n


def test_a_type_no_step_can_accept_is_announced_before_the_first_step(tmp_path):
    """Hostile pass: the default world's Spatial Perception (8 gate units, its ladders at most
    7 once its error cases are left out) can never be accepted at the defaults (8 straight
    wins), and a training run said nothing until its steps' notes. `train` now says so first,
    once per type, naming the numbers; types whose ladders can accept get no notice."""
    from vtrm_gate.harness import never_accepted
    from vtrm_gate.stats import GateParams

    ws = _init(tmp_path / "ws")
    options = RunOptions(gate=GateParams(e_confirm=1.5**20))  # ACCEPT needs 20 wins
    pools = {t: len(ws.pool[t]) for t in ws.task_types}
    assert pools["Spatial Reasoning"] < 21 <= min(n for t, n in pools.items()
                                                  if t != "Spatial Reasoning")
    assert never_accepted(ws, options) == {"Spatial Reasoning": (pools["Spatial Reasoning"] - 1,
                                                                 20)}
    assert never_accepted(ws, RunOptions()) == {}
    events: list = []
    _train(ws, 1, 1, options=options, on_event=events.append)
    notices = [ev for ev in events if ev.kind == "notice"]
    assert [ev.line for ev in notices] == [
        f"note: Spatial Reasoning has {pools['Spatial Reasoning']} gate units, so at most "
        f"{pools['Spatial Reasoning'] - 1} on a ladder (a step leaves its error cases out); "
        f"ACCEPT needs 20: no step can accept its candidates, it changes only through "
        f"probation"]
    assert events.index(notices[0]) < min(i for i, ev in enumerate(events) if ev.kind == "step")
    ws.close()
