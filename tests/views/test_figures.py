"""Shared figures: expected artists, PNG output, no backend forced on import."""

from __future__ import annotations

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import itertools
import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from matplotlib.text import Text

from vtrm_gate import GateParams, operating_characteristics, replay_prefix
from vtrm_gate.stats import units_curve
from vtrm_gate.views import (
    compare_replays,
    false_accept_frame,
    oc_grid,
    plot_false_accept,
    plot_makespan,
    plot_operating_characteristics,
    plot_prefix_vs_block,
    plot_token_savings,
    plot_trajectories,
    plot_waste,
    save,
)

WIN, LOSS, TIE = (False, True), (True, False), (True, True)
SETS = {"accept": [WIN] * 8 + [TIE] * 4, "futile": [LOSS, None, TIE, WIN],
        "inertia": [TIE] * 10, "empty": []}
PNG = b"\x89PNG\r\n\x1a\n"


def _lines(ax, prefix):
    return [ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith(prefix)]


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == PNG


def test_trajectories_have_one_line_per_type_and_the_threshold_lines(tmp_path):
    params = GateParams(e_confirm=25.0, e_provisional=3.0)
    outcomes = {t: replay_prefix(o, params) for t, o in SETS.items()}
    fig = plot_trajectories(outcomes, params)
    ax = fig.axes[0]
    assert len(_lines(ax, "trajectory:")) == len(SETS)
    (confirm,) = _lines(ax, "e_confirm")
    assert set(confirm.get_ydata()) == {25.0}
    (prov,) = _lines(ax, "e_provisional")
    assert set(prov.get_ydata()) == {3.0}
    assert ax.get_yscale() == "log"
    decisions = {c.get_gid() for c in ax.collections}
    assert {"decision:ACCEPT", "decision:FUTILE", "decision:INERTIA"} <= decisions
    (acc,) = _lines(ax, "trajectory:accept")
    assert list(acc.get_xdata()) == list(range(9)) and acc.get_ydata()[0] == 1.0
    assert _is_png(save(fig, "traj", tmp_path))


def test_trajectories_draw_on_a_given_axes():
    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.add_subplot()
    assert plot_trajectories({"a": replay_prefix([WIN])}, ax=ax) is fig


def test_false_accept_plot_shows_both_orders_and_the_bound(tmp_path):
    params = GateParams()
    df = false_accept_frame(params, [0.0, 0.5, 1.0], 1000, seed=3)
    assert set(df["n_rep"].to_list()) == {1000}
    ax = plot_false_accept(df).axes[0]
    assert {ln.get_gid() for ln in _lines(ax, "rate:")} == {"rate:prefix", "rate:arrival"}
    (bound,) = _lines(ax, "bound")
    assert list(bound.get_ydata()) == pytest.approx([1 / params.e_confirm] * 2)
    assert "false accepts" in ax.get_title(loc="left") and "not used" in " ".join(
        t.get_text() for t in ax.get_legend().get_texts())
    assert "1,000 replicates" in ax.get_figure().get_supxlabel()
    assert _is_png(save(ax.get_figure(), "fa", tmp_path))


def test_prefix_vs_block_has_two_bars_per_type(tmp_path):
    df = compare_replays({k: v for k, v in SETS.items() if v}, GateParams())
    ax = plot_prefix_vs_block(df).axes[0]
    assert len(ax.patches) == 2 * df.height
    assert "same label" in ax.get_title(loc="left") and "same Phase D effect" in ax.get_title(
        loc="left")
    assert _is_png(save(ax.get_figure(), "pvb", tmp_path))


def test_token_savings_draws_three_curves(tmp_path):
    ax = plot_token_savings(units_curve(GateParams(), [0.5, 0.8], 300, seed=1),
                            tokens_per_unit=2000, step_saving=(0.1, 0.2, 2)).axes[0]
    assert "tokens" in ax.get_title(loc="left") and "disc. 0.5" in ax.get_title(loc="left")
    assert "than the old block rule" in ax.get_title(loc="left")
    labels = [t.get_text() for t in ax.texts]
    assert labels and all(t.endswith("vs old") for t in labels)  # against the line beside
    assert "The simulated step (seed 2) saved only 10%" in ax.get_figure().get_supxlabel()
    assert len(_lines(ax, "units:")) == 3
    # it said "12-type" whatever the step gated (seed 7: 10 types; h17)
    ten = plot_token_savings(units_curve(GateParams(), [0.5, 0.8], 300, seed=1),
                             step_saving=(0.1, 0.2, 7, 10))
    assert "The simulated 10-type step (seed 7)" in ten.get_supxlabel()
    (flat,) = _lines(ax, "units:no_stop_units")
    assert set(flat.get_ydata()) == {40 * 2000}
    assert _is_png(save(ax.get_figure(), "tok", tmp_path))


def test_makespan_takes_numbers_and_checks_lengths(tmp_path):
    ax = plot_makespan([18.0, 9.0], [2.0, 1.5], [1.2, 1.0], labels=["12 types", "6 types"],
                       unit="h").axes[0]
    assert len(ax.patches) == 6
    assert [t.get_text() for t in ax.get_yticklabels()] == ["12 types", "6 types"]
    assert _is_png(save(ax.get_figure(), "mk", tmp_path))
    assert len(plot_makespan(18.0, 2.0, 1.2).axes[0].patches) == 3
    with pytest.raises(ValueError, match="same length"):
        plot_makespan([1.0, 2.0], [1.0], [1.0])


def test_waste_counts_every_call_started_past_the_stop(tmp_path):
    calls = pl.DataFrame({"task_type": ["a", "b"], "started": [12, 6],
                          "needed_calls": [10, 6], "past_stop_calls": [2, 0],
                          "cache_hits": [0, 4], "never_started": [8, 0]})
    ax = plot_waste(calls).axes[0]
    assert len(ax.patches) == 4 * 2
    assert "2 of 18 started calls" in ax.get_title(loc="left")
    assert _is_png(save(ax.get_figure(), "waste", tmp_path))


