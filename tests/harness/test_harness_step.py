"""The gate step end to end on a real workspace (SQLite on disk): phases A–D, re-runs,
manifest refusal, the INFRA abort, probation, cooldown and the rejected buffer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_harness_toy import (
    ToyEvolver,
    ToyInfer,
    cases_first,
    correct,
    make_workspace,
    skill,
    units,
)

from vtrm_gate._ids import arm_run_id, json_hash
from vtrm_gate.errors import InfraGuardError
from vtrm_gate.gate import GuardParams, UnitResult, UnitTask
from vtrm_gate.harness import (
    BaselineCache,
    StepRefusedError,
    Workspace,
    WorkspaceConfig,
    replay_step,
    run_step,
    run_step_sync,
    settle_probation_sync,
)
from vtrm_gate.options import UNSET, RunOptions
from vtrm_gate.sim import run_virtual
from vtrm_gate.stats import Action, GateParams, SequentialTest, replay_blocks

SIZES = {
    "Action Reasoning": 60,      # +3 levels: wins 30% of units -> ACCEPT
    "Attribute Perception": 20,  # the evolver fails -> evolve_error
    "Counting Problem": 60,      # -3 levels: loses 30% -> REJECT
    "OCR Problems": 12,          # +4 levels, 2 wins left on a 10-unit ladder -> PROVISIONAL
    "Spatial Perception": 9,     # no real change -> skipped
    "Temporal Reasoning": 9,     # level 9 gets everything right -> no error cases
}
LEVELS = {"Temporal Reasoning": 9}
DELTA = {"Action Reasoning": 3, "Counting Problem": -3, "OCR Problems": 4,
         "Attribute Perception": 1}
GATED = ("Action Reasoning", "Counting Problem", "OCR Problems")


def _ws(tmp_path: Path, name: str = "ws", **config) -> Workspace:
    return make_workspace(tmp_path / name, SIZES, LEVELS, **config)


def _step(ws, epoch=1, step=1, infer=None, evolver=None, virtual=False, **kw):
    """One step of the toy world; ``virtual``: on the simulator's virtual clock, where the
    toy's latencies are exact whatever the machine's load (a timing the test relies on)."""
    kw.setdefault("cases", cases_first(SIZES))
    options = kw.pop("options", RunOptions())
    kw["options"] = options if options.concurrency is not UNSET else options.replace(
        concurrency=8)
    kw |= {"infer": infer or ToyInfer(),
           "evolver": evolver or ToyEvolver(DELTA, fail=["Attribute Perception"])}
    if virtual:
        return run_virtual(run_step(ws, epoch, step, **kw))
    return run_step_sync(ws, epoch, step, **kw)


def _files(root: Path, *names: str) -> dict[str, bytes]:
    out = {}
    for n in names:
        for p in sorted((root / n).rglob("*")) if (root / n).is_dir() else [root / n]:
            if p.is_file():
                out[str(p.relative_to(root))] = p.read_bytes()
    return out


def assert_log_consistent(ws: Workspace, epoch: int, step: int) -> None:
    """Each type's gate_evidence is a contiguous ladder prefix whose stats replay exactly from
    its own rows, every row is backed by the predictions of both arms, no key repeats."""
    log = ws.log
    manifest = json.loads(ws.manifest_path(epoch, step).read_text())
    params = GateParams(**manifest["inputs"]["config"]["params"])
    ev = log.step_frame("gate_evidence", epoch, step)
    preds = log.frame("predictions")
    assert preds.select("run_id", "unit_id").is_duplicated().sum() == 0
    pred = {(r["run_id"], r["unit_id"]): r for r in preds.iter_rows(named=True)}
    for t in ev["task_type"].unique().to_list():
        rows = ev.filter(ev["task_type"] == t).sort("ladder_rank").to_dicts()
        ladder = manifest["inputs"]["ladders"][t]
        assert [r["ladder_rank"] for r in rows] == list(range(len(rows)))
        test = SequentialTest(len(ladder), params)
        for r in rows:
            assert r["unit_id"] == ladder[r["ladder_rank"]]
            b = pred[(arm_run_id(manifest["step_run_id"], t, "base"), r["unit_id"])]
            c = pred.get((arm_run_id(manifest["step_run_id"], t, "cand"), r["unit_id"]))
            if r["infra"]:
                assert b["infra"] or (c is not None and c["infra"])
                pair = None
            else:
                assert (b["correct"], c["correct"]) == (r["base_correct"], r["cand_correct"])
                pair = (bool(b["correct"]), bool(c["correct"]))
            action = test.consume(r["ladder_rank"], pair)
            s = test.state
            assert (s.W, s.L, s.n_used, s.e_plus, s.e_minus, str(action)) == (
                r["W"], r["L"], r["n_used"], r["e_plus"], r["e_minus"], r["action"])


def _consumed_predictions(ws: Workspace, epoch: int = 1, step: int = 1) -> list[tuple]:
    """The prediction rows behind the consumed units (timing decides the rest)."""
    return ws.log.query(
        "SELECT p.run_id, p.unit_id, p.correct, p.infra FROM predictions p JOIN gate_evidence g "
        "ON p.unit_id = g.unit_id AND p.task_type = g.task_type AND p.epoch = g.epoch AND "
        "p.step = g.step WHERE g.epoch = ? AND g.step = ? ORDER BY p.run_id, p.unit_id",
        (epoch, step))


# ---- one full step --------------------------------------------------------------------


def test_full_step_end_to_end_rows_match_the_gate_result(tmp_path):
    ws = _ws(tmp_path)
    infer = ToyInfer()
    res = _step(ws, infer=infer)
    gate = res.gate
    assert res.decisions == {"Action Reasoning": Action.ACCEPT,
                             "Counting Problem": Action.REJECT,
                             "OCR Problems": Action.PROVISIONAL}
    assert {t: s.status for t, s in res.types.items()} == {
        "Action Reasoning": "gated", "Attribute Perception": "evolve_error",
        "Counting Problem": "gated", "OCR Problems": "gated",
        "Spatial Perception": "skipped", "Temporal Reasoning": "no_cases"}
    log = ws.log
    assert_log_consistent(ws, 1, 1)

    ev = log.step_frame("gate_evidence", 1, 1)
    qp = log.step_frame("quadrant_pairs", 1, 1)
    rep = {r["task_type"]: r for r in log.step_frame("step_report", 1, 1).iter_rows(named=True)}
    preds = log.frame("predictions")
    cc = log.step_frame("candidate_correctness", 1, 1)
    assert set(rep) == set(SIZES)
    assert rep["Spatial Perception"]["status"] == "skipped"
    assert rep["Attribute Perception"]["note"] == "RuntimeError: evolver LLM timed out"
    for t in GATED:
        o, c = gate.outcomes[t], gate.counters[t]
        rows = ev.filter(ev["task_type"] == t).sort("ladder_rank")
        assert rows.height == o.n_consumed == len(o.trajectory) == o.stop_rank + 1
        assert rows["ladder_rank"].to_list() == [p.ladder_rank for p in o.trajectory]
        assert rows["d"].to_list() == [p.d for p in o.trajectory]
        assert rows["e_plus"].to_list() == [p.e_plus for p in o.trajectory]
        assert rows["action"].to_list()[-1] == str(o.action)
        quads = qp.filter(qp["task_type"] == t).sort("ladder_rank")
        expect = {1: "cand_only", -1: "base_only"}
        for d, q, b in zip(rows["d"], quads["quadrant"], quads["base_correct"], strict=True):
            assert q == expect.get(d, "both_correct" if b else "both_wrong")
        r = rep[t]
        assert (r["status"], r["action"], r["W"], r["L"], r["n_used"], r["e_plus"],
                r["stop_rank"]) == ("gated", str(o.action), o.W, o.L, o.n_used, o.e_plus,
                                    o.stop_rank)
        for k in ("started", "completed", "cache_hits", "cancelled_before_start",
                  "discarded_after_freeze", "infra_units", "tokens"):
            assert r[k] == getattr(c, k), (t, k)
        # Nothing silently lost: every unit-arm was started, served or reported cancelled.
        assert c.started + c.cache_hits + c.cancelled_before_start == 2 * c.units
        mine = preds.filter(preds["task_type"] == t)
        assert mine.height == c.completed + c.cache_hits
        assert set(mine["run_id"]) <= {arm_run_id("e1_s1", t, "base"),
                                       arm_run_id("e1_s1", t, "cand")}
        assert mine["discarded"].sum() == c.discarded_after_freeze
        assert mine["tokens"].sum() == c.tokens
        cand = mine.filter(mine["arm"] == "cand")
        assert cc.filter(cc["task_type"] == t).height == cand.height
    assert log.count("traces") == preds.height
    fresh_base = preds.filter((preds["arm"] == "base") & (preds["cached"] == 0))
    assert log.count("baseline_cache") == fresh_base.height
    applied = {t: r["applied"] for t, r in rep.items() if r["applied"]}
    assert applied["Action Reasoning"] == "accepted: v1 -> v2"
    assert applied["Counting Problem"].startswith("rejected (REJECT): kept v1")
    assert applied["OCR Problems"].startswith("probation: v1 -> v2")
    manifest = json.loads(res.manifest_path.read_text())
    assert set(manifest["inputs"]["ladders"]) == {"Action Reasoning", "Attribute Perception",
                                                  "Counting Problem", "OCR Problems",
                                                  "Spatial Perception"}
    assert manifest["agent_hash"] == json_hash({"backend": "toy"})
    assert manifest["candidates"]["Action Reasoning"]["dir"] == \
        "candidates/e1_s1/action-reasoning"
    cdir = ws.root / "candidates/e1_s1/action-reasoning"
    assert (cdir / "action-reasoning.md").read_text() == skill("Action Reasoning", 8,
                                                               "tried at e1 s1 after 0 rejects\n")
    assert (cdir / "counting-problem.md").read_text() == skill("Counting Problem", 5)
    assert (cdir / "default-strategy.md").is_file()
    # each base skill is written once, in .base/, and linked into every candidate dir (K
    # gated types wrote K² fsynced files: 3.9 GB at 2,000 types); each candidate its own
    shared, other = ws.root / "candidates/e1_s1/.base", ws.root / "candidates/e1_s1/ocr-problems"
    for name in ("counting-problem.md", "default-strategy.md"):
        inodes = {(d / name).stat().st_ino for d in (shared, cdir, other)}
        assert len(inodes) == 1, name
    own, linked = (d / "action-reasoning.md" for d in (cdir, other))
    assert own.stat().st_ino != linked.stat().st_ino
    assert linked.stat().st_ino == (shared / "action-reasoning.md").stat().st_ino
    cand_tasks = [t for t in infer.calls if t.arm == "cand"]
    assert {t.skill_dir for t in cand_tasks if t.task_type == "Action Reasoning"} == {str(cdir)}


def _slow_tail(task: UnitTask) -> float:
    """Seconds per call: most fast, some slow, so calls are in flight at every decision."""
    h = int(json_hash([task.unit_id, task.arm])[:4], 16)
    return 0.002 if h % 4 else 0.02


def test_calls_past_a_stop_are_cancelled_and_leave_no_row(tmp_path):
    """Issue 17 defaults: a frozen type's worthless calls are cancelled at its freeze and
    the rest once every type has decided; a cancelled call writes nothing (no prediction,
    trace or BaselineCache row), every call is accounted for, and the decisions are the
    ones a step that waits for every call makes."""
    waited = _step(_ws(tmp_path / "wait"), infer=ToyInfer(latency=_slow_tail),
                   options=RunOptions(concurrency=32, past_stop="wait",
                                      cancel_after_freeze=False), virtual=True)
    ws = _ws(tmp_path / "cancel")
    res = _step(ws, infer=ToyInfer(latency=_slow_tail), options=RunOptions(concurrency=32),
                virtual=True)
    assert res.decisions == waited.decisions
    for t in GATED:
        assert res.gate.outcomes[t].same_decision(waited.gate.outcomes[t])
    assert waited.gate.total("cancelled_in_flight") == 0
    assert res.gate.total("cancelled_in_flight") > 0
    preds = ws.log.frame("predictions")
    rep = {r["task_type"]: r for r in ws.log.step_frame("step_report", 1, 1).to_dicts()}
    for t in GATED:
        c = res.gate.counters[t]
        assert c.started == c.completed + c.cancelled_in_flight
        assert c.started + c.cache_hits + c.cancelled_before_start == 2 * c.units
        assert preds.filter(preds["task_type"] == t).height == c.completed + c.cache_hits
        assert rep[t]["cancelled_in_flight"] == c.cancelled_in_flight
    fresh_base = preds.filter((preds["arm"] == "base") & (preds["cached"] == 0) &
                              (preds["infra"] == 0))
    assert ws.log.count("baseline_cache") == fresh_base.height
    assert ws.log.count("traces") == preds.height
    assert_log_consistent(ws, 1, 1)


def test_accepts_and_provisionals_advance_versions(tmp_path):
    ws = _ws(tmp_path)
    res = _step(ws)
    state = Workspace.open(ws.root).state
    assert res.versions["Action Reasoning"] == 2 and state.skills["Action Reasoning"].version == 2
    assert state.skills["OCR Problems"].version == 2
    assert state.probation["OCR Problems"].prev_version == 1
    assert state.skills["Counting Problem"].version == 1
    new = (ws.root / "skills/action-reasoning.md").read_text()
    assert "level=8" in new and (ws.root / "history/action-reasoning/v2.md").read_text() == new
    assert (ws.root / "history/action-reasoning/v1.md").read_text() == skill(
        "Action Reasoning", 5)
    assert state.last_step == (1, 1) and state.steps_applied == 1

    # Step 2 runs on v2: base-arm measurements get new keys (a different content hash).
    infer = ToyInfer()
    evolver = ToyEvolver({"Action Reasoning": 1, "OCR Problems": 0})
    _step(ws, 1, 2, infer=infer, evolver=evolver)
    seen = {c[0]: c[1] for c in evolver.calls}
    assert level_line(seen["Action Reasoning"]) == "level=8"
    base = [t for t in infer.calls if t.task_type == "Action Reasoning" and t.arm == "base"]
    assert base and {t.skill_hash for t in base} == {state.skills["Action Reasoning"].hash}
    rep = ws.log.step_frame("step_report", 1, 2).to_dicts()
    ar = next(r for r in rep if r["task_type"] == "Action Reasoning")
    assert ar["cache_hits"] == 0 and ar["base_version"] == 2


def level_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("level="))


# ---- idempotent re-run ------------------------------------------------------------------


def test_rerun_gives_same_decisions_no_duplicates_and_base_from_cache(tmp_path):
    ws = _ws(tmp_path)
    first = _step(ws)
    ev1 = ws.log.step_frame("gate_evidence", 1, 1)
    rep1 = ws.log.step_frame("step_report", 1, 1)
    consumed1 = _consumed_predictions(ws)
    state1 = (ws.root / "state.json").read_bytes()
    cached_units = {(r[0], r[1]) for r in ws.log.query(
        "SELECT task_type, unit_id FROM baseline_cache")}

    evolver = ToyEvolver(DELTA)
    infer = ToyInfer()
    second = _step(Workspace.open(ws.root), infer=infer, evolver=evolver)
    assert second.rerun_of_applied and second.reused_candidates
    assert evolver.calls == []  # the manifest's candidates are replayed
    assert second.decisions == first.decisions
    for t in GATED:
        assert second.gate.outcomes[t].same_decision(first.gate.outcomes[t])
    assert ws.log.step_frame("gate_evidence", 1, 1).equals(ev1)
    assert ws.log.step_frame("step_report", 1, 1).select("task_type", "status", "action", "W",
                                                         "L").equals(
        rep1.select("task_type", "status", "action", "W", "L"))
    assert _consumed_predictions(ws) == consumed1
    assert (ws.root / "state.json").read_bytes() == state1
    # The base arm was served from the BaselineCache for every unit measured before.
    base_calls = [t for t in infer.calls if t.arm == "base"]
    assert all((t.task_type, t.unit_id) not in cached_units for t in base_calls)
    assert second.gate.total("cache_hits") > 0
    assert_log_consistent(ws, 1, 1)


def test_a_rerun_keeps_what_each_replaced_run_cost(tmp_path):
    """A finished step re-run to check the cache replaced its recorded calls, tokens and
    time with the re-run's, and nothing kept the first run's."""
    ws = _ws(tmp_path)
    _step(ws)
    ws.log.record_timings(1, 1, {"rollout": 2.0, "evolution": (3.0, 4.0)})
    first = ws.log.query("SELECT COUNT(*), SUM(cached = 0), SUM(tokens), SUM(latency_s) "
                         "FROM predictions WHERE epoch = 1 AND step = 1")[0]
    took = ws.log.query("SELECT SUM(seconds) FROM timings WHERE epoch = 1 AND step = 1")[0][0]
    assert first[0] > 0 and first[2] > 0 and took > 5.0
    _step(Workspace.open(ws.root))
    second = ws.log.query("SELECT COUNT(*), SUM(cached = 0), SUM(tokens) FROM predictions "
                          "WHERE epoch = 1 AND step = 1")[0]
    assert second[1] < first[1]  # the BaselineCache served the base arm
    _step(Workspace.open(ws.root))
    rows = ws.log.frame("replaced_runs").rows()
    assert rows[0] == (1, 1, 1, *first, pytest.approx(took))
    assert rows[1][:6] == (1, 1, 2, *second) and len(rows) == 2
    # the timings kept are the last run's: the rollout and evolution rows went with the run
    assert {p for (p,) in ws.log.query("SELECT phase FROM timings WHERE step = 1")} == {"gate"}


def test_rerun_with_changed_manifest_is_refused_saying_what_changed(tmp_path):
    ws = _ws(tmp_path)
    _step(ws)
    before = _files(ws.root, "state.json", "skills", "manifests", "candidates")
    counts = {t: ws.log.count(t) for t in ("predictions", "gate_evidence", "step_report")}
    with pytest.raises(StepRefusedError) as err:
        _step(Workspace.open(ws.root), options=RunOptions(gate=GateParams(e_confirm=10.0,
                                                                          n_max=30)))
    msg = str(err.value)
    assert "config.params.e_confirm: 20.0 -> 10.0" in msg
    assert "config.params.n_max: 40 -> 30" in msg
    assert "ladders.Action Reasoning: changed (40 -> 30 items" in msg
    assert "force=True" in msg
    assert _files(ws.root, "state.json", "skills", "manifests", "candidates") == before
    assert {t: ws.log.count(t) for t in counts} == counts
    forced = _step(Workspace.open(ws.root), force=True,
                   options=RunOptions(gate=GateParams(e_confirm=10.0, n_max=30)))
    assert forced.gate.outcomes["Action Reasoning"].n_ladder == 30
    assert_log_consistent(ws, 1, 1)


def test_changed_agent_config_is_named(tmp_path):
    ws = _ws(tmp_path)
    _step(ws)
    cfg = json.loads((ws.root / "workspace.json").read_text())
    cfg["agent"] = {"backend": "toy", "model": "bigger"}
    (ws.root / "workspace.json").write_text(json.dumps(cfg))
    with pytest.raises(StepRefusedError, match=r"agent\.model: added"):
        _step(Workspace.open(ws.root))


def test_older_step_cannot_be_rerun_after_a_later_one(tmp_path):
    ws = _ws(tmp_path)
    _step(ws)
    _step(ws, 1, 2, evolver=ToyEvolver({}))
    with pytest.raises(StepRefusedError, match="older than the last applied step e1 s2"):
        _step(Workspace.open(ws.root), 1, 1)


# ---- fail-fast --------------------------------------------------------------------------


def test_two_types_on_one_target_file_fail_before_any_inference(tmp_path):
    text = "# shared\n\nlevel=5\n"
    ws = Workspace.create(tmp_path / "ws", pool={"A": units("A", 20), "B": units("B", 20)},
                          skills={"A": text, "B": text},
                          config=WorkspaceConfig(targets={"A": "skills/shared.md",
                                                          "B": "skills/shared.md"}))
    infer, evolver = ToyInfer(), ToyEvolver({"A": 1, "B": 1})
    with pytest.raises(RuntimeError, match="'A' and 'B' map to the same target skill file"):
        run_step_sync(ws, 1, 1, infer=infer, evolver=evolver,
                      cases={"A": ["a-006"], "B": ["b-006"]})
    assert infer.calls == [] and evolver.calls == []
    assert ws.log.count("step_report") == 0


# ---- the INFRA guard ----------------------------------------------------------------------


def test_infra_abort_leaves_log_consistent_state_untouched_and_step_rerunnable(tmp_path):
    ws = _ws(tmp_path)
    twin = Workspace.open(shutil.copytree(ws.root, tmp_path / "twin"))
    before = _files(ws.root, "state.json", "skills", "history")
    broken = ToyInfer(infra={"Counting Problem": "cand"})
    with pytest.raises(InfraGuardError, match="Counting Problem") as err:
        _step(ws, infer=broken, options=RunOptions(concurrency=4, guard=GuardParams(min_calls=10)))
    assert err.value.partial is not None
    assert _files(ws.root, "state.json", "skills", "history") == before
    rep = ws.log.step_frame("step_report", 1, 1)
    aborted = rep.filter(rep["status"] == "aborted")
    assert set(aborted["task_type"]) == set(GATED)
    assert aborted["note"].str.contains("INFRA guard tripped").all()
    assert rep.filter(rep["task_type"] == "Counting Problem")["infra_units"].item() >= 2
    assert_log_consistent(ws, 1, 1)
    n_before = ws.log.count("predictions")
    assert n_before > 0

    again = _step(Workspace.open(ws.root), infer=ToyInfer())
    reference = _step(twin, infer=ToyInfer())
    assert again.decisions == reference.decisions
    assert ws.log.step_frame("gate_evidence", 1, 1).equals(
        twin.log.step_frame("gate_evidence", 1, 1))
    assert_log_consistent(ws, 1, 1)
    assert ws.log.count("predictions", "run_id LIKE 'e1_s1_gate_counting-problem_cand'"
                        " AND infra = 1") == 0
    assert (ws.root / "state.json").read_bytes() == (twin.root / "state.json").read_bytes()


# ---- Phase D --------------------------------------------------------------------------


def test_phase_d_is_the_only_writer_and_applies_alphabetically(tmp_path, monkeypatch):
    ws = _ws(tmp_path)
    watched = ("state.json", "skills", "history")
    before = _files(ws.root, *watched)
    during: list[bool] = []

    def watcher(event):  # sees every gate event: training state must not move in phase C
        during.append(_files(ws.root, *watched) == before)

    class WatchingEvolver(ToyEvolver):
        async def evolve(self, *a):
            during.append(_files(ws.root, *watched) == before)
            return await super().evolve(*a)

    import vtrm_gate.harness._apply as applymod  # Phase D: the history writes

    writes: list[str] = []
    real = applymod.atomic_write

    def spy(path, text):
        writes.append(str(Path(path).relative_to(ws.root)))
        real(path, text)

    monkeypatch.setattr(applymod, "atomic_write", spy)
    _step(ws, evolver=WatchingEvolver(DELTA), subscribers=[watcher])
    assert len(during) > 20 and all(during)
    assert _files(ws.root, *watched) != before
    history = [w for w in writes if w.startswith("history/")]
    assert history == ["history/action-reasoning/v2.md", "history/ocr-problems/v2.md"]


# ---- cooldown, rejected buffer, probation -----------------------------------------------


def test_cooldown_and_rejected_buffer_are_seen_by_the_evolver(tmp_path):
    ws = _ws(tmp_path, cooldown_steps=2)
    _step(ws)  # Counting Problem: REJECT -> rejected buffer + 2 steps of cooldown
    state = ws.state
    rejected = state.rejected_texts("Counting Problem")
    assert len(rejected) == 1 and "level=2" in rejected[0]
    for s in (2, 3):
        ev = ToyEvolver({})
        res = _step(ws, 1, s, evolver=ev)
        assert res.types["Counting Problem"].status == "cooldown"
        assert "Counting Problem" not in {c[0] for c in ev.calls}
    ev = ToyEvolver({})
    res = _step(ws, 1, 4, evolver=ev)
    call = next(c for c in ev.calls if c[0] == "Counting Problem")
    assert call[2] == tuple(rejected)  # the evolver sees what was rejected
    assert res.types["Counting Problem"].status == "skipped"
    rep = ws.log.step_frame("step_report", 1, 2).to_dicts()
    assert next(r for r in rep if r["task_type"] == "Counting Problem")["status"] == "cooldown"


FUTILE_DELTA = {**DELTA, "Action Reasoning": -1}  # loses 10% of units: FUTILE, not REJECT


@pytest.mark.parametrize("futile_cooldown", [True, False])
def test_a_futile_exit_cools_its_type_down_unless_futile_cooldown_is_off(tmp_path,
                                                                         futile_cooldown):
    ws = _ws(tmp_path, cooldown_steps=2, futile_cooldown=futile_cooldown)
    res = _step(ws, evolver=ToyEvolver(FUTILE_DELTA, fail=["Attribute Perception"]))
    assert res.decisions["Action Reasoning"] is Action.FUTILE
    assert res.decisions["Counting Problem"] is Action.REJECT
    state = ws.state
    for t in ("Action Reasoning", "Counting Problem"):  # both go to the rejected buffer
        assert len(state.rejected_texts(t)) == 1
    assert state.in_cooldown("Counting Problem")  # a REJECT always cools down
    assert state.in_cooldown("Action Reasoning") is futile_cooldown
    applied = res.types["Action Reasoning"].applied
    assert applied == ("rejected (FUTILE): kept v1; cooldown for 2 steps" if futile_cooldown
                       else "rejected (FUTILE): kept v1; no cooldown (futile_cooldown off)")
    ev = ToyEvolver({})
    nxt = _step(ws, 1, 2, evolver=ev)
    assert nxt.types["Counting Problem"].status == "cooldown"
    assert nxt.types["Action Reasoning"].status == ("cooldown" if futile_cooldown
                                                     else "skipped")
    evolved = {c[0]: c[2] for c in ev.calls}
    assert ("Action Reasoning" in evolved) is not futile_cooldown
    if not futile_cooldown:  # evolved again at once, seeing what was rejected
        assert evolved["Action Reasoning"] == tuple(state.rejected_texts("Action Reasoning"))


def test_turning_futile_cooldown_off_is_a_changed_input_of_a_recorded_step(tmp_path):
    ws = _ws(tmp_path)
    _step(ws, evolver=ToyEvolver(FUTILE_DELTA, fail=["Attribute Perception"]))
    raw = json.loads((ws.root / "workspace.json").read_text(encoding="utf-8"))
    assert raw["futile_cooldown"] is True
    (ws.root / "workspace.json").write_text(json.dumps({**raw, "futile_cooldown": False}),
                                            encoding="utf-8")
    again = Workspace.open(ws.root)
    with pytest.raises(StepRefusedError, match=r"config\.futile_cooldown: added \(false\)"):
        _step(again, evolver=ToyEvolver(FUTILE_DELTA, fail=["Attribute Perception"]))


# Probation tests: OCR has fresh units left after its gate (52 units, a +1 level candidate:
# at most 4 wins on its 40-unit ladder -> PROVISIONAL, not ACCEPT).
PROBATION_SIZES = {**SIZES, "OCR Problems": 52}
PROBATION_DELTA = {**DELTA, "OCR Problems": 1}


def _probation_ws(tmp_path: Path) -> tuple[Workspace, object]:
    # The w_net bet (the whole probe, keep if W - L >= 0): these tests count its units.
    ws = make_workspace(tmp_path / "ws", PROBATION_SIZES, LEVELS, probation_rule="w_net")
    res = _step(ws, evolver=ToyEvolver(PROBATION_DELTA, fail=["Attribute Perception"]),
                cases=cases_first(PROBATION_SIZES))
    assert res.decisions["OCR Problems"] is Action.PROVISIONAL
    return ws, res


def test_probation_passes_on_a_held_out_probe(tmp_path):
    ws, step = _probation_ws(tmp_path)
    res = settle_probation_sync(ws, 1, infer=ToyInfer())
    o = res.outcomes["OCR Problems"]
    # Held out: the pool minus the units its gate consumed and minus its evolution cases
    # (the candidate was written from those: they would flatter it).
    t = step.types["OCR Problems"]
    assert set(o.probe_units) == set(units("OCR Problems", 52)) - set(t.ladder) - set(t.cases)
    assert len(o.probe_units) == 10 and o.L == 0 and o.passed
    state = Workspace.open(ws.root).state
    assert state.skills["OCR Problems"].version == 2 and "OCR Problems" not in state.probation
    assert 1 in state.settled_epochs
    rep = ws.log.step_frame("step_report", 1, 0).to_dicts()
    assert rep[0]["status"] == "probation" and rep[0]["applied"].startswith("kept v2")
    assert settle_probation_sync(ws, 1, infer=ToyInfer()).already_settled
    with pytest.raises(StepRefusedError, match="settled"):
        _step(Workspace.open(ws.root))


def test_probation_failure_rolls_back(tmp_path):
    ws, _ = _probation_ws(tmp_path)

    class Worse(ToyInfer):  # the probationary version turns out worse on unseen units
        async def __call__(self, task: UnitTask) -> UnitResult:
            res = await super().__call__(task)
            if task.arm == "cand":
                return UnitResult(correct=False, tokens=res.tokens)
            return UnitResult(correct=True, tokens=res.tokens)

    res = settle_probation_sync(ws, 1, infer=Worse())
    o = res.outcomes["OCR Problems"]
    assert not o.passed and o.applied.startswith("rolled back v2 -> v1")
    state = Workspace.open(ws.root).state
    assert state.skills["OCR Problems"].version == 1
    assert state.skills["OCR Problems"].latest == 2
    assert (ws.root / "skills/ocr-problems.md").read_text() == skill("OCR Problems", 5)
    assert state.rejected["OCR Problems"][-1].action == "PROBATION_FAILED"
    assert state.skills["Action Reasoning"].version == 2  # accepts are not on probation


# ---- independence of selection and measurement (the v1 failure) -------------------------


def test_seed_record_never_appears_as_a_base_arm_measurement(tmp_path):
    base_text = {t: skill(t, LEVELS.get(t, 5)) for t in SIZES}
    # The seed record says the opposite of what the base skill really does, on every unit.
    seed = {t: {u: not correct(t, u, base_text[t]) for u in units(t, n)}
            for t, n in SIZES.items()}
    ws = make_workspace(tmp_path / "ws", SIZES, LEVELS, seed_record=seed)
    _step(ws)
    preds = ws.log.frame("predictions", "arm = 'base'")
    assert preds.height > 0
    for r in preds.iter_rows(named=True):
        assert bool(r["correct"]) != seed[r["task_type"]][r["unit_id"]]
    ev = ws.log.frame("gate_evidence", "infra = 0")
    for r in ev.iter_rows(named=True):
        assert bool(r["base_correct"]) != seed[r["task_type"]][r["unit_id"]]
    cache = ws.log.frame("baseline_cache")
    fresh = {(r["task_type"], r["unit_id"]): r for r in preds.iter_rows(named=True)
             if not r["cached"]}
    for r in cache.iter_rows(named=True):
        assert bool(r["correct"]) != seed[r["task_type"]][r["unit_id"]]
        assert r["run_id"] == arm_run_id("e1_s1", r["task_type"], "base")
        assert (r["task_type"], r["unit_id"]) in fresh
    # No API can fill the cache from selection data: get, put (fresh results only), key, and
    # the constructor from a workspace.
    public = {n for n in dir(BaselineCache) if not n.startswith("_")}
    assert public == {"get", "put", "key", "for_workspace"}


def test_baseline_cache_refuses_cand_infra_and_cached_results(tmp_path):
    import asyncio

    ws = _ws(tmp_path)
    cache = BaselineCache(ws.log, "cfg")
    base = UnitTask("A", "u1", "base", 0, "e1_s1_gate_a_base", "skill text")
    with pytest.raises(ValueError, match="base-arm results only"):
        asyncio.run(cache.put(UnitTask("A", "u1", "cand", 0, "r", "s"), UnitResult()))
    asyncio.run(cache.put(base, UnitResult(infra=True)))
    asyncio.run(cache.put(base, UnitResult(correct=True, cached=True)))
    assert len(cache) == 0
    asyncio.run(cache.put(base, UnitResult(correct=True, tokens=9)))
    hit = asyncio.run(cache.get(base))
    assert hit.correct and hit.cached and hit.tokens == 0
    other_cfg = BaselineCache(ws.log, "another agent")
    assert asyncio.run(other_cfg.get(base)) is None
    edited = UnitTask("A", "u1", "base", 0, "e1_s1_gate_a_base", "skill text v2")
    assert asyncio.run(cache.get(edited)) is None


# ---- replay -----------------------------------------------------------------------------


def test_replay_reports_unrun_units_instead_of_inventing_them(tmp_path):
    ws = _ws(tmp_path)
    _step(ws, options=RunOptions(concurrency=2))
    df = replay_step(ws, 1, 1)
    assert set(df["task_type"]) == set(GATED)
    assert df["prefix_matches_live"].all()
    manifest = json.loads(ws.manifest_path(1, 1).read_text())
    unknown = 0
    for r in df.iter_rows(named=True):
        t = r["task_type"]
        ladder = manifest["inputs"]["ladders"][t]
        base = skill(t, LEVELS.get(t, 5))
        cand = (ws.root / manifest["candidates"][t]["file"]).read_text()
        truth = [(correct(t, u, base), correct(t, u, cand)) for u in ladder]
        if r["block_needs_unrun_units"]:
            unknown += 1
            k = r["block_unrun_needed"]  # was "1 unrun units"
            assert r["block_action"] == f"UNKNOWN (needs {k} unrun unit{'s' * (k != 1)})"
            assert r["block_unrun_needed"] > 0 and r["block_stop_rank"] is None
            assert r["agree"] is None
        else:
            ref = replay_blocks(truth, GateParams())
            assert (r["block_action"], r["block_stop_rank"]) == (str(ref.action), ref.stop_rank)
    assert unknown >= 1


def test_forced_rerun_never_overwrites_a_recorded_version(tmp_path):
    ws = _ws(tmp_path)
    _step(ws)
    v2 = (ws.root / "history/action-reasoning/v2.md").read_text()
    res = _step(Workspace.open(ws.root), evolver=ToyEvolver({**DELTA, "Action Reasoning": 4}),
                force=True)
    assert res.rerun_of_applied and not res.reused_candidates
    assert res.decisions["Action Reasoning"] is Action.ACCEPT
    assert res.versions["Action Reasoning"] == 3
    assert (ws.root / "history/action-reasoning/v2.md").read_text() == v2
    assert "level=9" in (ws.root / "skills/action-reasoning.md").read_text()
    assert Workspace.open(ws.root).state.skills["Action Reasoning"].latest == 3


def test_step_report_carries_llm_cache_counters_per_arm(tmp_path):
    """With ``cache_stats`` the step report records each arm run's cache counters."""
    import json as _json

    from vtrm_gate.harness import run_step_sync
    from vtrm_gate.sim import SimConfig, init_simulated, simulated_backend

    ws = init_simulated(tmp_path / "ws", SimConfig(
        seed=1, pool_sizes={"Counting Problem": 12, "OCR Problems": 15}, infra_rate=0.0,
        time_scale=0.0, no_change_rate=0.0))
    be = simulated_backend(ws)
    seen: list[str] = []

    def stats(run_id: str) -> dict[str, int]:
        seen.append(run_id)
        return {"hits": len(run_id), "misses": 1}

    res = run_step_sync(ws, 1, 1, infer=be.infer, evolver=be.evolver, cases=be.cases,
                        cache_stats=stats)
    rows = ws.log.frame("step_report").filter(status="gated").to_dicts()
    ws.close()
    assert rows and len(seen) == 2 * len(rows)
    for row in rows:
        cache = _json.loads(row["llm_cache"])
        base_id = f"{res.step_run_id}_gate_{row['task_type'].lower().replace(' ', '-')}_base"
        assert cache["base"] == {"hits": len(base_id), "misses": 1}
        assert set(cache) == {"base", "cand"}


