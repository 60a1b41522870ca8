"""matplotlib figures shared by the notebooks, the live view and the CLI.

Object API only: every ``plot_*`` draws on the ``ax`` it is given or on a new `GateFigure`
and returns that Figure. pyplot is never imported and the backend is never changed, so this
module works the same in a Jupyter kernel, a headless CI run and a worker thread. A
`GateFigure` displays itself in a notebook as a PNG (``_repr_png_``): no ``%matplotlib``
magic needed. Design-review figures put their claim, with numbers, in the title and are
sized for a 1280×720 slide (`SLIDE`, saved at 100 dpi).
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import polars as pl
from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.lines import Line2D

from ..errors import ConfigError, is_number, is_whole
from ..gate import GateResult
from ..stats import (
    Action,
    FalseAcceptCurve,
    GateParams,
    TypeOutcome,
    UnitsCurve,
    as_params,
    false_accept_curve,
    operating_characteristics,
)
from ._frames import EFFECT, oc_grid
from ._style import (
    BAD,
    BOUND,
    DISPLAY_DPI,
    FONT_PT,
    FREE,
    MIN_FONT_PT,
    MUTED,
    OLD,
    SAVED,
    SERIES,
    SLIDE,
    SLIDE_DPI,
    V3,
    ink_on,
    literal,
    styled,
    type_colour,
    type_style,
)

EXIT_MARKERS: dict[Action, str] = {
    Action.ACCEPT: "^",
    Action.PROVISIONAL: "D",
    Action.INERTIA: "o",
    Action.FUTILE: "X",
    Action.REJECT: "v",
}
"""Decision marker shape per exit (the colour is the type's); CONTINUE has none."""

_LABEL_BOX = {"facecolor": "#FFFFFF", "edgecolor": "none", "alpha": 0.85, "pad": 1.0}
"""Behind a threshold's label, so lines crossing it do not hide it."""

E_FLOOR = 1e-4
"""E± below this is drawn at the floor (log scale; lambda=1 can make E+ exactly 0)."""

slide = styled
"""Draw with the deck's fonts and colours (kept as an alias of `styled`)."""


class GateFigure(Figure):
    """The one figure class the library returns: it renders itself as a PNG in a notebook
    (``_repr_png_``), with no pyplot and no magic, at the deck's 1280×720."""

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=DISPLAY_DPI, facecolor="#FFFFFF")
        return buf.getvalue()

    def __repr__(self) -> str:
        w, h = (round(v * SLIDE_DPI) for v in self.get_size_inches())
        title = self.get_suptitle()
        if not title and self.axes:
            title = self.axes[0].get_title(loc="left") or self.axes[0].get_title()
        return f"<GateFigure {w}x{h}: {title[:80]}>"


def new_figure(figsize: tuple[float, float] = SLIDE,
               layout: Literal["constrained", "compressed", "tight"] | None = "constrained",
               ) -> GateFigure:
    """A `GateFigure` (never registered with pyplot), 1280×720 and constrained layout by
    default."""
    return GateFigure(figsize=figsize, layout=layout)


def _decades(ax: Axes, lo: float, hi: float) -> None:
    """Log-axis ticks at whole decades only, no minor ticks: cheap to lay out and to draw
    (the live view redraws a dozen panels every second)."""
    from matplotlib.ticker import FixedLocator, LogFormatterSciNotation, NullLocator

    exps = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    ax.yaxis.set_major_locator(FixedLocator([10.0 ** e for e in exps]))
    ax.yaxis.set_major_formatter(LogFormatterSciNotation())
    ax.yaxis.set_minor_locator(NullLocator())


