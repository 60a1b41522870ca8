"""`show_train` / `TrainCurveView`: the training curve gains a point as each step, settlement
and evaluation finishes, with the numbers the run recorded; in a real kernel it is one image
output updated in place, so the notebook keeps the finished curve."""

from __future__ import annotations

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import sqlite3

import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

from vtrm_gate import slugify
from vtrm_gate.backends import train_workspace_sync
from vtrm_gate.options import RunOptions
from vtrm_gate.sim import SimConfig, SimWorld, init_simulated
from vtrm_gate.testing.sim import TRAIN_EFFECTS, TRAIN_POOLS
from vtrm_gate.views import TrainCurveView, figure_problems, show_train

CONFIG = SimConfig(seed=5, pool_sizes=TRAIN_POOLS, effects=TRAIN_EFFECTS)


def _workspace(path):
    init_simulated(path, CONFIG, heldout_fraction=0.2, probation_rule="e_continue").close()
    return path


def _true_mean(world: SimWorld, ws, versions) -> float:
    accs = [world.true_accuracy(t, (ws / "history" / slugify(t) / f"v{v}.md").read_text())
            for t, v in sorted(versions.items())]
    return sum(accs) / len(accs)


def test_a_point_is_added_per_step_settlement_and_evaluation(tmp_path):
    ws = _workspace(tmp_path / "ws")
    world = SimWorld(CONFIG)
    view = TrainCurveView(ws)
    start = view.frame().row(0, named=True)
    assert start["kind"] == "start" and start["true"] == pytest.approx(
        _true_mean(world, ws, dict.fromkeys(TRAIN_POOLS, 1)))
    events, heights = [], []

    def on_event(ev):
        view(ev)
        events.append(ev)
        heights.append(view.frame().height)

    train_workspace_sync(ws, 2, 2, RunOptions(concurrency=16), on_event=on_event)
    view.close()
    kinds = [ev.kind for ev in events]
    assert kinds == ["step", "step", "settle", "evaluate"] * 2 + ["finished"]
    assert heights == [*range(2, 10), 9]  # one more point per step, settlement, evaluation
    frame = view.frame()
    assert frame["kind"].to_list() == ["start", *kinds[:-1]]
    con = sqlite3.connect(f"file:{ws / 'harness.sqlite'}?mode=ro", uri=True)
    for ev, row in zip(events, list(frame.iter_rows(named=True))[1:], strict=False):
        if ev.kind == "step":
            assert row["true"] == pytest.approx(_true_mean(world, ws, ev.data.versions))
            got = dict(con.execute(
                "SELECT action, COUNT(*) FROM step_report WHERE epoch = ? AND step = ? "
                "GROUP BY action", (ev.epoch, ev.step)).fetchall())
            assert (row["accepted"], row["provisional"]) == (got.get("ACCEPT", 0),
                                                             got.get("PROVISIONAL", 0))
        elif ev.kind == "settle":
            failed = con.execute("SELECT COUNT(*) FROM step_report WHERE epoch = ? AND step = 0"
                                 " AND action = 'PROBATION_FAILED'", (ev.epoch,)).fetchone()[0]
            assert row["rolled_back"] == failed
        elif ev.kind == "evaluate":
            correct, n = con.execute("SELECT SUM(correct_current), SUM(n_current) FROM "
                                     "evaluation WHERE epoch = ?", (ev.epoch,)).fetchone()
            assert row["measured"] == pytest.approx(correct / n)
    con.close()
    assert frame["rolled_back"].sum() > 0 and frame["provisional"].sum() > 0
    fig = view.figure()
    assert figure_problems(fig) == []
    assert " over 8 steps, settlements and evaluations" in fig.axes[0].get_title(loc="left")


@pytest.mark.slow
def test_show_train_in_a_kernel_is_one_image_updated_in_place(tmp_path):
    ws = _workspace(tmp_path / "ws")
    nb = new_notebook(cells=[new_code_cell(
        "from vtrm_gate.options import RunOptions\nfrom vtrm_gate.views import show_train\n"
        f"run, view = show_train({str(ws)!r}, 1, 2, RunOptions(concurrency=16), "
        "min_interval=0)"), new_code_cell("print(view.redraws, view.frame().height)")])
    NotebookClient(nb, timeout=240, kernel_name="python3").execute()
    outs = nb.cells[0].outputs
    assert len(outs) == 1 and "image/png" in outs[0]["data"]  # one output, updated in place
    assert "epoch 1 evaluated" in outs[0]["data"]["text/plain"]  # the finished curve
    redraws, points = map(int, nb.cells[1].outputs[0]["text"].split())
    assert points == 5 and redraws >= 5  # a redraw per point (min_interval=0) + the last


def test_show_train_outside_jupyter_draws_nothing_and_says_so(tmp_path, capsys):
    """In a script, IPython's display printed each redraw's raw bundle, a base64 PNG of
    ~60,000 characters, to stdout."""
    ws = _workspace(tmp_path / "ws")
    with pytest.warns(UserWarning, match=r"^show_train: no Jupyter front end here"):
        run, view = show_train(ws, 1, 1, RunOptions(concurrency=16))
    assert run.summary is not None and view.redraws == 0
    assert capsys.readouterr().out == ""
