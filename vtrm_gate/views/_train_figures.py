"""Figures of a training run: the training curve per type and the time per phase.

Object API only (like the other figures): each ``plot_*`` returns a self-displaying
`GateFigure` in the deck's style (1280×720, claim as title, labelled axes); save it with
`vtrm_gate.views.save`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import polars as pl
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from ..errors import is_real, is_whole
from ._figures import GateFigure, new_figure
from ._style import (
    BAD,
    BOUND,
    EXIT_COLOURS,
    MUTED,
    OLD,
    SERIES,
    SLIDE,
    TYPE_COLOURS,
    V3,
    literal,
    styled,
)

MARKS = {"accepted": ("^", EXIT_COLOURS["ACCEPT"], 2),
         "provisional": ("D", EXIT_COLOURS["PROVISIONAL"], 1),
         "rolled_back": ("v", BAD, 0)}
"""Per decision kind: marker, colour and its row in the panel's decision strip (under the
accuracy axis, never on it), so an application and its rollback never cover each other."""
FEW_HELD_OUT = 5
"""Fewer held-out units than this: the measured accuracy of a type is drawn faint and its
title says so (1 unit measures 0 or 1)."""


def _decision_strip(ax: Axes, d: pl.DataFrame) -> None:
    """The epoch's decisions as markers in fixed rows, with the count when more than one."""
    for name, (m, c, y) in MARKS.items():
        hit = d.filter(pl.col(name) > 0)
        if not hit.height:
            continue
        xs = hit["epoch"].to_numpy()
        ax.scatter(xs, np.full(len(xs), y), marker=m, color=c, s=34, zorder=3,
                   edgecolor="#222222", linewidth=0.5, gid=f"decision:{name}")
        for x, k in zip(xs, hit[name].to_list(), strict=True):
            if k > 1:
                ax.annotate(f"×{k}", (x, y), xytext=(6, 0), textcoords="offset points",
                            va="center", fontsize="small", color=c)
    ax.set_ylim(-0.7, 2.7)
    ax.set_yticks([])
    ax.grid(True, axis="x", alpha=0.4)


def _curve_panel(ax: Axes, t: str, d: pl.DataFrame, n: int | None) -> None:
    few = n is not None and n < FEW_HELD_OUT
    if d["true"].null_count() < d.height:  # a real workspace has no true accuracy
        ax.plot(d["epoch"], d["true"], "-", color=V3, lw=2, label="true (simulator)")
    ax.plot(d["epoch"], d["measured"], ":" if few else "--", color=MUTED, lw=1.6,
            marker="o", ms=3, alpha=0.45 if few else 1.0, gid="measured:few" if few else
            "measured", label="measured on the held-out split")
    t = literal(t)
    title = t if n is None else f"{t}: only {n} held out" if few else f"{t}: {n} held out"
    ax.set_title(title, fontsize="small", loc="left")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.4)
    ax.tick_params(labelbottom=False)