def test_operating_characteristics_one_line_per_exit_and_discordance(tmp_path):
    p = GateParams()
    oc = oc_grid(p, [0.5, 0.7, 0.9], [0.3, 0.6], 40)
    fig = plot_operating_characteristics(oc, p)
    assert len(fig.axes) == 6  # one panel per exit + expected units
    assert sum(len(_lines(ax, "oc:")) for ax in fig.axes) == 6 * 2
    titles = " ".join(ax.get_title(loc="left") for ax in fig.axes)
    assert "EXHAUSTED" not in titles and "P(PROVISIONAL)" in titles
    assert "accepted 73%" in fig.get_suptitle()
    assert fig.axes[5].get_ylim() == (0, 40)  # units from zero, to the ladder's length
    assert _is_png(save(fig, "oc", tmp_path))


def test_save_creates_the_directory_and_appends_png(tmp_path):
    fig = plot_trajectories({"a": replay_prefix([WIN, WIN])})
    path = save(fig, "nested-name", tmp_path / "a" / "b")
    assert path == tmp_path / "a" / "b" / "nested-name.png" and _is_png(path)
    assert save(fig, "x.png", tmp_path).name == "x.png"


def test_importing_the_faces_forces_no_backend():
    code = ("import sys, vtrm_gate.views; "
            "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'")
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_a_figure_displays_itself_as_png_with_no_magic():
    fig = plot_trajectories({"a": replay_prefix([WIN, WIN])})
    assert fig._repr_png_()[:8] == PNG


def test_markers_use_the_exit_shape_and_the_type_colour():
    outcomes = {t: replay_prefix(o) for t, o in SETS.items()}
    ax = plot_trajectories(outcomes).axes[0]
    lines = {ln.get_gid(): ln.get_color() for ln in _lines(ax, "trajectory:")}
    for c in ax.collections:
        if (c.get_gid() or "").startswith("decision:"):
            assert tuple(c.get_facecolor()[0]) in {tuple(__import__("matplotlib").colors.to_rgba(v))
                                                   for v in lines.values()}


def test_review_build_writes_png_svg_and_the_readme(tmp_path):
    from vtrm_gate.views.review import ReviewParams, build

    paths = build(tmp_path, ReviewParams(n_rep=200), names=["03_operating_characteristics"])
    assert _is_png(paths[0]) and (tmp_path / "03_operating_characteristics.svg").exists()
    from PIL import Image

    assert Image.open(paths[0]).size == (1280, 720)
    readme = (tmp_path / "README.md").read_text()
    assert "make figures" in readme and "n_rep`: 200" in readme


def test_notebooks_in_ci_never_write_the_committed_figures(monkeypatch, tmp_path):
    from vtrm_gate.views import notebook_figures_dir

    root = Path(__file__).resolve().parents[2]
    monkeypatch.delenv("VTRM_FIGURES", raising=False)
    ci = notebook_figures_dir(True, root)
    assert root not in ci.parents and ci.is_dir()
    assert notebook_figures_dir(False, root) == root / "figures" / "notebooks"
    monkeypatch.setenv("VTRM_FIGURES", str(tmp_path))
    assert notebook_figures_dir(True, root) == tmp_path


@pytest.mark.parametrize("n_types, end", [(24, 0.02), (24, 30.0), (6, 1.0), (40, 0.001),
                                          (12, "one far below, the rest at the top")])
def test_overview_end_labels_stay_inside_their_axes_and_apart(n_types, end):
    """Many types ending bunched together (at the floor, at a threshold, or all but one at
    the top): the end labels are spread apart and never run past their panel."""
    from matplotlib.text import Annotation, Text

    from vtrm_gate.views import TrajectorySeries, draw_overview, new_figure

    ends = [end] * n_types if isinstance(end, float) else [0.01] + [30.0] * (n_types - 1)
    series = [TrajectorySeries(f"Type {i}", tuple(range(1, 41)),
                               (1.0, *[e] * 38, e * (1 + i / 1e3)), e_minus=(1.0, *[e] * 39))
              for i, e in enumerate(ends)]
    fig = new_figure((11.0, 6.5))  # as the live view's overview
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "constrained_layout not applied"
        axes = draw_overview(fig, series, GateParams(), n_max=40)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        canvas.draw()
    renderer = canvas.get_renderer()
    for ax in axes:
        labels = [t for t in ax.texts if isinstance(t, Annotation)]
        assert len(labels) == n_types
        box = ax.get_window_extent(renderer)
        boxes = [Text.get_window_extent(t, renderer) for t in labels]  # the text, no arrow
        spans = sorted((b.y0, b.y1) for b in boxes)
        assert spans[0][0] >= box.y0 - 1 and spans[-1][1] <= box.y1 + 1, (spans, box)
        centres = [(a + b) / 2 for a, b in spans]
        heights = [b - a for a, b in spans]
        gaps = [b - a for a, b in itertools.pairwise(centres)]
        assert min(gaps) >= 0.6 * min(heights)  # readable: at most slightly touching


def test_a_saved_figure_is_the_deck_size(tmp_path):
    # Was 120 dpi: the demo's and the notebooks' PNGs came out 1536x864 (or 1320x840).
    from PIL import Image

    fig = plot_trajectories({"a": replay_prefix([WIN, WIN])})
    assert Image.open(save(fig, "deck", tmp_path)).size == (1280, 720)


