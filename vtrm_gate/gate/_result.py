"""What a gate run returns: outcome and work counters per type, and the gate-wide figures."""

from __future__ import annotations

from dataclasses import dataclass

from ..stats import (
    Action,
    TypeOutcome,
)


@dataclass
class TypeCounters:
    """Per-type work accounting: nothing started, finished or dropped goes unreported."""

    units: int = 0
    started: int = 0
    completed: int = 0
    cache_hits: int = 0
    cancelled_before_start: int = 0
    cancelled_in_flight: int = 0
    discarded_after_freeze: int = 0
    discarded_after_infra: int = 0
    infra_units: int = 0
    tokens: int = 0
    infra_calls: int = 0


@dataclass(frozen=True)
class GateResult:
    """Outcome per type, counters per type, and the gate-wide figures."""

    outcomes: dict[str, TypeOutcome]
    counters: dict[str, TypeCounters]
    peak_in_flight: int
    wall_time_s: float
    concurrency: int
    aborted: str | None = None
    running: bool = False
    """A snapshot of a gate still running (`GateHandle.partial`): its figures so far."""

    def total(self, name: str) -> int:
        return sum(getattr(c, name) for c in self.counters.values())

    @property
    def tokens(self) -> int:
        return self.total("tokens")

    def decisions(self) -> dict[str, Action]:
        return {t: o.action for t, o in self.outcomes.items()}

    def __repr__(self) -> str:
        tally: dict[str, int] = {}
        for o in self.outcomes.values():
            tally[str(o.action)] = tally.get(str(o.action), 0) + 1
        decided = sum(o.decided for o in self.outcomes.values())
        exits = ", ".join(f"{a} {k}" for a, k in sorted(tally.items()))
        state = (f"aborted ({self.aborted})" if self.aborted else
                 "running, so far" if self.running else "finished")
        return (f"<GateResult {state}: {decided}/{len(self.outcomes)} types decided"
                f"{' (' + exits + ')' if exits else ''}, {self.total('completed')} calls, "
                f"peak {self.peak_in_flight} in flight, {self.wall_time_s:.1f} s>")



