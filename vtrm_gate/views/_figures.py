"""matplotlib figures shared by the notebooks, the live view and the CLI.

Object API only: every ``plot_*`` draws on the ``ax`` it is given or on a new `GateFigure`
and returns that Figure. pyplot is never imported and the backend is never changed, so this
module works the same in a Jupyter kernel, a headless CI run and a worker thread. A
`GateFigure` displays itself in a notebook as a PNG (``_repr_png_``): no ``%matplotlib``
magic needed. Design-review figures put their claim, with numbers, in the title and are
sized for a 1280×720 slide (`SLIDE`, saved at 100 dpi).
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import polars as pl
from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.lines import Line2D

from ..stats import (
    Action,
    FalseAcceptCurve,
    GateParams,
    TypeOutcome,
    UnitsCurve,
    false_accept_curve,
    operating_characteristics,
)
from ._frames import EFFECT, oc_grid

F = TypeVar("F", bound=Callable[..., Any])

EXIT_MARKERS: dict[Action, str] = {
    Action.ACCEPT: "^",
    Action.PROVISIONAL: "D",
    Action.INERTIA: "o",
    Action.FUTILE: "X",
    Action.REJECT: "v",
}
"""Decision marker shape per exit (the colour is the type's); CONTINUE has none."""

E_FLOOR = 1e-4
"""E± below this is drawn at the floor (log scale; lambda=1 can make E+ exactly 0)."""

SLIDE = (12.8, 7.2)
"""Design-review figure size in inches: 1280×720 px at `SLIDE_DPI`."""
SLIDE_DPI = 100
SLIDE_RC = {"font.size": 13, "axes.titlesize": 14, "axes.labelsize": 13,
            "legend.fontsize": 12, "xtick.labelsize": 12, "ytick.labelsize": 12,
            "figure.titlesize": 16}
DISPLAY_DPI = 90


class GateFigure(Figure):
    """A Figure that renders itself as a PNG in a notebook, with no pyplot and no magic."""

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=DISPLAY_DPI)
        return buf.getvalue()


def new_figure(figsize: tuple[float, float], layout: str | None = "constrained") -> GateFigure:
    """A `GateFigure` (never registered with pyplot), constrained layout by default."""
    return GateFigure(figsize=figsize, layout=layout)


def _decades(ax: Axes, lo: float, hi: float) -> None:
    """Log-axis ticks at whole decades only, no minor ticks: cheap to lay out and to draw
    (the live view redraws a dozen panels every second)."""
    from matplotlib.ticker import FixedLocator, LogFormatterSciNotation, NullLocator

    exps = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    ax.yaxis.set_major_locator(FixedLocator([10.0 ** e for e in exps]))
    ax.yaxis.set_major_formatter(LogFormatterSciNotation())
    ax.yaxis.set_minor_locator(NullLocator())


def slide(fn: F) -> F:
    """Draw with the slide font sizes (readable at 1280×720)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kw: Any) -> Any:
        with rc_context(SLIDE_RC):
            return fn(*args, **kw)
    return wrapper  # type: ignore[return-value]


def _axes(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.get_figure(), ax  # type: ignore[return-value]
    fig = new_figure(figsize)
    return fig, fig.add_subplot()


def _frame(data: pl.DataFrame | FalseAcceptCurve | UnitsCurve) -> pl.DataFrame:
    return data if isinstance(data, pl.DataFrame) else pl.DataFrame(data.columns())


def _caption(fig: Figure, text: str, width: int = 150) -> None:
    import textwrap

    fig.supxlabel(textwrap.fill(text, width), fontsize="small", color="0.25", ha="center")


# ---- e+ / e- trajectories ----------------------------------------------------------------


@dataclass(frozen=True)
class TrajectorySeries:
    """One type's path: ``e_plus[i]``/``e_minus[i]`` after ``steps[i]`` consumed units."""

    task_type: str
    steps: tuple[int, ...]
    e_plus: tuple[float, ...]
    action: Action = Action.CONTINUE
    e_minus: tuple[float, ...] = ()
    W: int = 0
    L: int = 0
    n_ladder: int = 0


def trajectory_series(outcomes: Mapping[str, TypeOutcome]) -> list[TrajectorySeries]:
    """Series from finished (or replayed) outcomes, sorted by task_type."""
    return [TrajectorySeries(t, tuple(range(1, len(o.trajectory) + 1)),
                             tuple(p.e_plus for p in o.trajectory), o.action,
                             tuple(p.e_minus for p in o.trajectory), o.W, o.L, o.n_ladder)
            for t, o in sorted(outcomes.items())]


