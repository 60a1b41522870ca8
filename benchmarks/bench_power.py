"""What the speed-up buys: the power frontier of a simulated training run.

Each configuration runs the real `train` (3 epochs x 5 steps, 12 types, e_continue probation,
20% held out, virtual clock) on every seed and is scored against the simulator's ground
truth: final true accuracy (mean over types), truly better candidates applied, the leak
(neutral-or-worse applied), probe units spent and the probe sizes left per type (a long
ladder eats the probe's pool), and simulated wall time of training (rollout + evolution +
gate + settlement; the evaluation is reporting, the same for all). Every number comes with
a 95% bootstrap interval over seeds (2000 resamples). Every run is also checked for "only
settled versions stand" (`settled_audit`).

Configurations: the old serial gate at n_max 40 (block-end decisions, `old_blocks`, timed as
the old serial pattern on its own inputs); v3 at n_max 40 (default) / 60 / 80 / 120 (capped
by each type's pool); the best fixed lambda and the lambda mixture (an adaptive bet) at
n_max 40; the probe in seed-wrong-first order; and the recommended combination. The best
lambda and the recommendation are chosen on tuning seeds (100+) and reported on seeds 0+.

Run: ``python -m benchmarks.bench_power [--quick] [--seeds N] [--tune-seeds N] [--jobs J]
[--scheduler tcp://HOST:PORT]``: the runs go to J local processes (default: every core; they
end with this process) or to a Dask cluster's workers (which must import this checkout's
``benchmarks`` and ``vtrm_gate``); a run is seeded, so the engine never changes a number. The
results land in ``benchmarks/results/bench_power.json`` (the frontier figure's input:
``python -m vtrm_gate.views.review --only 06_power_frontier``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import machine, print_table
from vtrm_gate.errors import VtrmError

EPOCHS, STEPS = 3, 5
TUNE_SEED0 = 100
RESULTS = Path(__file__).parent / "results" / "bench_power.json"
QUICK_RESULTS = RESULTS.with_suffix(".quick.json")
"""Where ``--quick`` writes, so ``make bench --quick`` never overwrites the recorded result."""
LAMBDAS = (0.3, 0.6, 0.7, 0.8)
TRAIN_PHASES = ("rollout", "evolution", "gate", "settlement")


@dataclass(frozen=True)
class Config:
    """One point of the frontier."""

    name: str
    n_max: int = 40
    lambda_dir: float = 0.5
    decision_rule: str = "paired_betting"
    probation_order: str = "shuffle"
    old: bool = False
    """Timed as the old serial gate (types, blocks of 8 and arms one after another)."""
    epochs: int = EPOCHS
    """Epochs of the run (more: the saved time spent on more training)."""
    steps: int = STEPS
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


OLD = Config("old serial gate, n_max 40", decision_rule="old_blocks", old=True)
DEFAULT = Config("v3 n_max 40 (default)")
ONE_FACTOR = [Config(f"v3 n_max {n}", n_max=n) for n in (60, 80, 120)] + [
    Config("v3 n_max 40, lambda mixture", decision_rule="lambda_mixture"),
    Config("v3 n_max 40, probe seed-wrong-first", probation_order="seed_wrong_first")]
LONGER = Config(f"v3 n_max 40, {2 * EPOCHS} epochs (the saved time spent training)",
                epochs=2 * EPOCHS)
"""The speed-up spent on training: twice the epochs, still a fraction of the old gate's time."""


def run(cfg: Config, seed: int) -> dict[str, Any]:
    """One training run of ``cfg`` on ``seed``: the metrics of the frontier."""
    from vtrm_gate.backends import run_simulated_training
    from vtrm_gate.harness import settled_audit
    from vtrm_gate.options import RunOptions
    from vtrm_gate.sim import SimConfig
    from vtrm_gate.stats import GateParams

    options = RunOptions(gate=GateParams(n_max=cfg.n_max, lambda_dir=cfg.lambda_dir),
                         decision_rule=cfg.decision_rule)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        ws, _, s = run_simulated_training(Path(d) / "ws", SimConfig(seed=seed), cfg.epochs,
                                            cfg.steps, options, probation_rule="e_continue",
                                            probation_order=cfg.probation_order)
        probes = ws.log.select("step_report", ["task_type", "n_ladder", "n_consumed"],
                               step=0, status="probation")
        violations = len(settled_audit(ws).violations)
        pools = {t: len(us) for t, us in ws.pool.items()}
        ws.close()
    q = s["quality"]
    phases = s["old_phases_s"] if cfg.old else s["v3_phases_s"]
    ev = s.get("evaluation") or {}
    return {"config": cfg.name, "seed": seed, "accuracy": q["mean_accuracy"]["gate"],
            "initial": q["mean_accuracy"]["initial"], "oracle": q["mean_accuracy"]["oracle"],
            "better_applied": q["applied"]["better"], "better_gated": q["gated"]["better"],
            "leak": q["leak"], "probe_units": sum(n or 0 for _, _, n in probes),
            "probes": [(t, n or 0) for t, n, _ in probes], "pools": pools,
            "wall_h": sum(phases[k] for k in TRAIN_PHASES) / 3600,
            "measured_gain": (ev.get("gain_pooled") or {}).get("estimate"),
            "violations": violations, "cpu_s": time.perf_counter() - t0}


