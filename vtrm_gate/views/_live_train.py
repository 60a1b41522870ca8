"""A live view of a training run: one line per step, settlement and evaluation as they finish.

In Jupyter the lines update one output area in place (``display_id``); elsewhere each line is
printed. Pass the view as ``train(..., on_event=view)``.
"""

from __future__ import annotations

import sys
from typing import Any


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
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
        return None
    return display({"text/plain": "training run starting ..."}, raw=True, display_id=True)