def _axes(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.get_figure(), ax  # type: ignore[return-value]  # a top-level figure's axes
    fig = new_figure(figsize)
    return fig, fig.add_subplot()


def _frame(data: pl.DataFrame | FalseAcceptCurve | UnitsCurve, figure: str) -> pl.DataFrame:
    """The curve as a frame; ValueError naming ``figure`` when it has no point to draw."""
    df = data if isinstance(data, pl.DataFrame) else pl.DataFrame(data.columns())
    if not df.height:
        raise ValueError(f"{figure}: the curve has no points to draw (was it computed over "
                         f"an empty grid?)")
    return df


def _caption(fig: Figure, text: str, width: int = 150) -> None:
    import textwrap

    fig.supxlabel(textwrap.fill(text, width), fontsize="small", color=MUTED, ha="center",
                  gid="caption")


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
    return [Line2D([], [], marker=m, ls="", color="#FFFFFF", mec=BOUND, mfc="#FFFFFF", ms=9,
                   label=str(a)) for a, m in EXIT_MARKERS.items()]


def _ylim(series: Sequence[TrajectorySeries], params: GateParams, sides: Sequence[str]
          ) -> tuple[float, float]:
    ys = [y for s in series for side in sides for y in _path(s, side)[1]]
    top = max([*ys, params.e_confirm, params.e_reject]) * 2.5
    bottom = min([*ys, 1 / 4]) / 2
    return bottom, top


def _height_pt(ax: Axes) -> float:
    """The panel's height in points, less the share the constrained layout will take."""
    fig = ax.get_figure()
    assert isinstance(fig, Figure)  # a panel of a top-level figure
    return max(ax.get_position().height * fig.get_figheight(), 0.5) * 72 * 0.8


def _label_size(ax: Axes, n: int) -> float:
    """The end labels' font size: "small", or less when ``n`` of them would not fit."""
    size = FontProperties(size="small").get_size_in_points()
    return max(min(size, _height_pt(ax) / (1.3 * max(n, 1))), 4.0)


def draw_trajectories(ax: Axes, series: Sequence[TrajectorySeries], params: GateParams,
                      *, title: str | None = "E+ per type (ladder prefix)",
                      side: str = "plus", n_max: int | None = None,
                      label_size: float | None = None, label_room: float | None = None
                      ) -> None:
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
        colour = type_colour(i)
        ax.plot(xs, ys, lw=1.8, color=colour, ls=type_style(i),
                gid=f"trajectory:{s.task_type}", label=literal(s.task_type))
        ends.append((xs[-1], ys[-1], i))
        if s.action in EXIT_MARKERS:
            key = (xs[-1], round(math.log10(ys[-1]), 2))
            dodge = seen.get(key, 0)  # two markers at one point: shift the later ones
            seen[key] = dodge + 1
            ax.scatter([xs[-1] + 0.45 * dodge], [ys[-1]], marker=EXIT_MARKERS[s.action],
                       s=80, color=colour, edgecolor=BOUND, linewidth=0.8, zorder=4,
                       gid=f"decision:{s.action}")
    if side == "plus":
        ax.axhline(params.e_confirm, color=BOUND, lw=1.2, gid="e_confirm")
        ax.text(0.3, params.e_confirm * 1.12, f"ACCEPT needs E+ ≥ e_confirm = "
                f"{params.e_confirm:g} and W − L ≥ {params.w_net_min}", fontsize="small",
                bbox=_LABEL_BOX)
        ax.axhline(params.e_provisional, color=BOUND, lw=1.0, ls="--", gid="e_provisional")
        ax.text(0.3, params.e_provisional * 1.12, f"PROVISIONAL at exhaustion: E+ ≥ "
                f"{params.e_provisional:g}", fontsize="small", bbox=_LABEL_BOX)
        ax.set_ylabel("E+ (accept side, log)")
    else:
        ax.axhline(params.e_reject, color=BOUND, lw=1.2, ls="-.", gid="e_reject")
        ax.text(0.3, params.e_reject * 1.12, f"REJECT: E− ≥ e_reject = {params.e_reject:g}",
                fontsize="small", bbox=_LABEL_BOX)
        ax.set_ylabel("E− (harm side, log)")
    _end_labels(ax, series, ends, (lo, hi), x_max, label_size, label_room)
    ax.set_xlim(0, x_max + 0.5)
    ax.set_xlabel("units consumed (ladder order)")
    if title:
        ax.set_title(title, loc="left")
    ax.grid(True, which="major", alpha=0.3)


def _end_labels(ax: Axes, series: Sequence[TrajectorySeries],
                ends: Sequence[tuple[float, float, int]], ylim: tuple[float, float],
                x_max: float, label_size: float | None, label_room: float | None) -> None:
    """Each type's name at the right of the panel, level with its line's end: spread apart
    (in axes fraction) so they never overlap and kept inside the panel (a crowd too tall for
    it gets a smaller font instead), each joined to its end by a faint dotted grey leader (in
    the type's colour and solid it read as the trajectory extrapolated: mid-run, 24 lines
    fanned out from (0, 1))."""
    lo, hi = ylim
    size = label_size or _label_size(ax, len(ends))
    room = label_room or _height_pt(ax)  # the panel's height in points, once laid out
    gap = min(1.3 * size / room, 1 / max(len(ends), 1))  # n gaps fit the panel
    span = math.log10(hi) - math.log10(lo)
    placed = _spread([(math.log10(y) - math.log10(lo)) / span for _, y, _ in ends], gap,
                     gap / 2, 1 - gap / 2)
    for (x, y, i), fy in zip(ends, placed, strict=True):
        ax.annotate(literal(series[i].task_type), (x, y), xytext=(x_max + 1.2, fy),
                    textcoords=ax.get_xaxis_transform(), fontsize=size,
                    color=type_colour(i), va="center", annotation_clip=False,
                    arrowprops={"arrowstyle": "-", "color": MUTED, "lw": 0.5,
                                "linestyle": ":", "alpha": 0.7})


def draw_overview(fig: Figure, series: Sequence[TrajectorySeries], params: GateParams, *,
                  title: str | None = None, n_max: int | None = None) -> list[Axes]:
    """The tangled overview: E+ of every type on top, E− below, exit shapes in the legend."""
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(1.7, 1.3))
    size = min(_label_size(top, len(series)), _label_size(bottom, len(series)))  # one size
    # each panel's height once title, legend and labels are laid out (about 70% of the
    # figure's height shared 1.7 : 1.3)
    rooms = [fig.get_figheight() * 72 * 0.7 * r / 3.0 for r in (1.7, 1.3)]
    if len(series) * 1.3 * MIN_FONT_PT <= rooms[1]:
        size = max(size, MIN_FONT_PT)
    draw_trajectories(top, series, params, title=title, n_max=n_max, label_size=size,
                      label_room=rooms[0])
    draw_trajectories(bottom, series, params, title=None, side="minus", n_max=n_max,
                      label_size=size, label_room=rooms[1])
    top.set_xlabel("")
    fig.legend(handles=_exit_legend(), loc="outside lower center", fontsize="small", ncols=5,
               title="marker shape = exit, colour = type", title_fontsize="small",
               frameon=False)
    return [top, bottom]


