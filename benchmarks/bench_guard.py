"""The INFRA guard of a default training run: how often it aborts, exactly.

Per gate (one type's step gate, settlement probe or evaluation), the guard trips within N
completed calls with a probability computed exactly (`vtrm_gate.stats.guard_oc`: dynamic
programming over i.i.d. calls; counting INFRA calls bounds the SPEC's count of INFRA units,
at most one per pair of calls, from above). A run aborts when any of its gates trips:
``1 - prod(1 - p_trip)`` over the gates of real default 3x5 runs (their completed calls
recorded with a guard that cannot trip), and over the worst case of 252 gates with unlimited
calls. Beside it: the opt-in sequential guard's false-abort and detection-delay numbers, and
the aborts seen in the seeds' real runs at the default rate.

Run: ``python -m benchmarks.bench_guard [--quick] [--seeds N]``.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._common import machine, print_table, run_with_seeds
from vtrm_gate.backends import run_simulated_training
from vtrm_gate.errors import InfraGuardError
from vtrm_gate.gate import GuardParams
from vtrm_gate.options import RunOptions
from vtrm_gate.sim import DEFAULT_INFRA_RATE, SimConfig
from vtrm_gate.stats import guard_oc, run_abort_probability

EPOCHS, STEPS = 3, 5
RATES = (DEFAULT_INFRA_RATE, 0.001, 0.003, 0.01)
GUARDS = {"ratio (default)": GuardParams(), "sequential": GuardParams(rule="sequential")}
NEVER = GuardParams(min_calls=10**9)


def _tripped(g: GuardParams) -> Any:
    return lambda k, n: g.tripped(k, n, k)


def gate_calls(res: Any) -> list[int]:
    """Completed calls of every gate of a training run (steps, settlements, evaluations)."""
    gates = [s.gate for s in res.steps.values()] + [p.gate for p in res.settlements.values()]
    gates += [e.gate for e in res.evaluations.values()]
    return [c.completed for g in gates if g is not None for c in g.counters.values()]


def run_seed(seed: int, infra_rate: float, guard: GuardParams) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        try:
            ws, res, _ = run_simulated_training(
                Path(d) / "ws", SimConfig(seed=seed, infra_rate=infra_rate), EPOCHS, STEPS,
                RunOptions(guard=guard), probation_rule="e_continue")
        except InfraGuardError as exc:
            return {"seed": seed, "aborted": str(exc)[:80], "calls": []}
        ws.close()
    return {"seed": seed, "aborted": None, "calls": gate_calls(res)}


def main(quick: bool = False, seeds: int | None = None) -> None:
    n = seeds or (3 if quick else 10)
    print(f"machine: {machine()}")
    print(f"{n} seeds, default {EPOCHS}x{STEPS} runs (12 types, e_continue, 20% held out), "
          f"virtual clock; default INFRA rate {DEFAULT_INFRA_RATE}")
    rows = [{"rule": name, "rate": r, **{f"p_trip_N{c}": guard_oc(_tripped(g), r, c).p_trip
                                          for c in (20, 40, 80, 128)}}
            for name, g in GUARDS.items() for r in RATES]
    print_table("P(one gate trips within N completed calls), exact", rows)

    structure = [run_seed(s, DEFAULT_INFRA_RATE, NEVER) for s in range(n)]
    counts = [len(r["calls"]) for r in structure]
    rows = []
    for name, g in GUARDS.items():
        for r in RATES:
            per_run = [run_abort_probability(_tripped(g), r, s["calls"]) for s in structure]
            rows.append({"rule": name, "rate": r, "p_abort_run_mean": statistics.mean(per_run),
                         "p_abort_run_max": max(per_run),
                         "worst_252_gates": run_abort_probability(_tripped(g), r, [200] * 252)})
    print_table(f"P(a default run aborts), exact over the gates of {n} real runs "
                f"({min(counts)}-{max(counts)} gates each) and for the worst case", rows)

    rows = []
    for r in (0.05, 0.1, 0.2, 0.3, 0.5, 1.0):
        for name, g in GUARDS.items():
            oc = guard_oc(_tripped(g), r, 80)
            rows.append({"rate": r, "rule": name, "p_abort_within_80_calls": oc.p_trip,
                         "mean_calls_to_abort": oc.expected_calls_to_trip})
    print_table("false aborts (rate <= 10%) and detection (rate > 10%) within one 80-call gate",
                rows)

    real = [run_seed(s, DEFAULT_INFRA_RATE, GuardParams()) for s in range(n)]
    aborted = [r for r in real if r["aborted"]]
    print(f"\nreal default runs at rate {DEFAULT_INFRA_RATE} with the default guard: "
          f"{len(aborted)} of {n} aborted" + "".join(f"\n  seed {r['seed']}: {r['aborted']}"
                                                     for r in aborted))


if __name__ == "__main__":
    run_with_seeds(main)