def _frontier_entry(name, wall, acc, wall_span, acc_span):
    """One configuration of a bench_power summary: its hours and accuracy with intervals
    ``wall_span`` / ``acc_span`` below and above."""
    return {"config": name, "seeds": 3, "wall_h": [wall, wall - wall_span[0], wall + wall_span[1]],
            "accuracy": [acc, acc - acc_span[0], acc + acc_span[1]]}


def test_power_frontier_draws_one_point_per_configuration_with_its_intervals():
    """Each configuration of a bench_power result is one point at (wall, accuracy) with its
    seed-level intervals; the old gate and the recommendation are named; the initial skills
    and the oracle gate are reference lines."""
    from vtrm_gate.views import plot_power_frontier

    def entry(name, wall, acc):
        return _frontier_entry(name, wall, acc, (1, 2), (0.02, 0.01))

    result = {"seeds": 3, "epochs": 3, "steps": 5, "old": "old", "recommended": "b",
              "summary": [entry("old", 60.0, 0.60), entry("a", 8.0, 0.62),
                          entry("b", 12.0, 0.65)],
              "initial": [0.55, 0.54, 0.56], "oracle": [0.71, 0.70, 0.72]}
    ax = plot_power_frontier(result).axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["old", "a", "b (chosen on the tuning seeds)"]
    points = [c.lines[0].get_xydata()[0].tolist() for c in ax.containers]
    assert points == [[60.0, 60.0], [8.0, 62.0], [12.0, 65.0]]
    xerr = ax.containers[2].lines[2][0].get_segments()[0]  # the recommended point's x bar
    assert xerr[:, 0].tolist() == [11.0, 14.0]
    # a configuration measured exactly like an earlier one joins its label, never hides it
    twin = {**entry("a", 8.0, 0.62), "config": "a twin"}
    ax2 = plot_power_frontier({**result, "summary": [*result["summary"], twin]}).axes[0]
    assert ax2.get_legend_handles_labels()[1] == ["old", "a = a twin",
                                                  "b (chosen on the tuning seeds)"]
    # Was one log time axis 7-100 h with 55-71 on the accuracy axis, mostly empty: the time
    # axis is broken between the v3 points and the old gate's, accuracy spans the points,
    # and the initial skills and oracle gate are named in the caption instead.
    fig = plot_power_frontier(result)
    near, far = fig.axes[:2]
    assert near.get_xlim()[0] > 5 and 14 < near.get_xlim()[1] < 20
    assert far.get_xlim()[0] > 50 and far.get_xlim()[1] < 70
    lo, hi = near.get_ylim()
    assert (66 - 58) / (hi - lo) > 0.8  # the points' intervals (58-66) fill the axis
    assert "initial skills 55.0 points, oracle gate 71.0" in fig.legends[0].get_title(
        ).get_text()


@pytest.mark.parametrize("vs_old", [(0.001, -0.003, 0.005), (0.02, 0.01, 0.03),
                                    (-0.02, -0.03, -0.01)])
def test_the_frontier_adds_v3_without_futiles_cooldown_and_its_title_says_how_it_compares(
        vs_old):
    from vtrm_gate.views import figure_problems, plot_power_frontier

    def entry(name, wall, acc):
        return _frontier_entry(name, wall, acc, (1, 1), (0.02, 0.02))

    result = {"seeds": 3, "epochs": 3, "steps": 5, "old": "old", "recommended": "v3 (default)",
              "summary": [entry("old", 95.0, 0.66), entry("v3 (default)", 8.0, 0.65),
                          entry("v3, 6 epochs", 14.5, 0.664)],
              "initial": [0.55, 0.54, 0.56], "oracle": [0.71, 0.70, 0.72],
              "cooldown": {"config": "v3, no FUTILE cooldown", "frontier": {
                  **entry("", 12.0, 0.66 + vs_old[0]), "vs_old": list(vs_old),
                  "six_epochs": {**entry("v3, 6 epochs, no FUTILE cooldown", 21.7, 0.67),
                                 "vs_old": [0.01, 0.005, 0.015]}}}}
    fig = plot_power_frontier(result)
    assert figure_problems(fig) == []
    ax = fig.axes[0]
    assert ax.get_legend_handles_labels()[1][-2:] == [
        "v3, no FUTILE cooldown (opt-in)", "v3, 6 epochs, no FUTILE cooldown (opt-in)"]
    assert ax.containers[-2].lines[0].get_xydata()[0].tolist() == pytest.approx(
        [12.0, 100 * (0.66 + vs_old[0])])
    d, lo, hi = (100 * v for v in vs_old)
    title = fig._suptitle.get_text()
    assert all(len(line) <= 112 for line in title.splitlines())  # wrapped to fit the figure
    flat = title.replace("\n", " ")
    # the default first (11.9x faster, 1 point below), then what the saved time buys; the
    # opt-in second, each with its difference from the old gate paired by seed
    assert flat.startswith("Default v3 trains 11.9× faster than the old serial gate at −1.0 "
                           "points, and on twice the epochs ends +0.4 from it in 15% of its "
                           "time (opt-in, ")
    assert (f"no cooldown after FUTILE: {d:+.1f} [{lo:+.1f}, {hi:+.1f}] in 13%; both: +1.0 "
            f"[+0.5, +1.5] in 23%); 3 seeds, differences paired by seed; bars: each point's "
            f"95% interval").replace("-", "−") in flat
    alone = plot_power_frontier({k: v for k, v in result.items() if k != "cooldown"})
    assert "opt-in" not in alone._suptitle.get_text()