def _panel_grid(fig: Figure, n: int, title_lines: int, titled: bool) -> tuple[Any, int]:
    """An ``nrows × ncols`` grid of log panels in fixed margins (constrained layout of a
    dozen log panels is slow), with room for ``title_lines`` lines above each panel."""
    ncols = 4 if n > 6 else min(n, 3)
    if n > 12:
        ncols = 6 if n <= 24 else 8
    nrows = math.ceil(n / ncols)
    height = fig.get_figheight()
    line = 1.25 * FONT_PT["small"] / 72  # one title line, inches
    gap = title_lines * line + 0.1  # between rows: the next row's title
    fig.set_layout_engine(None)
    top = 1 - ((0.45 if titled else 0.1) + gap) / height
    bottom = 1.25 / height
    span = (top - bottom) * height
    panel = (span - (nrows - 1) * gap) / nrows  # each panel's height, inches
    fig.subplots_adjust(left=0.07, right=0.975, top=top, bottom=bottom,
                        hspace=gap / max(panel, 0.1), wspace=0.1)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, sharex=True, sharey=True)).ravel()
    return axes, ncols


def _panel_title(s: TrajectorySeries, lines: int, note: str | None) -> str:
    state = "running" if s.action is Action.CONTINUE else str(s.action)
    done = len(s.steps)
    where = f"unit {done} of {s.n_ladder}" if s.n_ladder else f"{done} units"
    name = literal(s.task_type)
    rows = [name, f"{state} · W {s.W} L {s.L} · {where}"]
    if note:
        rows.append(note)
    return "\n".join(rows[:lines]) if lines > 1 else f"{name}: {state}"


def _draw_panel(ax: Axes, s: TrajectorySeries, i: int, params: GateParams,
                lo: float, hi: float) -> None:
    """One type: E+ solid and E− dashed in its colour, the thresholds, the exit marker."""
    colour = type_colour(i)
    ax.set_yscale("log")
    xp, yp = _path(s, "plus")
    xm, ym = _path(s, "minus")
    ax.plot(xp, yp, color=colour, lw=2.0, gid=f"e_plus:{s.task_type}")
    ax.plot(xm, ym, color=colour, lw=1.4, ls="--", gid=f"e_minus:{s.task_type}")
    ax.axhline(params.e_confirm, color=BOUND, lw=0.9, gid="e_confirm")
    if params.e_confirm != params.e_reject:
        ax.axhline(params.e_reject, color=BOUND, lw=0.9, ls="-.", gid="e_reject")
    ax.axhline(params.e_provisional, color=MUTED, lw=0.8, ls=":", gid="e_provisional")
    if s.action in EXIT_MARKERS:
        x, y = (xm[-1], ym[-1]) if s.action is Action.REJECT else (xp[-1], yp[-1])
        ax.scatter([x], [y], marker=EXIT_MARKERS[s.action], s=90, color=colour,
                   edgecolor=BOUND, linewidth=0.8, zorder=4, gid=f"decision:{s.action}")
    ax.grid(True, alpha=0.4)
    ax.set_ylim(lo, hi)
    _decades(ax, lo, hi)


def _panels_legend(fig: Figure, params: GateParams) -> None:
    same = params.e_confirm == params.e_reject
    thr = (f"e_confirm = e_reject = {params.e_confirm:g}" if same else
           f"e_confirm = {params.e_confirm:g}")
    handles = [Line2D([], [], color=MUTED, lw=2.0, label="E+ (accept side)"),
               Line2D([], [], color=MUTED, lw=1.4, ls="--", label="E− (harm side)"),
               Line2D([], [], color=BOUND, lw=0.9, label=thr),
               *([] if same else [Line2D([], [], color=BOUND, lw=0.9, ls="-.",
                                         label=f"e_reject = {params.e_reject:g}")]),
               Line2D([], [], color=MUTED, lw=0.8, ls=":",
                      label=f"e_provisional = {params.e_provisional:g}"),
               *_exit_legend()]
    fig.legend(handles=handles, loc="lower center", ncols=math.ceil(len(handles) / 2),
               fontsize="small", frameon=False, handlelength=1.6, columnspacing=1.2,
               borderaxespad=0.1)


def draw_type_panels(fig: Figure, series: Sequence[TrajectorySeries], params: GateParams, *,
                     title: str | None = None, n_max: int | None = None,
                     notes: Mapping[str, str] | None = None) -> list[Axes]:
    """Small multiples: one panel per type with E+ (solid) and E− (dashed) in the type's
    colour, e_confirm, e_reject and e_provisional, and the exit marker at the stop.
    ``notes`` adds a line under a type's panel title (e.g. its forecast)."""
    n = max(len(series), 1)
    lines = 3 if notes and n <= 12 else 2 if n <= 16 else 1
    axes, ncols = _panel_grid(fig, n, lines, bool(title))
    lo, hi = _ylim(series, params, ("plus", "minus"))
    x_max = max([n_max or 0, *(s.n_ladder for s in series), *(len(s.steps) for s in series), 1])
    for i, (ax, s) in enumerate(zip(axes, series, strict=False)):
        _draw_panel(ax, s, i, params, lo, hi)
        ax.set_title(_panel_title(s, lines, (notes or {}).get(s.task_type)),
                     fontsize="small", loc="left", linespacing=1.15)
        ax.set_xlim(0, x_max + 1.5)
    for ax in axes[len(series):]:
        ax.set_visible(False)
    for ax in axes[-ncols:]:
        ax.set_xlabel("units consumed (ladder order)", fontsize="small")
    for ax in axes[::ncols]:
        ax.set_ylabel("E± (log)", fontsize="small")
    _panels_legend(fig, params)
    if title:
        fig.suptitle(title, fontsize="medium", x=0.01, ha="left",
                     y=1 - 0.1 / fig.get_figheight(), va="top")
    return list(axes[:len(series)])


