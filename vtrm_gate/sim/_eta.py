"""How good the live ETA is: the forecast made part-way through a simulated step against
the time the step really took from there (virtual clock, so exact and repeatable)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .._env import DEFAULT_CONCURRENCY
from ..gate import GateEvent, GateForecast, run_gate
from ..stats import GateParams, as_params
from ._step import sim_step
from ._virtual import run_virtual

SHARES = (0.25, 0.5, 0.75)


@dataclass(frozen=True)
class EtaCheck:
    """At ``share`` of a step's makespan: the forecast ETA and the time actually left."""

    seed: int
    share: float
    eta_s: float
    actual_s: float

    @property
    def relative_error(self) -> float:
        return (self.eta_s - self.actual_s) / self.actual_s


def eta_checks(seed: int, shares: Sequence[float] = SHARES, concurrency: int = DEFAULT_CONCURRENCY,
               params: GateParams | None = None) -> list[EtaCheck]:
    """Run the simulated step of ``seed`` (virtual clock), then replay its events into a
    `GateForecast` and read the ETA at each share of the makespan."""
    st = sim_step(seed, wall_seconds=None, params=params)
    events: list[GateEvent] = []
    res = run_virtual(run_gate(list(st.plans), st.world.infer, as_params(params),
                               concurrency, subscribers=[events.append]))
    start, total = events[0].t, res.wall_time_s
    fc, i, out = GateForecast(), 0, []
    for share in sorted(shares):
        cut = start + share * total
        while i < len(events) and events[i].t <= cut:
            fc.update(events[i])
            i += 1
        eta = fc.forecast(cut).eta_s
        out.append(EtaCheck(seed, share, float("nan") if eta is None else eta,
                            start + total - cut))
    return out
