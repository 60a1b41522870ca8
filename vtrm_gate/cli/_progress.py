"""What a running command shows on stderr: gate progress (`TerminalProgress`, a subscriber
that never blocks the scheduler), the chat agent's retries and give-ups, and one status line
for long work without events (`status_line`: a key scan, a bootstrap)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from ._table import pad, short_names, terminal_width, text_width

STATUS_EVERY_S = 1.0
"""A status line is drawn at most this often, and not before work has run this long."""


class TerminalProgress:
    """Per-type progress on stderr: a line when a type decides, a status line now and then
    (calls in flight, the forecast ETA, each undecided type by a unique short name).

    A subscriber of the gate's event bus: it never blocks the scheduler. Lines fit
    ``width`` columns (default: the terminal's, 100 when not a terminal).
    """

    def __init__(self, stream: Any = None, every_s: float = 2.0, quiet: bool = False,
                 width: int | None = None):
        from ..gate import GateForecast

        self.stream = stream or sys.stderr
        self.every_s, self.quiet = every_s, quiet
        self.width = width or terminal_width(self.stream)
        self.ladder: dict[str, int] = {}
        self.short: dict[str, str] = {}
        self.consumed: dict[str, int] = {}
        self.decided: dict[str, str] = {}
        self.forecast = GateForecast()
        self.in_flight = 0
        self.retries = 0
        self.t0: float | None = None
        self._last = 0.0

    def _clock(self, t: float) -> str:
        s = int(t - (self.t0 or 0.0))
        return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"

    def __call__(self, ev: Any) -> None:
        from ..gate import (
            GateAborted,
            GateFinished,
            GateStarted,
            PrefixAdvanced,
            TaskFinished,
            TaskProgress,
            TaskStarted,
            TypeDecided,
        )

        if self.quiet:
            return
        if isinstance(ev, GateStarted):  # a new gate (train runs one per step): start over
            self.forecast = type(self.forecast)()
            self.t0, self.consumed, self.decided = ev.t, {}, {}
            self.in_flight = self.retries = 0
            self.ladder = dict(zip(ev.task_types, ev.ladder_sizes, strict=True))
            self.short = short_names(ev.task_types, 20)
            self._print(f"[{self._clock(ev.t)}] gate started: {len(ev.task_types)} types, "
                        f"{sum(ev.ladder_sizes)} ladder units, {ev.concurrency} slots")
        self.forecast.update(ev)
        if isinstance(ev, TaskStarted):
            self.in_flight = ev.in_flight
        elif isinstance(ev, TaskFinished) and ev.status != "cache_hit":
            self.in_flight = max(0, self.in_flight - 1)
        elif isinstance(ev, PrefixAdvanced):
            self.consumed[ev.task_type] = ev.ladder_rank + 1
        elif isinstance(ev, TaskProgress) and ev.status == "retrying":
            self.retries += 1
        elif isinstance(ev, TypeDecided):
            self._decided(ev)
        elif isinstance(ev, GateFinished | GateAborted):
            what = "finished" if isinstance(ev, GateFinished) else f"ABORTED: {ev.reason}"
            self._print(f"[{self._clock(ev.t)}] gate {what}")
            return
        now = time.monotonic()
        if now - self._last >= self.every_s and self.ladder:
            self._last = now
            self._status(ev.t)

    def _decided(self, ev: Any) -> None:
        """One line: where the type stopped (1-based, "unit k of n"), then as much of
        W/L, n_used (when INFRA units were skipped), the decided count and E+ as fits."""
        o = ev.outcome
        self.decided[ev.task_type] = str(o.action)
        name = ev.task_type if text_width(ev.task_type) <= 20 else self.short[ev.task_type]
        where = "empty ladder" if o.stop_rank is None else (
            f"stopped at unit {o.stop_rank + 1} of {o.n_ladder}")
        infra = o.n_consumed - o.n_used
        line = f"[{self._clock(ev.t)}] {pad(name, 20)} {o.action!s:<11} {where}"
        for part in (f"W={o.W} L={o.L}",
                     f"n_used {o.n_used}, {infra} INFRA" if infra else "",
                     f"{len(self.decided)}/{len(self.ladder)} decided", f"E+={o.e_plus:.3g}"):
            if part and text_width(line) + 2 + len(part) <= self.width:
                line += "  " + part
        self._print(line)

    def _status(self, t: float) -> None:
        fc = self.forecast.forecast()
        eta = f" | {fc.text()}" if fc.eta_s is not None and fc.types else ""
        retrying = f" | {self.retries} retries" if self.retries else ""
        head = f"[{self._clock(t)}] in flight {self.in_flight:>2}{retrying}{eta} | "
        busy = [f"{self.short.get(n, n)} {self.consumed.get(n, 0)}/{k}"
                for n, k in self.ladder.items() if n not in self.decided]
        shown: list[str] = []
        for i, item in enumerate(busy):  # as many as fit, then how many more
            more = f" +{len(busy) - i - 1} more" if i < len(busy) - 1 else ""
            if text_width(head + ", ".join([*shown, item]) + more) > self.width:
                break
            shown.append(item)
        rest = len(busy) - len(shown)
        self._print(head + ", ".join(shown) + (f" +{rest} more" if rest else ""))

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


def agent_printer(quiet: bool) -> Callable[[Any], None]:
    """Retries and give-ups of the chat agent, one line each on stderr."""

    def show(ev: Any) -> None:
        if quiet or ev.kind == "request":
            return
        what = (f"retry {ev.attempt} in {ev.delay_s:.1f}s" if ev.kind == "retry"
                else f"gave up after {ev.attempt} attempt(s)")
        print(f"[agent] {ev.call_kind} {ev.unit_id} ({ev.run_id}): {what}: {ev.error}",
              file=sys.stderr, flush=True)

    return show


def status_line(stream: Any = None) -> tuple[Callable[[str], None], Callable[[], None]]:
    """``(show, done)``: ``show(text)`` draws one status line on stderr at most every
    `STATUS_EVERY_S` (redrawn in place on a terminal, a line each in a log); ``done()`` ends
    it. Work shorter than `STATUS_EVERY_S` shows nothing."""
    out = stream or sys.stderr
    tty = hasattr(out, "isatty") and out.isatty()
    state = {"last": time.monotonic(), "shown": False}

    def show(text: str) -> None:
        now = time.monotonic()
        if now - state["last"] >= STATUS_EVERY_S:
            print(f"\r{text}" if tty else text, end="" if tty else "\n", file=out, flush=True)
            state["last"], state["shown"] = now, True

    def done() -> None:
        if state["shown"] and tty:
            print(file=out, flush=True)

    return show, done
