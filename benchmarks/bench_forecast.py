"""The live ETA's error against the simulator, at 25/50/75% of a 12-type step.

Per seed the simulated step runs on the virtual clock; its events are replayed into a
`GateForecast` and the ETA read at each share of the makespan is compared with the time the
step really took from there. The live view and the terminal show the ETA only because the
median relative error at 50% is <= 25% (tests/gate/test_eta.py keeps it so on 10 seeds).

Run: ``python -m benchmarks.bench_forecast [--quick] [--seeds N]``.
"""

from __future__ import annotations

import statistics
import time

from benchmarks._common import machine, print_table, run_with_seeds
from vtrm_gate.sim import eta_checks


def summary(seeds: int) -> list[dict[str, str]]:
    checks = [c for seed in range(seeds) for c in eta_checks(seed)]
    rows = []
    for share in sorted({c.share for c in checks}):
        errs = [c.relative_error for c in checks if c.share == share]
        mags = sorted(abs(e) for e in errs)
        rows.append({"at": f"{share:.0%} of the step", "seeds": str(len(errs)),
                     "median |error|": f"{statistics.median(mags):.1%}",
                     "p90 |error|": f"{mags[int(0.9 * (len(mags) - 1))]:.1%}",
                     "worst": f"{mags[-1]:.1%}",
                     "median signed": f"{statistics.median(errs):+.1%}"})
    return rows


def main(quick: bool = False, seeds: int | None = None) -> None:
    seeds = seeds or (5 if quick else 20)
    t = time.perf_counter()
    rows = summary(seeds)
    print(f"{machine()}; {seeds} seeds, virtual clock, {time.perf_counter() - t:.1f} s")
    print_table("ETA forecast vs the time the step really took", rows)


if __name__ == "__main__":
    run_with_seeds(main)