def decisions_claim(series: Sequence[TrajectorySeries], aborted: str | None = None) -> str:
    """The title of a step's trajectories: how many types decided, after how many of the
    ladder's units, and the count of each exit; a gate that was ``aborted`` says so first
    (its figure is no ordinary partial step)."""
    text = _decided(series)
    if not aborted:
        return text[0].upper() + text[1:]
    return f"Gate aborted ({textwrap.shorten(aborted, 60, placeholder=' …')}): {text}"


def _decided(series: Sequence[TrajectorySeries]) -> str:
    counts = {a: sum(s.action is a for s in series) for a in EXIT_MARKERS}
    decided = sum(counts.values())
    used = sum(len(s.steps) for s in series)
    total = sum(max(s.n_ladder, len(s.steps)) for s in series)
    exits = ", ".join(f"{n} {a}" for a, n in counts.items() if n)
    n = len(series)
    kinds = "type" if n == 1 else "types"
    head = (f"all {n} types decided" if decided == n and n > 1
            else f"{decided} of {n} {kinds} decided")
    return f"{head} after {used} of {total} ladder units" + (f": {exits}" if exits else "")


@styled
def plot_trajectories(outcomes: Mapping[str, TypeOutcome] | GateResult,
                      params: GateParams | None = None, ax: Axes | None = None, *,
                      layout: str = "overview", title: str | None = None) -> Figure:
    """Per-type trajectories: ``layout="overview"`` (every type on one E+ axis and one E−
    axis; with ``ax``, the E+ axis only) or ``"panels"`` (one small panel per type). The
    title (default: `decisions_claim`) states what the step decided. ``outcomes`` may be the
    `GateResult` itself: an aborted gate's title then says so."""
    params = as_params(params)
    aborted = outcomes.aborted if isinstance(outcomes, GateResult) else None
    series = trajectory_series(outcomes.outcomes if isinstance(outcomes, GateResult)
                               else outcomes)
    if ax is not None:
        draw_trajectories(ax, series, params, n_max=params.n_max)
        return ax.get_figure()  # type: ignore[return-value]  # a top-level figure's axes
    title = title or decisions_claim(series, aborted)
    if layout == "panels":
        fig = new_figure(SLIDE, None)
        draw_type_panels(fig, series, params, title=title, n_max=params.n_max)
        return fig
    if layout != "overview":
        raise ValueError(f"layout must be 'overview' or 'panels', got {layout!r}")
    fig = new_figure(SLIDE)
    draw_overview(fig, series, params, title=title, n_max=params.n_max)
    return fig


# ---- prefix vs block -----------------------------------------------------------------


def _effect(label: str) -> str:
    """`EFFECT` of a replay's action label ("unknown" for a block replay that needs unrun
    units: ``UNKNOWN (needs k unrun units)``)."""
    return EFFECT[Action(label)] if label in Action.__members__ else "unknown"


