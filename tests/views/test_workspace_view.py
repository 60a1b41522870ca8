"""`open_workspace`: a workspace read-only in a notebook - frames with the SQLite tables' rows,
figures from its records, readable while a writer holds the lock and an open transaction."""

from __future__ import annotations

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import hashlib
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

import vtrm_gate
from vtrm_gate.errors import ConfigError, WorkspaceError
from vtrm_gate.harness import replay_step
from vtrm_gate.views import GateFigure, figure_problems, open_workspace

PNG = b"\x89PNG\r\n\x1a\n"


def sql(ws: Path, query: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{ws / 'harness.sqlite'}?mode=ro", uri=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def test_open_workspace_is_the_package_level_name():
    assert vtrm_gate.open_workspace is open_workspace


def test_every_frame_has_the_rows_of_its_table(trained_workspace):
    ws, _ = trained_workspace
    want = {
        "decisions": "SELECT COUNT(*) FROM step_report WHERE step >= 1",
        "settlements": "SELECT COUNT(*) FROM step_report WHERE step = 0",
        "gate_evidence": "SELECT COUNT(*) FROM gate_evidence",
        "predictions": "SELECT COUNT(*) FROM predictions",
        "evaluation": "SELECT COUNT(*) FROM evaluation",
        "timings": "SELECT COUNT(*) FROM timings",
        "infra": "SELECT COUNT(*) FROM predictions WHERE infra = 1",
    }
    with open_workspace(ws) as view:
        for name, query in want.items():
            frame = getattr(view, name)
            assert isinstance(frame, pl.DataFrame)
            assert frame.height == sql(ws, query)[0][0], name
        assert view.settlements.height > 0  # the run settled some probation
        assert set(view.settlements["action"]) <= {"PROBATION_PASSED", "PROBATION_FAILED"}
        assert view.table("infra_aborts").columns == ["epoch", "step", "aborts", "last"]


def test_timings_add_up_to_the_runs_time_per_phase(trained_workspace):
    ws, res = trained_workspace
    from vtrm_gate.views._workspace import phase_seconds

    with open_workspace(ws) as view:
        got = phase_seconds(view.timings)
    assert got == pytest.approx(dict(res.phases), rel=1e-9, abs=1e-9)
    # 15 steps x (rollout, evolution, gate) + one settlement and one evaluation per epoch
    assert sql(ws, "SELECT COUNT(*) FROM timings WHERE step >= 1")[0][0] == 15 * 3
    assert sql(ws, "SELECT COUNT(*) FROM timings WHERE step = -1")[0][0] == 3


def test_trajectories_are_the_steps_gate_evidence(trained_workspace):
    ws, _ = trained_workspace
    from vtrm_gate.views._workspace import step_outcomes

    with open_workspace(ws) as view:
        outcomes, _ = step_outcomes(view.ws, 1, 1)
        fig = view.trajectories(1, 1)
    report = {t: (a, w, lo) for t, a, w, lo in sql(
        ws, "SELECT task_type, action, W, L FROM step_report WHERE epoch = 1 AND step = 1 "
            "AND action IS NOT NULL")}
    assert {t: (str(o.action), o.W, o.L) for t, o in outcomes.items()} == report
    for t, o in outcomes.items():
        e_plus = [e for (e,) in sql(ws, f"SELECT e_plus FROM gate_evidence WHERE epoch = 1 AND "
                                        f"step = 1 AND task_type = '{t}' ORDER BY ladder_rank")]
        assert [p.e_plus for p in o.trajectory] == e_plus
    assert isinstance(fig, GateFigure) and fig._repr_png_().startswith(PNG)
    assert f"{len(outcomes)} types" in repr(fig)


def test_figures_display_themselves_in_the_deck_style(trained_workspace):
    ws, res = trained_workspace
    with open_workspace(ws) as view:
        curve, phases = view.training_curve(), view.phase_times()
        frame = view.curve()
    for fig in (curve, phases):
        assert isinstance(fig, GateFigure) and fig._repr_png_().startswith(PNG)
        assert figure_problems(fig) == []
    assert sorted(set(frame["epoch"])) == [0, 1, 2, 3]
    assert f"{res.total_s / 3600:.1f} h with v3" in phases.axes[0].get_title(loc="left")


def test_without_a_simulator_the_figures_show_what_was_measured(trained_workspace):
    from vtrm_gate.views import plot_phase_times, plot_training_curve

    with open_workspace(trained_workspace[0]) as view:
        curve = view.curve().with_columns(pl.lit(None, pl.Float64).alias("true"))
        from vtrm_gate.views._workspace import phase_seconds

        new = phase_seconds(view.timings)
    fig = plot_training_curve(curve)
    assert "mean held-out accuracy" in fig._suptitle.get_text()
    assert not any(ln.get_label() == "true (simulator)" for ax in fig.axes for ln in ax.lines)
    bars = plot_phase_times(None, new, unit="hours (loop clock)")
    title = bars.axes[0].get_title(loc="left")
    assert "old serial" not in title and f"{sum(new.values()) / 3600:.2f} h with v3" in title
    for f in (fig, bars):
        assert figure_problems(f) == []


def test_a_step_that_never_ran_is_named(trained_workspace):
    with open_workspace(trained_workspace[0]) as view, pytest.raises(
            WorkspaceError, match=r"e9_s1\.json: missing; step e9 s1 has not been run"):
        view.trajectories(9, 1)


@pytest.mark.parametrize("epoch, step, bad", [
    ("1", "1", "epoch must be an integer >= 1, got '1'"),  # a widget's Dropdown gives text
    (1.0, 1, "epoch must be an integer >= 1, got 1.0"),
    (1, True, "step must be an integer >= 1, got True"),
    (0, 1, "epoch must be an integer >= 1, got 0")])
def test_a_step_named_by_text_or_a_float_is_refused_and_its_manifest_kept(
        trained_workspace, epoch, step, bad):
    """``trajectories("1", "1")`` told the researcher to delete manifests/e1_s1.json, a good
    file ("epoch/step must be 1/1 (the file's name), got (1, 1)"); ``(1.0, 1)`` said step
    "e1.0 s1" had not been run."""
    root = trained_workspace[0]
    before = (root / "manifests" / "e1_s1.json").read_bytes()
    with open_workspace(root) as view, pytest.raises(ConfigError) as err:
        view.trajectories(epoch, step)
    assert str(err.value) == bad
    with pytest.raises(ConfigError, match="must be an integer >= 1"):
        replay_step(root, epoch, step)
    assert (root / "manifests" / "e1_s1.json").read_bytes() == before


def test_phase_times_never_compare_real_time_with_the_simulated_old_gate(tmp_path):
    """A step run with ``time_scale`` (real time, latencies scaled) was drawn against the
    old gate's simulated hours: at time_scale 0 the title read "takes 0.0 h with v3 vs 8.6 h
    with the old serial gate, ×98495". Such steps are drawn alone in real hours; both clocks
    mixed, or nothing timed (a fresh workspace drew "takes 0.00 h"), is refused."""
    from vtrm_gate.sim import SimConfig, init_simulated

    for name in ("fresh", "instant", "mixed"):
        init_simulated(tmp_path / name, SimConfig(seed=3)).close()
    with open_workspace(tmp_path / "fresh") as view, pytest.raises(
            WorkspaceError, match=r"fresh: no step timed yet \(run a step first\)"):
        view.phase_times()
    real = vtrm_gate.RunOptions(time_scale=0)
    vtrm_gate.step_workspace_sync(tmp_path / "instant", 1, 1, real)
    with open_workspace(tmp_path / "instant") as view:
        assert view.timings["clock"].to_list() == ["real"]
        fig = view.phase_times()
    title, ylabel = fig.axes[0].get_title(loc="left"), fig.axes[0].get_ylabel()
    assert "old serial" not in title and "×" not in title.split("\n")[0]
    assert ylabel == "hours of real time (not simulated)"
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["v3: one shared slot pool"] and len(fig.axes[0].containers) == 1
    assert figure_problems(fig) == []
    vtrm_gate.step_workspace_sync(tmp_path / "mixed", 1, 1)  # the virtual clock
    vtrm_gate.step_workspace_sync(tmp_path / "mixed", 1, 2, real)
    with open_workspace(tmp_path / "mixed") as view:
        assert view.timings["clock"].to_list() == ["virtual", "real"]
        with pytest.raises(WorkspaceError, match=r"mixed: phase times mix the virtual clock "
                                                 r"and real time \(real: e1 s2\)"):
            view.phase_times()


def test_phase_times_claim_no_speed_up_over_a_re_run_step(tmp_path):
    """After a re-run of e1 s1 the title read "×15.9" (×8.0 before it): v3's time was the
    re-run's, its base arm served by the BaselineCache, against the old gate replayed from
    scratch (h12)."""
    from vtrm_gate.sim import SimConfig, init_simulated

    init_simulated(tmp_path / "ws", SimConfig(seed=2)).close()
    titles = []
    for _ in range(2):
        vtrm_gate.step_workspace_sync(tmp_path / "ws", 1, 1)
        with open_workspace(tmp_path / "ws") as view:
            fig = view.phase_times()
            titles.append(fig.axes[0].get_title(loc="left"))
            assert figure_problems(fig) == []
    # a bare step times its gate only, and only the gate is compared: the old gate's
    # replayed rollout beside v3's untimed one made it ×8.0 (h17); ×7.3 is the deck's step
    assert titles[0].startswith("The training run takes 1.3 h with v3 vs 9.3 h") and (
        "×7.3 = old total / v3 total" in titles[0])
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["gate"]
    assert titles[1] == ("No speed-up to read: v3's time of e1 s1 is a re-run's (its base "
                         "arm from the BaselineCache),\nthe old gate's a replay from scratch: "
                         "0.7 h vs 9.3 h are not like for like")


WRITER = textwrap.dedent("""
    import sys, time
    from vtrm_gate.harness import HarnessLog, workspace_lock
    root = sys.argv[1]
    with workspace_lock(root, "writer under test"):
        log = HarnessLog(root + "/harness.sqlite")
        cur = log._con.cursor()
        cur.execute("BEGIN IMMEDIATE")  # an open write transaction, as in a running step
        cur.execute("DELETE FROM step_report")
        print("writing", flush=True)
        sys.stdin.readline()
        cur.execute("ROLLBACK")
""")


def _digest(root: Path) -> dict[str, str]:
    """Every file's hash, but the lock file (the writer's) and SQLite's shared-memory index
    (readers of a WAL database mark what they read there)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.iterdir())
            if p.is_file() and p.name != ".lock" and not p.name.endswith("-shm")}


def test_reads_while_a_writer_holds_the_lock_and_a_transaction(trained_workspace, tmp_path):
    ws, _ = trained_workspace
    decisions = sql(ws, "SELECT COUNT(*) FROM step_report WHERE step >= 1")[0][0]
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(ws)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "writing\n"
        before = _digest(ws)
        with open_workspace(ws) as view:  # no lock, no wait: the last committed rows
            assert view.decisions.height == decisions
            status = view.status()
            assert "(writer under test)" in status["writer"]
            assert status["next"].startswith("wait: a writer holds")
            view.export(tmp_path)
        assert _digest(ws) == before  # the reader wrote nothing
    finally:
        writer.communicate("done\n", timeout=60)
    assert writer.returncode == 0
    assert pl.read_parquet(tmp_path / "step_report.parquet").height == sql(
        ws, "SELECT COUNT(*) FROM step_report")[0][0]
