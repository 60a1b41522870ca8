"""Choose gate parameters knowingly: exact operating characteristics at a point, live.

`explore()` shows ipywidgets sliders for e_confirm, λ, δ, w_net_min, the provisional
thresholds and n_max, and for the assumed p_win and discordance. Every change (debounced)
redraws the exact exit probabilities (accept / provisional / inertia / futile / reject,
expected units) and the H0 false-accept rate; "Monte Carlo check" simulates the same point.
Headless (``interactive=False``) it renders the default point once.

The numbers are `stats.operating_characteristics` (exact, O(n³), milliseconds at n ≤ 100), the
same function the design-review figures and the README quote.
"""

from __future__ import annotations

import asyncio
import base64
import html
import io
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import polars as pl

from ..stats import (
    ACTION_CODES,
    Action,
    GateParams,
    OperatingCharacteristics,
    operating_characteristics,
    paired_outcomes,
    replay_prefix_batch,
    wilson_interval,
)
from ._figures import EXIT_MARKERS, GateFigure, new_figure
from ._style import BOUND, MUTED, SLIDE, jupyter_frontend, styled
from ._style import EXIT_COLOURS as STYLE_EXIT_COLOURS

EXITS = (Action.ACCEPT, Action.PROVISIONAL, Action.INERTIA, Action.FUTILE, Action.REJECT)
EXIT_COLOURS = {a: STYLE_EXIT_COLOURS[str(a)] for a in EXITS}


def point_oc(params: GateParams, p_win: float, discordance: float, n_units: int
             ) -> OperatingCharacteristics:
    """The explorer's numbers: the kernel's exact OC (INFRA-free), milliseconds at n ≤ 100."""
    return operating_characteristics(params, p_win, discordance, n_units)


@dataclass(frozen=True)
class Point:
    """One explorer setting: gate parameters and the assumed candidate."""

    params: GateParams = field(default_factory=GateParams)
    p_win: float = 0.7
    discordance: float = 0.5

    @property
    def n_units(self) -> int:
        return self.params.n_max


def _probs(oc: OperatingCharacteristics) -> dict[Action, float]:
    return {Action.ACCEPT: oc.p_accept, Action.PROVISIONAL: oc.p_provisional,
            Action.INERTIA: oc.p_inertia, Action.FUTILE: oc.p_futile,
            Action.REJECT: oc.p_reject}


def monte_carlo_check(point: Point, n_rep: int = 20_000, seed: int = 0
                      ) -> dict[Action, tuple[float, float, float]]:
    """Simulated P(exit) at ``point``: (rate, 95% Wilson low, high) per exit."""
    rng = np.random.default_rng(seed)
    base, cand = paired_outcomes(rng, n_rep, point.n_units, point.discordance, point.p_win)
    codes = replay_prefix_batch(base, cand, point.params).action
    out = {}
    for a in EXITS:
        k = int(np.sum(codes == ACTION_CODES.index(a)))
        lo, hi = wilson_interval(k, n_rep)
        out[a] = (k / n_rep, float(lo), float(hi))
    return out


def _exit_curves(ax: Any, point: Point, p_grid: Sequence[float]) -> None:
    params, n = point.params, point.n_units
    curves = [point_oc(params, float(p), point.discordance, n) for p in p_grid]
    for a in EXITS:
        ax.plot(p_grid, [_probs(c)[a] for c in curves], color=EXIT_COLOURS[a],
                marker=EXIT_MARKERS[a], ms=5, lw=1.8, label=str(a), gid=f"curve:{a}")
    ax.axvline(point.p_win, color=BOUND, lw=1.2, gid="p_win")
    ax.axvline(0.5, color=MUTED, lw=0.8, ls=":")
    ax.axhline(1 / params.e_confirm, color=BOUND, lw=0.8, ls="--",
               label=f"1/e_confirm = {1 / params.e_confirm:.3g}")
    ax.set_ylim(0, 1)
    ax.set_xlabel("candidate's P(win | discordant pair)")
    ax.set_ylabel("exit probability (exact)")
    ax.legend(loc="center left", fontsize="small", frameon=False)
    ax.grid(True, alpha=0.4)
    ax.set_title(f"every p_win: discordance {point.discordance:g}, {n} units", loc="left",
                 fontsize="medium")


