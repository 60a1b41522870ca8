"""The held-out evaluation is honest (issue 16): one skill on one unit is one measurement
(an unchanged skill is measured once, shows no gain and no noise, and is reused in later
epochs), and the gain is the paired difference with a named interval."""

from __future__ import annotations

import sqlite3

import pytest

from vtrm_gate.gate import UnitResult, UnitTask
from vtrm_gate.harness import (
    HarnessLog,
    Workspace,
    evaluate_epoch,
    evaluation_summary,
    gain_text,
    read_heldout,
    run_step,
)
from vtrm_gate.sim import SimConfig, init_simulated, run_virtual, simulated_backend
from vtrm_gate.stats import NEWCOMBE, Action, paired_difference, update_state

CONFIG = SimConfig(seed=11, pool_sizes={"A": 150, "B": 150, "C": 60}, infra_rate=0.0,
                   no_change_rate=0.0, effects={"A": "helpful", "B": "harmful",
                                                "C": "neutral"})


@pytest.fixture
def ws(tmp_path) -> Workspace:
    return init_simulated(tmp_path / "ws", CONFIG, heldout_fraction=0.2)


class Counted:
    """The world's infer, counting the calls that reach it per (type, arm)."""

    def __init__(self, infer):
        self.infer, self.calls = infer, {}

    async def __call__(self, task: UnitTask) -> UnitResult:
        key = (task.task_type, task.arm)
        self.calls[key] = self.calls.get(key, 0) + 1
        return await self.infer(task)


def _evaluate(ws: Workspace, epoch: int, infer):
    return run_virtual(evaluate_epoch(ws, epoch, infer=infer))


def test_an_unchanged_skill_is_measured_once_and_shows_no_gain(ws):
    infer = Counted(simulated_backend(ws).infer)
    res = _evaluate(ws, 1, infer)
    held = read_heldout(ws)
    # one call per held-out unit, not one per arm: the candidate arm reuses the base's answer
    assert sum(infer.calls.values()) == sum(len(u) for u in held.values())
    for r in res.rows:
        assert r["same_skill"] == 1 and r["version"] == 1
        assert (r["correct_initial"], r["n_initial"]) == (r["correct_current"], r["n_current"])
        assert (r["gain"], r["gain_lo"], r["gain_hi"], r["wins"], r["losses"]) == (0, 0, 0, 0, 0)
        assert r["n_pairs"] == len(held[r["task_type"]])
    s = evaluation_summary(res.rows)
    assert s["gain_pooled"]["estimate"] == 0 and s["same_skill_types"] == 3


def test_an_unchanged_skill_is_not_measured_again_in_a_later_epoch(ws):
    be = simulated_backend(ws)
    first = _evaluate(ws, 1, be.infer)
    infer = Counted(be.infer)
    again = _evaluate(ws, 2, infer)
    assert not infer.calls  # every answer is the epoch-1 measurement, reused
    keep = ("task_type", "version", "correct_initial", "correct_current", "gain")
    assert [{k: r[k] for k in keep} for r in again.rows] == [
        {k: r[k] for k in keep} for r in first.rows]


class AcceptAll:
    def update(self, state, pair, params):
        return update_state(state, pair, params)

    def decide(self, state, n_remaining, params):
        return Action.ACCEPT if state.n_consumed >= 3 else Action.CONTINUE


def test_a_changed_skill_gain_is_the_paired_difference_with_newcombes_interval(ws, monkeypatch):
    import vtrm_gate.harness._gating as gating

    be = simulated_backend(ws)
    orig = gating.run_gate

    async def accept(plans, *a, **kw):
        return await orig(plans, *a, **{**kw, "rule": AcceptAll()})

    monkeypatch.setattr(gating, "run_gate", accept)
    run_virtual(run_step(ws, 1, 1, infer=be.infer, evolver=be.evolver, cases=be.cases))
    monkeypatch.undo()
    changed = {t for t, s in ws.state.skills.items() if s.version > 1}
    assert changed
    infer = Counted(be.infer)
    res = _evaluate(ws, 1, infer)
    held = read_heldout(ws)
    for r in res.rows:
        t = r["task_type"]
        if t not in changed:
            assert r["same_skill"] == 1 and r["gain"] == 0
            continue
        assert infer.calls[(t, "cand")] == len(held[t])  # a new skill: measured fresh
        ans = {}
        for arm, u, c in ws.log.query("SELECT arm, unit_id, correct FROM predictions WHERE "
                                      "step = -1 AND task_type = ?", (t,)):
            ans.setdefault(u, {})[arm] = bool(c)
        both = sum(a["base"] and a["cand"] for a in ans.values())
        wins = sum(a["cand"] and not a["base"] for a in ans.values())
        losses = sum(a["base"] and not a["cand"] for a in ans.values())
        d = paired_difference(both, wins, losses, len(ans) - both - wins - losses)
        assert (r["wins"], r["losses"], r["n_pairs"]) == (wins, losses, len(ans))
        assert r["gain"] == pytest.approx((wins - losses) / len(ans))
        assert (r["gain_lo"], r["gain_hi"]) == pytest.approx((d.lo, d.hi))
        assert r["gain_lo"] <= r["gain"] <= r["gain_hi"] and r["gain_method"] == NEWCOMBE
    s = evaluation_summary(res.rows)
    text = gain_text(s)
    assert "pooled over" in text and "mean over 3 types" in text and "Newcombe" in text
    p = s["gain_pooled"]
    assert p["lo"] <= p["estimate"] <= p["hi"]
    assert p["n"] == sum(r["n_pairs"] for r in res.rows)


def test_an_older_log_gains_the_new_evaluation_columns_and_keeps_its_rows(tmp_path):
    db = tmp_path / "harness.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE evaluation (epoch INTEGER, task_type TEXT, version INTEGER, "
                "skill_hash TEXT, n_units INTEGER, n_initial INTEGER, correct_initial "
                "INTEGER, n_current INTEGER, correct_current INTEGER, acc_initial REAL, "
                "acc_current REAL, PRIMARY KEY (epoch, task_type))")
    con.execute("INSERT INTO evaluation VALUES (1, 'A', 2, 'h', 10, 10, 5, 10, 7, 0.5, 0.7)")
    con.commit()
    con.close()
    old = HarnessLog(db, readonly=True).frame("evaluation").to_dicts()
    assert old[0]["acc_current"] == 0.7 and old[0]["gain"] is None  # read-only: NULL
    rows = HarnessLog(db).frame("evaluation").to_dicts()
    assert rows[0]["correct_current"] == 7 and rows[0]["n_pairs"] is None
    assert evaluation_summary(rows)["gain_pooled"]["n"] == 0  # no pairs recorded: no gain


def test_the_cli_summary_names_the_gain_its_two_views_and_their_methods():
    from vtrm_gate.cli._train import summary_text

    summary = {"v3_phases_s": {"gate": 3600.0}, "v3_total_s": 3600.0,
               "evaluation": {"epoch": 2, "types": 2, "units": 80, "same_skill_types": 1,
                              "acc_current": 0.6, "acc_initial": 0.55,
                              "gain_pooled": {**paired_difference(30, 8, 4, 38).__dict__},
                              "gain_mean_over_types": {
                                  **paired_difference(30, 8, 4, 38).__dict__}}}
    text = summary_text(summary, "llm")
    assert "held-out accuracy after epoch 2: 60.0% (initial skills 55.0%, 80 units)" in text
    assert "gain +5.0 points [" in text and "pooled over 80 units (95% Newcombe)" in text
    assert "mean over 2 types (95% MOVER)" in text
