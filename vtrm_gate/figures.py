"""matplotlib figures shared by the notebooks, the live view and the CLI.

Object API only: every ``plot_*`` draws on the ``ax`` it is given or on a new
`matplotlib.figure.Figure`, and returns that Figure. pyplot is never imported, so this
module sets no backend and works the same in a Jupyter kernel, in a headless CI run and
in a worker thread (a bare Figure renders PNGs through Agg when saved). In a notebook,
``%matplotlib inline`` makes a returned Figure display itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .frames import oc_grid
from .montecarlo import FalseAcceptCurve, UnitsCurve, false_accept_curve
from .stats import Action, GateParams, TypeOutcome

ACTION_MARKERS: dict[Action, tuple[str, str]] = {
    Action.ACCEPT: ("^", "tab:green"),
    Action.PROVISIONAL: ("D", "tab:olive"),
    Action.INERTIA: ("o", "tab:gray"),
    Action.FUTILE: ("X", "tab:orange"),
    Action.REJECT: ("v", "tab:red"),
}
"""Decision marker (shape, colour) per exit; CONTINUE has none."""

E_FLOOR = 1e-4
"""E+ below this is drawn at the floor (log scale; lambda=1 can make E+ exactly 0)."""


def _axes(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.get_figure(), ax  # type: ignore[return-value]
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def _frame(data: pl.DataFrame | FalseAcceptCurve | UnitsCurve) -> pl.DataFrame:
    return data if isinstance(data, pl.DataFrame) else pl.DataFrame(data.columns())


# ---- e+ trajectories -----------------------------------------------------------------


@dataclass(frozen=True)
class TrajectorySeries:
    """One type's e+ path: ``e_plus[i]`` after ``steps[i]`` consumed units; its action."""

    task_type: str
    steps: tuple[int, ...]
    e_plus: tuple[float, ...]
    action: Action = Action.CONTINUE


def trajectory_series(outcomes: Mapping[str, TypeOutcome]) -> list[TrajectorySeries]:
    """Series from finished (or replayed) outcomes, sorted by task_type."""
    return [TrajectorySeries(t, tuple(range(1, len(o.trajectory) + 1)),
                             tuple(p.e_plus for p in o.trajectory), o.action)
            for t, o in sorted(outcomes.items())]


