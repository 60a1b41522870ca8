"""Live views of a training run, each an ``on_event`` callback of ``train``: `TrainView`, one
line per step, settlement and evaluation as they finish (in Jupyter the lines update one
output area in place, ``display_id``; elsewhere each line is printed); `TrainCurveView` /
`show_train`, the training curve growing a point at a time (one PNG output updated in place).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from ._style import jupyter_frontend, no_frontend
from ._train_figures import plot_train_progress


class TrainView:
    """``on_event`` callback for `vtrm_gate.harness.train`: the run's progress so far."""

    def __init__(self, stream: Any = None) -> None:
        self.lines: list[str] = []
        self.stream = stream
        self._display: Any = None

    def __call__(self, ev: Any) -> None:
        self.lines.append(ev.line)
        if self._display is None and self.stream is None:
            self._display = _jupyter_display()
        if self._display is not None:
            self._display.update({"text/plain": self.text()}, raw=True)
        else:
            print(ev.line, file=self.stream or sys.stdout, flush=True)

    def text(self) -> str:
        return "\n".join(self.lines)


def _jupyter_display() -> Any:
    """A display handle when running in an IPython kernel with a frontend, else None."""
    if not jupyter_frontend():
        return None
    from IPython.display import display

    return display({"text/plain": "training run starting ..."}, raw=True, display_id=True)


# ---- the training curve, growing as the run goes ------------------------------------------

CURVE_SCHEMA: dict[str, Any] = {
    "i": "Int64", "kind": "String", "epoch": "Int64", "step": "Int64", "true": "Float64",
    "measured": "Float64", "accepted": "Int64", "provisional": "Int64", "kept": "Int64",
    "rolled_back": "Int64", "done_before": "Boolean"}
"""One row per step, settlement and evaluation (`TrainCurveView.frame`)."""


class TrainCurveView:
    """``on_event`` callback for `vtrm_gate.harness.train` that adds a point to the training
    curve as each step, settlement and evaluation finishes (after point 0, the start): the
    mean true accuracy of the standing skills (simulated workspaces), the held-out accuracy
    each evaluation measured,
    and the decisions (accepted, provisional, kept, rolled back). Displayed, it is one PNG
    output updated in place (redrawn at most every ``min_interval`` s and at every epoch's
    end), so the notebook keeps the last image when saved and reopened."""

    def __init__(self, workspace: Any, *, min_interval: float = 1.0) -> None:
        from ..harness import Workspace

        root = workspace.root if isinstance(workspace, Workspace) else workspace
        self.ws = Workspace.open(root, readonly=True)
        self.world = _sim_world(self.ws)
        self.min_interval = min_interval
        self.redraws = 0
        self._accuracy: dict[tuple[str, int], float] = {}
        self._handle: Any = None
        self._last_draw = -math.inf
        self.points: list[dict[str, Any]] = [dict.fromkeys(CURVE_SCHEMA) | {
            "i": 0, "kind": "start", "true": self.true_accuracy()}]
        """Point 0: the skills standing when the view was made (the run's start, or where
        a resumed run stands); then one per step, settlement and evaluation."""

    def __call__(self, ev: Any) -> None:
        if ev.kind in ("step", "settle", "evaluate"):
            self.points.append(self._point(ev))
        if self._handle is not None and (ev.kind in ("settle", "evaluate", "finished")
                                         or time.monotonic() - self._last_draw
                                         >= self.min_interval):
            self._draw()

    def _point(self, ev: Any) -> dict[str, Any]:
        row = dict.fromkeys(CURVE_SCHEMA) | {
            "i": len(self.points), "kind": ev.kind, "epoch": ev.epoch, "step": ev.step,
            "done_before": ev.done_before, "true": self.true_accuracy()}
        data = ev.data
        if ev.kind == "step" and data is not None:
            actions = [str(a) for a in data.decisions.values()]
            row |= {"accepted": actions.count("ACCEPT"),
                    "provisional": actions.count("PROVISIONAL")}
        elif ev.kind == "settle" and data is not None:
            kept = sum(o.passed for o in data.outcomes.values())
            row |= {"kept": kept, "rolled_back": len(data.outcomes) - kept}
        elif ev.kind == "evaluate" and data is not None:
            from ..harness import evaluation_summary

            s = evaluation_summary(data.rows)
            row["measured"] = None if s is None else s["acc_current"]
        return row

    def true_accuracy(self) -> float | None:
        """The mean true accuracy of the skills ``state.json`` holds now (None: not
        simulated)."""
        if self.world is None:
            return None
        from ..harness import TrainingState, read_json

        state = TrainingState.from_json(read_json(self.ws.state_path, self.ws.root))
        accs = []
        for t, ref in sorted(state.skills.items()):
            key = (t, ref.version)
            if key not in self._accuracy:
                self._accuracy[key] = self.world.true_accuracy(
                    t, self.ws.version_text(t, ref.version))
            accs.append(self._accuracy[key])
        return sum(accs) / len(accs)

    def frame(self) -> Any:
        """The points so far as a polars frame (`CURVE_SCHEMA`)."""
        import polars as pl

        schema = {k: getattr(pl, v) for k, v in CURVE_SCHEMA.items()}
        return pl.DataFrame(self.points, schema=schema, orient="row")

    def figure(self) -> Any:
        """The curve so far (`plot_train_progress`)."""
        return plot_train_progress(self.frame())

    def display(self) -> TrainCurveView:
        """Show the curve in the current cell (one image output, updated in place); with no
        Jupyter front end, warn and draw nothing."""
        if no_frontend("TrainCurveView.display"):
            return self
        from IPython.display import display

        self._handle = display(self._bundle(), raw=True, display_id=True)
        self._last_draw = time.monotonic()
        return self

    def _bundle(self) -> dict[str, str]:
        import base64

        fig = self.figure()
        return {"image/png": base64.b64encode(fig._repr_png_()).decode("ascii"),
                "text/plain": repr(fig)}

    def _draw(self) -> None:
        self._handle.update(self._bundle(), raw=True)
        self.redraws += 1
        self._last_draw = time.monotonic()

    def close(self) -> None:
        self.ws.close()


def _sim_world(ws: Any) -> Any:
    if ws.config.kind != "simulated":
        return None
    from ..sim import simulated_backend

    return simulated_backend(ws).world


def show_train(workspace: Any, epochs: int, steps_per_epoch: int, options: Any = None,
               *, display: bool = True, min_interval: float = 1.0,
               **kw: Any) -> tuple[Any, TrainCurveView]:
    """Run (or resume) a training run of ``workspace`` (`train_workspace_sync`: the
    simulator's virtual clock or real time) with its training curve shown in the cell and
    growing as each step, settlement and evaluation finishes (redrawn at most every
    ``min_interval`` s, and at each epoch's end); returns (the run, the view). ``kw`` goes
    to `train_workspace` (``evaluate``, ``subscribers``, ``on_event``, ...)."""
    from ..backends import train_workspace_sync
    from ..options import RunOptions

    view = TrainCurveView(workspace, min_interval=min_interval)
    try:
        if display and not no_frontend("show_train"):
            view.display()
        on_event = kw.pop("on_event", None)

        def both(ev: Any) -> None:
            view(ev)
            if on_event is not None:
                on_event(ev)

        run = train_workspace_sync(workspace, epochs, steps_per_epoch,
                                   options or RunOptions(), on_event=both, **kw)
        return run, view
    finally:
        if view._handle is not None:
            view._draw()  # the last state (finished, or where it failed): the saved image
        view.close()
