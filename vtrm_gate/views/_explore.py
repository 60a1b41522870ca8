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
import io
from collections.abc import Sequence
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

EXITS = (Action.ACCEPT, Action.PROVISIONAL, Action.INERTIA, Action.FUTILE, Action.REJECT)
EXIT_COLOURS = {Action.ACCEPT: "tab:green", Action.PROVISIONAL: "tab:olive",
                Action.INERTIA: "tab:gray", Action.FUTILE: "tab:orange",
                Action.REJECT: "tab:red"}


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


def explorer_figure(point: Point, mc: dict[Action, tuple[float, float, float]] | None = None,
                    p_grid: Sequence[float] = tuple(np.round(np.linspace(0.3, 1.0, 11), 3))
                    ) -> GateFigure:
    """Left: exact P(exit) vs p_win with the chosen p_win marked; right: the chosen point's
    exits (numbers on the bars, Monte Carlo check as error bars when given)."""
    params, n = point.params, point.n_units
    oc = point_oc(params, point.p_win, point.discordance, n)
    h0 = point_oc(params, 0.5, point.discordance, n)
    curves = [point_oc(params, float(p), point.discordance, n) for p in p_grid]
    fig = new_figure((12.8, 5.4))
    left, right = fig.subplots(1, 2, width_ratios=(1.4, 1))
    for a in EXITS:
        left.plot(p_grid, [_probs(c)[a] for c in curves], color=EXIT_COLOURS[a],
                  marker=EXIT_MARKERS[a], ms=5, lw=1.8, label=str(a), gid=f"curve:{a}")
    left.axvline(point.p_win, color="black", lw=1.2, gid="p_win")
    left.axvline(0.5, color="0.5", lw=0.8, ls=":")
    left.axhline(1 / params.e_confirm, color="black", lw=0.8, ls="--",
                 label=f"1/e_confirm = {1 / params.e_confirm:.3g}")
    left.set_ylim(0, 1)
    left.set_xlabel("candidate's P(win | discordant pair)")
    left.set_ylabel("exit probability (exact)")
    left.legend(loc="center left", fontsize="small", frameon=False)
    left.grid(True, alpha=0.3)
    left.set_title(f"discordance {point.discordance:g}, {n} units", loc="left")
    probs = _probs(oc)
    xs = np.arange(len(EXITS))
    bars = right.bar(xs, [probs[a] for a in EXITS],
                     color=[EXIT_COLOURS[a] for a in EXITS], gid="point")
    right.bar_label(bars, labels=[f"{probs[a]:.1%}" for a in EXITS], padding=2)
    if mc is not None:
        rate = np.array([mc[a][0] for a in EXITS])
        err = np.array([[mc[a][0] - mc[a][1] for a in EXITS], [mc[a][2] - mc[a][0]
                                                               for a in EXITS]])
        right.errorbar(xs + 0.25, rate, yerr=err, fmt="o", color="black", capsize=4,
                       label="Monte Carlo (95% Wilson)", gid="monte_carlo")
        right.legend(loc="upper right", fontsize="small", frameon=False)
    right.set_xticks(xs, [str(a) for a in EXITS], fontsize="small")
    right.set_ylim(0, 1.1)
    right.set_title(f"at p_win {point.p_win:g}: expected {oc.expected_units:.1f} units",
                    loc="left")
    fig.suptitle(f"ACCEPT {oc.p_accept:.1%} at p_win {point.p_win:g}; H0 false accept "
                 f"{h0.p_accept:.2%} (bound 1/e_confirm = {1 / params.e_confirm:.1%}).  "
                 f"e_confirm {params.e_confirm:g}, λ {params.lambda_dir:g}, δ "
                 f"{params.delta_min:g}, w_net_min {params.w_net_min}, e_prov "
                 f"{params.e_provisional:g}, w_prov {params.w_net_min_provisional}",
                 x=0.01, ha="left", fontsize="medium")
    return fig