def _legend(fig: GateFigure, few: bool) -> None:
    handles = [Line2D([], [], color=V3, lw=2, label="true accuracy (simulator)"),
               Line2D([], [], color=MUTED, lw=1.6, ls="--", marker="o", ms=3,
                      label="measured on the held-out split"),
               *([Line2D([], [], color=MUTED, lw=1.6, ls=":", marker="o", ms=3, alpha=0.45,
                         label=f"measured on < {FEW_HELD_OUT} units: too few to read")]
                 if few else []),
               *(Line2D([], [], ls="", marker=m, color=c, mec="#222222", mew=0.5, ms=7,
                        label=name.replace("_", " ") + " (strip under each panel)")
                 for name, (m, c, _) in MARKS.items())]
    fig.legend(handles=handles, loc="outside lower center", ncols=-(-len(handles) // 2),
               fontsize="small")


def _panels(fig: GateFigure, n: int, cols: int) -> list[tuple[Axes, Axes]]:
    """Per type: an accuracy axes over a thin decision strip, all on one epoch axis."""
    rows = max(1, -(-n // cols))
    grid = fig.add_gridspec(rows, min(cols, n))
    out: list[tuple[Axes, Axes]] = []
    for i in range(n):  # the strip about 0.6 inch high whatever the number of rows
        pair = grid[i // grid.ncols, i % grid.ncols].subgridspec(
            2, 1, height_ratios=(max(1.5, 6 / rows), 1), hspace=0.0)
        first = out[0] if out else None
        acc = fig.add_subplot(pair[0], sharex=first[0] if first else None,
                              sharey=first[0] if first else None)
        strip = fig.add_subplot(pair[1], sharex=acc, sharey=first[1] if first else None)
        out.append((acc, strip))
    return out


@styled
def plot_training_curve(curve: pl.DataFrame, cols: int = 4, *,
                        n_heldout: Mapping[str, int] | None = None,
                        run: str | None = None) -> GateFigure:
    """One panel per type: true (line) and measured held-out (dashed) accuracy per epoch,
    and under it a strip with each epoch's accepts, provisional applications and rollbacks.
    ``n_heldout`` (units per type, e.g. from `vtrm_gate.harness.read_heldout`) goes in each
    panel's title: the count its measured rate comes from (under 5: drawn faint). ``run``
    (e.g. "seed 2, 3 epochs × 5 steps") ends the title."""
    _check_curve(curve, cols)
    types = curve["task_type"].unique(maintain_order=True).to_list()
    fig = new_figure(SLIDE)
    panels = _panels(fig, len(types), cols)
    epochs = sorted(set(curve["epoch"].to_list()))
    held = n_heldout or {}
    for (acc, strip), t in zip(panels, types, strict=True):
        d = curve.filter(pl.col("task_type") == t).sort("epoch")
        _curve_panel(acc, t, d, held.get(t))
        _decision_strip(strip, d)
    acc0 = panels[0][0]
    acc0.set_xticks(epochs)
    acc0.set_xlim(epochs[0] - 0.25, epochs[-1] + 0.45)  # room for the last epoch's "×k"
    ncols = min(cols, len(types))
    for i, (_, strip) in enumerate(panels):  # the lowest panel of each column
        if i + ncols >= len(types):
            strip.set_xlabel("epoch (0 = initial skills)", fontsize="small")
        else:
            strip.tick_params(labelbottom=False)
    fig.supylabel("accuracy", fontsize="small")
    _legend(fig, any(held.get(t, FEW_HELD_OUT) < FEW_HELD_OUT for t in types))
    fig.suptitle(_wrapped(f"Training run{f' ({run})' if run else ''}: {_curve_claim(curve)}"),
                 x=0.01, ha="left")
    return fig


TITLE_CHARS = 112
"""A title line's characters at most: a 1280-pixel figure's width in the deck's font."""


def _wrapped(text: str) -> str:
    """``text`` in lines of at most `TITLE_CHARS` (its own line breaks kept): a long claim
    ran off the figure (a 12-type run's training curve, 14 px past its edge)."""
    return "\n".join(line for part in text.split("\n")
                     for line in textwrap.wrap(part, TITLE_CHARS, break_on_hyphens=False)
                     or [""])


CURVE_COLUMNS = ("epoch", "task_type", "true", "measured", "accepted", "provisional",
                 "rolled_back")
"""What `plot_training_curve` reads of its frame (`vtrm_gate.sim.training_curve`'s)."""


def _check_curve(curve: pl.DataFrame, cols: int) -> None:
    """A curve the figure can draw and title truthfully: its columns, a row at most per
    (epoch, type), some rows; ``cols`` panels a row."""
    if not is_whole(cols) or cols < 1:
        raise ValueError(f"cols must be an integer >= 1, got {cols!r}")
    missing = [c for c in CURVE_COLUMNS if c not in curve.columns]
    if missing:
        raise ValueError(f"curve: missing column {missing[0]!r} (a frame of "
                         f"vtrm_gate.sim.training_curve has {list(CURVE_COLUMNS)})")
    if curve.height == 0:
        raise ValueError("curve: no rows")
    twice = curve.filter(pl.struct("epoch", "task_type").is_duplicated())
    if twice.height:
        e, t = twice.select("epoch", "task_type").row(0)
        raise ValueError(f"curve: epoch {e} of {t!r} twice (one row per epoch and type)")


def _curve_claim(curve: pl.DataFrame) -> str:
    """The title's claim: the mean accuracy from the first epoch to the last over the types
    measured at both (NaN counts as unmeasured), and how many of them improved by > 1 pt."""
    y = "true" if curve["true"].fill_nan(None).null_count() < curve.height else "measured"
    what = "true" if y == "true" else "held-out"
    d = curve.select("epoch", "task_type", pl.col(y).fill_nan(None).alias("v")).drop_nulls()
    if d.height == 0:
        return f"no {what} accuracy measured yet"
    first, last = cast(int, d["epoch"].min()), cast(int, d["epoch"].max())
    end = d.filter(pl.col("epoch") == last)
    both = end.join(d.filter(pl.col("epoch") == first), on="task_type", suffix="_0")
    if first == last or both.height == 0:
        return (f"mean {what} accuracy {cast(float, end['v'].mean()):.1%} at epoch {last} "
                f"({_types(end.height)})")
    left_out = curve["task_type"].n_unique() - both.height
    up = both.filter(pl.col("v") > pl.col("v_0") + 0.01).height
    note = f"\n({_types(left_out)} without both ends left out)" if left_out else ""
    return (f"mean {what} accuracy {cast(float, both['v_0'].mean()):.1%} → "
            f"{cast(float, both['v'].mean()):.1%} over epochs {first}–{last}; {up} of "
            f"{both.height} types improved{note}")


def _types(n: int) -> str:
    return f"{n} type{'' if n == 1 else 's'}"


@styled
def plot_phase_times(old: Mapping[str, float] | None, new: Mapping[str, float], *,
                     unit: str = "simulated hours (virtual clock)",
                     run: str | None = None, rerun: str | None = None) -> GateFigure:
    """Side-by-side bars: hours per phase, old serial (grey) vs v3 (blue); ``old`` None (a
    real run, no simulator to replay the old gate on): v3's bars alone. The title's speed-up
    is the run's total time ratio, named with ``run`` (e.g. "seed 2, 3 epochs × 5 steps");
    ``rerun`` names steps whose v3 time is a re-run's, which gets no ratio."""
    _check_phases(old, new)
    fig = new_figure(SLIDE)
    ax = fig.subplots()
    phases = list(new)
    x = np.arange(len(phases))
    series: list[tuple[float, Mapping[str, float], str, str]] = (
        [(-0.2, old, "old serial gate and phases", OLD)] if old is not None else [])
    series.append((0.2 if series else 0.0, new, "v3: one shared slot pool", V3))
    for dx, times, label, colour in series:
        bars = ax.bar(x + dx, [times[p] / 3600 for p in phases], 0.4, label=label,
                      color=colour, gid=f"phase:{label}")
        ax.bar_label(bars, fmt="%.1f h", padding=2)
    ax.set_xticks(x, phases)
    ax.set_xlabel("phase of the training run (summed over every step and epoch)")
    ax.set_ylabel(unit)
    tot_o, tot_n = sum((old or {}).values()) / 3600, sum(new.values()) / 3600
    which = f" ({run})" if run else ""
    if rerun and old is not None:
        title = (f"No speed-up to read{which}: v3's time of {rerun} is a re-run's (its base "
                 f"arm from the BaselineCache),\nthe old gate's a replay from scratch: "
                 f"{tot_n:.1f} h vs {tot_o:.1f} h are not like for like")
    elif tot_n and old is not None:
        title = (f"The training run{which} takes {tot_n:.1f} h with v3 vs {tot_o:.1f} h with "
                 f"the old serial gate\n×{tot_o / tot_n:.1f} = old total / v3 total, simulated "
                 f"hours of every phase{_no_eval(old, new)}")
    else:
        title = f"The training run{which} takes {tot_n:.2f} h with v3 (time per phase)"
    ax.set_title(title, loc="left")
    ax.legend(loc="upper right")
    ax.set_ylim(0, max([*(old or {}).values(), *new.values(), 1.0]) / 3600 * 1.12)
    return fig


def _no_eval(old: Mapping[str, float] | None, new: Mapping[str, float]) -> str:
    """The speed-up without the evaluation phase, which the old loop never ran (its bar is
    v3's held-out evaluation replayed serially)."""
    if old is None or not old.get("evaluation") or "evaluation" not in new:
        return ""
    o, n = sum(old.values()) - old["evaluation"], sum(new.values()) - new["evaluation"]
    return (f"\n×{o / n:.1f} without the evaluation, which the old loop never ran (its bar: "
            f"v3's evaluation run serially)" if n > 0 else "")


def _check_phases(old: Mapping[str, float] | None, new: Mapping[str, float]) -> None:
    """Seconds per phase the figure can draw and divide: the same phases on both sides (a
    phase only in one would move the claimed speed-up without a bar), each a finite
    number >= 0."""
    if old is not None:
        only = {"old": sorted(set(old) - set(new)), "new": sorted(set(new) - set(old))}
        side = "old" if only["old"] else "new" if only["new"] else None
        if side is not None:
            raise ValueError(f"old and new must name the same phases: {only[side][0]!r} only "
                             f"in {side}")
    for side, times in (("old", old or {}), ("new", new)):
        for p, v in times.items():
            if not (is_real(v) and v >= 0):
                raise ValueError(f"{side}[{p!r}] must be a finite number of seconds >= 0, got "
                                 f"{v!r}")


@styled
def plot_power_frontier(result: Mapping[str, Any]) -> GateFigure:
    """Final true accuracy against simulated training time, one point per configuration
    with 95% seed-level intervals on both axes (`benchmarks.bench_power`'s result), the old
    serial gate's point marked. The time axis is broken between the v3 configurations and
    the old gate (one log axis left most of the figure empty), and the accuracy axis spans
    the points; the initial skills and the oracle gate are named in the caption."""
    fig = new_figure(SLIDE)
    summary = [*result["summary"], *_futile_free_point(result)]
    old, rec = result["old"], result["recommended"]
    near, far = fig.subplots(1, 2, sharey=True, width_ratios=(5, 1))
    fig.get_layout_engine().set(wspace=0.01)  # type: ignore[union-attr,call-arg]  # constrained
    for ax in (near, far):
        _frontier_errorbars(ax, summary, old, rec)
    _break_time_axis(near, far, summary, old)
    lo = min(100 * e["accuracy"][1] for e in summary)
    hi = max(100 * e["accuracy"][2] for e in summary)
    near.set_ylim(lo - 0.1 * (hi - lo), hi + 0.1 * (hi - lo))
    near.set_ylabel("final true accuracy (points, mean over 12 types)")
    near.set_xlabel("simulated training time, hours (every phase but the held-out evaluation)")
    far.set_xlabel("old gate, hours")
    fig.suptitle(_frontier_claim(result, summary), x=0.01, ha="left")
    handles, labels = near.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize="small",
               title=_frontier_caption(result, summary), title_fontsize="small")
    return fig


def _frontier_errorbars(ax: Axes, summary: list[dict[str, Any]], old: str, rec: str) -> None:
    """Every configuration's point with its intervals (drawn on both halves of the axis)."""
    # type colours, less the teal too close to the 6-epoch point's green
    others = iter([c for c in TYPE_COLOURS if c != "#009988"] * 2)
    for e, label in _frontier_points(summary, rec):
        (x, x0, x1), (y, y0, y1) = e["wall_h"], e["accuracy"]
        is_old, is_default = e["config"] == old, "(default)" in e["config"]
        longer = "epochs" in e["config"]  # the saved time spent on more training
        free = e.get("futile_cooldown") is False
        ax.errorbar([x], [100 * y], xerr=[[x - x0], [x1 - x]],
                    yerr=[[100 * (y - y0)], [100 * (y1 - y)]],
                    fmt="s" if is_old else "*" if longer else "^" if free else "o",
                    color=OLD if is_old else V3 if is_default else FUTILE_FREE_COLOUR
                    if free else EXIT_COLOURS["ACCEPT"] if longer else next(others),
                    markersize=16 if longer else 11 if is_old or is_default or free else 7,
                    capsize=3, label=label)
    ax.grid(True, alpha=0.4)


def _break_time_axis(near: Axes, far: Axes, summary: list[dict[str, Any]], old: str) -> None:
    """Left: the v3 configurations' hours; right: the old gate's; diagonal marks at the
    break."""
    def span(entries: list[dict[str, Any]]) -> tuple[float, float]:
        lo = min(e["wall_h"][1] for e in entries)
        hi = max(e["wall_h"][2] for e in entries)
        pad = 0.08 * max(hi - lo, 1.0)
        return lo - pad, hi + pad

    v3 = [e for e in summary if e["config"] != old] or summary
    near.set_xlim(*span(v3))
    far.set_xlim(*span([e for e in summary if e["config"] == old] or summary))
    from matplotlib.ticker import MaxNLocator

    far.xaxis.set_major_locator(MaxNLocator(2, integer=True))
    near.spines["right"].set_visible(False)
    far.spines["left"].set_visible(False)
    far.tick_params(left=False)
    d: dict[str, Any] = dict(marker=[(-1, -1.5), (1, 1.5)], markersize=10, linestyle="none",
                             color=BOUND, mec=BOUND, mew=1, clip_on=False)
    near.plot([1, 1], [0, 1], transform=near.transAxes, **d)
    far.plot([0, 0], [0, 1], transform=far.transAxes, **d)


def _futile_free_point(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`bench_power`'s ``cooldown`` section on the frontier's seeds as one more point (none
    when the result has no such section)."""
    front = (result.get("cooldown") or {}).get("frontier")
    if not front:
        return []
    points = [{**front, "config": result["cooldown"]["config"]}]
    if front.get("six_epochs"):  # both uses of the speed at once
        points.append(front["six_epochs"])
    return [{"config": f"{p['config']} (opt-in)", "futile_cooldown": False,
             **{k: p[k] for k in ("seeds", "accuracy", "wall_h", "vs_old")}} for p in points]


def _frontier_points(summary: list[dict[str, Any]], rec: str) -> list[tuple[dict[str, Any], str]]:
    """Each configuration to draw with its legend label; one measured exactly like an earlier
    one (the best fixed λ when it is the default's) joins that point's label instead of
    hiding it."""
    points: list[tuple[dict[str, Any], list[str]]] = []
    for e in summary:
        name = e["config"] + (" (chosen on the tuning seeds)" if e["config"] == rec else "")
        same = next((p for p in points if (p[0]["wall_h"], p[0]["accuracy"])
                     == (e["wall_h"], e["accuracy"])), None)
        if same is None:
            points.append((e, [name]))
        else:
            same[1].append(name)
    return [(e, " = ".join(names)) for e, names in points]


def _frontier_claim(result: Mapping[str, Any], summary: list[dict[str, Any]]) -> str:
    """The frontier's title: the default first (how much faster v3 trains than the old gate,
    at what difference in final accuracy, and what the saved time buys spent on more epochs),
    then the opt-in without FUTILE's cooldown; differences from the old gate paired by seed
    where the result has them (from the result, never hard-coded)."""
    by = {e["config"]: e for e in summary}
    old = by.get(result["old"])
    default = next((e for e in summary if "(default)" in e["config"]), None)
    runs = f"{result['seeds']} seeds"
    if old is None or default is None or not default["wall_h"][0]:
        return f"Final accuracy against training time ({runs}, 95% intervals over seeds)"

    def vs_old(e: dict[str, Any]) -> str:
        paired = e.get("delta_vs_old") or e.get("vs_old")
        if paired is None:
            return _signed(100 * (e["accuracy"][0] - old["accuracy"][0]))
        d, lo, hi = (100 * v for v in paired)
        return f"{_signed(d)} [{_signed(lo)}, {_signed(hi)}]"

    def share(e: dict[str, Any]) -> str:
        return f"{100 * e['wall_h'][0] / old['wall_h'][0]:.0f}%"

    speed = old["wall_h"][0] / default["wall_h"][0]
    text = (f"Default v3 trains {speed:.1f}× faster than the old serial gate at "
            f"{vs_old(default)} points")
    longer = next((e for e in summary if "epochs" in e["config"]
                   and e.get("futile_cooldown") is not False), None)
    if longer is not None and longer["wall_h"][0]:
        text += (f", and on twice the epochs ends {vs_old(longer)} from it in {share(longer)} "
                 f"of its time")
    opt = [f"{'both' if 'epochs' in e['config'] else 'no cooldown after FUTILE'}: "
           f"{vs_old(e)} in {share(e)}" for e in summary if e.get("futile_cooldown") is False]
    text += ((f" (opt-in, {'; '.join(opt)})" if opt else "")
             + f"; {runs}, differences paired by seed; bars: each point's 95% interval")
    return _wrapped(text)


CROSSOVER_LINES = {"no_gate": ("no gate (apply every candidate)", SERIES[3], "o", "-"),
                   "old": ("old serial gate", OLD, "s", "-"),
                   "v3": ("v3 gate (default)", V3, "D", "-"),
                   "oracle": ("oracle gate (exactly the truly better ones; cooldown after a "
                              "rejection)", BOUND, "", "--")}
"""Per baseline of `bench_power`'s harmful sweep: legend label, colour, marker, line style."""
FUTILE_FREE_COLOUR = SERIES[1]
"""v3 without FUTILE's cooldown, in the crossover and the frontier alike."""
FUTILE_FREE_LINE = ("v3, no cooldown after FUTILE (opt-in: init --no-futile-cooldown)",
                    FUTILE_FREE_COLOUR, "^", "-")
"""`bench_power`'s ``cooldown`` section on the same shares, when the result has it."""


@styled
def plot_harmful_crossover(result: Mapping[str, Any]) -> GateFigure:
    """Final true accuracy of no gate, the old gate, v3 and the oracle as the share of harmful
    candidates grows, with 95% seed-level intervals, and the share from which v3 beats
    applying every candidate (`benchmarks.bench_power`'s ``harmful_sweep``)."""
    sweep: Mapping[str, Any] = result["harmful_sweep"]
    fig = new_figure(SLIDE)
    ax = fig.subplots()
    xs = [100 * p["p_harmful"] for p in sweep["points"]]
    lines = {label: (*style, np.array([next(e["accuracy"] for e in p["summary"]
                                            if e["label"] == label) for p in sweep["points"]]))
             for label, style in CROSSOVER_LINES.items()}
    free = _futile_free(result)
    if free is not None:
        lines["futile_free"] = (*FUTILE_FREE_LINE, free[0])
    for label, (name, colour, marker, style, acc) in lines.items():
        ax.fill_between(xs, 100 * acc[:, 1], 100 * acc[:, 2], color=colour, linewidth=0,
                        alpha=0.06 if label == "oracle" else 0.15)
        ax.plot(xs, 100 * acc[:, 0], linestyle=style, marker=marker or None, color=colour,
                lw=2, label=name)
    marks = [("v3", sweep["crossover"].get("v3"), V3, 1, 0.04, _clear_from(sweep, "v3")),
             ("old", sweep["crossover"].get("old"), OLD, -1, 0.08,  # its label to the left
              _clear_from(sweep, "old"))]
    if free is not None and free[1][0] is not None:  # its label left where it fits
        side = -1 if 100 * free[1][0] - min(xs) >= 0.35 * (max(xs) - min(xs)) else 1
        marks.append(("no FUTILE cooldown", free[1], FUTILE_FREE_COLOUR, side, 0.12,
                      _clear_from(sweep, None, result["cooldown"])))
    for mark in marks:
        _crossover_mark(ax, *mark)
    ax.set_xlabel("share of harmful candidates (%; helpful : neutral stays 40 : 35)")
    ax.set_ylabel("final true accuracy (points, mean over 12 types)")
    ax.set_xlim(min(xs) - 1, max(xs) + 1)
    ax.grid(True, alpha=0.4)
    ax.set_title(crossover_claim(sweep, None if free is None else result["cooldown"]),
                 loc="left")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    return fig


def _crossover_mark(ax: Axes, gate: str, cross: list[float | None] | None, colour: str,
                    side: int, y: float, clear: float | None) -> None:
    """Where ``gate``'s mean overtakes no gate: a dotted line, its 95% interval as a bar
    under the label, and the share from which its interval clears zero."""
    c, lo, hi = cross or (None, None, None)
    if c is None:
        return
    ax.axvline(100 * c, color=colour, linestyle=":", lw=1.5)
    end = c  # the label starts where the interval's bar ends, on the bar's line
    if lo is not None and hi is not None:
        ax.plot([100 * lo, 100 * hi], [y] * 2, transform=ax.get_xaxis_transform(),
                color=colour, lw=4, alpha=0.5, solid_capstyle="butt", gid=f"cross:{gate}")
        end = hi if side > 0 else lo
    sure = "" if clear is None else f" (95% CI > 0 from {100 * clear:.0f}%)"
    ax.annotate(f"{gate}: {100 * c:.0f}%{sure}", (100 * end, y),
                xycoords=("data", "axes fraction"), xytext=(4 * side, 0),
                textcoords="offset points", color=colour, fontsize="small", va="center",
                ha="left" if side > 0 else "right")


def _clear_from(sweep: Mapping[str, Any], label: str | None,
               cooldown: Mapping[str, Any] | None = None) -> float | None:
    """The smallest share from which ``label``'s 95% interval of its difference from no gate
    lies above zero at every larger share (``cooldown``: v3 without FUTILE's cooldown), or
    None. The crossover marks where the mean turns; this is where the seeds are sure."""
    shares = [p["p_harmful"] for p in sweep["points"]]
    if cooldown is not None:
        lows = [cooldown["worlds"][f"p_harmful {s:.1f}"]["vs_no_gate"][1] for s in shares]
    else:
        lows = [next(e["vs_no_gate"][1] for e in p["summary"] if e["label"] == label)
                for p in sweep["points"]]
    out = None
    for share, low in zip(reversed(shares), reversed(lows), strict=True):
        if low is None or low <= 0:
            break
        out = share
    return out


def _futile_free(result: Mapping[str, Any]) -> tuple[np.ndarray, list[float | None]] | None:
    """The ``cooldown`` section's accuracy per share of the harmful sweep (mean, low, high)
    and its crossover, or None when the result has no such section."""
    cool = result.get("cooldown")
    if not cool:
        return None
    worlds = cool["worlds"]
    keys = [f"p_harmful {p['p_harmful']:.1f}" for p in result["harmful_sweep"]["points"]]
    if not all(k in worlds for k in keys):
        return None
    return np.array([worlds[k]["accuracy"] for k in keys]), cool["crossover"]


def crossover_claim(sweep: Mapping[str, Any], cooldown: Mapping[str, Any] | None = None
                    ) -> str:
    """The title: where v3 starts beating no gate (with its interval), and the gap at both
    ends of the sweep; with `bench_power`'s ``cooldown`` section, what v3 gains across the
    sweep when FUTILE charges no cooldown, and where it then beats no gate (from the result,
    never hard-coded)."""
    if cooldown is not None:
        return _cooldown_claim(sweep, cooldown)
    pts = sweep["points"]

    def gap(p: Mapping[str, Any]) -> float:
        return 100 * next(e["vs_no_gate"][0] for e in p["summary"] if e["label"] == "v3")

    first, last = pts[0], pts[-1]
    ends = (f"at {100 * first['p_harmful']:.0f}% harmful v3 is {gap(first):+.1f} points vs "
            f"no gate, at {100 * last['p_harmful']:.0f}% {gap(last):+.1f}").replace("-", "−")
    c, lo, hi = sweep["crossover"]["v3"]
    runs = f"{sweep['seeds']} seeds per point, 3 × 5 runs, 95% intervals over seeds"
    if c is None:
        return f"v3 never beats applying every candidate up to {100 * last['p_harmful']:.0f}% " \
               f"harmful ({ends})\n{runs}"
    span = "" if lo is None or hi is None else f" [95%: {100 * lo:.0f}–{100 * hi:.0f}%]"
    old = (sweep["crossover"].get("old") or [None])[0]
    also = "" if old is None else f" (the old gate: ≥ {100 * old:.0f}%)"
    return (f"v3 beats applying every candidate once ≥ {100 * c:.0f}%{span} of candidates "
            f"are harmful{also}\n({ends}; {runs})")


def _cooldown_claim(sweep: Mapping[str, Any], cooldown: Mapping[str, Any]) -> str:
    """The crossover title when the sweep also ran v3 without FUTILE's cooldown: the default
    first (where it overtakes no gate, and how it stands against the old gate at every
    share), then what the opt-in changes."""
    worlds = [cooldown["worlds"][f"p_harmful {p['p_harmful']:.1f}"] for p in sweep["points"]]
    gain = [100 * w["vs_v3"][0] for w in worlds]
    old_v3 = [next(e["vs_v3"] for e in p["summary"] if e["label"] == "old")
              for p in sweep["points"]]
    v3_old = [-100 * d[0] for d in old_v3]
    sure = sum(1 for d in old_v3 if d[1] > 0 or d[2] < 0)  # its interval excludes 0

    def at(cross: list[float | None] | None) -> str:
        c, lo, hi = cross or (None, None, None)
        if c is None:
            return "never on the grid"
        span = "" if lo is None or hi is None else f" [{100 * lo:.0f}–{100 * hi:.0f}%]"
        return f"at {100 * c:.0f}%{span}"

    lo, hi = min(v3_old), max(v3_old)
    stand = (f"trails the old gate by {-hi:.1f}–{-lo:.1f} points" if hi < 0 else
             f"is {_signed(lo)} to {_signed(hi)} points from the old gate")
    old = (sweep["crossover"].get("old") or [None])[0]
    also = "" if old is None else f" (old gate {100 * old:.0f}%)"
    text = (f"Default v3 overtakes no gate {at(sweep['crossover'].get('v3'))} harmful{also} "
            f"and {stand} at every share (paired, the interval excluding 0 at {sure} of "
            f"{len(old_v3)}). Opt-in, no cooldown after FUTILE: {_signed(min(gain))} to "
            f"{_signed(max(gain))} over the default, overtakes no gate "
            f"{at(cooldown['crossover'])}; {sweep['seeds']} seeds, 95% intervals")
    return _wrapped(text)


def _signed(x: float) -> str:
    """``x`` with its sign, a minus sign for a negative one."""
    return f"{x:+.1f}".replace("-", "−")


PROGRESS_BARS = (("accepted", EXIT_COLOURS["ACCEPT"], "ACCEPTed"),
                 ("provisional", EXIT_COLOURS["PROVISIONAL"], "PROVISIONAL (on probation)"),
                 ("kept", V3, "kept by a settlement"), ("rolled_back", BAD, "rolled back"))


@styled
def plot_train_progress(points: pl.DataFrame) -> GateFigure:
    """A training run so far, one x position per finished step, settlement and evaluation
    (`TrainCurveView.frame`): above, the mean true accuracy of the standing skills
    (simulated) and the held-out accuracy each evaluation measured; below, each point's
    decisions."""
    points = points.sort("i")  # the run's order, whatever order the frame's rows are in
    fig = new_figure(SLIDE)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    x = points["i"].to_numpy()
    true = points["true"].cast(pl.Float64).to_numpy()
    if points.height and points["true"].null_count() < points.height:
        top.plot(x, 100 * true, "-o", color=V3, lw=2, ms=4, label="mean true accuracy "
                 "(simulator)")
    ev = points.filter(pl.col("measured").is_not_null())
    if ev.height:
        top.plot(ev["i"], 100 * ev["measured"], "--s", color=MUTED, lw=1.6, ms=6,
                 label="held-out accuracy (measured at each epoch's end)")
    top.set_ylabel("accuracy, %")
    top.grid(True, alpha=0.4)
    if top.lines:
        top.legend(loc="best")
    bottom_ = np.zeros(points.height)
    for name, colour, label in PROGRESS_BARS:
        ys = points[name].fill_null(0).to_numpy()
        bottom.bar(x, ys, 0.7, bottom=bottom_, color=colour, label=label, gid=f"bar:{name}")
        bottom_ = bottom_ + ys
    bottom.set_ylabel("types")
    bottom.set_xlabel("the start, then finished steps, settlements (s) and evaluations (e)")
    bottom.legend(loc="upper left", ncols=4, fontsize="small")
    bottom.set_ylim(0, max(bottom_.max(initial=0), 1) * 1.6)
    ticks = [(i, f"e{e}s{s}" if k == "step" else "start" if k == "start" else k[0])
             for i, k, e, s in points.select("i", "kind", "epoch", "step").iter_rows()]
    if ticks:
        step = max(1, len(ticks) // 24)  # at most ~24 labels
        bottom.set_xticks([i for i, _ in ticks[::step]], [t for _, t in ticks[::step]],
                          fontsize="small", rotation=90)
    top.set_title(_progress_claim(points), loc="left")
    return fig


def _progress_claim(points: pl.DataFrame) -> str:
    """The title: where the run is and how accuracy moved so far."""
    last = points.row(-1, named=True) if points.height else {"kind": "start"}
    if last["kind"] == "start":
        return "Training run: waiting for the first step"
    where = (f"e{last['epoch']} s{last['step']}" if last["kind"] == "step"
             else f"epoch {last['epoch']} {'settled' if last['kind'] == 'settle' else 'evaluated'}")
    true = points["true"].drop_nulls()
    if true.len():
        return (f"Training run after {where}: mean true accuracy {true[0]:.1%} → "
                f"{true[-1]:.1%} over {points.height - 1} steps, settlements and "
                f"evaluations")  # "(9 points)" read as a 9-point gain
    measured = points["measured"].drop_nulls()
    if measured.len():
        return f"Training run after {where}: held-out accuracy {measured[-1]:.1%}"
    return f"Training run after {where}"


def _frontier_caption(result: Mapping[str, Any], summary: list[dict[str, Any]]) -> str:
    """What the frontier's speed-up is (its definition and runs) and where the initial
    skills and the oracle gate lie (off the accuracy axis)."""
    by = {e["config"]: e for e in summary}
    old = by.get(result["old"])
    default = next((e for e in summary if "(default)" in e["config"]), None)
    init, oracle = (100 * result[k][0] for k in ("initial", "oracle"))
    where = f"initial skills {init:.1f} points, oracle gate {oracle:.1f}"
    if old is None or default is None or not default["wall_h"][0]:
        return where
    speed = old["wall_h"][0] / default["wall_h"][0]
    return (f"{speed:.1f}× = the old gate's mean simulated training time / the default v3's "
            f"({result['epochs']} × {result['steps']} steps, {result['seeds']} seeds); {where}; "
            f"time axis broken")