def test_statuses_are_step_status_members_and_the_stored_strings_are_unchanged(tmp_path):
    """`StepStatus` is a StrEnum: in memory a type, in SQLite, the manifest and frames the
    same plain strings as before; a manifest with a status outside it is refused by name."""
    from vtrm_gate.harness import StepStatus

    ws = _ws(tmp_path)
    res = _step(ws)
    assert {t: s.status for t, s in res.types.items()} == {
        "Action Reasoning": StepStatus.GATED, "Attribute Perception": StepStatus.EVOLVE_ERROR,
        "Counting Problem": StepStatus.GATED, "OCR Problems": StepStatus.GATED,
        "Spatial Perception": StepStatus.SKIPPED, "Temporal Reasoning": StepStatus.NO_CASES}
    assert all(type(s.status) is StepStatus for s in res.types.values())
    rows = ws.log.query("SELECT DISTINCT status, typeof(status) FROM step_report "
                        "ORDER BY status", ())
    assert [tuple(r) for r in rows] == [("evolve_error", "text"), ("gated", "text"),
                                        ("no_cases", "text"), ("skipped", "text")]
    path = ws.manifest_path(1, 1)
    manifest = json.loads(path.read_text())
    assert {t: c["status"] for t, c in manifest["candidates"].items()} == {
        t: str(s.status) for t, s in res.types.items() if t != "Temporal Reasoning"}
    assert str(res.frame().schema["status"]) == "String"
    assert [s.value for s in StepStatus] == [
        "gated", "skipped", "cooldown", "no_cases", "rollout_error", "evolve_error",
        "aborted", "probation"]
    manifest["candidates"]["Spatial Perception"]["status"] = "skiped"
    path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"candidates\['Spatial Perception'\]\.status must be "
                                         r"gated \| skipped .* got 'skiped'"):
        _step(Workspace.open(ws.root))


def test_a_ladder_too_short_to_accept_is_noted_on_its_type(tmp_path):
    """Hostile pass: the default world's Spatial Perception (9 units) gates on a 5-unit
    ladder, where ACCEPT (8 straight wins at the defaults) can never come; the step said
    nothing. Now the type's note says so, with the numbers, in the result and the report."""
    ws = _ws(tmp_path)
    res = _step(ws, options=RunOptions(gate=GateParams(e_confirm=100.0)))  # 1.5**12 >= 100
    notes = {t: r["note"] for t, r in ws.log.frame("step_report").select(
        "task_type", "note").rows_by_key("task_type", unique=True, named=True).items()}
    n_ocr = len(res.types["OCR Problems"].ladder)
    assert n_ocr == 10 and res.types["OCR Problems"].status == "gated"
    want = ("its ladder holds 10 units, and ACCEPT needs at least 12 (straight wins at these "
            "gate parameters): this step cannot accept its candidate")
    assert want in res.types["OCR Problems"].note and want in notes["OCR Problems"]
    for t in ("Action Reasoning", "Counting Problem"):  # 48- and 40-unit ladders
        assert "ACCEPT needs" not in (res.types[t].note or "") + (notes[t] or "")
    ws.close()