def tradeoffs(p_win: float = 0.7, n_units: int = 40, discordance: float = 0.5,
              target: float = 0.5, e_confirms: Sequence[float] = (20, 15, 10, 8, 5),
              lambdas: Sequence[float] = (0.3, 0.5, 0.7, 0.9),
              w_net_mins: Sequence[int] = (3,)) -> pl.DataFrame:
    """Every setting on a grid with its P(ACCEPT) at ``p_win`` and H0 false accept; the
    column ``meets`` says whether P(ACCEPT) > ``target``. Sorted by false accept."""
    rows = []
    for e in e_confirms:
        for lam in lambdas:
            for w in w_net_mins:
                params = GateParams(e_confirm=float(e), lambda_dir=lam, w_net_min=w,
                                    n_max=n_units)
                good = point_oc(params, p_win, discordance, n_units)
                null = point_oc(params, 0.5, discordance, n_units)
                rows.append({"e_confirm": float(e), "lambda_dir": lam, "w_net_min": w,
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


class Explorer:
    """The widgets and their state; ``redraws`` counts figure renders."""

    def __init__(self, point: Point | None = None, *, debounce: float = 0.25,
                 mc_reps: int = 20_000):
        import ipywidgets as w

        self.point = point or Point()
        self.debounce = debounce
        self.mc_reps = mc_reps
        self.redraws = 0
        self.error = ""
        self._timer: asyncio.TimerHandle | None = None
        self.mc: dict[Action, tuple[float, float, float]] | None = None
        p = self.point.params
        self.sliders: dict[str, Any] = {}
        style = {"description_width": "120px"}
        for name, label, lo, hi, step in SLIDERS:
            cls = w.IntSlider if isinstance(step, int) else w.FloatSlider
            self.sliders[name] = cls(value=getattr(p, name), min=lo, max=hi, step=step,
                                     description=label, style=style, continuous_update=True)
        self.sliders["p_win"] = w.FloatSlider(value=self.point.p_win, min=0.0, max=1.0,
                                              step=0.01, description="assumed p_win",
                                              style=style)
        self.sliders["discordance"] = w.FloatSlider(value=self.point.discordance, min=0.05,
                                                    max=1.0, step=0.05,
                                                    description="assumed discordance",
                                                    style=style)
        self.button = w.Button(description="Monte Carlo check", icon="random")
        self.message = w.HTML()
        self.image = w.Image(format="png", layout=w.Layout(max_width="100%"))
        for s in self.sliders.values():
            s.observe(self._changed, names="value")
        self.button.on_click(lambda _: self.check())
        controls = w.VBox([*self.sliders.values(), self.button])
        self.widget = w.VBox([w.HBox([controls, self.message]), self.image])
        self.widget.add_class("vtrm-explorer")
        self.redraw()

    def _read(self) -> Point:
        v = {k: s.value for k, s in self.sliders.items()}
        params = replace(GateParams(), **{k: v[k] for k, *_ in SLIDERS})
        return Point(params, float(v["p_win"]), float(v["discordance"]))

    def _changed(self, _: Any) -> None:
        self.mc = None
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
        """Read the sliders, recompute exactly and replace the figure."""
        self._timer = None
        try:
            self.point = self._read()
        except ValueError as exc:  # e.g. λ > 1/(1+δ): say which, keep the last figure
            self.error = str(exc)
            self.message.value = f"<span style='color:#b00'>{exc}</span>"
            return
        self.error = ""
        fig = explorer_figure(self.point, self.mc)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=80)
        self.image.value = buf.getvalue()
        self.redraws += 1
        oc = point_oc(self.point.params, self.point.p_win, self.point.discordance,
                     self.point.n_units)
        self.message.value = (f"<div style='padding:8px;font-size:14px'>P(ACCEPT) "
                              f"<b>{oc.p_accept:.1%}</b><br>expected units "
                              f"{oc.expected_units:.1f}<br>redraws {self.redraws}</div>")

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def check(self) -> None:
        """Run the Monte Carlo check of the current point and redraw with it."""
        self.mc = monte_carlo_check(self.point, self.mc_reps)
        self.redraw()


def explore(point: Point | None = None, *, interactive: bool = True) -> Any:
    """The parameter explorer (an `Explorer`: displays its widgets as a cell's last
    expression), or headless (``interactive=False``) the figure of ``point``, rendered once."""
    if not interactive:
        return explorer_figure(point or Point())
    return Explorer(point)