def type_colour(i: int) -> tuple[float, float, float, float]:
    """A distinct colour per type index (tab20: dark/light pairs, darks first)."""
    from matplotlib import colormaps

    return colormaps["tab20"]((2 * i) % 20 + (2 * i) // 20)


def _path(s: TrajectorySeries, side: str) -> tuple[list[int], list[float]]:
    vals = s.e_plus if side == "plus" else s.e_minus
    n = min(len(s.steps), len(vals))
    return [0, *s.steps[:n]], [max(y, E_FLOOR) for y in (1.0, *vals[:n])]


def _spread(ys: Sequence[float], gap: float, lo: float = -math.inf,
            hi: float = math.inf) -> list[float]:
    """Label positions at least ``gap`` apart (same units as ``ys``), each group of crowded
    labels centred on its targets' mean, and all within ``[lo, hi]`` (they must fit:
    ``(len(ys) - 1) * gap <= hi - lo``)."""
    order = sorted(range(len(ys)), key=lambda i: ys[i])
    groups: list[tuple[list[int], float]] = []  # (members in order, first one's position)

    def place(members: list[int]) -> float:
        start = sum(ys[i] for i in members) / len(members) - (len(members) - 1) * gap / 2
        return min(max(start, lo), hi - (len(members) - 1) * gap)

    for i in order:
        groups.append(([i], place([i])))
        while len(groups) > 1 and \
                groups[-2][1] + len(groups[-2][0]) * gap > groups[-1][1]:  # they overlap
            members = groups[-2][0] + groups.pop()[0]
            groups[-1] = (members, place(members))
    out = list(ys)
    for members, start in groups:
        for k, i in enumerate(members):
            out[i] = start + k * gap
    return out


def _exit_legend() -> list[Line2D]:
    return [Line2D([], [], marker=m, ls="", color="white", mec="black", mfc="0.6", ms=9,
                   label=str(a)) for a, m in EXIT_MARKERS.items()]


def _ylim(series: Sequence[TrajectorySeries], params: GateParams, sides: Sequence[str]
          ) -> tuple[float, float]:
    ys = [y for s in series for side in sides for y in _path(s, side)[1]]
    top = max([*ys, params.e_confirm, params.e_reject]) * 2.5
    bottom = min([*ys, 1 / 4]) / 2
    return bottom, top


def _height_pt(ax: Axes) -> float:
    """The panel's height in points, less the share the constrained layout will take."""
    return max(ax.get_position().height * ax.get_figure().get_figheight(), 0.5) * 72 * 0.8


def _label_size(ax: Axes, n: int) -> float:
    """The end labels' font size: "small", or less when ``n`` of them would not fit."""
    size = FontProperties(size="small").get_size_in_points()
    return max(min(size, _height_pt(ax) / (1.3 * max(n, 1))), 4.0)


def draw_trajectories(ax: Axes, series: Sequence[TrajectorySeries], params: GateParams,
                      *, title: str | None = "E+ per type (ladder prefix)",
                      side: str = "plus", n_max: int | None = None,
                      label_size: float | None = None) -> None:
    """All types on one log axis: one line per type in its colour, labelled at its end,
    the thresholds, and at each decided type's stop a marker whose shape is the exit."""
    ax.set_yscale("log")
    lo, hi = _ylim(series, params, (side,))
    ax.set_ylim(lo, hi)
    _decades(ax, lo, hi)
    x_max = max([n_max or 0, *(len(s.steps) for s in series), 1])
    ends: list[tuple[float, float, int]] = []
    seen: dict[tuple[int, float], int] = {}
    for i, s in enumerate(series):
        xs, ys = _path(s, side)
        colour = type_colour(i % 20)
        ax.plot(xs, ys, lw=1.6, color=colour, ls=("-", "--", ":")[i // 20 % 3],
                gid=f"trajectory:{s.task_type}", label=s.task_type)
        ends.append((xs[-1], ys[-1], i))
        if s.action in EXIT_MARKERS:
            key = (xs[-1], round(math.log10(ys[-1]), 2))
            dodge = seen.get(key, 0)  # two markers at one point: shift the later ones
            seen[key] = dodge + 1
            ax.scatter([xs[-1] + 0.45 * dodge], [ys[-1]], marker=EXIT_MARKERS[s.action],
                       s=80, color=colour, edgecolor="black", linewidth=0.8, zorder=4,
                       gid=f"decision:{s.action}")
    if side == "plus":
        ax.axhline(params.e_confirm, color="black", lw=1.2, gid="e_confirm")
        ax.text(0.3, params.e_confirm * 1.12, f"ACCEPT needs E+ ≥ e_confirm = "
                f"{params.e_confirm:g} and W − L ≥ {params.w_net_min}", fontsize="small")
        ax.axhline(params.e_provisional, color="black", lw=1.0, ls="--", gid="e_provisional")
        ax.text(0.3, params.e_provisional * 1.12, f"PROVISIONAL at exhaustion: E+ ≥ "
                f"{params.e_provisional:g}", fontsize="small")
        ax.set_ylabel("E+ (accept side, log)")
    else:
        ax.axhline(params.e_reject, color="black", lw=1.2, ls="-.", gid="e_reject")
        ax.text(0.3, params.e_reject * 1.12, f"REJECT: E− ≥ e_reject = {params.e_reject:g}",
                fontsize="small")
        ax.set_ylabel("E− (harm side, log)")
    # labels at the line ends, spread apart (in axes fraction) so they never overlap, and
    # kept inside the panel; a crowd too tall for it gets a smaller font instead
    size = label_size or _label_size(ax, len(ends))
    gap = min(1.3 * size / _height_pt(ax), 1 / max(len(ends), 1))  # n gaps fit the panel
    span = math.log10(hi) - math.log10(lo)
    placed = _spread([(math.log10(y) - math.log10(lo)) / span for _, y, _ in ends], gap,
                     gap / 2, 1 - gap / 2)
    for (x, y, i), fy in zip(ends, placed, strict=True):
        ax.annotate(series[i].task_type, (x, y), xytext=(x_max + 1.2, fy),
                    textcoords=ax.get_xaxis_transform(), fontsize=size,
                    color=type_colour(i % 20), va="center", annotation_clip=False,
                    arrowprops={"arrowstyle": "-", "color": type_colour(i % 20), "lw": 0.6,
                                "alpha": 0.6})
    ax.set_xlim(0, x_max + 0.5)
    ax.set_xlabel("units consumed (ladder order)")
    if title:
        ax.set_title(title, loc="left")
    ax.grid(True, which="major", alpha=0.3)


def draw_overview(fig: Figure, series: Sequence[TrajectorySeries], params: GateParams, *,
                  title: str | None = None, n_max: int | None = None) -> list[Axes]:
    """The tangled overview: E+ of every type on top, E− below, exit shapes in the legend."""
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(1.7, 1.3))
    size = min(_label_size(top, len(series)), _label_size(bottom, len(series)))  # one size
    draw_trajectories(top, series, params, title=title, n_max=n_max, label_size=size)
    draw_trajectories(bottom, series, params, title=None, side="minus", n_max=n_max,
                      label_size=size)
    top.set_xlabel("")
    fig.legend(handles=_exit_legend(), loc="outside lower center", fontsize="small", ncols=5,
               title="marker shape = exit, colour = type", title_fontsize="small",
               frameon=False)
    return [top, bottom]


def draw_type_panels(fig: Figure, series: Sequence[TrajectorySeries], params: GateParams, *,
                     title: str | None = None, n_max: int | None = None) -> list[Axes]:
    """Small multiples: one panel per type with E+ (solid) and E− (dashed) in the type's
    colour, e_confirm, e_reject and e_provisional, and the exit marker at the stop."""
    n = max(len(series), 1)
    ncols = 4 if n > 6 else min(n, 3)
    nrows = math.ceil(n / ncols)
    fig.set_layout_engine(None)  # fixed margins: constrained layout of 12 log panels is slow
    height = fig.get_figheight()
    fig.subplots_adjust(left=0.06, right=0.99, top=1 - (0.75 if title else 0.45) / height,
                        bottom=0.85 / height, hspace=0.75 * nrows / max(height, 1),
                        wspace=0.08)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, sharex=True, sharey=True)).ravel()
    lo, hi = _ylim(series, params, ("plus", "minus"))
    x_max = max([n_max or 0, *(s.n_ladder for s in series), *(len(s.steps) for s in series), 1])
    same = params.e_confirm == params.e_reject
    for i, (ax, s) in enumerate(zip(axes, series, strict=False)):
        colour = type_colour(i % 20)
        ax.set_yscale("log")
        xp, yp = _path(s, "plus")
        xm, ym = _path(s, "minus")
        ax.plot(xp, yp, color=colour, lw=2.0, gid=f"e_plus:{s.task_type}")
        ax.plot(xm, ym, color=colour, lw=1.4, ls="--", gid=f"e_minus:{s.task_type}")
        ax.axhline(params.e_confirm, color="black", lw=0.9, gid="e_confirm")
        if not same:
            ax.axhline(params.e_reject, color="black", lw=0.9, ls="-.", gid="e_reject")
        ax.axhline(params.e_provisional, color="0.45", lw=0.8, ls=":", gid="e_provisional")
        if s.action in EXIT_MARKERS:
            x, y = (xm[-1], ym[-1]) if s.action is Action.REJECT else (xp[-1], yp[-1])
            ax.scatter([x], [y], marker=EXIT_MARKERS[s.action], s=90, color=colour,
                       edgecolor="black", linewidth=0.8, zorder=4, gid=f"decision:{s.action}")
        done = len(s.steps)
        state = "running" if s.action is Action.CONTINUE else str(s.action)
        ax.set_title(f"{s.task_type}\n{state}  W {s.W} L {s.L}  {done}/{s.n_ladder or '?'}",
                     fontsize="small", loc="left")
        ax.grid(True, alpha=0.25)
        ax.set_ylim(lo, hi)
        _decades(ax, lo, hi)
        ax.set_xlim(0, x_max + 1.5)
    for ax in axes[len(series):]:
        ax.set_visible(False)
    for ax in axes[-ncols:]:
        ax.set_xlabel("units consumed", fontsize="small")
    thr = (f"e_confirm = e_reject = {params.e_confirm:g}" if same else
           f"e_confirm = {params.e_confirm:g}")
    handles = [Line2D([], [], color="0.3", lw=2.0, label="E+ (accept side)"),
               Line2D([], [], color="0.3", lw=1.4, ls="--", label="E− (harm side)"),
               Line2D([], [], color="black", lw=0.9, label=thr),
               *([] if same else [Line2D([], [], color="black", lw=0.9, ls="-.",
                                         label=f"e_reject = {params.e_reject:g}")]),
               Line2D([], [], color="0.45", lw=0.8, ls=":",
                      label=f"e_provisional = {params.e_provisional:g}"),
               *_exit_legend()]
    fig.legend(handles=handles, loc="lower center", ncols=5, fontsize="small",
               frameon=False)
    if title:
        fig.suptitle(title, fontsize="medium", x=0.01, ha="left",
                     y=1 - 0.12 / fig.get_figheight(), va="top")
    return list(axes[:len(series)])