def test_the_recorded_power_frontier_is_a_deck_figure_whose_title_is_its_claim():
    import json
    from pathlib import Path

    from vtrm_gate.views import figure_problems, plot_power_frontier

    path = Path(__file__).parents[2] / "benchmarks" / "results" / "bench_power.json"
    result = json.loads(path.read_text(encoding="utf-8"))
    fig = plot_power_frontier(result)
    assert figure_problems(fig) == []
    by = {e["config"]: e for e in result["summary"]}
    default = next(e for e in result["summary"] if "(default)" in e["config"])
    speed = by[result["old"]]["wall_h"][0] / default["wall_h"][0]
    title = fig._suptitle.get_text().replace("\n", " ")
    assert title.startswith(f"Default v3 trains {speed:.1f}× faster than the old serial gate")
    assert "twice the epochs" in title
    d = 100 * result["cooldown"]["frontier"]["vs_old"][0]
    assert "(opt-in, " + f"no cooldown after FUTILE: {d:+.1f} [".replace("-", "−") in title
    caption = fig.legends[0].get_title().get_text()  # the speed-up's definition and runs
    assert (f"{speed:.1f}× = the old gate's mean simulated training time / the default "
            f"v3's ({result['epochs']} × {result['steps']} steps, {result['seeds']} seeds)"
            ) in caption


def _curve(n_types: int = 5):
    import polars as pl

    rows = []
    for i in range(n_types):
        for e in range(4):
            rows.append({"task_type": f"type {i}", "epoch": e, "true": 0.5 + 0.05 * e,
                         "measured": 0.45 + 0.06 * e, "accepted": int(e == 1),
                         "provisional": 2 * int(e == 2), "rolled_back": int(e == 3)})
    return pl.DataFrame(rows)


def test_training_curve_decisions_sit_in_a_strip_under_each_panel_not_on_its_accuracy():
    """The accept / provisional / rollback markers were drawn at accuracy 0.05-0.27 on the
    accuracy axis; a type measured on 1-4 held-out units was drawn like the others."""
    from vtrm_gate.views import figure_problems, plot_training_curve

    fig = plot_training_curve(_curve(), n_heldout={f"type {i}": 4 * i for i in range(5)},
                              run="seed 9, 3 epochs × 2 steps")
    assert figure_problems(fig) == []
    assert "Training run (seed 9, 3 epochs × 2 steps)" in fig._suptitle.get_text()
    accuracy = [ax for ax in fig.axes if ax.get_title(loc="left")]
    strips = [ax for ax in fig.axes if not ax.get_title(loc="left")]
    assert len(accuracy) == len(strips) == 5
    for acc, strip in zip(accuracy, strips, strict=True):
        assert not [c for c in acc.collections if "decision" in str(c.get_gid())]
        assert {c.get_gid() for c in strip.collections} == {
            "decision:accepted", "decision:provisional", "decision:rolled_back"}
        assert acc.get_ylim() == (0, 1.02) and not strip.get_yticks().size
    titles = [ax.get_title(loc="left") for ax in accuracy]
    assert titles[:3] == ["type 0: only 0 held out", "type 1: only 4 held out",
                          "type 2: 8 held out"]
    faint = [ln.get_gid() for ax in accuracy for ln in ax.lines]
    assert faint.count("measured:few") == 2 and faint.count("measured") == 3
    assert any("too few to read" in t.get_text() for t in fig.legends[0].get_texts())


def test_phase_times_names_its_run_and_its_speed_up():
    from vtrm_gate.views import plot_phase_times

    fig = plot_phase_times({"gate": 36000.0, "evaluation": 7200.0},
                           {"gate": 3600.0, "evaluation": 1200.0},
                           run="seed 10, 3 epochs × 5 steps")
    title = fig.axes[0].get_title(loc="left")
    assert "The training run (seed 10, 3 epochs × 5 steps) takes 1.3 h" in title
    assert "×9.0 = old total / v3 total, simulated hours of every phase" in title
    # the old loop ran no evaluation: its bar is hypothetical, so the title says both ratios
    assert "×10.0 without the evaluation, which the old loop never ran" in title



def _sweep_result(v3_gaps):
    """A bench_power result whose harmful sweep has v3 - no gate = ``v3_gaps`` per share."""
    from benchmarks.bench_power import crossover_interval

    shares = [0.1 * i for i in range(len(v3_gaps))]
    points = []
    for s, g in zip(shares, v3_gaps, strict=True):
        acc = {"no_gate": 0.7 - s, "v3": 0.7 - s + g, "old": 0.7 - s + g + 0.01,
               "oracle": 0.78}
        points.append({"p_harmful": s, "summary": [
            {"label": k, "accuracy": [a, a - 0.02, a + 0.02],
             "vs_no_gate": [a - acc["no_gate"], a - acc["no_gate"] - 0.01,
                            a - acc["no_gate"] + 0.01],
             "vs_v3": [a - acc["v3"]] * 3} for k, a in acc.items()]})
    diffs = np.array([[g - 0.01, g + 0.01] for g in v3_gaps])
    return {"harmful_sweep": {"shares": shares, "seeds": 2, "points": points,
                              "crossover": {"v3": crossover_interval(shares, diffs, reps=200),
                                            "old": [None, None, None]}}}


def test_the_crossover_figure_draws_four_baselines_and_marks_where_v3_pays():
    from vtrm_gate.views import figure_problems, plot_harmful_crossover

    fig = plot_harmful_crossover(_sweep_result([-0.04, -0.02, 0.02, 0.06]))
    assert figure_problems(fig) == []
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["no gate (apply every candidate)", "old serial gate", "v3 gate (default)",
                      "oracle gate (exactly the truly better ones; cooldown after a rejection)"]
    v3 = ax.lines[2].get_xydata()
    assert v3[:, 0] == pytest.approx([0.0, 10.0, 20.0, 30.0])
    assert v3[:, 1] == pytest.approx([66.0, 58.0, 52.0, 46.0])
    cross = [ln for ln in ax.lines if ln.get_linestyle() == ":"]
    assert len(cross) == 1 and cross[0].get_xdata()[0] == pytest.approx(15.0)
    title = ax.get_title(loc="left")
    assert "v3 beats applying every candidate once ≥ 15%" in title
    assert "at 0% harmful v3 is −4.0 points vs no gate, at 30% +6.0" in title
    never = plot_harmful_crossover(_sweep_result([-0.04, -0.03, -0.02, -0.01]))
    assert "never beats applying every candidate up to 30% harmful" in \
        never.axes[0].get_title(loc="left")


