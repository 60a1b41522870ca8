"""Wall time of one sweep of training runs on each engine (issue 25, item 6): one worker
(serially, in this process), every local core (spawned processes that end with this one),
and a 2-worker Dask cluster (``LocalCluster``, one process of one thread per worker; started
before the clock, as a real cluster would be). The runs are seeded, so every engine must
return the serial results exactly (checked, wall time aside).

Run: ``python -m benchmarks.bench_sweep [--quick] [--seeds N]``.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks._common import machine, print_table, run_with_seeds
from benchmarks.bench_power import DEFAULT, Config, engine, run_all


def _timed(cfg: Config, seeds: list[int], **where: Any) -> tuple[float, list[dict[str, Any]]]:
    t = time.perf_counter()
    with engine(**where) as ex:
        rows = run_all([cfg], seeds, ex)
    return time.perf_counter() - t, rows


def _same(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "cpu_s"} for r in rows]


def main(quick: bool = False, seeds: int | None = None) -> None:
    from dask.distributed import LocalCluster

    from vtrm_gate.sim import local_workers

    cfg = Config("v3 1 epoch", epochs=1) if quick else DEFAULT
    n = seeds or (2 if quick else 8)
    ss = list(range(n))
    print(f"machine: {machine()}")
    print(f"{n} training runs ({cfg.epochs} x {cfg.steps}, v3 default), seeds 0-{n - 1}")
    serial_s, ref = _timed(cfg, ss, jobs=1)
    local_s, local = _timed(cfg, ss)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster:
        dask_s, dasked = _timed(cfg, ss, scheduler=cluster.scheduler_address)
    same = _same(local) == _same(ref) and _same(dasked) == _same(ref)
    print_table("wall time of the sweep by engine (the same seeded runs)", [
        {"engine": "1 worker (serial, this process)", "workers": 1, "wall s": serial_s,
         "vs 1 worker": 1.0},
        {"engine": "local processes (every core)", "workers": local_workers(),
         "wall s": local_s, "vs 1 worker": serial_s / local_s},
        {"engine": "Dask LocalCluster (processes)", "workers": 2, "wall s": dask_s,
         "vs 1 worker": serial_s / dask_s}])
    print(f"\nresults identical to the serial run on every engine: {same}")
    if not same:
        raise SystemExit("an engine changed a seeded result")


if __name__ == "__main__":
    run_with_seeds(main)
