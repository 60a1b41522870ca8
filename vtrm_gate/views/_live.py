"""The Jupyter live view of a running gate: per-type E+/E− panels, progress, decisions.

`LiveGateView` is a gate subscriber (``subscribers=[view]``) or follows a `GateHandle`.
Receiving an event only updates in-memory state (cheap, never awaits), so the view cannot
slow the scheduler. Each redraw takes one `LiveSnapshot`, and the status line, the table
and the figure all come from it (they never disagree). Once displayed it redraws at most
every ``min_interval`` seconds (leading + trailing edge, plus a final redraw); the PNG is
rendered in a worker thread so the event loop is never blocked by matplotlib.

Widgets exist only while the gate runs: when it ends, the displayed view replaces itself
with plain outputs (a PNG figure and an HTML table) that survive save, reload, nbconvert
and GitHub rendering. Headless (never displayed: nbval, scripts) it only collects state;
render on demand with `figure()` and `table()`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import html
import io
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from ..gate import (
    Forecast,
    ForecastInput,
    GateAborted,
    GateEvent,
    GateFinished,
    GateForecast,
    GateHandle,
    GateResult,
    GateStarted,
    Infer,
    PrefixAdvanced,
    TaskFinished,
    TaskStarted,
    TypeDecided,
    TypePlan,
    launch,
)
from ..llm import EndpointPool, EndpointStats
from ..stats import Action, GateParams, TypeOutcome, as_params
from ._figures import (
    TrajectorySeries,
    decisions_claim,
    draw_overview,
    draw_type_panels,
    new_figure,
)
from ._frames import outcomes_frame
from ._style import DISPLAY_DPI, SLIDE, no_frontend, styled, type_colour

PROGRESS_SCHEMA: dict[str, pl.DataType] = {
    "task_type": pl.String(), "consumed": pl.Int64(), "n_ladder": pl.Int64(),
    "in_flight": pl.Int64(), "started": pl.Int64(), "cache_hits": pl.Int64(),
    "W": pl.Int64(), "L": pl.Int64(), "e_plus": pl.Float64(), "e_minus": pl.Float64(),
    "action": pl.String()}

EXIT_GLYPHS = {Action.ACCEPT: "▲", Action.PROVISIONAL: "◆", Action.INERTIA: "●",
               Action.FUTILE: "✖", Action.REJECT: "▼"}
"""The figure's exit marker shapes as text, for the tables."""

LAYOUTS = ("panels", "overview")


@dataclass
class _TypeProgress:
    """Mutable per-type state owned by one view (not shared). The trajectory is kept whole,
    in typed arrays (8 bytes a value, not a boxed number per point)."""

    n_ladder: int = 0
    steps: array[int] = field(default_factory=lambda: array("l"))
    e_plus: array[float] = field(default_factory=lambda: array("d"))
    e_minus: array[float] = field(default_factory=lambda: array("d"))
    W: int = 0
    L: int = 0
    in_flight: int = 0
    started: int = 0
    cache_hits: int = 0
    action: Action = Action.CONTINUE
    outcome: TypeOutcome | None = None

    @property
    def consumed(self) -> int:
        return self.steps[-1] if self.steps else 0


@dataclass(frozen=True)
class LiveSnapshot:
    """One consistent picture of the gate: status, per-type rows, series, the result."""

    status: str
    state: str
    rows: tuple[dict[str, Any], ...]
    series: tuple[TrajectorySeries, ...]
    params: GateParams
    outcomes: dict[str, TypeOutcome]
    consumed: int
    n_ladder: int
    aborted: str | None = None
    endpoints: tuple[EndpointStats, ...] = ()
    """Per-endpoint counters at the snapshot (when the view was given an endpoint pool)."""
    forecast_input: ForecastInput | None = None
    """While the gate runs: what the forecast is computed from (a frozen copy)."""

    @functools.cached_property
    def forecast(self) -> Forecast | None:
        """The ETA and each undecided type's exits from where it stands (the exact
        recursions: computed once per snapshot, in the render thread when there is one)."""
        return None if self.forecast_input is None else self.forecast_input.forecast()

    @property
    def status_line(self) -> str:
        """The status with the forecast ETA while the gate runs."""
        f = self.forecast
        return f"{self.status} · {f.text()}" if f is not None and f.eta_s else self.status

    @property
    def finished(self) -> bool:
        return self.state != "running"

    def progress(self) -> pl.DataFrame:
        return pl.DataFrame(list(self.rows), schema=PROGRESS_SCHEMA, orient="row")

    def table(self) -> pl.DataFrame:
        return outcomes_frame(self.outcomes)


@styled
def render_figure(snap: LiveSnapshot, layout: str = "panels",
                  figsize: tuple[float, float] | None = None) -> Figure:
    """The snapshot's trajectories as a new 1280×720 figure (small multiples or the
    overview), titled with what the gate has decided so far."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    fig = new_figure(figsize or SLIDE, None if layout == "panels" else "constrained")
    title = decisions_claim(snap.series, snap.aborted)
    if snap.forecast is not None and snap.forecast.eta_s is not None:
        title += f"; {snap.forecast.text()}"
    if layout == "panels":
        notes = ({t: panel_note(f) for t, f in snap.forecast.types.items()}
                 if snap.forecast is not None else None)
        if notes:
            title += "; → each running type's likeliest exit (forecast)"
        draw_type_panels(fig, snap.series, snap.params, title=title, n_max=snap.params.n_max,
                         notes=notes)
    else:
        draw_overview(fig, snap.series, snap.params, title=title, n_max=snap.params.n_max)
    return fig


def panel_note(f: Any) -> str:
    """A running type's forecast under its panel title, short enough for a quarter of a
    1280 px figure (``forecast: PROVISIONAL 44%, ~20 to go`` ran into the next panel)."""
    a, p = f.likeliest()
    chance = ">99%" if p > 0.995 else f"{p:.0%}"
    return f"→ {a} {chance}, ~{f.oc.expected_units:.0f} to go"


def render_png(snap: LiveSnapshot, layout: str = "panels",
               figsize: tuple[float, float] | None = None, dpi: int = DISPLAY_DPI) -> bytes:
    """A PNG of the snapshot; a pure function of its inputs, so safe in a worker thread."""
    buf = io.BytesIO()
    render_figure(snap, layout, figsize).savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


_CELL = "padding:2px 8px;font-variant-numeric:tabular-nums;white-space:nowrap"
_NUM = f"{_CELL};text-align:right"
_TXT = f"{_CELL};text-align:left"
_WRAP = "padding:2px 8px;text-align:left;white-space:normal;min-width:12em"
"""The last text column wraps instead of being cut at the output's edge (1280 px)."""


def _table_html(head: Sequence[tuple[str, bool]], body: Sequence[Sequence[str]]) -> str:
    """An HTML table with every row shown; numeric columns right-aligned (flag per column),
    a last text column wrapping within the output's width."""
    styles = [_NUM if num else _TXT for _, num in head]
    if head and not head[-1][1]:
        styles[-1] = _WRAP
    th = "".join(f"<th style='{st}'>{html.escape(h)}</th>"
                 for (h, _), st in zip(head, styles, strict=True))
    tr = "".join("<tr>" + "".join(f"<td style='{st}'>{cell}</td>"
                                  for cell, st in zip(row, styles, strict=True)) + "</tr>"
                 for row in body)
    return (f"<table class='vtrm-table' style='border-collapse:collapse;font-size:13px'>"
            f"<thead><tr>{th}</tr></thead><tbody>{tr}</tbody></table>")


def _swatch(i: int) -> str:
    return (f"<span style='display:inline-block;width:10px;height:10px;margin-right:6px;"
            f"background:{to_hex(type_colour(i))}'></span>")


def _decision(action: str) -> str:
    if action == "CONTINUE":
        return ""
    return f"{EXIT_GLYPHS[Action(action)]} {html.escape(action)}"


def endpoints_html(snap: LiveSnapshot) -> str:
    """Per endpoint: up/down, cap, in flight, calls, errors, times down, latency p50/p95."""
    if not snap.endpoints:
        return ""

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.0f} ms"

    head = [("endpoint", False), ("state", False), ("cap", True), ("in flight", True),
            ("calls", True), ("errors", True), ("down", True), ("p50", True), ("p95", True)]
    body = [[html.escape(e.url), "up" if e.up else "<b style='color:#b00'>DOWN</b>",
             str(e.max_concurrency), str(e.in_flight), str(e.calls), str(e.errors),
             f"{e.times_down}x", ms(e.latency_p50_s), ms(e.latency_p95_s)]
            for e in snap.endpoints]
    return _table_html(head, body)


FORECAST_NOTE = ("forecast: the exact operating-characteristics recursion from each type's "
                 "current state, assuming i.i.d. units at the discordance and win rate it "
                 "showed so far, shrunk toward the prior (p_win 0.5, discordance 0.3); the "
                 "ETA adds the observed call latencies and the slot count. A forecast, not a "
                 "guarantee.")


def _forecast_cell(snap: LiveSnapshot, task_type: str) -> str:
    f = snap.forecast.types.get(task_type) if snap.forecast is not None else None
    if f is None:
        return ""
    return f.label().removeprefix("forecast: ")


def progress_html(snap: LiveSnapshot) -> str:
    """Per type: a progress bar, consumed / ladder, in flight, W, L, E+, E−, the decision
    or, while undecided, the forecast (likeliest exit from here, units expected still)."""
    head = [("type", False), ("progress", False), ("units", True),
            ("in flight", True), ("W", True), ("L", True), ("E+", True), ("E−", True),
            ("decision / forecast", False)]
    body = []
    for i, r in enumerate(snap.rows):
        share = r["consumed"] / r["n_ladder"] if r["n_ladder"] else 1.0
        bar = (f"<div style='width:80px;height:9px;background:#e6e6e6'><div style='width:"
               f"{100 * share:.0f}%;height:9px;background:{to_hex(type_colour(i))}'>"
               f"</div></div>")
        body.append([f"{_swatch(i)}{html.escape(r['task_type'])}", bar,
                     f"{r['consumed']} / {r['n_ladder']}", _count(r["in_flight"]), str(r["W"]),
                     str(r["L"]), f"{r['e_plus']:.3g}", f"{r['e_minus']:.3g}",
                     _decision(r["action"]) or _forecast_cell(snap, r["task_type"])])
    note = (f"<div style='font-size:12px'>{html.escape(FORECAST_NOTE)}</div>"
            if snap.forecast is not None else "")
    return _table_html(head, body) + note + endpoints_html(snap)


def _count(n: int | None) -> str:
    return "—" if n is None else str(n)


def stopped_at(stop_rank: int | None, n_ladder: int) -> str:
    """The 1-based place a type stopped, for display: "unit 28 of 40" (``stop_rank`` is
    0-based in the data, the log and JSON); an empty ladder never started."""
    return "empty ladder" if stop_rank is None else f"unit {stop_rank + 1} of {n_ladder}"


N_USED_NOTE = "n_used: the paired units that counted (INFRA units are skipped, not counted)"


def decision_html(snap: LiveSnapshot, status: bool = True) -> str:
    """The final decision table (every row), with the status line unless ``status`` is
    False (the live widget shows it above already)."""
    head = [("type", False), ("decision", False), ("W", True), ("L", True),
            ("n_used", True), ("E+", True), ("E−", True), ("stopped at", True)]
    body = [[f"{_swatch(i)}{html.escape(r['task_type'])}", _decision(r["action"]),
             str(r["W"]), str(r["L"]), str(r["n_used"]), f"{r['e_plus']:.3g}",
             f"{r['e_minus']:.3g}", stopped_at(r["stop_rank"], r["n_ladder"])]
            for i, r in enumerate(snap.table().iter_rows(named=True))]
    note = (f"<div style='color:#D55E00'>{html.escape(snap.aborted)}</div>"
            if snap.aborted else "")
    line = f"<b>{html.escape(snap.status)}</b>" if status else ""
    return (f"{line}{note}{_table_html(head, body)}"
            f"<div style='font-size:12px'>{N_USED_NOTE}</div>{endpoints_html(snap)}")


class LiveGateView:
    """Live per-type E+/E− panels, progress and the final decision table of one gate.

    Use as a subscriber (``launch(..., subscribers=[view])``), or ``await watch(handle)``.
    ``redraws`` counts figure renders, so throttling is observable. ``layout`` is
    ``"panels"`` (one small panel per type, the default) or ``"overview"`` (all types on
    one E+ and one E− axis). ``calls=False`` takes no per-call events: no in-flight,
    started or cache-hit counts and no ETA, only trajectories and decisions, so the gate
    builds no per-call event for it (for a huge simulated gate, where the view's own cost
    shows: docs/performance.md).
    """

    def __init__(self, params: GateParams | None = None, *, min_interval: float = 0.75,
                 clock: Callable[[], float] = time.monotonic,
                 figsize: tuple[float, float] | None = None, threaded: bool = True,
                 layout: str = "panels", endpoints: EndpointPool | None = None,
                 calls: bool = True):
        if not min_interval >= 0:
            raise ValueError(f"min_interval must be >= 0 seconds, got {min_interval!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        self.params = as_params(params)
        self.min_interval = float(min_interval)
        self.figsize = figsize
        self.threaded = threaded
        self.layout = layout
        self.endpoints = endpoints
        """An `EndpointPool` (e.g. ``agent.endpoints``): its counters join every frame."""
        self.calls = bool(calls)
        self.gate_events = _ALL_EVENTS if self.calls else _DECISION_EVENTS
        """The event classes this view takes (the gate builds per-call ones only if asked)."""
        self.types: dict[str, _TypeProgress] = {}
        self.forecaster = GateForecast()
        """Each running type's exits from where it stands, and the step's ETA."""
        self.result: GateResult | None = None
        self.aborted: str | None = None
        self.concurrency: int | None = None
        self.in_flight = 0
        self.events_seen = 0
        self.redraws = 0
        self.source: GateHandle | None = None
        self._clock = clock
        self._t0: float | None = None
        self._t_end: float | None = None
        self._last_draw = -float("inf")
        self._trailing: asyncio.TimerHandle | None = None
        self._rendering: asyncio.Future[bytes] | None = None
        self._dirty = False
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._widgets: dict[str, Any] | None = None
        self._handles: tuple[Any, Any] | None = None
        self._watched = False
        self.planned: tuple[tuple[str, int], ...] = ()
        """(type, ladder units) of the gate to come: the first frame's placeholder shows it."""
        self.static = False
        """True once the displayed widgets were replaced by the plain final outputs."""

    # ---- state ----------------------------------------------------------------------

    def __call__(self, event: GateEvent) -> None:
        """Subscriber entry point: update state, then maybe redraw (never blocks)."""
        self.update(event)

    def _type(self, name: str) -> _TypeProgress:
        tp = self.types.get(name)  # not setdefault: a new _TypeProgress per event is slow
        if tp is None:
            tp = self.types[name] = _TypeProgress()
        return tp

    def update(self, ev: GateEvent) -> None:
        """Take one event: state first, then maybe a redraw (throttled; never blocks)."""
        self.events_seen += 1
        self.forecaster.update(ev)
        if self._t0 is None:
            self._t0 = self._clock()
        handler = _VIEW_HANDLERS.get(type(ev))
        if handler is not None:
            handler(self, ev)
        if self._widgets is not None and type(ev) not in _FINAL:  # those redraw in _ended
            self._request_redraw()

    def _started(self, ev: TaskStarted) -> None:
        tp = self._type(ev.task.task_type)
        tp.in_flight += 1
        tp.started += 1
        self.in_flight = ev.in_flight

    def _finished(self, ev: TaskFinished) -> None:
        tp = self._type(ev.task.task_type)
        if ev.status == "cache_hit":
            tp.cache_hits += 1
        else:
            tp.in_flight = max(tp.in_flight - 1, 0)
            self.in_flight = max(self.in_flight - 1, 0)

    def _advanced(self, ev: PrefixAdvanced) -> None:
        tp = self._type(ev.task_type)
        consumed = tp.consumed + 1
        tp.n_ladder = max(tp.n_ladder, consumed + ev.n_remaining)
        tp.steps.append(consumed)
        tp.e_plus.append(ev.e_plus)
        tp.e_minus.append(ev.e_minus)
        tp.W, tp.L, tp.action = ev.W, ev.L, ev.action

    def _gate_started(self, ev: GateStarted) -> None:
        self.params, self.concurrency = ev.params, ev.concurrency
        for name, n in zip(ev.task_types, ev.ladder_sizes, strict=True):
            self._type(name).n_ladder = n

    def _decided(self, ev: TypeDecided) -> None:
        tp = self._type(ev.task_type)
        tp.action, tp.outcome = ev.outcome.action, ev.outcome
        tp.n_ladder = max(tp.n_ladder, ev.outcome.n_ladder)

    def _gate_finished(self, ev: GateFinished) -> None:
        self.result = ev.result
        self.aborted = getattr(ev.result, "aborted", None) or self.aborted
        for name, o in ev.result.outcomes.items():
            tp = self._type(name)
            tp.action, tp.outcome = o.action, o
        self.in_flight = 0
        self._ended()

    def _gate_aborted(self, ev: GateAborted) -> None:
        self.aborted = ev.reason
        for tp in self.types.values():
            tp.in_flight = 0
        self.in_flight = 0
        self._ended()

    def _ended(self) -> None:
        self._t_end = self._clock()
        self._request_redraw(final=True)

    @property
    def finished(self) -> bool:
        return self.result is not None or self.aborted is not None

    def snapshot(self) -> LiveSnapshot:
        """The current state, frozen: every rendering reads one snapshot."""
        counted = self.calls  # without per-call events the call counts are unknown: None
        rows = tuple({"task_type": name, "consumed": tp.consumed, "n_ladder": tp.n_ladder,
                      "in_flight": tp.in_flight if counted else None,
                      "started": tp.started if counted else None,
                      "cache_hits": tp.cache_hits if counted else None, "W": tp.W, "L": tp.L,
                      "e_plus": tp.e_plus[-1] if tp.e_plus else 1.0,
                      "e_minus": tp.e_minus[-1] if tp.e_minus else 1.0,
                      "action": str(tp.action)}
                     for name, tp in sorted(self.types.items()))
        series = tuple(TrajectorySeries(name, tuple(tp.steps), tuple(tp.e_plus), tp.action,
                                        tuple(tp.e_minus), tp.W, tp.L, tp.n_ladder)
                       for name, tp in sorted(self.types.items()))
        if self.result is not None:
            outcomes = dict(self.result.outcomes)
        else:
            outcomes = {n: tp.outcome for n, tp in self.types.items() if tp.outcome is not None}
        state = "aborted" if self.aborted else "finished" if self.result else "running"
        decided = sum(r["action"] != "CONTINUE" for r in rows)
        consumed = sum(tp.consumed for tp in self.types.values())
        n_ladder = sum(tp.n_ladder for tp in self.types.values())
        end = self._t_end if self._t_end is not None else self._clock()
        elapsed = end - self._t0 if self._t0 is not None else 0.0
        status = (f"gate {state}: {decided}/{len(rows)} types decided · {consumed}/{n_ladder} "
                  f"units consumed · "
                  + (f"{self.in_flight} calls in flight · " if counted else "")
                  + f"{elapsed:.1f} s")
        return LiveSnapshot(status, state, rows, series, self.params, outcomes, consumed,
                            n_ladder, self.aborted,
                            self.endpoints.stats() if self.endpoints is not None else (),
                            self.forecaster.freeze() if state == "running" else None)

    def series(self) -> list[TrajectorySeries]:
        return list(self.snapshot().series)

    def status(self) -> str:
        """The status line (with the forecast ETA while the gate runs)."""
        return self.snapshot().status_line

    # ---- on-demand rendering (works headless) ----------------------------------------

    def figure(self, layout: str | None = None) -> Figure:
        """The trajectories as a new Figure (``layout``: "panels" or "overview")."""
        return render_figure(self.snapshot(), layout or self.layout, self.figsize)

    def table(self) -> pl.DataFrame:
        """The decision table (`outcomes_frame`) of every type decided so far."""
        return self.snapshot().table()

    def progress(self) -> pl.DataFrame:
        """Per type: consumed / ladder, calls in flight, W, L, E+, E− and the action so far."""
        return self.snapshot().progress()

    def progress_html(self) -> str:
        return progress_html(self.snapshot())

    def _repr_html_(self) -> str:
        snap = self.snapshot()
        body = decision_html(snap) if snap.finished else progress_html(snap)
        return f"<b>{html.escape(snap.status_line)}</b>{body}" if not snap.finished else body

    # ---- live display -----------------------------------------------------------------

    @property
    def widget(self) -> Any:
        """The ipywidgets box (status, overall progress bar, figure, per-type table);
        creating it turns live redrawing on."""
        if self._widgets is None:
            import ipywidgets as w

            status = w.HTML()
            bar = w.IntProgress(value=0, min=0, max=1, description="units",
                                layout=w.Layout(width="60%"))
            # hidden until its first PNG lands: an empty image showed a broken-image icon
            image = w.Image(format="png", layout=w.Layout(max_width="100%", display="none"))
            table = w.HTML()
            box = w.VBox([status, bar, image, table])
            box.add_class("vtrm-live")
            self._widgets = {"box": box, "status": status, "bar": bar, "image": image,
                             "table": table}
            self._draw()
        return self._widgets["box"]

    def display(self) -> LiveGateView:
        """Display the live widget in the current cell; when the gate ends it is replaced
        by a static PNG and an HTML table (plain outputs, no widget). With no Jupyter front
        end, warn and draw nothing: the view keeps its state."""
        if no_frontend("LiveGateView.display"):
            return self
        from IPython.display import HTML, display

        box = self.widget
        self._handles = (display(box, display_id=True),
                         display(HTML(""), display_id=True))
        if self.finished and self._rendering is None:
            self._finalize()
        return self

    def _request_redraw(self, final: bool = False) -> None:
        if self._widgets is None:
            return  # headless: state only
        now = self._clock()
        if final or now - self._last_draw >= self.min_interval:
            self._draw()
            return
        if self._trailing is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop to defer to: the next event (or the final one) redraws
            delay = self.min_interval - (now - self._last_draw)
            self._trailing = loop.call_later(delay, self._trailing_draw)

    def _trailing_draw(self) -> None:
        self._trailing = None
        self._draw()

    def expect(self, plans: Sequence[TypePlan]) -> LiveGateView:
        """Name the gate to come (its types and ladders) for the first frame's placeholder."""
        self.planned = tuple((p.task_type, len(p.units)) for p in plans)
        return self

    def placeholder_html(self) -> str:
        """Before the gate starts: the plan (types, ladder units) and what comes next, instead
        of an empty "0/0 types" frame."""
        n = sum(u for _, u in self.planned)
        head = (f"gate starting: {len(self.planned)} types, {n} ladder units"
                if self.planned else "waiting for the gate to start")
        body = [[f"{_swatch(i)}{html.escape(t)}", str(u), "waiting"]
                for i, (t, u) in enumerate(sorted(self.planned))]
        table = _table_html([("type", False), ("ladder units", True), ("state", False)], body)
        return (f"<b>{html.escape(head)}</b><div style='font-size:12px'>the E+/E− panels "
                f"appear with the first results</div>" + (table if body else ""))

    def _draw(self) -> None:
        assert self._widgets is not None
        if self._trailing is not None:
            self._trailing.cancel()
            self._trailing = None
        if not self.types:  # nothing started yet: the plan, not an empty figure
            self._widgets["status"].value = self.placeholder_html()
            self._widgets["bar"].max = max(sum(u for _, u in self.planned), 1)
            return
        if self._rendering is not None:  # one render at a time; redo when it lands
            self._dirty = True
            return
        self._last_draw = self._clock()
        snap = self.snapshot()
        self.redraws += 1
        args = (snap, self.layout, self.figsize)
        loop = None
        if self.threaded:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        if loop is None:
            self._show(snap, render_png(*args))
            return
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="vtrm-live")
        self._rendering = loop.run_in_executor(self._executor, render_png, *args)
        self._rendering.add_done_callback(lambda fut: self._rendered(fut, snap))

    def _rendered(self, fut: asyncio.Future[bytes], snap: LiveSnapshot) -> None:
        self._rendering = None
        if not fut.cancelled() and fut.exception() is None:
            self._show(snap, fut.result())
        if self._dirty:
            self._dirty = False
            self._draw()
        elif self.finished and self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    def _show(self, snap: LiveSnapshot, png: bytes) -> None:
        """Put one snapshot's status, bar, figure and table on screen together."""
        assert self._widgets is not None
        wd = self._widgets
        self._png = png
        status = f"<b>{html.escape(snap.status_line)}</b>"
        if snap.aborted:
            status += f"<br><span style='color:#b00'>{html.escape(snap.aborted)}</span>"
        wd["status"].value = status
        wd["bar"].max = max(snap.n_ladder, 1)
        wd["bar"].value = snap.consumed
        wd["image"].value = png
        wd["image"].layout.display = None
        wd["table"].value = (decision_html(snap, status=False) if snap.finished
                             else progress_html(snap))
        if snap.finished and not self._dirty and not self._watched:
            self._finalize()  # nobody awaits watch(): replace from the gate's own context

    def _finalize(self) -> None:
        """Replace the displayed widgets by plain outputs: the last PNG and the table."""
        if self._handles is None or self.static or self._widgets is None:
            return
        import base64

        snap = self.snapshot()
        png = getattr(self, "_png", None) or render_png(snap, self.layout, self.figsize)
        fig_handle, table_handle = self._handles
        fig_handle.update({"image/png": base64.b64encode(png).decode("ascii"),
                           "text/plain": f"<{snap.status}>"}, raw=True)
        table_handle.update({"text/html": decision_html(snap),
                             "text/plain": str(snap.table())}, raw=True)
        for wdg in self._widgets.values():
            wdg.close()
        self.static = True

    async def drain(self) -> None:
        """Wait until no render is pending (the last redraw has landed)."""
        while self._rendering is not None or self._trailing is not None:
            if self._rendering is not None:
                await asyncio.wait([self._rendering])
            else:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0)

    async def follow(self, handle: GateHandle) -> None:
        """Feed this view from ``handle.events()`` (every event, history included)."""
        self.source = handle
        async for ev in handle.events():
            self.update(ev)


_VIEW_HANDLERS: dict[type, Callable[[LiveGateView, Any], None]] = {
    GateStarted: LiveGateView._gate_started, TaskStarted: LiveGateView._started,
    TaskFinished: LiveGateView._finished, PrefixAdvanced: LiveGateView._advanced,
    TypeDecided: LiveGateView._decided, GateFinished: LiveGateView._gate_finished,
    GateAborted: LiveGateView._gate_aborted}
"""One method per event class (a dict lookup, not a chain of isinstance checks per event)."""
_FINAL = frozenset({GateFinished, GateAborted})
_ALL_EVENTS = tuple(_VIEW_HANDLERS)
"""Every class the view reads (its handlers'); not `TaskProgress` (a gate whose listeners all
leave it out builds none)."""
_DECISION_EVENTS = tuple(k for k in _ALL_EVENTS if k not in (TaskStarted, TaskFinished))


async def watch(handle: GateHandle, view: LiveGateView | None = None) -> GateResult:
    """Await ``handle`` while ``view`` (a new, displayed one if None) follows it.

    A view already fed by this handle (e.g. from `show_live`) is not subscribed twice.
    """
    if view is None:
        view = LiveGateView()
        view.display()
    view._watched = True  # finalize from this (the awaiting cell's) context: frontends
    follower = None       # route display updates by the cell that sends them
    if view.source is not handle and view.events_seen == 0:
        follower = asyncio.ensure_future(view.follow(handle))
    try:
        return await handle
    finally:
        if follower is not None:
            # The stream ends with GateFinished/GateAborted; a gate cancelled before it ran
            # emits nothing, so do not wait for ever.
            await asyncio.wait([follower], timeout=1.0)
            follower.cancel()
        await view.drain()
        view._finalize()


def show_live(plans: Sequence[TypePlan], infer: Infer, *, view: LiveGateView | None = None,
              display: bool = True, layout: str = "panels",
              endpoints: EndpointPool | None = None, **kw: Any
              ) -> tuple[GateHandle, LiveGateView]:
    """`launch` the gate in the running loop with a live view subscribed; return both.

    The cell returns at once; the view keeps updating and, when the gate ends, turns into
    a static figure and table. ``await watch(handle, view)`` (or ``await handle``) for the
    result. ``endpoints`` (an `EndpointPool`, e.g. ``agent.endpoints``) adds per-endpoint
    counters to the view. ``kw`` goes to `launch` (params, concurrency, ...). To serve a
    re-launch from Redis, wrap ``infer`` with `vtrm_gate.cache.cached_infer` (see the README).
    """
    view = view or LiveGateView(kw.get("params"), layout=layout, endpoints=endpoints)
    view.expect(plans)
    subs = [view, *kw.pop("subscribers", ())]
    handle = launch(plans, infer, subscribers=subs, **kw)
    view.source = handle
    if display and not no_frontend("show_live"):
        view.display()
    return handle, view