def _run_star(args: tuple[Config, int]) -> dict[str, Any]:
    return run(*args)


def run_all(cfgs: list[Config], seeds: list[int], engine: Executor | None
            ) -> list[dict[str, Any]]:
    """Every configuration on every seed, on ``engine`` (None: serially, here), in order."""
    from vtrm_gate.sim import sweep_map

    return sweep_map(_run_star, [(c, s) for c in cfgs for s in seeds], engine)


def where(jobs: int | None, scheduler: str | None) -> str:
    """The engine in words, for the header."""
    from vtrm_gate.sim import local_workers

    if scheduler:
        return f"the Dask cluster at {scheduler}"
    n = local_workers() if jobs is None else jobs
    return "this process, serially" if n == 1 else f"{n} local processes"


@contextmanager
def engine(jobs: int | None = None, scheduler: str | None = None
           ) -> Iterator[Executor | None]:
    """Where the runs go: the Dask cluster at ``scheduler``, else ``jobs`` local processes
    (default every core; 1: serially in this process)."""
    from vtrm_gate.sim import sweep_executor

    if jobs == 1 and not scheduler:
        with nullcontext(None) as none:
            yield none
        return
    with sweep_executor(scheduler, jobs) as ex:
        yield ex


def boot(xs: list[float], reps: int = 2000) -> tuple[float, float, float]:
    """Mean and 95% bootstrap percentile interval over seeds (seeded resampling)."""
    a = np.asarray(xs, dtype=float)
    rng = np.random.default_rng(16)
    means = a[rng.integers(0, len(a), (reps, len(a)))].mean(axis=1)
    return float(a.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


METRICS = ("accuracy", "better_applied", "leak", "probe_units", "wall_h")


def summarise(rows: list[dict[str, Any]], cfgs: list[Config]) -> list[dict[str, Any]]:
    """Per configuration: each metric's mean and interval over seeds, and the final accuracy's
    difference from the v3 default paired by seed (``delta_vs_default``)."""
    ref = {r["seed"]: r["accuracy"] for r in rows if r["config"] == DEFAULT.name}
    out = []
    for c in cfgs:
        rs = [r for r in rows if r["config"] == c.name]
        entry: dict[str, Any] = {"config": c.name, "seeds": len(rs)}
        for m in METRICS:
            entry[m] = boot([r[m] for r in rs])
        paired = [r["accuracy"] - ref[r["seed"]] for r in rs if r["seed"] in ref]
        entry["delta_vs_default"] = boot(paired) if paired else None
        entry["violations"] = sum(r["violations"] for r in rs)
        out.append(entry)
    return out


def _fmt(e: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"config": e["config"], "seeds": e["seeds"]}
    for m, scale, f in (("accuracy", 100, "{:.1f}"), ("better_applied", 1, "{:.1f}"),
                        ("leak", 1, "{:.2f}"), ("probe_units", 1, "{:.0f}"),
                        ("wall_h", 1, "{:.1f}")):
        mean, lo, hi = (v * scale for v in e[m])
        row[m] = f"{f.format(mean)} [{f.format(lo)}, {f.format(hi)}]"
        if m == "accuracy" and e.get("delta_vs_default") is not None:
            d, dlo, dhi = (100 * v for v in e["delta_vs_default"])
            row["vs default (paired)"] = f"{d:+.2f} [{dlo:+.2f}, {dhi:+.2f}]"
    row["unsettled"] = e["violations"]
    return row


def probe_sizes(rows: list[dict[str, Any]], cfgs: list[Config]) -> list[dict[str, Any]]:
    """Mean probe length per type (when settled) for each configuration."""
    types = sorted(rows[0]["pools"])
    out = []
    for t in types:
        row: dict[str, Any] = {"type": t, "pool": rows[0]["pools"][t]}
        for c in cfgs:
            ns = [n for r in rows if r["config"] == c.name for tt, n in r["probes"] if tt == t]
            row[c.name.replace("v3 ", "").replace(", ", " ")] = (
                f"{statistics.mean(ns):.0f}" if ns else "-")
        out.append(row)
    return out


def tune(seeds: list[int], ex: Executor | None) -> tuple[Config, Config, list[dict[str, Any]]]:
    """The best fixed lambda and the recommended configuration, on tuning seeds only: the
    most accurate one whose training time stays within the old serial gate's."""
    lam_cfgs = [Config(f"v3 n_max 40, lambda {lam}", lambda_dir=lam) for lam in LAMBDAS]
    rows = run_all([OLD, DEFAULT, *ONE_FACTOR, *lam_cfgs], seeds, ex)

    def mean_of(c: Config, key: str) -> float:
        return statistics.mean(r[key] for r in rows if r["config"] == c.name)

    def acc(c: Config) -> float:
        return mean_of(c, "accuracy")

    best_lam = max([DEFAULT, *lam_cfgs], key=acc)
    n_best = max([DEFAULT, *ONE_FACTOR[:3]], key=acc).n_max
    bet = max([best_lam, ONE_FACTOR[3]], key=acc)
    order = "seed_wrong_first" if acc(ONE_FACTOR[4]) > acc(DEFAULT) else "shuffle"
    bet_name = ("lambda mixture" if bet.decision_rule == "lambda_mixture"
                else f"lambda {bet.lambda_dir}")
    combo = Config(f"combined: n_max {n_best}, {bet_name}, probe {order}", n_max=n_best,
                   lambda_dir=bet.lambda_dir, decision_rule=bet.decision_rule,
                   probation_order=order)
    rows += run_all([combo], seeds, ex)
    old_wall = mean_of(OLD, "wall_h")
    pool = [c for c in (DEFAULT, *ONE_FACTOR, best_lam, combo) if mean_of(c, "wall_h") <= old_wall]
    rec = max(pool, key=acc)
    named = replace(best_lam, name=f"v3 n_max 40, lambda {best_lam.lambda_dir} (best fixed)")
    return named, (named if rec is best_lam else rec), rows


def main(quick: bool = False, seeds: int | None = None, tune_seeds: int | None = None,
         jobs: int | None = None, out: Path | None = None, scheduler: str | None = None
         ) -> None:
    out = out or (QUICK_RESULTS if quick else RESULTS)
    n = seeds or (3 if quick else 20)
    nt = tune_seeds or (2 if quick else 8)
    print(f"machine: {machine()}")
    print(f"{EPOCHS} epochs x {STEPS} steps, 12 types, e_continue, 20% held out, virtual "
          f"clock; tuning seeds {TUNE_SEED0}-{TUNE_SEED0 + nt - 1}, reported seeds 0-{n - 1}; "
          f"runs on {where(jobs, scheduler)}")
    t0 = time.perf_counter()
    with engine(jobs, scheduler) as ex:
        best_lam, rec, tune_rows = tune(list(range(TUNE_SEED0, TUNE_SEED0 + nt)), ex)
        cfgs = [OLD, DEFAULT, *ONE_FACTOR, best_lam, LONGER]
        if rec.name not in {c.name for c in cfgs}:
            cfgs.append(rec)
        rows = run_all(cfgs, list(range(n)), ex)
    print(f"chosen on tuning seeds: best fixed lambda {best_lam.lambda_dir}; recommended "
          f"{rec.name!r}")
    summary = summarise(rows, cfgs)
    print_table(f"the power frontier, {n} reported seeds (mean [95% bootstrap interval over "
                f"seeds]; accuracy in points; wall in simulated hours of training)",
                [_fmt(e) for e in summary])
    base = rows[0]
    print(f"initial true accuracy {100 * statistics.mean(r['initial'] for r in rows):.1f}, "
          f"oracle gate {100 * statistics.mean(r['oracle'] for r in rows):.1f} (the same "
          f"for every configuration of a seed; seed {base['seed']}: "
          f"{100 * base['initial']:.1f} / {100 * base['oracle']:.1f})")
    sizes = [c for c in cfgs if c.name.startswith("v3 n_max") and "," not in c.name]
    print_table("probe units available per type (mean over its settlements), by n_max",
                probe_sizes(rows, sizes))
    bad = sum(r["violations"] for r in rows + tune_rows)
    seeds_all = len({r["seed"] for r in rows + tune_rows})
    print(f"\nonly settled versions stand: {len(rows) + len(tune_rows)} runs on {seeds_all} "
          f"seeds, {bad} violations")
    print(f"recommended (chosen on the tuning seeds, reported above): {rec.name}")
    print(f"wall time of this benchmark: {time.perf_counter() - t0:.0f} s")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "machine": machine(), "epochs": EPOCHS, "steps": STEPS, "seeds": n,
        "tune_seeds": nt, "best_lambda": best_lam.lambda_dir, "recommended": rec.name,
        "old": OLD.name, "summary": summary,
        "initial": boot([r["initial"] for r in rows if r["config"] == OLD.name]),
        "oracle": boot([r["oracle"] for r in rows if r["config"] == OLD.name]),
        "runs": [{k: v for k, v in r.items() if k not in ("pools", "probes")} for r in rows],
        "tuning": [{k: v for k, v in r.items() if k not in ("pools", "probes")}
                   for r in tune_rows]}, indent=1) + "\n")
    print(f"results: {out}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--tune-seeds", type=int, default=None)
    ap.add_argument("--jobs", type=int, default=None,
                    help="local worker processes (default: every core; 1: serially)")
    ap.add_argument("--scheduler", default=None, metavar="tcp://HOST:PORT",
                    help="run on this Dask distributed cluster instead")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    try:
        main(quick=a.quick, seeds=a.seeds, tune_seeds=a.tune_seeds, jobs=a.jobs, out=a.out,
             scheduler=a.scheduler)
    except VtrmError as e:
        print(f"bench_power: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(0)