def _point_bars(ax: Any, oc: OperatingCharacteristics,
                mc: dict[Action, tuple[float, float, float]] | None, n_rep: int | None) -> None:
    probs = _probs(oc)
    xs = np.arange(len(EXITS))
    bars = ax.bar(xs, [probs[a] for a in EXITS], color=[EXIT_COLOURS[a] for a in EXITS],
                  gid="point")
    tall = [probs[a] >= 0.9 for a in EXITS]  # labelled inside, so the axis can stop at 1
    ax.bar_label(bars, labels=["" if t else f"{probs[a]:.1%}" for a, t in zip(EXITS, tall,
                                                                              strict=True)],
                 padding=2)
    ax.bar_label(bars, labels=[f"{probs[a]:.1%}" if t else "" for a, t in zip(EXITS, tall,
                                                                              strict=True)],
                 padding=-22, color="#FFFFFF")
    if mc is not None:
        rate = np.array([mc[a][0] for a in EXITS])
        err = np.array([[mc[a][0] - mc[a][1] for a in EXITS],
                        [mc[a][2] - mc[a][0] for a in EXITS]])
        ax.errorbar(xs + 0.3, rate, yerr=err, fmt="o", color=BOUND, capsize=4,
                    label=f"Monte Carlo, {n_rep:,} runs (95% Wilson)" if n_rep
                    else "Monte Carlo (95% Wilson)", gid="monte_carlo")
        ax.legend(loc="upper right", fontsize="small", frameon=False)
    ax.set_xticks(xs, [str(a) for a in EXITS], fontsize="small")
    ax.set_ylim(0, 1)
    ax.set_xlabel("exit")
    ax.set_ylabel("probability at the chosen point")
    ax.set_title(f"at p_win {oc.p_win:g}: expected {oc.expected_units:.1f} units", loc="left",
                 fontsize="medium")


@styled
def explorer_figure(point: Point, mc: dict[Action, tuple[float, float, float]] | None = None,
                    p_grid: Sequence[float] = tuple(np.round(np.linspace(0.3, 1.0, 11), 3)),
                    *, n_rep: int | None = None) -> GateFigure:
    """Left: exact P(exit) vs p_win with the chosen p_win marked; right: the chosen point's
    exits (numbers on the bars, the Monte Carlo check of ``n_rep`` runs as error bars)."""
    params, n = point.params, point.n_units
    oc = point_oc(params, point.p_win, point.discordance, n)
    h0 = point_oc(params, 0.5, point.discordance, n)
    fig = new_figure(SLIDE)
    left, right = fig.subplots(1, 2, width_ratios=(1.4, 1))
    _exit_curves(left, point, p_grid)
    _point_bars(right, oc, mc, n_rep)
    fig.suptitle(f"ACCEPT {oc.p_accept:.1%} at p_win {point.p_win:g}; H0 false accept "
                 f"{h0.p_accept:.2%} (bound 1/e_confirm = {1 / params.e_confirm:.1%})",
                 x=0.01, ha="left")
    fig.supxlabel(f"e_confirm {params.e_confirm:g}, λ {params.lambda_dir:g}, δ "
                  f"{params.delta_min:g}, w_net_min {params.w_net_min}, e_provisional "
                  f"{params.e_provisional:g}, w_net_min_provisional "
                  f"{params.w_net_min_provisional}, n_max {params.n_max}; exact dynamic "
                  f"programming", fontsize="small", color=MUTED, gid="caption")
    return fig


def stale_png(fig: GateFigure, reason: str) -> bytes:
    """``fig`` greyed out under ``reason``: what the explorer shows when it cannot redraw."""
    from matplotlib.patches import Rectangle

    fig.add_artist(Rectangle((0, 0), 1, 1, transform=fig.transFigure, color="#FFFFFF",
                             alpha=0.75, zorder=10, gid="stale"))
    fig.text(0.5, 0.5, f"not redrawn: {reason}", ha="center", va="center", wrap=True,
             fontsize="large", color=BOUND, zorder=11)
    return fig._repr_png_()