def type_colour(i: int) -> tuple[float, float, float, float]:
    """A distinct colour per type index (tab20: dark/light pairs, darks first)."""
    from matplotlib import colormaps

    return colormaps["tab20"]((2 * i) % 20 + (2 * i) // 20)


def draw_trajectories(ax: Axes, series: Sequence[TrajectorySeries], params: GateParams,
                      *, title: str | None = "E+ per type (ladder prefix)") -> None:
    """Draw one line per type (starting at E+ = 1 before any unit), the e_confirm and
    e_provisional lines, and a marker at each decided type's stopping point."""
    ax.set_yscale("log")
    markers: dict[Action, list[tuple[int, float]]] = {}
    for i, s in enumerate(series):
        xs = (0, *s.steps)
        ys = [max(y, E_FLOOR) for y in (1.0, *s.e_plus)]
        # 12 Video-MME types outnumber a 10-colour cycle: 20 colours, then line styles
        ax.plot(xs, ys, lw=1.4, label=s.task_type, gid=f"trajectory:{s.task_type}",
                color=type_colour(i % 20), ls=("-", "--", ":")[i // 20 % 3])
        if s.action in ACTION_MARKERS:
            markers.setdefault(s.action, []).append((xs[-1], ys[-1]))
    ax.axhline(params.e_confirm, color="black", lw=1.2, gid="e_confirm",
               label=f"e_confirm = {params.e_confirm:g}")
    ax.axhline(params.e_provisional, color="black", lw=1.0, ls="--", gid="e_provisional",
               label=f"e_provisional = {params.e_provisional:g}")
    for action, pts in markers.items():
        shape, colour = ACTION_MARKERS[action]
        x, y = zip(*pts, strict=True)
        ax.scatter(x, y, marker=shape, s=60, color=colour, edgecolor="black", zorder=3,
                   label=str(action), gid=f"decision:{action}")
    ax.set_xlabel("units consumed (ladder order)")
    ax.set_ylabel("E+ (log scale)")
    if title:
        ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small", frameon=False)


def plot_trajectories(outcomes: Mapping[str, TypeOutcome], params: GateParams | None = None,
                      ax: Axes | None = None) -> Figure:
    """Per-type E+ trajectories with the e_confirm / e_provisional lines and decisions."""
    fig, ax = _axes(ax, (9, 4.8))
    draw_trajectories(ax, trajectory_series(outcomes), params or GateParams())
    return fig


# ---- prefix vs block -----------------------------------------------------------------


def plot_prefix_vs_block(comparison: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Units consumed per type under the old block replay vs the prefix replay.

    ``comparison`` is `vtrm_gate.frames.compare_replays` output; each pair of bars is
    labelled with both decisions, and disagreements are marked.
    """
    fig, ax = _axes(ax, (9, 0.5 * max(comparison.height, 4) + 1.2))
    rows = comparison.sort("task_type", descending=True)
    y = np.arange(rows.height)
    h = 0.38
    ax.barh(y + h / 2, rows["block_units"], h, color="tab:gray", label="block replay (old)",
            gid="block")
    ax.barh(y - h / 2, rows["prefix_units"], h, color="tab:blue", label="prefix replay (v3)",
            gid="prefix")
    ax.set_yticks(y, rows["task_type"].to_list())
    for yi, r in zip(y, rows.iter_rows(named=True), strict=True):
        mark = "" if r["agree"] else "  (differs)"
        ax.text(max(r["block_units"], r["prefix_units"]) + 0.5, yi,
                f"{r['block_action']} → {r['prefix_action']}{mark}", va="center",
                fontsize="small", color="black" if r["agree"] else "tab:red")
    ax.set_xlabel("units consumed   (labels: block decision → prefix decision)")
    total_b, total_p = int(rows["block_units"].sum()), int(rows["prefix_units"].sum())
    saved = 1 - total_p / total_b if total_b else 0.0
    ax.set_title(f"Same outcomes, block vs prefix: {total_b} → {total_p} units "
                 f"({saved:.0%} fewer)\ndecisions agree on "
                 f"{int(rows['agree'].sum())}/{rows.height} types")
    ax.set_xlim(0, max(int(rows["n_ladder"].max() or 1), 1) * 1.45)
    ax.legend(loc="lower right", fontsize="small")
    return fig


# ---- false accept under H0 -----------------------------------------------------------


def false_accept_frame(params: GateParams, correlations: Sequence[float], n_rep: int,
                       seed: int | None = 0, **kw: float) -> pl.DataFrame:
    """`vtrm_gate.montecarlo.false_accept_curve` as a polars frame (long format)."""
    return pl.DataFrame(false_accept_curve(params, correlations, n_rep, seed, **kw).columns())


def plot_false_accept(curve: pl.DataFrame | FalseAcceptCurve, ax: Axes | None = None) -> Figure:
    """False-accept rate under H0 vs latency/correctness correlation, arrival order vs
    ladder prefix, with 95% Wilson bands and the 1/e_confirm line."""
    fig, ax = _axes(ax, (7.5, 4.5))
    df = _frame(curve).sort("correlation")
    styles = {"arrival": ("tab:red", "arrival order (rejected)"),
              "prefix": ("tab:blue", "ladder prefix (v3)")}
    for order, (colour, label) in styles.items():
        part = df.filter(pl.col("order") == order)
        if part.is_empty():
            continue
        x = part["correlation"].to_numpy()
        ax.plot(x, part["false_accept"].to_numpy(), "o-", color=colour, label=label,
                gid=f"rate:{order}")
        ax.fill_between(x, part["ci_low"].to_numpy(), part["ci_high"].to_numpy(),
                        color=colour, alpha=0.2, lw=0)
    bound = float(df["bound"][0])
    ax.axhline(bound, color="black", ls="--", gid="bound",
               label=f"1/e_confirm = {bound:.3g}")
    if "exact_prefix" in df.columns:
        ax.axhline(float(df["exact_prefix"][0]), color="tab:blue", ls=":", lw=1,
                   gid="exact_prefix", label="prefix, exact")
    ax.set_xlabel("correlation of log-latency with candidate wrongness")
    ax.set_ylabel("P(ACCEPT) under H0")
    ax.set_ylim(0, min(1.0, max(float(df["ci_high"].max()), bound) * 1.1))
    n_rep, n = int(df["n_rep"][0]), int(df["n_units"][0])
    ax.set_title(f"False accept under H0 (p_win = {float(df['p_win'][0]):g}, "
                 f"{n} units, {n_rep:,} replicates, 95% Wilson bands)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return fig


# ---- tokens, makespan, waste ----------------------------------------------------------


def plot_token_savings(curve: pl.DataFrame | UnitsCurve, *, tokens_per_unit: float | None = None,
                       ax: Axes | None = None) -> Figure:
    """Mean work per type vs the candidate's true p_win: no early stop, old block rule,
    v3 prefix rule (``units_curve`` columns). With ``tokens_per_unit``, y is tokens."""
    fig, ax = _axes(ax, (7.5, 4.5))
    df = _frame(curve).sort("p_win")
    k = tokens_per_unit or 1.0
    x = df["p_win"].to_numpy()
    series = (("no_stop_units", "no early stop", "black", "--"),
              ("block_units", "block replay (old)", "tab:gray", "-"),
              ("prefix_units", "prefix (v3)", "tab:blue", "-"))
    for col, label, colour, ls in series:
        if col in df.columns:
            ax.plot(x, df[col].to_numpy() * k, marker="o", ls=ls, color=colour, label=label,
                    gid=f"units:{col}")
    no_stop = df["no_stop_units"].to_numpy() * k
    prefix = df["prefix_units"].to_numpy() * k
    for xi, a, b in zip(x, no_stop, prefix, strict=True):
        ax.annotate(f"-{1 - b / a:.0%}", (xi, b), textcoords="offset points", xytext=(0, -14),
                    ha="center", fontsize="small", color="tab:blue")
    ax.set_ylim(0, float(no_stop.max()) * 1.1)
    ax.set_xlabel("candidate's P(win | discordant pair)")
    ax.set_ylabel("tokens per type" if tokens_per_unit else "units consumed per type")
    n_rep = int(df["n_rep"][0]) if "n_rep" in df.columns else None
    ax.set_title("Work saved by stopping early" + (f" ({n_rep:,} replicates per point)"
                                                   if n_rep else ""))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def _seq(x: float | Sequence[float]) -> list[float]:
    return [float(x)] if isinstance(x, int | float) else [float(v) for v in x]


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
    fig, ax = _axes(ax, (max(5.0, 2.2 * len(o) + 2), 4.5))
    x = np.arange(len(o))
    w = 0.27
    for off, vals, label, colour in ((-w, o, "old (serial)", "tab:gray"),
                                     (0.0, n, "v3 (continuous)", "tab:blue"),
                                     (w, lb, "lower bound", "tab:green")):
        bars = ax.bar(x + off, vals, w, label=label, color=colour, gid=f"makespan:{label}")
        ax.bar_label(bars, fmt="%.3g", fontsize="small")
    for xi, a, b in zip(x, o, n, strict=True):
        if b > 0:
            ax.text(xi, max(a, b) * 1.08, f"×{a / b:.1f} faster", ha="center",
                    fontsize="small")
    ax.set_xticks(x, labels)
    ax.set_ylabel(f"makespan ({unit})")
    ax.set_ylim(0, max(o + n + lb) * 1.2)
    ax.set_title("Gate step makespan")
    ax.legend(fontsize="small", loc="upper right")
    return fig


WASTE_PARTS: tuple[tuple[str, str, str], ...] = (
    ("counted", "counted calls", "tab:blue"),
    ("cache_hits", "base cache hits (free)", "tab:green"),
    ("discarded_after_freeze", "discarded after freeze", "tab:red"),
    ("cancelled_in_flight", "cancelled in flight", "tab:purple"),
    ("cancelled_before_start", "never started (saved)", "lightgray"),
)


def plot_waste(counters: pl.DataFrame, ax: Axes | None = None) -> Figure:
    """Where each type's 2 × ladder calls went (`vtrm_gate.frames.counters_frame`)."""
    fig, ax = _axes(ax, (9, 0.45 * max(counters.height, 4) + 1.2))
    df = counters.sort("task_type", descending=True)
    y = np.arange(df.height)
    left = np.zeros(df.height)
    for col, label, colour in WASTE_PARTS:
        if col not in df.columns:
            continue
        vals = df[col].fill_null(0).to_numpy().astype(float)
        ax.barh(y, vals, left=left, color=colour, label=label, gid=f"waste:{col}")
        left += vals
    ax.set_yticks(y, df["task_type"].to_list())
    ax.set_xlabel("inference calls (2 per ladder unit)")
    done = int(df["completed"].sum()) if "completed" in df.columns else 0
    wasted = int(df["wasted"].sum()) if "wasted" in df.columns else 0
    share = f"{wasted / done:.1%}" if done else "n/a"
    ax.set_title(f"Waste: {wasted} of {done} completed calls discarded or cancelled ({share})")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small", frameon=False)
    return fig


# ---- operating characteristics ---------------------------------------------------------

OC_EXITS: tuple[tuple[str, str], ...] = (
    ("p_accept", "tab:green"), ("p_provisional", "tab:olive"), ("p_inertia", "tab:gray"),
    ("p_futile", "tab:orange"), ("p_reject", "tab:red"))


def plot_operating_characteristics(oc: pl.DataFrame | None = None,
                                   params: GateParams | None = None, *,
                                   p_wins: Sequence[float] | None = None,
                                   discordances: Sequence[float] = (0.5,),
                                   n_units: int | None = None,
                                   ax: Axes | None = None) -> Figure:
    """Exact exit probabilities vs p_win, one line style per discordance.

    Pass an `oc_grid` frame, or let it compute one from ``params`` (n_units = n_max).
    """
    params = params or GateParams()
    if oc is None:
        grid = p_wins if p_wins is not None else np.linspace(0.3, 1.0, 15).tolist()
        oc = oc_grid(params, grid, discordances, n_units or params.n_max)
    fig, ax = _axes(ax, (8, 4.5))
    styles = ["-", "--", ":", "-."]
    for i, disc in enumerate(sorted(set(oc["discordance"].to_list()))):
        part = oc.filter(pl.col("discordance") == disc).sort("p_win")
        for col, colour in OC_EXITS:
            ax.plot(part["p_win"].to_numpy(), part[col].to_numpy(), color=colour,
                    ls=styles[i % len(styles)],
                    label=f"{col[2:]} (disc {disc:g})", gid=f"oc:{col}:{disc:g}")
    ax.axhline(1 / params.e_confirm, color="black", lw=0.8, ls="--", gid="bound",
               label=f"1/e_confirm = {1 / params.e_confirm:.3g}")
    ax.set_xlabel("candidate's P(win | discordant pair)")
    ax.set_ylabel("exit probability")
    n = sorted(set(oc["n_units"].to_list()))
    ax.set_title(f"Operating characteristics (exact), n_units = {', '.join(map(str, n))}")
    ax.set_ylim(0, 1)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small", frameon=False)
    return fig


# ---- saving ----------------------------------------------------------------------------


def save(fig: Figure, name: str, directory: str | Path = "figures", dpi: int = 120) -> Path:
    """Write ``fig`` as ``<directory>/<name>.png`` (directory created); return the path."""
    path = Path(directory) / name
    if path.suffix.lower() != ".png":
        path = path.with_name(path.name + ".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png")
    return path