def test_the_recorded_crossover_is_a_deck_figure_whose_title_is_its_claim():
    import json

    from vtrm_gate.views import figure_problems, plot_harmful_crossover

    path = Path(__file__).parents[2] / "benchmarks" / "results" / "bench_power.json"
    result = json.loads(path.read_text(encoding="utf-8"))
    sweep = result["harmful_sweep"]
    assert sweep["shares"][0] == 0.0 and sweep["shares"][-1] == 0.6
    assert [e["label"] for e in sweep["points"][0]["summary"]] == ["no_gate", "oracle", "old",
                                                                  "v3"]
    fig = plot_harmful_crossover(result)
    assert figure_problems(fig) == []
    c = sweep["crossover"]["v3"][0]
    title = fig.axes[0].get_title(loc="left").replace("\n", " ")
    assert title.startswith(f"Default v3 overtakes no gate at {100 * c:.0f}% [" if c is not None
                            else "Default v3 overtakes no gate never")
    cool = result["cooldown"]
    gains = [100 * cool["worlds"][f"p_harmful {s:.1f}"]["vs_v3"][0] for s in sweep["shares"]]
    assert f"{min(gains):+.1f} to {max(gains):+.1f} over the default".replace("-", "−") in title


def test_the_crossover_figure_adds_v3_without_futiles_cooldown_when_the_result_has_it():
    from vtrm_gate.views import figure_problems, plot_harmful_crossover

    result = _sweep_result([-0.04, -0.02, 0.02, 0.06])
    shares = result["harmful_sweep"]["shares"]
    free = {f"p_harmful {s:.1f}": {"accuracy": [0.75 - s, 0.73 - s, 0.77 - s],
                                    "vs_v3": [0.09 - g, 0, 0], "vs_old": [g - 0.03, 0, 0],
                                    "vs_no_gate": [0.05, 0.01, 0.09]}
            for s, g in zip(shares, [0.0, 0.01, 0.02, 0.03], strict=True)}
    result["cooldown"] = {"worlds": free, "crossover": [0.05, 0.02, 0.08]}
    fig = plot_harmful_crossover(result)
    assert figure_problems(fig) == []
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert labels[-1] == "v3, no cooldown after FUTILE (opt-in: init --no-futile-cooldown)"
    assert ax.lines[4].get_xydata()[:, 1] == pytest.approx([75.0, 65.0, 55.0, 45.0])
    cross = sorted(ln.get_xdata()[0] for ln in ax.lines if ln.get_linestyle() == ":")
    assert cross == pytest.approx([5.0, 15.0])  # v3 default's and this one's
    title = ax.get_title(loc="left")
    assert all(len(line) <= 112 for line in title.splitlines())
    title = title.replace("\n", " ")
    # the default first: where it overtakes no gate, and against the old gate at every share
    # (how many of its paired intervals exclude 0: a mean alone overclaimed), the opt-in second
    assert title.startswith("Default v3 overtakes no gate at 15% [")
    assert ("harmful and trails the old gate by 1.0–1.0 points at every share (paired, the "
            "interval excluding 0 at 4 of 4)") in title
    assert "Opt-in, no cooldown after FUTILE: +6.0 to +9.0 over the default, overtakes no " \
           "gate at 5% [2–8%]; 2 seeds, 95% intervals" in title
    # each crossover's interval is drawn, and where the seeds' interval clears zero is said
    bars = {ln.get_gid(): ln.get_xdata() for ln in ax.lines
            if (ln.get_gid() or "").startswith("cross:")}
    assert list(bars["cross:no FUTILE cooldown"]) == pytest.approx([2.0, 8.0])
    said = [t.get_text() for t in ax.texts]
    assert any(t.startswith("v3: 15% (95% CI > 0 from 20%)") for t in said), said


MATH_NAMES = ("Cost $\\alpha^$", "Price $5 or $10")
"""Type names matplotlib would read as math: the first is malformed mathtext (drawing it
raised ValueError), the second drew "5 or " in italics and lost both dollar signs."""


def _dollar_figures():
    from vtrm_gate.views import plot_training_curve

    outcomes = {t: replay_prefix(SETS["accept"], GateParams()) for t in MATH_NAMES}
    calls = pl.DataFrame({"task_type": list(MATH_NAMES), "started": [12, 6],
                          "needed_calls": [10, 6], "past_stop_calls": [2, 0],
                          "cache_hits": [0, 4], "never_started": [8, 0]})
    curve = _curve(2).with_columns(pl.col("task_type").replace(
        {"type 0": MATH_NAMES[0], "type 1": MATH_NAMES[1]}))
    return {"overview": plot_trajectories(outcomes),
            "panels": plot_trajectories(outcomes, layout="panels"),
            "prefix_vs_block": plot_prefix_vs_block(compare_replays(
                dict.fromkeys(MATH_NAMES, SETS["accept"]), GateParams())),
            "waste": plot_waste(calls), "training_curve": plot_training_curve(curve)}


@pytest.mark.parametrize("kind", ["overview", "panels", "prefix_vs_block", "waste",
                                  "training_curve"])