SLOW_GRID_UNITS = 200
"""Beyond this ladder length each exact OC takes a noticeable time (O(n³): ~0.06 s at 200
units, ~3 s at 1,000), so `tradeoffs` reports its progress in a Jupyter cell."""


@contextmanager
def _grid_progress(total: int, n_units: int) -> Iterator[Callable[[int], None]]:
    """``progress(done)`` for a grid of ``total`` settings: a line in the cell that ends
    saying how long the grid took (plain HTML, so a saved notebook keeps it); silent for
    short ladders and outside Jupyter."""
    if n_units <= SLOW_GRID_UNITS or not jupyter_frontend():
        yield lambda done: None
        return
    from IPython.display import HTML, display

    t0 = time.perf_counter()
    line = display(HTML(""), display_id=True)

    def progress(done: int) -> None:
        line.update(HTML(f"<span style='color:{MUTED}'>exact OC at {n_units:,} units: "
                         f"setting {done + 1} of {total}…</span>"))

    yield progress
    line.update(HTML(f"<span style='color:{MUTED}'>{total} settings at {n_units:,} units in "
                     f"{time.perf_counter() - t0:.0f} s</span>"))


def tradeoffs(p_win: float = 0.7, n_units: int = 40, discordance: float = 0.5,
              target: float = 0.5, e_confirms: Sequence[float] = (20, 15, 10, 8, 5),
              lambdas: Sequence[float] = (0.3, 0.5, 0.7, 0.9),
              w_net_mins: Sequence[int] = (3,)) -> pl.DataFrame:
    """Every setting on a grid with its P(ACCEPT) at ``p_win`` and H0 false accept; the
    column ``meets`` says whether P(ACCEPT) > ``target``. Sorted by false accept. Beyond
    `SLOW_GRID_UNITS` units a Jupyter cell shows how far the grid has got."""
    rows: list[dict[str, Any]] = []
    grid = [(float(e), lam, w) for e in e_confirms for lam in lambdas for w in w_net_mins]
    with _grid_progress(len(grid), n_units) as progress:
        for e, lam, w in grid:
            progress(len(rows))
            params = GateParams(e_confirm=e, lambda_dir=lam, w_net_min=w, n_max=n_units)
            good = point_oc(params, p_win, discordance, n_units)
            null = point_oc(params, 0.5, discordance, n_units)
            rows.append({"e_confirm": e, "lambda_dir": lam, "w_net_min": w,
                         "p_accept": good.p_accept, "false_accept_h0": null.p_accept,
                         "bound": 1 / e, "expected_units": good.expected_units,
                         "meets": good.p_accept > target})
    return pl.DataFrame(rows).sort("false_accept_h0", "p_accept", descending=[False, True])


SLIDERS: tuple[tuple[str, str, float, float, float], ...] = (
    ("e_confirm", "e_confirm", 2.0, 50.0, 0.5),
    ("lambda_dir", "λ", 0.05, 1.0, 0.05),
    ("delta_min", "δ", 0.0, 0.3, 0.01),
    ("w_net_min", "w_net_min", 0, 10, 1),
    ("e_provisional", "e_provisional", 1.0, 10.0, 0.5),
    ("w_net_min_provisional", "w_net_min_prov", 0, 10, 1),
    ("n_max", "n_max", 5, 100, 1),
)


STALE_CSS = ("<style>.vtrm-stale{opacity:0.35;pointer-events:none}</style>")
"""Greys out the figure and the numbers while they are recomputed for a new setting."""

SNAPSHOT_CSS = ("<style>.jp-OutputArea:has(.vtrm-explorer:not(.jupyter-widgets-disconnected))"
                " .vtrm-snapshot{display:none}"
                ".vtrm-explorer.jupyter-widgets-disconnected{display:none}"
                ".jp-OutputArea-child:has(~.jp-OutputArea-child .vtrm-snapshot)"
                ":has(.jupyter-widgets):not(:has(.vtrm-explorer)){display:none}</style>")