def plot_trajectories(outcomes: Mapping[str, TypeOutcome], params: GateParams | None = None,
                      ax: Axes | None = None, *, layout: str = "overview") -> Figure:
    """Per-type trajectories: ``layout="overview"`` (every type on one E+ axis and one E−
    axis; with ``ax``, the E+ axis only) or ``"panels"`` (one small panel per type)."""
    params = params or GateParams()
    series = trajectory_series(outcomes)
    if ax is not None:
        draw_trajectories(ax, series, params, n_max=params.n_max)
        return ax.get_figure()  # type: ignore[return-value]
    if layout == "panels":
        fig = new_figure((12.8, 2.2 * math.ceil(max(len(series), 1) / 4) + 1.6), None)
        draw_type_panels(fig, series, params, n_max=params.n_max)
        return fig
    if layout != "overview":
        raise ValueError(f"layout must be 'overview' or 'panels', got {layout!r}")
    fig = new_figure((11, 7))
    draw_overview(fig, series, params, title="E+ and E− per type (ladder prefix)",
                  n_max=params.n_max)
    return fig


# ---- prefix vs block -----------------------------------------------------------------


@slide
def plot_prefix_vs_block(comparison: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Units consumed per type under the old block replay vs the prefix replay.

    ``comparison`` is `compare_replays` output. Each pair of bars carries
    both decisions; a different label with the same effect on the skill (INERTIA vs FUTILE
    both keep the baseline) is told apart from a different effect.
    """
    fig, ax = _axes(ax, SLIDE)
    rows = comparison.sort("task_type", descending=True)
    y = np.arange(rows.height)
    h = 0.38
    ax.barh(y + h / 2, rows["block_units"], h, color="tab:gray", label="block replay (old)",
            gid="block")
    ax.barh(y - h / 2, rows["prefix_units"], h, color="tab:blue", label="prefix replay (v3)",
            gid="prefix")
    ax.set_yticks(y, rows["task_type"].to_list())
    same_effect = (rows["same_effect"] if "same_effect" in rows.columns
                   else rows["agree"]).to_list()
    for yi, r, eff in zip(y, rows.iter_rows(named=True), same_effect, strict=True):
        if r["agree"]:
            text, colour = f"{r['prefix_action']} (same)", "black"
        elif eff:
            text, colour = (f"{r['block_action']} → {r['prefix_action']}  (same effect: "
                            f"{EFFECT[Action(r['prefix_action'])]})"), "0.35"
        else:
            text, colour = f"{r['block_action']} → {r['prefix_action']}  (differs)", "tab:red"
        ax.text(max(r["block_units"], r["prefix_units"]) + 0.5, yi, text, va="center",
                fontsize="small", color=colour)
    ax.set_xlabel("ladder units consumed (2 inference calls each); label: block → prefix")
    total_b, total_p = int(rows["block_units"].sum()), int(rows["prefix_units"].sum())
    saved = 1 - total_p / total_b if total_b else 0.0
    n_eff = int(sum(bool(e) for e in same_effect))
    ax.set_title(f"Same outcomes: block {total_b} → prefix {total_p} units ({saved:.0%} fewer);"
                 f" same label {int(rows['agree'].sum())}/{rows.height}, same effect on the "
                 f"skill {n_eff}/{rows.height}", loc="left")
    ax.set_xlim(0, max(int(rows["n_ladder"].max() or 1), 1) * 1.75)
    ax.legend(loc="upper right", ncols=2, frameon=False, bbox_to_anchor=(1.0, 1.0))
    ax.set_ylim(-0.7, rows.height + 0.4)
    return fig


# ---- false accept under H0 -----------------------------------------------------------


def false_accept_frame(params: GateParams, correlations: Sequence[float], n_rep: int,
                       seed: int | None = 0, **kw: float) -> pl.DataFrame:
    """`vtrm_gate.stats.false_accept_curve` as a polars frame (long format)."""
    return pl.DataFrame(false_accept_curve(params, correlations, n_rep, seed, **kw).columns())


@slide
def plot_false_accept(curve: pl.DataFrame | FalseAcceptCurve, ax: Axes | None = None) -> Figure:
    """False-accept rate under H0 vs latency/correctness correlation: arrival order (not
    used) vs ladder prefix, with 95% Wilson intervals, the exact rate and 1/e_confirm."""
    fig, ax = _axes(ax, SLIDE)
    df = _frame(curve).sort("correlation")
    bound = float(df["bound"][0])
    pre = df.filter(pl.col("order") == "prefix")
    arr = df.filter(pl.col("order") == "arrival")
    exact = float(df["exact_prefix"][0]) if "exact_prefix" in df.columns else None
    prefix_rate = float(pre["false_accept"][0]) if pre.height else float("nan")
    styles = {"arrival": ("tab:red", "arrival order (not used): consumes results as they "
                                     "complete"),
              "prefix": ("tab:blue", f"ladder prefix (v3): {prefix_rate:.2%} at every "
                                     "correlation (it never looks at latency)")}
    for order, part in (("arrival", arr), ("prefix", pre)):
        if part.is_empty():
            continue
        colour, label = styles[order]
        x = part["correlation"].to_numpy()
        yv = part["false_accept"].to_numpy()
        err = np.vstack([yv - part["ci_low"].to_numpy(), part["ci_high"].to_numpy() - yv])
        ax.fill_between(x, part["ci_low"].to_numpy(), part["ci_high"].to_numpy(),
                        color=colour, alpha=0.3, lw=0, gid=f"band:{order}")
        ax.errorbar(x, yv, yerr=err, fmt="o-", color=colour, capsize=5, lw=2, label=label,
                    gid=f"rate:{order}")
    ax.axhline(bound, color="black", ls="--", gid="bound",
               label=f"Ville's bound 1/e_confirm = {bound:.3g}")
    if exact is not None:
        ax.axhline(exact, color="tab:blue", ls=":", lw=1.5, gid="exact_prefix",
                   label=f"prefix, exact (dynamic programming): {exact:.2%}")
    ax.set_xlabel("correlation of the candidate's log-latency with being wrong")
    ax.set_ylabel("P(ACCEPT) under H0 (false accept)")
    ax.set_ylim(0, min(1.0, max(float(df["ci_high"].max()), bound) * 1.15))
    n_rep, n = int(df["n_rep"][0]), int(df["n_units"][0])
    worst = float(arr["false_accept"].max()) if arr.height else float("nan")
    over = arr.filter(pl.col("ci_low") > bound)
    first = (f"above the bound from correlation {float(over['correlation'].min()):g}"
             if over.height else "never above the bound")
    ax.set_title(f"Arrival order reaches {worst:.0%} false accepts ({first}); "
                 f"the ladder prefix stays at {prefix_rate:.1%} ≤ {bound:.0%}", loc="left")
    half = float((df["ci_high"] - df["ci_low"]).max()) / 2
    _caption(fig, f"H0: p_win = {float(df['p_win'][0]):g}, discordance "
                  f"{float(df['discordance'][0]):g}, {n} units, {n_rep:,} replicates per point "
                  f"(seed {df['seed'][0]}); shaded bars: 95% Wilson intervals, at most "
                  f"±{half:.1%}. The prefix line is flat: the same outcomes are replayed at "
                  f"every correlation and the prefix order ignores latencies.")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", frameon=False)
    return fig


# ---- tokens, makespan, waste ----------------------------------------------------------


@slide
def plot_token_savings(curve: pl.DataFrame | UnitsCurve, *, tokens_per_unit: float | None = None,
                       step_saving: tuple[float, float, int] | None = None,
                       ax: Axes | None = None) -> Figure:
    """Mean units per type vs the candidate's true p_win: no early stop, old block rule,
    v3 prefix rule (``units_curve``). With ``tokens_per_unit``, y is tokens.

    ``step_saving = (saving, discordance, seed)`` of a simulated step is reconciled with the
    Monte Carlo in the caption.
    """
    fig, ax = _axes(ax, SLIDE)
    df = _frame(curve).sort("p_win")
    k = tokens_per_unit or 1.0
    what = "tokens" if tokens_per_unit else "units"
    x = df["p_win"].to_numpy()
    series = (("no_stop_units", "no early stop", "black", "--"),
              ("block_units", "block replay (old)", "tab:gray", "-"),
              ("prefix_units", "prefix (v3)", "tab:blue", "-"))
    for col, label, colour, ls in series:
        if col in df.columns:
            ax.plot(x, df[col].to_numpy() * k, marker="o", ls=ls, color=colour, label=label,
                    lw=2, gid=f"units:{col}")
    no_stop = df["no_stop_units"].to_numpy() * k
    prefix = df["prefix_units"].to_numpy() * k
    savings = 1 - prefix / no_stop
    for xi, b, sv in zip(x, prefix, savings, strict=True):
        ax.annotate(f"−{sv:.0%}", (xi, b), textcoords="offset points", xytext=(0, -20),
                    ha="center", color="tab:blue", fontweight="bold")
    ax.set_ylim(0, float(no_stop.max()) * 1.12)
    ax.set_xlabel("candidate's P(win | discordant pair)")
    ax.set_ylabel(f"{what} consumed per type" + ("" if tokens_per_unit else
                                                 " (2 inference calls each)"))
    disc = float(df["discordance"][0]) if "discordance" in df.columns else float("nan")
    n_units = int(df["n_units"][0]) if "n_units" in df.columns else int(no_stop.max() / k)
    ax.set_title(f"Stopping early saves {savings.min():.0%}–{savings.max():.0%} of {what} "
                 f"at discordance {disc:g} ({n_units}-unit ladders)", loc="left")
    n_rep = int(df["n_rep"][0]) if "n_rep" in df.columns else None
    cap = (f"Monte Carlo, i.i.d. pairs, {n_rep:,} replicates per point. " if n_rep else "")
    if step_saving is not None:
        sv, d, seed = step_saving
        cap += (f"The simulated 12-type step (seed {seed}) saved only {sv:.0%}: its arms share "
                f"per-unit difficulty, so only {d:.0%} of pairs are discordant and most "
                f"types run their ladder to the end.")
    if cap:
        _caption(fig, cap)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower left", frameon=False)
    return fig


def _seq(x: float | Sequence[float]) -> list[float]:
    return [float(x)] if isinstance(x, int | float) else [float(v) for v in x]


@slide
def plot_makespan(old: float | Sequence[float], new: float | Sequence[float],
                  lower_bound: float | Sequence[float], *, labels: Sequence[str] | None = None,
                  unit: str = "h", ax: Axes | None = None) -> Figure:
    """Makespan of a gate step: old serial gate vs v3 continuous gate vs the lower bound.

    Numbers in (one value per scenario, or scalars), so any benchmark can feed it.
    """
    o, n, lb = _seq(old), _seq(new), _seq(lower_bound)
    if not len(o) == len(n) == len(lb):
        raise ValueError(f"old, new and lower_bound need the same length, got "
                         f"{len(o)}, {len(n)}, {len(lb)}")
    labels = list(labels) if labels is not None else (
        ["gate step"] if len(o) == 1 else [f"scenario {i + 1}" for i in range(len(o))])
    if len(labels) != len(o):
        raise ValueError(f"labels has {len(labels)} entries, expected {len(o)}")
    fig, ax = _axes(ax, SLIDE)
    x = np.arange(len(o))
    w = 0.27
    for off, vals, label, colour in ((-w, o, "old: serial types, blocks, arms", "tab:gray"),
                                     (0.0, n, "v3: continuous, 32 shared slots", "tab:blue"),
                                     (w, lb, "lower bound: needed inference / 32",
                                      "tab:green")):
        bars = ax.bar(x + off, vals, w, label=label, color=colour, gid=f"makespan:{label}")
        ax.bar_label(bars, fmt=f"%.2f {unit}", padding=3)
    for xi, a, b in zip(x, o, n, strict=True):
        if b > 0:
            ax.text(xi, max(a, b) * 1.1, f"×{a / b:.1f} faster", ha="center",
                    fontweight="bold")
    ax.set_xticks(x, labels)
    ax.set_ylabel(f"makespan ({unit})")
    ax.set_ylim(0, max(o + n + lb) * 1.25)
    ratio = n[0] / lb[0] if lb[0] else float("nan")
    ax.set_title(f"The continuous gate: {o[0]:.2f} {unit} → {n[0]:.2f} {unit} "
                 f"(×{o[0] / n[0]:.1f} faster), {ratio:.2f}× its lower bound", loc="left")
    ax.legend(loc="upper right", frameon=False)
    return fig


WASTE_PARTS: tuple[tuple[str, str, str], ...] = (
    ("needed_calls", "started up to the stop (needed)", "tab:blue"),
    ("past_stop_calls", "started past the stop (wasted)", "tab:red"),
    ("cache_hits", "base arm from BaselineCache (free)", "tab:green"),
    ("never_started", "never started (saved)", "0.85"),
)


@slide
def plot_waste(calls: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Where each type's 2 × ladder calls went (`call_accounting`):
    every call started past the type's stop rank counts as waste, finished or not."""
    fig, ax = _axes(ax, SLIDE)
    df = calls.sort("task_type", descending=True)
    y = np.arange(df.height)
    left = np.zeros(df.height)
    for col, label, colour in WASTE_PARTS:
        vals = df[col].fill_null(0).to_numpy().astype(float)
        bars = ax.barh(y, vals, left=left, color=colour, label=label, gid=f"waste:{col}")
        if col == "past_stop_calls":
            ax.bar_label(bars, labels=[str(int(v)) if v else "" for v in vals],
                         label_type="center", color="white", fontweight="bold")
        left += vals
    ax.set_yticks(y, df["task_type"].to_list())
    ax.set_xlabel("inference calls (2 per ladder unit: base and candidate arm)")
    started = int(df["started"].sum())
    wasted = int(df["past_stop_calls"].sum())
    share = f"{wasted / started:.1%}" if started else "n/a"
    ax.set_title(f"Waste: {wasted} of {started} started calls ({share}) were past their "
                 f"type's stop rank", loc="left")
    fig.legend(loc="outside upper center", ncols=4, frameon=False, fontsize="small")
    _caption(fig, "Past the stop: started while the type was still undecided, for a unit "
                  "beyond the rank where it stopped; counted whether it finished before the "
                  "freeze or after.")
    return fig


@slide
def plot_call_breakdown(bars: Mapping[str, Mapping[str, float]], *, title: str,
                        xlabel: str = "inference calls", ax: Axes | None = None) -> Figure:
    """Horizontal stacked bars, each part labelled with its count: ``{bar: {part: n}}``."""
    fig, ax = _axes(ax, (12.8, 1.1 * len(bars) + 2.2))
    parts = list(dict.fromkeys(p for b in bars.values() for p in b))
    colours = dict(zip(parts, ("tab:gray", "tab:red", "tab:orange", "tab:blue", "tab:green",
                               "tab:purple", "tab:olive"), strict=False))
    names = list(bars)[::-1]
    y = np.arange(len(names))
    left = np.zeros(len(names))
    for part in parts:
        vals = np.array([float(bars[b].get(part, 0)) for b in names])
        rects = ax.barh(y, vals, left=left, color=colours.get(part, "0.5"), label=part,
                        gid=f"part:{part}")
        ax.bar_label(rects, labels=[f"{int(v):,}" if v else "" for v in vals],
                     label_type="center", color="white", fontweight="bold")
        left += vals
    ax.set_yticks(y, names)
    ax.set_xlabel(xlabel)
    ax.set_title(title, loc="left")
    fig.legend(loc="outside lower center", ncols=min(len(parts), 3), frameon=False)
    return fig


# ---- operating characteristics ---------------------------------------------------------

OC_EXITS: tuple[tuple[str, str], ...] = (
    ("p_accept", "ACCEPT"), ("p_provisional", "PROVISIONAL"), ("p_inertia", "INERTIA"),
    ("p_futile", "FUTILE"), ("p_reject", "REJECT"))


@slide
def plot_operating_characteristics(oc: pl.DataFrame | None = None,
                                   params: GateParams | None = None, *,
                                   p_wins: Sequence[float] | None = None,
                                   discordances: Sequence[float] = (0.5,),
                                   n_units: int | None = None,
                                   claim: tuple[float, float] = (0.8, 0.5)) -> Figure:
    """Exact exit probabilities vs p_win: one panel per exit (SPEC names) plus expected
    units, one line per discordance. The title states P(ACCEPT) at ``claim`` =
    (p_win, discordance) and under H0.

    Pass an `oc_grid` frame, or let it compute one from ``params`` (n_units = n_max).
    """
    params = params or GateParams()
    if oc is None:
        grid = p_wins if p_wins is not None else np.linspace(0.3, 1.0, 15).tolist()
        oc = oc_grid(params, grid, discordances, n_units or params.n_max)
    fig = new_figure(SLIDE)
    axes = fig.subplots(2, 3, sharex=True).ravel()
    discs = sorted(set(oc["discordance"].to_list()))
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    colour = {d: cmap(0.15 + 0.7 * i / max(len(discs) - 1, 1)) for i, d in enumerate(discs)}
    panels = [*OC_EXITS, ("expected_units", "expected units consumed")]
    for ax, (col, name) in zip(axes, panels, strict=True):
        for d in discs:
            part = oc.filter(pl.col("discordance") == d).sort("p_win")
            ax.plot(part["p_win"].to_numpy(), part[col].to_numpy(), color=colour[d], lw=2,
                    marker=".", label=f"discordance {d:g}", gid=f"oc:{col}:{d:g}")
        ax.set_title(name if col == "expected_units" else f"P({name})", loc="left")
        ax.grid(True, alpha=0.3)
        if col != "expected_units":
            ax.set_ylim(0, 1)
        ax.axvline(0.5, color="0.5", lw=0.8, ls=":")
    axes[0].axhline(1 / params.e_confirm, color="black", lw=1, ls="--", gid="bound",
                    label=f"1/e_confirm = {1 / params.e_confirm:.3g}")
    axes[0].legend(loc="upper left", frameon=False, fontsize="small")
    for ax in axes[3:]:
        ax.set_xlabel("candidate's P(win | discordant pair)")
    n = sorted(set(oc["n_units"].to_list()))
    p_win, disc = claim
    n0 = n[-1]
    good = operating_characteristics(params, p_win, disc, n0)
    null = operating_characteristics(params, 0.5, disc, n0)
    fig.suptitle(f"{n0} units: a {p_win:g}-win candidate (disc. {disc:g}) is accepted "
                 f"{good.p_accept:.0%}, PROVISIONAL {good.p_provisional:.0%}; under H0 "
                 f"{null.p_accept:.1%} ≤ 1/e_confirm", x=0.01, ha="left")
    _caption(fig, f"Exact (dynamic programming). e_confirm {params.e_confirm:g}, λ "
                  f"{params.lambda_dir:g}, δ {params.delta_min:g}, w_net_min "
                  f"{params.w_net_min}; the dotted line marks H0 (p_win 0.5).")
    return fig


# ---- saving ----------------------------------------------------------------------------


def save(fig: Figure, name: str, directory: str | Path = "figures", dpi: int = 120,
         formats: Sequence[str] = ("png",)) -> Path:
    """Write ``fig`` as ``<directory>/<name>.<fmt>`` per format (directory created); return
    the first path (the PNG by default)."""
    base = Path(directory) / name
    if base.suffix.lower() == ".png":
        base = base.with_suffix("")
    base.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = base.with_name(f"{base.name}.{fmt}")
        # no date, fixed ids: the same figure gives the same bytes (diffable in git)
        meta = {"Date": None} if fmt in ("svg", "pdf") else None
        with rc_context({"svg.hashsalt": "vtrm_gate"}):
            fig.savefig(path, dpi=dpi, format=fmt, metadata=meta)
        paths.append(path)
    return paths[0]


def notebook_figures_dir(ci: bool, root: str | Path) -> Path:
    """Where a notebook saves figures: ``$VTRM_FIGURES``, else a fresh temp dir in CI, else
    ``<root>/figures/notebooks`` (git-ignored). Only ``make figures`` writes the committed
    design-review figures."""
    import os
    import tempfile

    if os.environ.get("VTRM_FIGURES"):
        return Path(os.environ["VTRM_FIGURES"])
    if ci:
        return Path(tempfile.mkdtemp(prefix="vtrm-figures-"))
    return Path(root) / "figures" / "notebooks"