def test_a_type_name_with_dollar_signs_is_drawn_as_written(kind, tmp_path):
    """A type's name is text, never mathtext: "Cost $\\alpha^$" made every figure naming it
    raise at draw time, and "Price $5 or $10" lost its dollar signs."""
    fig = _dollar_figures()[kind]
    assert _is_png(save(fig, kind, tmp_path))  # drawn: tick labels exist now
    shown = [t._preprocess_math(t.get_text()) for t in fig.findobj(Text) if t.get_text()]
    for name in MATH_NAMES:
        assert any(name in text and not math for text, math in shown), (name, kind)
    assert not [text for text, math in shown if math and "mathdefault" not in text]


def test_literal_text_is_drawn_as_written_whatever_its_backslashes():
    from matplotlib.text import Text

    from vtrm_gate.views._style import literal

    for name in ("$", "$$", "a\\$b$", "\\$", "$x$ and $y$", "50% $\\frac{1}{2}$", "plain"):
        assert Text(text=literal(name))._preprocess_math(literal(name)) == (name, False)


def test_a_long_training_curve_title_wraps_inside_the_figure():
    """A 12-type run's title ("... 4 of 12 types improved") ran 14 px past the figure's
    edge; `save` wrote it so (h17)."""
    from vtrm_gate.views import figure_problems, plot_training_curve

    fig = plot_training_curve(_curve(12), run="seed 10, 3 epochs × 5 steps, rule e_harm, "
                                              "the mostly_neutral world, 20% held out")
    title = fig._suptitle.get_text()
    assert "\n" in title and max(map(len, title.split("\n"))) <= 112
    assert "12 of 12 types improved" in title.replace("\n", " ")
    assert figure_problems(fig) == []


def test_the_training_curves_title_claims_only_what_its_frame_holds():
    """Filtered to epoch 2 the title said "67.8% → 67.8% over 2 epochs"; a NaN at the end
    counted as an improvement ("→ nan%; 3 of 3 types improved"), duplicate rows as more
    types than there are ("4 of 3"), and a type missing at the end moved the mean."""
    from vtrm_gate.views import figure_problems, plot_training_curve

    curve = _curve(3)  # true 50% at epoch 0 -> 65% at epoch 3, every type
    title = plot_training_curve(curve)._suptitle.get_text()
    assert "mean true accuracy 50.0% → 65.0% over epochs 0–3; 3 of 3 types improved" in title
    only = plot_training_curve(curve.filter(pl.col("epoch") == 2))._suptitle.get_text()
    assert "mean true accuracy 60.0% at epoch 2 (3 types)" in only and "→" not in only
    late = plot_training_curve(curve.filter(pl.col("epoch") >= 1))._suptitle.get_text()
    assert "55.0% → 65.0% over epochs 1–3; 3 of 3 types improved" in late
    nan_end = curve.with_columns(
        pl.when((pl.col("epoch") == 3) & (pl.col("task_type") == "type 0")).then(float("nan"))
        .otherwise(pl.col("true")).alias("true"))
    fig = plot_training_curve(nan_end)
    title = fig._suptitle.get_text()
    assert figure_problems(fig) == []
    assert "50.0% → 65.0% over epochs 0–3; 2 of 2 types improved\n(1 type without both " \
           "ends left out)" in title
    missing = curve.filter(~((pl.col("epoch") == 3) & (pl.col("task_type") == "type 2")))
    assert "2 of 2 types improved\n(1 type" in plot_training_curve(missing)._suptitle.get_text()
    with pytest.raises(ValueError, match="curve: epoch 3 of 'type 0' twice"):
        plot_training_curve(pl.concat([curve, curve.filter(pl.col("epoch") == 3).head(1)]))
    with pytest.raises(ValueError, match="curve: no rows"):
        plot_training_curve(curve.clear())
    with pytest.raises(ValueError, match="curve: missing column 'measured'"):
        plot_training_curve(curve.drop("measured"))
    for cols in (0, True, 2.5):
        with pytest.raises(ValueError, match=f"cols must be an integer >= 1, got {cols!r}"):
            plot_training_curve(curve, cols)


def test_the_train_progress_title_reads_the_points_in_their_order_not_the_frames():
    """Rows reversed, a finished run was titled "waiting for the first step"; sorted by
    kind, "after e2 s2: 67.8% → 73.5%" for a run that went 63.7% → 67.8% and ended with an
    evaluation."""
    from vtrm_gate.views import plot_train_progress

    rows = [(0, "start", 0, 0, 0.50, None), (1, "step", 1, 1, 0.55, None),
            (2, "step", 1, 2, 0.60, None), (3, "settle", 1, 0, 0.58, None),
            (4, "evaluate", 1, 0, 0.58, 0.57)]
    points = pl.DataFrame(
        [dict(zip(("i", "kind", "epoch", "step", "true", "measured"), r, strict=True))
         | {"accepted": 1, "provisional": 0, "kept": 0, "rolled_back": 0} for r in rows])
    want = ("Training run after epoch 1 evaluated: mean true accuracy 50.0% → 58.0% over 4 "
            "steps, settlements and evaluations")
    for frame in (points, points.reverse(), points.sort("kind")):
        assert plot_train_progress(frame).axes[0].get_title(loc="left") == want