"""The snapshot (a plain output) is hidden while the explorer's widgets are live; widgets
without a kernel (a reopened notebook) are hidden instead, so the last state shows as an
image, not as a dozen "disconnected" icons (nor, without saved widget state, as "Error
displaying widget")."""


def snapshot_html(png: bytes, numbers: str) -> str:
    """The explorer's last figure and numbers as plain HTML (no widget), with `SNAPSHOT_CSS`."""
    src = base64.b64encode(png).decode("ascii")
    return (f"{SNAPSHOT_CSS}<div class='vtrm-snapshot'><div style='color:{MUTED}'>the "
            f"explorer's last state (run the cell for live sliders)</div><img alt='explorer' "
            f"style='max-width:100%' src='data:image/png;base64,{src}'>{numbers}</div>")


class Explorer:
    """The widgets and their state; ``redraws`` counts figure renders. λ's slider stops at
    1/(1+δ) as δ moves (its value clamped), so every setting the sliders reach is valid.
    From a slider move until the redraw lands the figure and the numbers are greyed out
    and the button disabled (`recomputing`): what is shown never disagrees with the
    sliders unmarked."""

    def __init__(self, point: Point | None = None, *, debounce: float = 0.25,
                 mc_reps: int = 20_000):
        import ipywidgets as w

        self.point = point or Point()
        self.debounce = debounce
        self.mc_reps = mc_reps
        self.redraws = 0
        self.error = ""
        self._timer: asyncio.TimerHandle | None = None
        self._snapshot: Any = None  # the display handle of the plain snapshot, once shown
        self.mc: dict[Action, tuple[float, float, float]] | None = None
        self.sliders = _sliders(w, self.point)
        self.recomputing = False
        self.button = w.Button(description="Monte Carlo check", icon="random",
                               layout=w.Layout(width="auto"))  # 148 px cut its label
        self.message = w.HTML()
        self.note = w.HTML()
        self.image = w.Image(format="png", layout=w.Layout(max_width="100%"))
        # clamp λ before anything reads the sliders: observers run in the order added
        self.sliders["delta_min"].observe(self._clamp_lambda, names="value")
        for s in self.sliders.values():
            s.observe(self._changed, names="value")
        self.button.on_click(lambda _: self.check())
        controls = w.VBox([*self.sliders.values(), self.button])
        self.widget = w.VBox([w.HTML(STALE_CSS),
                              w.HBox([controls, w.VBox([self.message, self.note])]),
                              self.image])
        self.widget.add_class("vtrm-explorer")
        self._clamp_lambda(None)
        self.redraw()

    def _clamp_lambda(self, _: Any) -> None:
        """λ's valid range is (0, 1/(1+δ)]: move the slider's end (and its value) with δ."""
        lam = self.sliders["lambda_dir"]
        top = 1.0 / (1.0 + float(self.sliders["delta_min"].value))
        before = float(lam.value)
        lam.max = top  # ipywidgets clamps the value to the new end
        self.note.value = (f"<div style='padding:4px 8px'>λ ≤ 1/(1+δ) = {top:.3f}: moved "
                           f"from {before:g} to {float(lam.value):.3f}</div>"
                           if float(lam.value) < before else "")

    def _read(self) -> Point:
        v = {k: s.value for k, s in self.sliders.items()}
        params = replace(GateParams(), **{k: v[k] for k, *_ in SLIDERS})
        return Point(params, float(v["p_win"]), float(v["discordance"]))

    def _stale(self, on: bool) -> None:
        """Grey out (or restore) the figure and numbers, and disable (or enable) the button."""
        self.recomputing = on
        for wdg in (self.image, self.message):
            (wdg.add_class if on else wdg.remove_class)("vtrm-stale")
        self.button.disabled = on

    def _changed(self, _: Any) -> None:
        self.mc = None
        self._stale(True)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or self.debounce <= 0:
            self.redraw()
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_later(self.debounce, self.redraw)

    def redraw(self) -> None:
        """Read the sliders, recompute exactly and replace the figure; a setting that does
        not validate greys the last figure out and says why."""
        self._timer = None
        try:
            point = self._read()
        except ValueError as exc:
            self.error = str(exc)
            self.image.value = stale_png(explorer_figure(self.point), self.error)
            self.message.value = f"<span style='color:#D55E00'>{html.escape(self.error)}</span>"
            self._stale(False)
            self._publish()
            return
        self.point, self.error = point, ""
        fig = explorer_figure(point, self.mc, n_rep=self.mc_reps if self.mc else None)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=80)
        self.image.value = buf.getvalue()
        self.redraws += 1
        oc = point_oc(point.params, point.p_win, point.discordance, point.n_units)
        mc = (f"<br>Monte Carlo: {self.mc_reps:,} runs, ACCEPT "
              f"{self.mc[Action.ACCEPT][0]:.1%}" if self.mc else "")
        self.message.value = (f"<div style='padding:8px;font-size:14px'>P(ACCEPT) "
                              f"<b>{oc.p_accept:.1%}</b><br>expected units "
                              f"{oc.expected_units:.1f}{mc}<br>redraws {self.redraws}</div>")
        self._stale(False)
        self._publish()

    def snapshot(self) -> str:
        """The figure and numbers now shown, as plain HTML (`snapshot_html`)."""
        return snapshot_html(self.image.value, self.message.value)

    def _publish(self) -> None:
        """Update the displayed snapshot (if any) to what the widgets now show."""
        if self._snapshot is not None:
            from IPython.display import HTML

            self._snapshot.update(HTML(self.snapshot()))

    def _ipython_display_(self) -> None:
        """The widgets, then a plain snapshot of their figure and numbers that follows every
        redraw: a saved notebook reopened without a kernel shows that, not broken widgets."""
        from IPython.display import HTML, display

        display(self.widget)
        self._snapshot = display(HTML(self.snapshot()), display_id=True)

    def check(self) -> bool:
        """Run the Monte Carlo check of the current setting and redraw with it; say so, and
        return False, when the setting is invalid."""
        try:
            point = self._read()
        except ValueError as exc:
            self.message.value = (f"<span style='color:#D55E00'>Monte Carlo check not run: "
                                  f"{html.escape(str(exc))}</span>")
            return False
        self.message.value = f"running the Monte Carlo check ({self.mc_reps:,} runs) ..."
        self._stale(True)
        self.point = point
        self.mc = monte_carlo_check(point, self.mc_reps)
        self.redraw()
        return True