@styled
def plot_prefix_vs_block(comparison: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Units consumed per type under the old block replay vs the prefix replay.

    ``comparison`` is `compare_replays` output. Each pair of bars carries
    both decisions; a different label with the same effect in Phase D (`EFFECT`) is told apart
    from a different effect (INERTIA vs FUTILE: FUTILE costs a cooldown).
    """
    fig, ax = _axes(ax, SLIDE)
    rows = comparison.sort("task_type", descending=True)
    y = np.arange(rows.height)
    h = 0.38
    ax.barh(y + h / 2, rows["block_units"], h, color=OLD, label="block replay (old)",
            gid="block")
    ax.barh(y - h / 2, rows["prefix_units"], h, color=V3, label="prefix replay (v3)",
            gid="prefix")
    ax.set_yticks(y, [literal(t) for t in rows["task_type"]])
    same_effect = (rows["same_effect"] if "same_effect" in rows.columns
                   else rows["agree"]).to_list()
    for yi, r, eff in zip(y, rows.iter_rows(named=True), same_effect, strict=True):
        if r["agree"]:
            text, colour = f"{r['prefix_action']} (same)", BOUND
        elif eff:
            text, colour = (f"{r['block_action']} → {r['prefix_action']}  (same effect: "
                            f"{_effect(r['prefix_action'])})"), MUTED
        else:
            text, colour = (f"{r['block_action']} → {r['prefix_action']}  (differs: "
                            f"{_effect(r['block_action'])} → {_effect(r['prefix_action'])})"
                            ), BAD
        ax.text(max(r["block_units"], r["prefix_units"]) + 0.5, float(yi), text, va="center",
                fontsize="small", color=colour)
    ax.set_xlabel("ladder units consumed (2 inference calls each); label: block → prefix")
    ax.set_ylabel("question type")
    total_b, total_p = int(rows["block_units"].sum()), int(rows["prefix_units"].sum())
    saved = 1 - total_p / total_b if total_b else 0.0
    n_eff = int(sum(bool(e) for e in same_effect))
    ax.set_title(f"Same outcomes: block {total_b} → prefix {total_p} units ({saved:.0%} fewer);"
                 f" same label {int(rows['agree'].sum())}/{rows.height}, same Phase D effect "
                 f"{n_eff}/{rows.height}", loc="left")
    ax.set_xlim(0, max(int(rows["n_ladder"].max() or 1), 1) * 1.75)  # type: ignore[arg-type]  # a numeric polars cell
    ax.legend(loc="upper right", ncols=2, frameon=False)
    ax.set_ylim(-0.7, rows.height + 0.5)  # a free row on top for the legend
    return fig


# ---- false accept under H0 -----------------------------------------------------------


def false_accept_frame(params: GateParams, correlations: Sequence[float], n_rep: int,
                       seed: int | None = 0, **kw: Any) -> pl.DataFrame:
    """`vtrm_gate.stats.false_accept_curve` as a polars frame (long format)."""
    return pl.DataFrame(false_accept_curve(params, correlations, n_rep, seed, **kw).columns())


@styled
def plot_false_accept(curve: pl.DataFrame | FalseAcceptCurve, ax: Axes | None = None) -> Figure:
    """False-accept rate under H0 vs latency/correctness correlation: arrival order (not
    used) vs ladder prefix, with 95% Wilson intervals, the exact rate and 1/e_confirm."""
    fig, ax = _axes(ax, SLIDE)
    df = _frame(curve, "plot_false_accept").sort("correlation")
    bound = float(df["bound"][0])
    pre = df.filter(pl.col("order") == "prefix")
    arr = df.filter(pl.col("order") == "arrival")
    exact = float(df["exact_prefix"][0]) if "exact_prefix" in df.columns else None
    prefix_rate = float(pre["false_accept"][0]) if pre.height else float("nan")
    n_rep, n = int(df["n_rep"][0]), int(df["n_units"][0])
    styles = {"arrival": (BAD, "arrival order (not used): consumes results as they complete"),
              "prefix": (V3, f"ladder prefix (v3): {prefix_rate:.2%} at every correlation "
                             f"({round(prefix_rate * n_rep):,} of {n_rep:,} runs)")}
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
    ax.axhline(bound, color=BOUND, ls="--", gid="bound",
               label=f"Ville's bound 1/e_confirm = {bound:.3g}")
    if exact is not None:
        ax.axhline(exact, color=V3, ls=":", lw=1.5, gid="exact_prefix",
                   label=f"prefix, exact (dynamic programming): {exact:.2%}")
    ax.set_xlabel("correlation of the candidate's log-latency with being wrong")
    ax.set_ylabel("P(ACCEPT) under H0 (share of runs)")
    ax.set_ylim(0, min(1.0, max(float(df["ci_high"].max()), bound) * 1.15))  # type: ignore[arg-type]  # a numeric polars cell
    worst = float(arr["false_accept"].max()) if arr.height else float("nan")  # type: ignore[arg-type]  # a numeric polars cell
    over = arr.filter(pl.col("ci_low") > bound)
    first = (f"above the bound from correlation {float(over['correlation'].min()):g}"  # type: ignore[arg-type]  # a numeric polars cell
             if over.height else "never above the bound")
    ax.set_title(f"Arrival order reaches {worst:.0%} false accepts ({first}); "
                 f"the ladder prefix stays at {prefix_rate:.1%} ≤ {bound:.0%}", loc="left")
    half = float((df["ci_high"] - df["ci_low"]).max()) / 2  # type: ignore[arg-type]  # a numeric polars cell
    _caption(fig, f"H0: p_win = {float(df['p_win'][0]):g}, discordance "
                  f"{float(df['discordance'][0]):g}, {n} units, {n_rep:,} replicates per point "
                  f"(seed {df['seed'][0]}); shaded bars: 95% Wilson intervals, at most "
                  f"±{half:.1%}. The prefix line is flat: the same outcomes are replayed at "
                  f"every correlation and the prefix order ignores latencies.")
    ax.grid(True, alpha=0.4)
    ax.legend(loc="upper left", frameon=False)
    return fig


# ---- tokens, makespan, waste ----------------------------------------------------------


@styled
def plot_token_savings(curve: pl.DataFrame | UnitsCurve, *, tokens_per_unit: float | None = None,
                       step_saving: tuple[float, float, int] | tuple[float, float, int, int]
                       | None = None,
                       ax: Axes | None = None) -> Figure:
    """Mean units per type vs the candidate's true p_win: no early stop, old block rule,
    v3 prefix rule (``units_curve``). With ``tokens_per_unit``, y is tokens. Each v3 point
    is labelled with its saving against the old block rule drawn beside it.

    ``step_saving = (saving, discordance, seed[, types gated])`` of a simulated step is
    reconciled with the Monte Carlo in the caption.
    """
    fig, ax = _axes(ax, SLIDE)
    df = _frame(curve, "plot_token_savings").sort("p_win")
    k = tokens_per_unit or 1.0
    what = "tokens" if tokens_per_unit else "units"
    x = df["p_win"].to_numpy()
    series = (("no_stop_units", "no early stop (every ladder unit)", BOUND, "--"),
              ("block_units", "old block rule (decides every 8 units)", OLD, "-"),
              ("prefix_units", "v3 prefix rule (decides after every unit)", V3, "-"))
    for col, label, colour, ls in series:
        if col in df.columns:
            ax.plot(x, df[col].to_numpy() * k, marker="o", ls=ls, color=colour, label=label,
                    lw=2, gid=f"units:{col}")
    no_stop = df["no_stop_units"].to_numpy() * k
    prefix = df["prefix_units"].to_numpy() * k
    block = df["block_units"].to_numpy() * k if "block_units" in df.columns else no_stop
    vs_old, vs_none = 1 - prefix / block, 1 - prefix / no_stop
    for xi, b, sv in zip(x, prefix, vs_old, strict=True):
        ax.annotate(f"−{sv:.0%} vs old", (xi, b), textcoords="offset points", xytext=(0, -22),
                    ha="center", color=V3, fontweight="bold")
    ax.set_ylim(0, float(no_stop.max()) * 1.12)
    pad = 0.1 * (float(x.max() - x.min()) or 1.0)  # room for the end points' labels
    ax.set_xlim(float(x.min()) - pad, float(x.max()) + pad)
    ax.set_xlabel("candidate's P(win | discordant pair)")
    ax.set_ylabel(f"mean {what} consumed per type" + ("" if tokens_per_unit else
                                                      " (2 inference calls each)"))
    disc = float(df["discordance"][0]) if "discordance" in df.columns else float("nan")
    n_units = int(df["n_units"][0]) if "n_units" in df.columns else int(no_stop.max() / k)
    ax.set_title(f"The prefix rule: {vs_old.min():.0%}–{vs_old.max():.0%} fewer {what} than "
                 f"the old block rule, {vs_none.min():.0%}–{vs_none.max():.0%} fewer than no "
                 f"early stop (disc. {disc:g}, {n_units} units)", loc="left")
    n_rep = int(df["n_rep"][0]) if "n_rep" in df.columns else None
    cap = (f"Monte Carlo, i.i.d. pairs, {n_rep:,} replicates per point. " if n_rep else "")
    if step_saving is not None:
        sv, d, seed, *gated = step_saving  # (saving, discordance, seed[, types gated])
        kind = f"{gated[0]}-type " if gated else ""
        cap += (f"The simulated {kind}step (seed {seed}) saved only {sv:.0%} against no "
                f"early stop: its arms share per-unit difficulty, so only {d:.0%} of pairs "
                f"are discordant and most types run their ladder to the end.")
    if cap:
        _caption(fig, cap)
    ax.grid(True, alpha=0.4)
    ax.legend(loc="lower left", frameon=False)
    return fig


def _makespans(x: float | Sequence[float], name: str) -> list[float]:
    """One makespan per scenario (a number alone: one scenario), each finite and > 0: the
    title divides by them."""
    if isinstance(x, str | bytes) or not (is_number(x) or isinstance(x, Sequence | np.ndarray)):
        raise ValueError(f"{name} must be a number or a sequence of numbers, got {x!r}")
    values: list[Any] = [x] if is_number(x) else list(cast(Sequence[Any], x))
    if not values:
        raise ValueError(f"{name} must hold at least one makespan, got none")
    for v in values:
        if not is_number(v):
            raise ValueError(f"{name} must be a number or a sequence of numbers, got {v!r}")
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must hold makespans > 0, got {v!r}")
    return [float(v) for v in values]


@styled
def plot_makespan(old: float | Sequence[float], new: float | Sequence[float],
                  lower_bound: float | Sequence[float], *, labels: Sequence[str] | None = None,
                  unit: str = "h", ax: Axes | None = None) -> Figure:
    """Makespan of a gate step: old serial gate vs v3 continuous gate vs the lower bound,
    one horizontal bar each per scenario (the first scenario's numbers in the title).

    Numbers in (one value per scenario, or scalars), so any benchmark can feed it.
    """
    o, n, lb = (_makespans(old, "old"), _makespans(new, "new"),
                _makespans(lower_bound, "lower_bound"))
    if not len(o) == len(n) == len(lb):
        raise ValueError(f"old, new and lower_bound need the same length, got "
                         f"{len(o)}, {len(n)}, {len(lb)}")
    labels = list(labels) if labels is not None else (
        ["gate step"] if len(o) == 1 else [f"scenario {i + 1}" for i in range(len(o))])
    if len(labels) != len(o):
        raise ValueError(f"labels has {len(labels)} entries, expected {len(o)}")
    fig, ax = _axes(ax, SLIDE)
    rows: tuple[tuple[str, list[float], dict[str, Any]], ...] = (
            ("old: serial types, blocks, arms", o, {"color": OLD}),
            ("v3: continuous, one shared slot pool", n, {"color": V3}),
            ("lower bound: needed inference / slots", lb,
             {"color": "#FFFFFF", "edgecolor": BOUND, "hatch": "//", "linewidth": 1.5}))
    single = len(o) == 1  # one bar per schedule, named on the y axis; else grouped bars
    h = 0.7 if single else 0.8 / len(rows)
    centres = np.arange(len(o))[::-1].astype(float)
    for j, (label, vals, style) in enumerate(rows):
        ys = np.array([len(rows) - 1 - j]) if single else centres + (1 - j) * h
        bars = ax.barh(ys, vals, h * 0.9, label=label, gid=f"makespan:{label}", **style)
        texts = [f"{v:.2f} {unit}" + (f"  ({_times(a, v)} than old)" if j == 1 else "")
                 for v, a in zip(vals, o, strict=True)]
        ax.bar_label(bars, labels=texts, padding=6)
    if single:
        ax.set_yticks(range(len(rows))[::-1], [r[0].replace(": ", ":\n") for r in rows])
        ax.set_ylabel(f"schedule ({labels[0]})")
    else:
        ax.set_yticks(centres, labels)
        ax.set_ylabel("scenario")
        ax.legend(loc="upper right", frameon=False)
        ax.set_ylim(-0.6, len(o) - 0.4 + 0.6)
    ax.set_xlabel(f"makespan of the gate step ({unit})")
    ax.set_xlim(0, max(o + n + lb) * 1.3)
    ax.set_title(f"The continuous gate: {o[0]:.2f} {unit} → {n[0]:.2f} {unit} "
                 f"({_times(o[0], n[0])}), {n[0] / lb[0]:.2f}× its lower bound", loc="left")
    return fig


def _times(old: float, new: float) -> str:
    """"×3.0 faster" or, when ``new`` took longer, "×5.0 slower"."""
    return f"×{old / new:.1f} faster" if new <= old else f"×{new / old:.1f} slower"


WASTE_PARTS: tuple[tuple[str, str, str], ...] = (
    ("needed_calls", "started up to the stop (needed)", V3),
    ("past_stop_calls", "started past the stop (wasted)", BAD),
    ("cache_hits", "base arm from BaselineCache (free)", FREE),
    ("never_started", "never started (saved)", SAVED),
)


@styled
def plot_waste(calls: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Where each type's 2 × ladder calls went (`call_accounting`):
    every call started past the type's stop rank counts as waste, finished or not. Parts
    with no calls at all are left out of the bars and the legend."""
    fig, ax = _axes(ax, SLIDE)
    df = calls.sort("task_type", descending=True)
    y = np.arange(df.height)
    left = np.zeros(df.height)
    for col, label, colour in WASTE_PARTS:
        vals = df[col].fill_null(0).to_numpy().astype(float)
        if not vals.any():
            continue
        total = int(vals.sum())
        bars = ax.barh(y, vals, left=left, color=colour, label=f"{label}: {total:,}",
                       gid=f"waste:{col}")
        if col == "past_stop_calls":
            ax.bar_label(bars, labels=[str(int(v)) if v else "" for v in vals],
                         label_type="center", color="#FFFFFF", fontweight="bold")
        left += vals
    ax.set_yticks(y, [literal(t) for t in df["task_type"]])
    ax.set_ylabel("question type")
    ax.set_xlabel("inference calls (2 per ladder unit: base and candidate arm)")
    started = int(df["started"].sum())
    wasted = int(df["past_stop_calls"].sum())
    share = f"{wasted / started:.1%}" if started else "n/a"
    ax.set_title(f"Waste: {wasted} of {started} started calls ({share}) were past their "
                 f"type's stop rank", loc="left")
    fig.legend(loc="outside lower center", ncols=4, frameon=False, fontsize="small",
               title="past the stop: started while the type was undecided, for a unit beyond "
                     "the rank where it stopped (finished before the freeze or not)",
               title_fontsize="small")
    return fig


@styled
def plot_call_breakdown(bars: Mapping[str, Mapping[str, float]], *, title: str,
                        xlabel: str = "inference calls", ylabel: str = "run",
                        colours: Mapping[str, str] | None = None,
                        ax: Axes | None = None) -> Figure:
    """Horizontal stacked bars, each part labelled with its count: ``{bar: {part: n}}``
    (part colours from ``colours``, else the deck's series colours in order)."""
    for b, counts in bars.items():
        for part, n in counts.items():
            if not (is_number(n) and math.isfinite(n) and n >= 0):
                raise ValueError(f"bars[{b!r}][{part!r}] must be a count >= 0, got {n!r}")
    fig, ax = _axes(ax, SLIDE)
    parts = list(dict.fromkeys(p for b in bars.values() for p in b))
    colour = {p: c for p, c in zip(parts, SERIES * (len(parts) // len(SERIES) + 1),
                                   strict=False)} | dict(colours or {})
    names = list(bars)[::-1]
    y = np.arange(len(names))
    left = np.zeros(len(names))
    for part in parts:
        vals = np.array([float(bars[b].get(part, 0)) for b in names])
        rects = ax.barh(y, vals, left=left, color=colour[part], label=part, height=0.6,
                        gid=f"part:{part}")
        ax.bar_label(rects, labels=[f"{int(v):,}" if v else "" for v in vals],
                     label_type="center", color=ink_on(colour[part]), fontweight="bold")
        left += vals
    ax.set_yticks(y, names)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, loc="left")
    fig.legend(loc="outside lower center", ncols=min(len(parts), 3), frameon=False)
    return fig


# ---- operating characteristics ---------------------------------------------------------

OC_EXITS: tuple[tuple[str, str], ...] = (
    ("p_accept", "ACCEPT"), ("p_provisional", "PROVISIONAL"), ("p_inertia", "INERTIA"),
    ("p_futile", "FUTILE"), ("p_reject", "REJECT"))


@styled
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
    params = as_params(params)
    if oc is None:
        if n_units is not None and not (is_whole(n_units) and n_units >= 1):
            raise ValueError(f"n_units must be an integer >= 1, got {n_units!r}")
        grid = p_wins if p_wins is not None else np.linspace(0.3, 1.0, 15).tolist()
        if not len(grid):
            raise ValueError("p_wins must hold at least one p_win")
        oc = oc_grid(params, grid, discordances, params.n_max if n_units is None else n_units)
    _check_oc_params(oc, params)
    fig = new_figure(SLIDE)
    axes = fig.subplots(2, 3, sharex=True).ravel()
    for ax in axes[1:5]:
        ax.sharey(axes[0])  # the five probabilities on one scale; expected units on its own
    discs = sorted(set(oc["discordance"].to_list()))
    colour = {d: SERIES[i % len(SERIES)] for i, d in enumerate(discs)}
    panels = [*OC_EXITS, ("expected_units", "expected units consumed")]
    n0 = sorted(set(oc["n_units"].to_list()))[-1]
    for ax, (col, name) in zip(axes, panels, strict=True):
        for d in discs:
            part = oc.filter(pl.col("discordance") == d).sort("p_win")
            ax.plot(part["p_win"].to_numpy(), part[col].to_numpy(), color=colour[d], lw=2,
                    marker=".", label=f"discordance {d:g}", gid=f"oc:{col}:{d:g}")
        ax.set_title(name if col == "expected_units" else f"P({name})", loc="left")
        ax.grid(True, alpha=0.4)
        ax.axvline(0.5, color=MUTED, lw=0.8, ls=":")
    axes[0].set_ylim(0, 1)
    for i in (0, 3):
        axes[i].set_ylabel("probability (exact)")
    axes[5].set_ylabel(f"units (of {n0})")
    axes[5].set_ylim(0, n0)  # from zero: an axis from ~11 read a 2x saving as 5x
    axes[0].axhline(1 / params.e_confirm, color=BOUND, lw=1, ls="--", gid="bound",
                    label=f"1/e_confirm = {1 / params.e_confirm:.3g}")
    axes[0].legend(loc="upper left", frameon=False, fontsize="small")
    for ax in axes[3:]:
        ax.set_xlabel("candidate's P(win | discordant)")
    p_win, disc = claim
    good = operating_characteristics(params, p_win, disc, n0)
    null = operating_characteristics(params, 0.5, disc, n0)
    fig.suptitle(f"{n0} units: a {p_win:g}-win candidate (disc. {disc:g}) is accepted "
                 f"{good.p_accept:.0%}, PROVISIONAL {good.p_provisional:.0%}; under H0 "
                 f"{null.p_accept:.1%} ≤ 1/e_confirm", x=0.01, ha="left")
    _caption(fig, f"Exact (dynamic programming). e_confirm {params.e_confirm:g}, λ "
                  f"{params.lambda_dir:g}, δ {params.delta_min:g}, w_net_min "
                  f"{params.w_net_min}; the dotted line marks H0 (p_win 0.5).")
    return fig


def _check_oc_params(oc: pl.DataFrame, params: GateParams) -> None:
    """Refuse a grid computed under other params than the title, the bound line and the
    caption will use (an `oc_grid` frame does not carry its params): its first row is
    recomputed under ``params``."""
    if oc.height == 0:
        raise ValueError("oc: no rows")
    r = oc.row(0, named=True)
    again = operating_characteristics(params, r["p_win"], r["discordance"], int(r["n_units"]),
                                      r.get("infra_rate") or 0.0)
    if not math.isclose(again.p_accept, r["p_accept"], rel_tol=1e-9, abs_tol=1e-12):
        raise ValueError(f"oc was not computed with these params (row 1: p_accept "
                         f"{r['p_accept']:.6g} in the frame, {again.p_accept:.6g} under them); "
                         f"pass the params it was built with")


# ---- saving ----------------------------------------------------------------------------


def save(fig: Figure, name: str, directory: str | Path = "figures", dpi: int = SLIDE_DPI,
         formats: Sequence[str] = ("png",)) -> Path:
    """Write ``fig`` as ``<directory>/<name>.<fmt>`` per format (directory created), at the
    deck's `SLIDE_DPI` (a slide-sized figure is 1280×720); return the first path."""
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
    """Where a notebook saves figures: ``$VTRM_FIGURES``, else in CI a fresh temp dir removed
    when the kernel exits, else ``<root>/figures/notebooks`` (git-ignored). Only ``make
    figures`` writes the committed design-review figures."""
    import atexit
    import os
    import shutil
    import tempfile

    if os.environ.get("VTRM_FIGURES"):
        out = Path(os.environ["VTRM_FIGURES"]).expanduser()
        blocked = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
        if blocked is not None:  # named now, not by the first save(), after the work
            raise ConfigError(f"VTRM_FIGURES={os.environ['VTRM_FIGURES']}: {blocked} exists and "
                              f"is not a directory")
        return out
    if ci:
        tmp = Path(tempfile.mkdtemp(prefix="vtrm-figures-"))
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        return tmp
    return Path(root) / "figures" / "notebooks"