@pytest.mark.parametrize(("old", "new", "message"), [
    ({"gate": 7200.0, "evaluation": 30000.0}, {"gate": 3600.0},
     "old and new must name the same phases: 'evaluation' only in old"),
    ({"gate": 7200.0}, {"gate": 3600.0, "rollout": 60.0},
     "old and new must name the same phases: 'rollout' only in new"),
    ({"gate": -7200.0}, {"gate": 3600.0}, "old['gate'] must be a finite number of seconds >= 0, "
                                          "got -7200.0"),
    ({"gate": float("nan")}, {"gate": 3600.0}, "old['gate'] must be a finite number"),
    ({"gate": 7200.0}, {"gate": True}, "new['gate'] must be a finite number of seconds >= 0, "
                                       "got True"),
])
def test_phase_times_claim_a_speed_up_only_over_the_phases_drawn(old, new, message):
    """A phase only in ``old`` raised the claimed speed-up from ×3.7 to ×10.3 without a bar;
    negative seconds, NaN and True were drawn and divided; a phase only in ``new`` was a
    KeyError."""
    from vtrm_gate.views import plot_phase_times

    with pytest.raises(ValueError, match=re.escape(message)):
        plot_phase_times(old, new)
    title = plot_phase_times({"gate": 7200.0}, {"gate": 3600.0}).axes[0].get_title(loc="left")
    assert "×2.0 = old total / v3 total" in title


def test_the_makespan_title_says_slower_when_v3_is_slower_and_refuses_what_it_cannot_divide():
    """v3 five times slower was titled "(×0.2 faster)"; a negative makespan "×-7.2 faster";
    new=0 a ZeroDivisionError; a string was read character by character and a numpy
    integer was "not iterable"; lower_bound=0 gave "nan× its lower bound"."""
    from vtrm_gate.views import plot_makespan

    title = plot_makespan(1.0, 5.0, 0.5).axes[0].get_title(loc="left")
    assert "1.00 h → 5.00 h (×5.0 slower), 10.00× its lower bound" in title
    title = plot_makespan(np.int64(6), np.float64(2.0), 1.0).axes[0].get_title(loc="left")
    assert "6.00 h → 2.00 h (×3.0 faster), 2.00× its lower bound" in title
    for args, message in (((1.0, -0.1, 0.05), "new must hold makespans > 0, got -0.1"),
                          ((1.0, 0, 0.05), "new must hold makespans > 0, got 0"),
                          ((1.0, 0.5, 0), "lower_bound must hold makespans > 0, got 0"),
                          (("12", 0.5, 0.1), "old must be a number or a sequence of numbers, "
                                             "got '12'"),
                          ((1.0, [0.5, float("nan")], [0.1, 0.1]),
                           "new must hold makespans > 0, got nan"),
                          ((True, 0.5, 0.1), "old must be a number or a sequence of numbers, "
                                             "got True")):
        with pytest.raises(ValueError, match=re.escape(message)):
            plot_makespan(*args)


def test_the_oc_figure_refuses_a_grid_of_other_params_than_its_title_would_use():
    """A grid built with e_confirm=5, drawn without ``params``, was titled with the default
    params' numbers ("accepted 73% ... under H0 2.2%") over curves at 92% / 14.5%, and the
    1/e_confirm line sat at the default; ``n_units=0`` silently became 40, and
    ``p_wins=[]`` was an IndexError."""
    from vtrm_gate.views import oc_grid, plot_operating_characteristics

    loose = GateParams(e_confirm=5.0)
    grid = oc_grid(loose, [0.5, 0.8], [0.5], 40)
    with pytest.raises(ValueError, match=r"oc was not computed with these params \(row 1: "
                                         r"p_accept [0-9.]+ in the frame, [0-9.]+ under them\); "
                                         r"pass the params it was built with"):
        plot_operating_characteristics(grid)
    fig = plot_operating_characteristics(grid, loose)
    good = operating_characteristics(loose, 0.8, 0.5, 40)
    assert f"accepted {good.p_accept:.0%}" in fig._suptitle.get_text()
    for kwargs, message in (({"n_units": 0}, "n_units must be an integer >= 1, got 0"),
                            ({"n_units": True}, "n_units must be an integer >= 1, got True"),
                            ({"p_wins": []}, "p_wins must hold at least one p_win")):
        with pytest.raises(ValueError, match=re.escape(message)):
            plot_operating_characteristics(**kwargs)
    with pytest.raises(ValueError, match="oc: no rows"):
        plot_operating_characteristics(grid.clear(), loose)
    assert oc_grid(loose, [0.8], [0.5], np.int64(40)).equals(oc_grid(loose, [0.8], [0.5], 40))
    with pytest.raises(ValueError, match="n_units must be an integer >= 1 or a sequence of "
                                         "them, got True"):
        oc_grid(loose, [0.8], [0.5], True)


@pytest.mark.parametrize("n", [float("nan"), -3, True, "12"])
def test_a_call_breakdown_count_that_is_no_count_is_refused_naming_its_bar(n):
    """A NaN count crashed deep in the bar labels ("cannot convert float NaN to integer")."""
    from vtrm_gate.views import plot_call_breakdown

    with pytest.raises(ValueError, match=r"bars\['v3'\]\['needed'\] must be a count >= 0"):
        plot_call_breakdown({"v3": {"needed": n}}, title="t")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n_rep": 1}, "ReviewParams.n_rep must be an integer >= 2, got 1"),
    ({"n_rep": "4000"}, "ReviewParams.n_rep must be an integer >= 2, got '4000'"),
    ({"epochs": 0}, "ReviewParams.epochs must be an integer >= 1, got 0"),
    ({"p_wins": ()}, "ReviewParams.p_wins must be a non-empty sequence of numbers"),
])
def test_review_params_are_checked_when_made_naming_the_field(kwargs, message):
    """Notebook 03's ``N_REP = 1`` ran, then a later figure cell failed with "n_rep must be
    an integer >= 1, got 0" (the token figure halves it); ``'4000'`` was a TypeError there."""
    from vtrm_gate.errors import ConfigError
    from vtrm_gate.views.review import ReviewParams

    with pytest.raises(ConfigError, match=re.escape(message)):
        ReviewParams(**kwargs)