def _sliders(w: Any, point: Point) -> dict[str, Any]:
    """One slider per parameter of `SLIDERS`, then the assumed p_win and discordance."""
    p = point.params
    longest = max([len(label) for _, label, *_ in SLIDERS] + [len("assumed discordance")])
    style = {"description_width": f"{8 * longest + 8}px"}  # 120 px cut "assumed discordance"
    out: dict[str, Any] = {}
    for name, label, lo, hi, step in SLIDERS:
        cls = w.IntSlider if isinstance(step, int) else w.FloatSlider
        out[name] = cls(value=getattr(p, name), min=lo, max=hi, step=step, description=label,
                        style=style, continuous_update=True)
    out["p_win"] = w.FloatSlider(value=point.p_win, min=0.0, max=1.0, step=0.01,
                                 description="assumed p_win", style=style)
    out["discordance"] = w.FloatSlider(value=point.discordance, min=0.05, max=1.0, step=0.05,
                                       description="assumed discordance", style=style)
    return out


def explore(point: Point | None = None, *, interactive: bool = True) -> Any:
    """The parameter explorer (an `Explorer`: displays its widgets as a cell's last
    expression), or headless (``interactive=False``) the figure of ``point``, rendered once."""
    if not interactive:
        return explorer_figure(point or Point())
    return Explorer(point)
