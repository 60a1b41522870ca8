"""What a running command shows on stderr: gate progress (`TerminalProgress`, a subscriber
that never blocks the scheduler) and the chat agent's retries and give-ups."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any


class TerminalProgress:
    """Per-type progress on stderr: a line when a type decides, a status line now and then.

    A subscriber of the gate's event bus: it never blocks the scheduler.
    """

    def __init__(self, stream: Any = None, every_s: float = 2.0, quiet: bool = False):
        self.stream = stream or sys.stderr
        self.every_s, self.quiet = every_s, quiet
        self.ladder: dict[str, int] = {}
        self.consumed: dict[str, int] = {}
        self.decided: dict[str, str] = {}
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
        if isinstance(ev, GateStarted):
            self.t0 = ev.t
            self.ladder = dict(zip(ev.task_types, ev.ladder_sizes, strict=True))
            self._print(f"[{self._clock(ev.t)}] gate started: {len(ev.task_types)} types, "
                        f"{sum(ev.ladder_sizes)} ladder units, {ev.concurrency} slots")
        elif isinstance(ev, TaskStarted):
            self.in_flight = ev.in_flight
        elif isinstance(ev, TaskFinished) and ev.status != "cache_hit":
            self.in_flight = max(0, self.in_flight - 1)
        elif isinstance(ev, PrefixAdvanced):
            self.consumed[ev.task_type] = ev.ladder_rank + 1
        elif isinstance(ev, TaskProgress) and ev.status == "retrying":
            self.retries += 1
        elif isinstance(ev, TypeDecided):
            o = ev.outcome
            self.decided[ev.task_type] = str(o.action)
            where = "empty ladder" if o.stop_rank is None else (
                f"after {o.n_consumed}/{o.n_ladder} units")
            self._print(f"[{self._clock(ev.t)}] {ev.task_type:<22} {o.action!s:<11} {where}"
                        f"  W={o.W} L={o.L} E+={o.e_plus:.3g}  "
                        f"({len(self.decided)}/{len(self.ladder)} decided)")
        elif isinstance(ev, GateFinished | GateAborted):
            what = "finished" if isinstance(ev, GateFinished) else f"ABORTED: {ev.reason}"
            self._print(f"[{self._clock(ev.t)}] gate {what}")
            return
        now = time.monotonic()
        if now - self._last >= self.every_s and self.ladder:
            self._last = now
            busy = [f"{t.split()[0][:6]} {self.consumed.get(t, 0)}/{n}"
                    for t, n in self.ladder.items() if t not in self.decided]
            retrying = f" | {self.retries} retries" if self.retries else ""
            self._print(f"[{self._clock(ev.t)}] in flight {self.in_flight:>2}{retrying} | "
                        + ", ".join(busy[:6]) + (" ..." if len(busy) > 6 else ""))

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


def agent_printer(quiet: bool) -> Callable[[Any], None]:
    """Retries and give-ups of the chat agent, one line each on stderr."""

    def show(ev: Any) -> None:
        if quiet or ev.kind == "request":
            return
        what = (f"retry {ev.attempt} in {ev.delay_s:.1f}s" if ev.kind == "retry"
                else f"gave up after {ev.attempt} attempt(s)")
        print(f"[agent] {ev.step} {ev.unit_id} ({ev.run_id}): {what}: {ev.error}",
              file=sys.stderr, flush=True)

    return show