def test_a_figures_directory_that_is_a_file_is_named_before_any_work(tmp_path, monkeypatch):
    """``VTRM_FIGURES`` naming a file was taken; the first ``save`` failed after the work
    with "FileExistsError: [Errno 17] File exists" naming no variable."""
    from vtrm_gate.errors import ConfigError
    from vtrm_gate.views import notebook_figures_dir

    (tmp_path / "afile").write_text("x")
    for target in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        monkeypatch.setenv("VTRM_FIGURES", str(target))
        with pytest.raises(ConfigError, match=f"VTRM_FIGURES={re.escape(str(target))}: "
                                              f".*afile exists and is not a directory"):
            notebook_figures_dir(True, tmp_path)
    monkeypatch.setenv("VTRM_FIGURES", str(tmp_path / "new" / "dir"))
    assert notebook_figures_dir(True, tmp_path) == tmp_path / "new" / "dir"


def test_label_leaders_do_not_read_as_trajectories():
    """Mid-run, each type's label leader ran from its current point to the right edge in
    the type's colour, solid: it read as the trajectory extrapolated (notebook 01's overview
    drawn before the gate ended: 24 lines fanning out from (0, 1))."""
    from matplotlib.colors import to_hex

    from vtrm_gate.views._style import MUTED

    outcomes = {f"T{i}": replay_prefix(SETS["accept"][:3], GateParams()) for i in range(3)}
    fig = plot_trajectories(outcomes)
    leaders = [t.arrow_patch for ax in fig.axes for t in ax.texts
               if getattr(t, "arrow_patch", None) is not None]
    assert len(leaders) == 6  # a label per type on each panel
    for a in leaders:
        assert a.get_linestyle() == ":" and to_hex(a.get_edgecolor()) == to_hex(MUTED)


def test_a_ci_notebooks_temporary_figures_go_when_its_kernel_exits(tmp_path):
    """Without VTRM_FIGURES a CI notebook saved into a fresh temp dir that nothing removed:
    a /tmp/vtrm-figures-* per run, for ever."""
    code = ("import sys\nfrom vtrm_gate.views import notebook_figures_dir\n"
            "d = notebook_figures_dir(True, '.')\n(d / 'f.png').write_bytes(b'x')\nprint(d)")
    env = {k: v for k, v in os.environ.items() if k != "VTRM_FIGURES"}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, check=True,
                         capture_output=True, text=True).stdout.strip()
    assert out.startswith(tempfile.gettempdir()) and not Path(out).exists()


def test_the_review_finds_the_frontier_data_from_outside_the_checkout(tmp_path, monkeypatch):
    """``python -m vtrm_gate.views.review`` run elsewhere than the checkout's root failed with
    FileNotFoundError on benchmarks/results/bench_power.json (resolved against the cwd)."""
    from vtrm_gate.views.review import ReviewParams, _power_results

    monkeypatch.chdir(tmp_path)
    assert "runs" in _power_results(ReviewParams())


def test_inertia_and_futile_are_not_the_same_effect():
    """02_prefix_vs_block labelled INERTIA → FUTILE "same effect: keep" and counted 12/12
    types alike, while FUTILE's cooldown is the whole gap between v3 and the old gate."""
    from vtrm_gate.stats import Action
    from vtrm_gate.views._frames import EFFECT

    assert EFFECT[Action.INERTIA] != EFFECT[Action.FUTILE] == EFFECT[Action.REJECT]


def test_the_trajectories_of_an_aborted_gate_say_it_was_aborted():
    """A cancelled or INFRA-aborted gate's figure read like an ordinary partial step
    ("0 of 2 types decided after 16 of 80 ladder units"), its live view too (h12)."""
    import asyncio

    from vtrm_gate import GuardParams, InfraGuardError, TypePlan, UnitResult, launch
    from vtrm_gate.sim import run_virtual
    from vtrm_gate.views import plot_trajectories, show_live, watch

    plans = [TypePlan(t, [f"u{i}" for i in range(40)]) for t in ("A", "B")]

    async def slow(task):
        await asyncio.sleep(5)
        return UnitResult(correct=True)

    async def flaky(task):
        await asyncio.sleep(1)
        return UnitResult(infra=task.unit_id in ("u1", "u2", "u3"), correct=True)

    async def main():
        handle = launch(plans, slow)
        await asyncio.sleep(1)
        handle.cancel()
        res = await handle
        with pytest.warns(UserWarning, match="no Jupyter front end"):
            h, view = show_live(plans, flaky, guard=GuardParams())
        with pytest.raises(InfraGuardError):
            await watch(h, view)
        return res, view.figure()

    res, live = run_virtual(main())
    assert plot_trajectories(res).axes[0].get_title(loc="left") == (
        "Gate aborted (CancelledError): 0 of 2 types decided after 0 of 80 ladder units")
    assert plot_trajectories(res.outcomes).axes[0].get_title(loc="left") == (
        "0 of 2 types decided after 0 of 80 ladder units")  # outcomes alone cannot know
    assert re.fullmatch(r"Gate aborted \(InfraGuardError: INFRA guard tripped for type '[AB]': "
                        r"\d INFRA …\): 0 of 2 types decided after \d+ of 80 ladder units",
                        live._suptitle.get_text())


def test_figures_of_nothing_are_refused_naming_what_is_empty():
    """An empty false-accept curve raised IndexError ("index 0 is out of bounds"), empty
    makespans "max() arg is an empty sequence" (h12)."""
    from vtrm_gate.views import false_accept_frame, plot_false_accept, plot_makespan

    with pytest.raises(ValueError, match=r"^plot_false_accept: the curve has no points"):
        plot_false_accept(false_accept_frame(GateParams(), [], 20))
    with pytest.raises(ValueError, match=r"^old must hold at least one makespan, got none"):
        plot_makespan([], [], [])
    with pytest.raises(ValueError, match=r"^lower_bound must hold at least one makespan"):
        plot_makespan(2.0, [1.0], [])
