"""Figures of a training run: the training curve per type and the time per phase.

Object API only (like the other figures): each ``plot_*`` returns a Figure; save it with
`vtrm_gate.views.save`.
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl
from matplotlib.figure import Figure

MARKS = {"accepted": ("^", "tab:green"), "provisional": ("D", "tab:olive"),
         "rolled_back": ("v", "tab:red")}


def plot_training_curve(curve: pl.DataFrame, cols: int = 4) -> Figure:
    """One panel per type: true (line) and measured held-out (dashed) accuracy per epoch,
    with markers for the epoch's accepts, provisional applications and rollbacks."""
    types = curve["task_type"].unique(maintain_order=True).to_list()
    rows = max(1, -(-len(types) // cols))
    fig = Figure(figsize=(12.8, 7.2), layout="constrained")  # a slide at 100 dpi
    axes = fig.subplots(rows, min(cols, len(types)), squeeze=False, sharex=True)
    for ax, t in zip(axes.flat, types, strict=False):
        d = curve.filter(pl.col("task_type") == t).sort("epoch")
        ax.plot(d["epoch"], d["true"], "-", color="tab:blue", label="true")
        ax.plot(d["epoch"], d["measured"], "--", color="tab:gray", label="measured (held out)")
        # Markers side by side within the epoch so an application and its rollback in the
        # same epoch never hide each other.
        for k, (name, (m, c)) in enumerate(MARKS.items()):
            hit = d.filter(pl.col(name) > 0)
            if hit.height:
                ax.scatter(hit["epoch"] + (k - 1) * 0.12, hit["true"], marker=m, color=c,
                           zorder=3, label=name.replace("_", " "))
        ax.set_title(t, fontsize=10)
        ax.set_ylim(0, 1)
        ax.set_xticks(sorted(set(d["epoch"].to_list())))
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(types):]:
        ax.set_visible(False)
    seen: dict[str, object] = {}  # one legend entry per label, over every panel
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncols=5,
               fontsize=8)
    first, last = curve["epoch"].min(), curve["epoch"].max()
    t0 = curve.filter(pl.col("epoch") == first)["true"].mean()
    t1 = curve.filter(pl.col("epoch") == last)["true"].mean()
    up = curve.filter(pl.col("epoch") == last).join(
        curve.filter(pl.col("epoch") == first), on="task_type", suffix="_0").filter(
        pl.col("true") > pl.col("true_0") + 0.01).height
    fig.suptitle(f"Training run: mean true accuracy {t0:.1%} → {t1:.1%} over {last} epochs; "
                 f"{up} of {len(types)} types improved (epoch 0 = initial skills; dashed = "
                 f"measured on the held-out split)", fontsize=11)
    return fig


def plot_phase_times(old: Mapping[str, float], new: Mapping[str, float]) -> Figure:
    """Side-by-side bars: simulated hours per phase, old serial vs v3."""
    fig = Figure(figsize=(12.8, 7.2), layout="constrained")  # a slide at 100 dpi
    ax = fig.subplots()
    phases = list(new)
    x = range(len(phases))
    for dx, times, label in ((-0.2, old, "old serial"), (0.2, new, "v3")):
        bars = ax.bar([i + dx for i in x], [times[p] / 3600 for p in phases], 0.4, label=label)
        ax.bar_label(bars, fmt="%.1f h", fontsize=9)
    ax.set_xticks(list(x), phases)
    ax.set_ylabel("simulated hours")
    tot_o, tot_n = sum(old.values()) / 3600, sum(new.values()) / 3600
    ax.set_title(f"Training run time per phase: old {tot_o:.1f} h vs v3 {tot_n:.1f} h "
                 f"({tot_o / tot_n:.1f}x)" if tot_n else "Training run time per phase",
                 fontsize=12)
    ax.legend()
    return fig


def plot_power_frontier(result: Mapping[str, object]) -> Figure:
    """Final true accuracy against simulated training time, one point per configuration
    with 95% seed-level intervals on both axes (`benchmarks.bench_power`'s result), the old
    serial gate's point marked, the initial skills and the oracle gate as lines."""
    fig = Figure(figsize=(12.8, 7.2), layout="constrained")  # a slide at 100 dpi
    ax = fig.subplots()
    summary = list(result["summary"])  # type: ignore[call-overload]
    old, rec = result["old"], result["recommended"]
    others = iter(["tab:blue", "tab:orange", "tab:purple", "tab:brown", "tab:pink",
                   "tab:gray", "tab:olive", "tab:cyan", "navy", "gold"] * 2)
    for e in summary:
        (x, x0, x1), (y, y0, y1) = e["wall_h"], e["accuracy"]
        is_old, is_rec = e["config"] == old, e["config"] == rec
        ax.errorbar([x], [100 * y], xerr=[[x - x0], [x1 - x]],
                    yerr=[[100 * (y - y0)], [100 * (y1 - y)]], fmt="s" if is_old else "o",
                    color="tab:red" if is_old else "tab:green" if is_rec else next(others),
                    markersize=11 if is_old or is_rec else 7, capsize=3,
                    label=e["config"] + (" (recommended)" if is_rec else ""))
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    ticks = [t for t in (2, 5, 10, 20, 50, 100, 200, 500) if lo <= t <= hi]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    for key, style, name in (("initial", ":", "initial skills"), ("oracle", "--",
                                                                    "oracle gate")):
        y = 100 * result[key][0]  # type: ignore[index]
        ax.axhline(y, linestyle=style, color="tab:gray")
        ax.annotate(f"{name} {y:.1f}", (0.01, y), xycoords=("axes fraction", "data"),
                    ha="left", va="bottom", fontsize=9, color="tab:gray")
    ax.set_xlabel("simulated wall time of training, hours (log scale; rollout + evolution + "
                  "gate + settlement)")
    ax.set_ylabel("final true accuracy (points, mean over 12 types)")
    ax.set_title(f"What the speed-up buys: {result['seeds']} seeds x {result['epochs']} epochs x "
                 f"{result['steps']} steps (95% bootstrap intervals over seeds)", fontsize=12)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig
