"""The Jupyter live view of a running gate: e+ trajectories, per-type progress, decisions.

`LiveGateView` is a gate subscriber (``subscribers=[view]``) or follows a `GateHandle`.
Receiving an event only updates in-memory state (cheap, never awaits), so the view cannot
slow the scheduler. Once displayed, it redraws at most every ``min_interval`` seconds
(leading + trailing edge, plus a final redraw); the PNG is rendered in a worker thread so
the event loop is never blocked by matplotlib. Headless (never displayed, e.g. under nbval
or in a script) it only collects state: render on demand with `figure()` and `table()`.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import html
import io
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl
from matplotlib.figure import Figure

from .figures import TrajectorySeries, draw_trajectories
from .frames import outcomes_frame
from .scheduler import (
    GateAborted,
    GateEvent,
    GateFinished,
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
from .stats import Action, GateParams, TypeOutcome

PROGRESS_SCHEMA: dict[str, pl.DataType] = {
    "task_type": pl.String(), "consumed": pl.Int64(), "n_ladder": pl.Int64(),
    "in_flight": pl.Int64(), "started": pl.Int64(), "cache_hits": pl.Int64(),
    "W": pl.Int64(), "L": pl.Int64(), "e_plus": pl.Float64(), "action": pl.String()}


@dataclass
class _TypeProgress:
    """Mutable per-type state owned by one view (not shared)."""

    n_ladder: int = 0
    steps: list[int] = field(default_factory=list)
    e_plus: list[float] = field(default_factory=list)
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


def render_png(series: Sequence[TrajectorySeries], params: GateParams, title: str,
               figsize: tuple[float, float] = (9.0, 4.8), dpi: int = 90) -> bytes:
    """A PNG of the trajectories; pure function of its inputs, so safe in a worker thread."""
    fig = Figure(figsize=figsize, layout="constrained")
    draw_trajectories(fig.add_subplot(), series, params, title=title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


class LiveGateView:
    """Live per-type E+ trajectories, progress and the final decision table of one gate.

    Use as a subscriber (``launch(..., subscribers=[view])``), or ``await watch(handle)``.
    ``redraws`` counts figure renders, so throttling is observable.
    """

    def __init__(self, params: GateParams | None = None, *, min_interval: float = 0.5,
                 clock: Callable[[], float] = time.monotonic,
                 figsize: tuple[float, float] = (9.0, 4.8), threaded: bool = True):
        if not min_interval >= 0:
            raise ValueError(f"min_interval must be >= 0 seconds, got {min_interval!r}")
        self.params = params or GateParams()
        self.min_interval = float(min_interval)
        self.figsize = figsize
        self.threaded = threaded
        self.types: dict[str, _TypeProgress] = {}
        self.result: GateResult | None = None
        self.aborted: str | None = None
        self.concurrency: int | None = None
        self.in_flight = 0
        self.events_seen = 0
        self.redraws = 0
        self.source: GateHandle | None = None
        self._clock = clock
        self._last_draw = -float("inf")
        self._trailing: asyncio.TimerHandle | None = None
        self._rendering: asyncio.Future[bytes] | None = None
        self._dirty = False
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._widgets: tuple[Any, Any, Any, Any] | None = None

    # ---- state ----------------------------------------------------------------------

    def __call__(self, event: GateEvent) -> None:
        """Subscriber entry point: update state, then maybe redraw (never blocks)."""
        self.update(event)

    def _type(self, name: str) -> _TypeProgress:
        return self.types.setdefault(name, _TypeProgress())

    def update(self, ev: GateEvent) -> None:
        self.events_seen += 1
        if isinstance(ev, GateStarted):
            self.params, self.concurrency = ev.params, ev.concurrency
            for name, n in zip(ev.task_types, ev.ladder_sizes, strict=True):
                self._type(name).n_ladder = n
        elif isinstance(ev, TaskStarted):
            tp = self._type(ev.task.task_type)
            tp.in_flight += 1
            tp.started += 1
            self.in_flight = ev.in_flight
        elif isinstance(ev, TaskFinished):
            tp = self._type(ev.task.task_type)
            if ev.status == "cache_hit":
                tp.cache_hits += 1
            else:
                tp.in_flight = max(tp.in_flight - 1, 0)
                self.in_flight = max(self.in_flight - 1, 0)
        elif isinstance(ev, PrefixAdvanced):
            tp = self._type(ev.task_type)
            consumed = tp.consumed + 1
            tp.n_ladder = max(tp.n_ladder, consumed + ev.n_remaining)
            tp.steps.append(consumed)
            tp.e_plus.append(ev.e_plus)
            tp.W, tp.L, tp.action = ev.W, ev.L, ev.action
        elif isinstance(ev, TypeDecided):
            tp = self._type(ev.task_type)
            tp.action, tp.outcome = ev.outcome.action, ev.outcome
            tp.n_ladder = max(tp.n_ladder, ev.outcome.n_ladder)
        elif isinstance(ev, GateFinished):
            self.result = ev.result
            for name, o in ev.result.outcomes.items():
                tp = self._type(name)
                tp.action, tp.outcome = o.action, o
        elif isinstance(ev, GateAborted):
            self.aborted = ev.reason
            for tp in self.types.values():
                tp.in_flight = 0
            self.in_flight = 0
        self._request_redraw(final=isinstance(ev, GateFinished | GateAborted))

    @property
    def finished(self) -> bool:
        return self.result is not None or self.aborted is not None

    def series(self) -> list[TrajectorySeries]:
        return [TrajectorySeries(name, tuple(tp.steps), tuple(tp.e_plus), tp.action)
                for name, tp in sorted(self.types.items())]

    def status(self) -> str:
        decided = sum(tp.action is not Action.CONTINUE for tp in self.types.values())
        state = ("aborted" if self.aborted else "finished" if self.result else "running")
        return (f"gate {state}: {decided}/{len(self.types)} types decided, "
                f"{self.in_flight} calls in flight")

    # ---- on-demand rendering (works headless) ----------------------------------------

    def figure(self) -> Figure:
        """The trajectories as a new Figure, from the state collected so far."""
        fig = Figure(figsize=self.figsize, layout="constrained")
        draw_trajectories(fig.add_subplot(), self.series(), self.params, title=self.status())
        return fig

    def table(self) -> pl.DataFrame:
        """The decision table (`outcomes_frame`) of every type decided so far."""
        if self.result is not None:
            return outcomes_frame(self.result.outcomes)
        return outcomes_frame({name: tp.outcome for name, tp in self.types.items()
                               if tp.outcome is not None})

    def progress(self) -> pl.DataFrame:
        """Per type: consumed / ladder, calls in flight, W, L, E+ and the action so far."""
        rows = [{"task_type": name, "consumed": tp.consumed, "n_ladder": tp.n_ladder,
                 "in_flight": tp.in_flight, "started": tp.started,
                 "cache_hits": tp.cache_hits, "W": tp.W, "L": tp.L,
                 "e_plus": tp.e_plus[-1] if tp.e_plus else 1.0, "action": str(tp.action)}
                for name, tp in sorted(self.types.items())]
        return pl.DataFrame(rows, schema=PROGRESS_SCHEMA, orient="row")

    def progress_html(self) -> str:
        head = ("<tr><th>type</th><th>consumed / ladder</th><th>in flight</th>"
                "<th>W</th><th>L</th><th>E+</th><th>decision</th></tr>")
        body = "".join(
            f"<tr><td>{html.escape(r['task_type'])}</td>"
            f"<td>{r['consumed']} / {r['n_ladder']}</td><td>{r['in_flight']}</td>"
            f"<td>{r['W']}</td><td>{r['L']}</td><td>{r['e_plus']:.3g}</td>"
            f"<td>{'' if r['action'] == 'CONTINUE' else html.escape(r['action'])}</td></tr>"
            for r in self.progress().iter_rows(named=True))
        return f"<table>{head}{body}</table>"

    def _repr_html_(self) -> str:
        return f"<b>{html.escape(self.status())}</b>{self.progress_html()}"

    # ---- live display -----------------------------------------------------------------

    @property
    def widget(self) -> Any:
        """The ipywidgets box (status, plot Output, progress/decision table); creating it
        turns live redrawing on."""
        if self._widgets is None:
            import ipywidgets as w

            status, plot, table = w.HTML(), w.Output(), w.HTML()
            self._widgets = (w.VBox([status, plot, table]), status, plot, table)
            self._draw()
        return self._widgets[0]

    def display(self) -> LiveGateView:
        """Display the live widget in the current notebook cell."""
        from IPython.display import display

        display(self.widget)
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

    def _draw(self) -> None:
        assert self._widgets is not None
        _, status, _, table = self._widgets
        if self._trailing is not None:
            self._trailing.cancel()
            self._trailing = None
        self._last_draw = self._clock()
        status.value = f"<b>{html.escape(self.status())}</b>"
        if self.aborted:
            status.value += f"<br><span style='color:#b00'>{html.escape(self.aborted)}</span>"
        table.value = (self.table()._repr_html_() if self.result is not None
                       else self.progress_html())
        if self._rendering is not None:  # one render at a time; redo when it lands
            self._dirty = True
            return
        self.redraws += 1
        args = (self.series(), self.params, self.status(), self.figsize)
        loop = None
        if self.threaded:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        if loop is None:
            self._show_png(render_png(*args))
            return
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="vtrm-live")
        self._rendering = loop.run_in_executor(self._executor, render_png, *args)
        self._rendering.add_done_callback(self._rendered)

    def _rendered(self, fut: asyncio.Future[bytes]) -> None:
        self._rendering = None
        if not fut.cancelled() and fut.exception() is None:
            self._show_png(fut.result())
        if self._dirty:
            self._dirty = False
            self._draw()
        elif self.finished and self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    def _show_png(self, png: bytes) -> None:
        assert self._widgets is not None
        # Replacing the outputs tuple works from any task, even after the cell has returned
        # (no output-capture context needed), and swaps the image without flicker.
        self._widgets[2].outputs = ({
            "output_type": "display_data",
            "data": {"image/png": base64.b64encode(png).decode("ascii"),
                     "text/plain": "<E+ trajectories>"},
            "metadata": {}},)

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


async def watch(handle: GateHandle, view: LiveGateView | None = None) -> GateResult:
    """Await ``handle`` while ``view`` (a new, displayed one if None) follows it.

    A view already fed by this handle (e.g. from `show_live`) is not subscribed twice.
    """
    if view is None:
        view = LiveGateView()
        view.display()
    follower = None
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


def show_live(plans: Sequence[TypePlan], infer: Infer, *, view: LiveGateView | None = None,
              display: bool = True, **kw: Any) -> tuple[GateHandle, LiveGateView]:
    """`launch` the gate in the running loop with a live view subscribed; return both.

    The cell returns at once; the view keeps updating. ``await watch(handle, view)`` (or
    ``await handle``) for the result. ``kw`` goes to `launch` (params, concurrency, ...).
    """
    view = view or LiveGateView(kw.get("params"))
    subs = [view, *kw.pop("subscribers", ())]
    handle = launch(plans, infer, subscribers=subs, **kw)
    view.source = handle
    if display:
        view.display()
    return handle, view
