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

Honest baselines (section ``baselines``): on today's world and the presets
``mostly_harmful`` / ``mostly_neutral`` / ``mostly_helpful`` (and every ``--world FILE``),
the JSON rows ``no_gate`` (apply every candidate), ``oracle`` (apply exactly the truly better
ones, reject the rest like the gate, cooldown included: not an upper bound), ``old`` and
``v3``, on the same seeds, each with its accuracy's difference from no gate and from v3
paired by seed; no gate and the oracle are `simulate_policy` runs of the same seed, as in
the training summary. Section ``harmful``: the four as the share of harmful candidates grows
0 -> 60% (helpful : neutral 40 : 35, drawn per candidate) and the share where each gate starts
beating no gate (bootstrap over seeds). Section ``levers``: lambda 0.7, n_max 80, n_max 120 and
the seed-wrong-first probe on the presets, paired with v3. Section ``cooldown``: v3 whose
FUTILE exits charge no cooldown (`FUTILE_FREE`) on today's world, the presets and the harmful
shares, paired with v3, the old gate and no gate. ``--quick``: the baselines on the three
presets, 3 seeds.

Run: ``python -m benchmarks.bench_power [--quick] [--seeds N] [--tune-seeds N] [--jobs J]
[--scheduler tcp://HOST:PORT] [--world FILE|PRESET ...] [--sections frontier,baselines,
harmful,levers,cooldown,ranking]`` (a section not run keeps its recorded result in the
output file). The runs go to J local processes (default: every core; they end with this
process) or to a Dask cluster's workers (which must import this checkout's ``benchmarks``
and ``vtrm_gate``); a run is seeded, so the engine never changes a number. The results land in
``benchmarks/results/bench_power.json`` (the input of the figures ``06_power_frontier`` and
``06_harmful_crossover``: ``python -m vtrm_gate.views.review --only NAME``).
"""

from __future__ import annotations

import argparse
import json
import math
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
from vtrm_gate.errors import ConfigError, VtrmError

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
    futile_cooldown: bool = True
    """Whether a FUTILE exit puts its type in cooldown (the SPEC's Phase D; `WorkspaceConfig`)."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


OLD = Config("old serial gate, n_max 40", decision_rule="old_blocks", old=True)
DEFAULT = Config("v3 n_max 40 (default)")
ONE_FACTOR = [Config(f"v3 n_max {n}", n_max=n) for n in (60, 80, 120)] + [
    Config("v3 n_max 40, lambda mixture", decision_rule="lambda_mixture"),
    Config("v3 n_max 40, probe seed-wrong-first", probation_order="seed_wrong_first")]
LONGER = Config(f"v3 n_max 40, {2 * EPOCHS} epochs (the saved time spent training)",
                epochs=2 * EPOCHS)
"""The speed-up spent on training: twice the epochs, still a fraction of the old gate's time."""


def run(cfg: Config, seed: int, world: dict[str, Any] | None = None) -> dict[str, Any]:
    """One training run of ``cfg`` on ``seed`` in ``world`` (a `World`'s JSON object; None:
    today's world): the metrics of the frontier, and the same seed's no-gate and oracle
    runs (`simulate_policy`, through the training summary)."""
    from vtrm_gate.backends import run_simulated_training
    from vtrm_gate.harness import settled_audit
    from vtrm_gate.options import RunOptions
    from vtrm_gate.sim import SimConfig
    from vtrm_gate.stats import GateParams

    options = RunOptions(gate=GateParams(n_max=cfg.n_max, lambda_dir=cfg.lambda_dir),
                         decision_rule=cfg.decision_rule)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        ws, _, s = run_simulated_training(Path(d) / "ws", SimConfig(seed=seed, world=world),
                                            cfg.epochs,
                                            cfg.steps, options, probation_rule="e_continue",
                                            probation_order=cfg.probation_order,
                                            futile_cooldown=cfg.futile_cooldown)
        probes = ws.log.select("step_report", ["task_type", "n_ladder", "n_consumed"],
                               step=0, status="probation")
        violations = len(settled_audit(ws).violations)
        pools = {t: len(us) for t, us in ws.pool.items()}
        ws.close()
    q = s["quality"]
    phases = s["old_phases_s"] if cfg.old else s["v3_phases_s"]
    ev = s.get("evaluation") or {}
    no_gate = q["policies"]["accept_all"]["applied"]
    return {"config": cfg.name, "seed": seed, "accuracy": q["mean_accuracy"]["gate"],
            "initial": q["mean_accuracy"]["initial"], "oracle": q["mean_accuracy"]["oracle"],
            "no_gate": q["mean_accuracy"]["accept_all"], "no_gate_better": no_gate["better"],
            "no_gate_leak": no_gate["neutral"] + no_gate["worse"],
            "oracle_better": q["policies"]["oracle"]["applied"]["better"],
            "better_applied": q["applied"]["better"], "better_gated": q["gated"]["better"],
            "leak": q["leak"], "probe_units": sum(n or 0 for _, _, n in probes),
            "probes": [(t, n or 0) for t, n, _ in probes], "pools": pools,
            "wall_h": sum(phases[k] for k in TRAIN_PHASES) / 3600,
            "measured_gain": (ev.get("gain_pooled") or {}).get("estimate"),
            "violations": violations, "cpu_s": time.perf_counter() - t0}


def _run_star(args: tuple[Config, int, dict[str, Any] | None]) -> dict[str, Any]:
    return run(*args)


def run_all(cfgs: list[Config], seeds: list[int], engine: Executor | None,
            world: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every configuration on every seed in ``world``, on ``engine`` (None: serially, here),
    in order."""
    from vtrm_gate.sim import sweep_map

    return sweep_map(_run_star, [(c, s, world) for c in cfgs for s in seeds], engine)


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
    difference from the v3 default and from the old gate, paired by seed
    (``delta_vs_default``, ``delta_vs_old``)."""
    ref = {r["seed"]: r["accuracy"] for r in rows if r["config"] == DEFAULT.name}
    old = {r["seed"]: r["accuracy"] for r in rows if r["config"] == OLD.name}
    out = []
    for c in cfgs:
        rs = [r for r in rows if r["config"] == c.name]
        entry: dict[str, Any] = {"config": c.name, "seeds": len(rs)}
        for m in METRICS:
            entry[m] = boot([r[m] for r in rs])
        paired = [r["accuracy"] - ref[r["seed"]] for r in rs if r["seed"] in ref]
        entry["delta_vs_default"] = boot(paired) if paired else None
        to_old = [r["accuracy"] - old[r["seed"]] for r in rs if r["seed"] in old]
        entry["delta_vs_old"] = boot(to_old) if to_old else None
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


# ---- honest baselines: no gate and the oracle beside the gates, world by world ------------

BASELINES = ("no_gate", "oracle", "old", "v3")
"""The four rows of every world: apply every candidate, apply exactly the truly better ones,
the old serial gate, v3 (default)."""
PRESET_WORLDS = ("mostly_harmful", "mostly_neutral", "mostly_helpful")
HARMFUL_SHARES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
"""The crossover sweep: the share of harmful candidates; helpful : neutral stays 40 : 35."""
SECTIONS = ("frontier", "baselines", "harmful", "levers", "cooldown", "ranking")
LEVERS = (Config("v3 lambda 0.7", lambda_dir=0.7), Config("v3 n_max 80", n_max=80),
          Config("v3 n_max 120", n_max=120),
          Config("v3 probe seed-wrong-first", probation_order="seed_wrong_first"))
"""Ways to spend the speed on information that keep the validity guarantee (opt-in): a
larger bet (worst-case false accept 4.16% <= 5%, exact, at discordance 1), longer ladders
(n_max 80 and 120, each capped by the type's pool), the probe's order."""


def harmful_world(share: float) -> dict[str, Any]:
    """Today's shares with ``share`` harmful candidates, drawn per candidate (JSON values)."""
    from vtrm_gate.sim import World

    rest = 1.0 - share
    return World(p_harmful=share, p_neutral=rest * 35 / 75,
                 p_helpful=rest - rest * 35 / 75).to_dict()


def _accuracies(rows: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """Per baseline, seed -> final true accuracy (no gate and oracle from the v3 runs)."""
    by = {"old": OLD.name, "v3": DEFAULT.name}
    out = {k: {r["seed"]: r["accuracy"] for r in rows if r["config"] == name}
           for k, name in by.items()}
    v3 = [r for r in rows if r["config"] == DEFAULT.name]
    out["no_gate"] = {r["seed"]: r["no_gate"] for r in v3}
    out["oracle"] = {r["seed"]: r["oracle"] for r in v3}
    return out


def baseline_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The four baselines of one world's runs: final true accuracy and its differences from
    no gate and from v3 paired by seed (95% bootstrap intervals over seeds), truly better
    candidates applied and the leak (neutral-or-worse applied)."""
    acc = _accuracies(rows)
    v3 = [r for r in rows if r["config"] == DEFAULT.name]
    old = [r for r in rows if r["config"] == OLD.name]
    applied = {"no_gate": ([r["no_gate_better"] for r in v3], [r["no_gate_leak"] for r in v3]),
               "oracle": ([r["oracle_better"] for r in v3], [0] * len(v3)),
               "old": ([r["better_applied"] for r in old], [r["leak"] for r in old]),
               "v3": ([r["better_applied"] for r in v3], [r["leak"] for r in v3])}
    out = []
    for label in BASELINES:
        a = acc[label]
        seeds = sorted(a)
        out.append({"label": label, "seeds": len(seeds),
                    "accuracy": boot([a[s] for s in seeds]),
                    "vs_no_gate": boot([a[s] - acc["no_gate"][s] for s in seeds]),
                    "vs_v3": boot([a[s] - acc["v3"][s] for s in seeds]),
                    "better_applied": boot(applied[label][0]), "leak": boot(applied[label][1])})
    return out


def _points(v: list[float], sign: str = "", digits: int = 1) -> str:
    """A (mean, low, high) fraction as points with its interval: ``61.6 [54.3, 68.3]``, or
    signed (``sign="+"``) for a difference: ``+1.2 [+0.2, +2.3]``."""
    return "{0:{s}.{d}f} [{1:{s}.{d}f}, {2:{s}.{d}f}]".format(*(100 * x for x in v), s=sign,
                                                             d=digits)


def _fmt_baseline(e: dict[str, Any]) -> dict[str, Any]:
    return {"baseline": e["label"], "accuracy": _points(e["accuracy"]),
            "vs no gate (paired)": _points(e["vs_no_gate"], "+"),
            "vs v3 (paired)": _points(e["vs_v3"], "+"),
            "better applied": f"{e['better_applied'][0]:.1f}",
            "leak": f"{e['leak'][0]:.1f}"}


def run_baselines(worlds: dict[str, dict[str, Any]], seeds: list[int], ex: Executor | None
                  ) -> dict[str, Any]:
    """The four baselines on each world, the same seeds everywhere."""
    from vtrm_gate.sim import sweep_map

    work = [(c, s, w) for w in worlds.values() for c in (OLD, DEFAULT) for s in seeds]
    rows = sweep_map(_run_star, work, ex)
    k = 2 * len(seeds)
    out = {}
    for i, (name, w) in enumerate(worlds.items()):
        rs = rows[i * k:(i + 1) * k]
        acc = _accuracies(rs)
        out[name] = {"world": w, "seeds": len(seeds), "summary": baseline_rows(rs),
                     "per_seed": {k: [acc[k][s] for s in seeds] for k in BASELINES},
                     "violations": sum(r["violations"] for r in rs)}
        print_table(f"{name}: final true accuracy (points; mean [95% interval over "
                    f"{len(seeds)} seeds]; differences paired by seed)",
                    [_fmt_baseline(e) for e in out[name]["summary"]])
    return out


def crossover(shares: list[float], diffs: np.ndarray) -> float:
    """The harmful share where a gate's mean accuracy minus no gate's first turns >= 0
    (linear between grid points; the smallest share when it pays there already, +inf when
    it never does on the grid). ``diffs``: shares x seeds, paired by seed."""
    d = diffs.mean(axis=1)
    if d[0] >= 0:
        return shares[0]
    for i in range(1, len(shares)):
        if d[i] >= 0:
            return shares[i - 1] + (shares[i] - shares[i - 1]) * -d[i - 1] / (d[i] - d[i - 1])
    return math.inf


def crossover_interval(shares: list[float], diffs: np.ndarray, reps: int = 2000
                       ) -> list[float | None]:
    """`crossover` and its 95% bootstrap interval, resampling seeds (paired across shares);
    None stands for beyond the grid."""
    rng = np.random.default_rng(25)
    n = diffs.shape[1]
    draws = np.array([crossover(shares, diffs[:, rng.integers(0, n, n)]) for _ in range(reps)])
    lo, hi = np.quantile(draws, [0.025, 0.975], method="inverted_cdf")
    return [None if not math.isfinite(v) else float(v)
            for v in (crossover(shares, diffs), lo, hi)]


def harmful_sweep(seeds: list[int], ex: Executor | None) -> dict[str, Any]:
    """The four baselines as the share of harmful candidates grows (`HARMFUL_SHARES`), and
    where each gate starts paying for itself against applying every candidate."""
    worlds = {f"p_harmful {s:.1f}": harmful_world(s) for s in HARMFUL_SHARES}
    res = run_baselines(worlds, seeds, ex)
    points = [{"p_harmful": s, **res[name]} for s, name in zip(HARMFUL_SHARES, worlds,
                                                                strict=True)]
    cross = {}
    for gate in ("old", "v3"):
        diffs = np.array([np.subtract(res[w]["per_seed"][gate], res[w]["per_seed"]["no_gate"])
                          for w in worlds])
        cross[gate] = crossover_interval(list(HARMFUL_SHARES), diffs)
    for gate, (c, lo, hi) in cross.items():
        print(f"{gate} pays for itself (beats no gate) from a harmful share of "
              f"{_share(c)} [95%: {_share(lo)}, {_share(hi)}]")
    return {"shares": list(HARMFUL_SHARES), "seeds": len(seeds), "points": points,
            "crossover": cross}


def _share(v: float | None) -> str:
    return "beyond the grid" if v is None else f"{100 * v:.0f}%"


def run_levers(worlds: dict[str, dict[str, Any]], seeds: list[int], ex: Executor | None,
               v3: dict[str, list[float]]) -> dict[str, Any]:
    """Each lever on each preset world against v3 at the SPEC's defaults, paired by seed
    (``v3``: world -> the default's accuracy per seed, from the baselines section)."""
    from vtrm_gate.sim import sweep_map

    work = [(c, s, w) for w in worlds.values() for c in LEVERS for s in seeds]
    rows = sweep_map(_run_star, work, ex)
    out: dict[str, Any] = {}
    k = len(LEVERS) * len(seeds)
    for i, name in enumerate(worlds):
        rs, ref = rows[i * k:(i + 1) * k], v3[name]
        entries = []
        for c in LEVERS:
            mine = [r for r in rs if r["config"] == c.name]
            entries.append({"label": c.name.replace(" ", "_"), "config": c.name,
                            "seeds": len(mine),
                            "accuracy": boot([r["accuracy"] for r in mine]),
                            "vs_v3": boot([r["accuracy"] - ref[j] for j, r in enumerate(mine)]),
                            "better_applied": boot([r["better_applied"] for r in mine]),
                            "leak": boot([r["leak"] for r in mine]),
                            "wall_h": boot([r["wall_h"] for r in mine]),
                            "violations": sum(r["violations"] for r in mine)})
        out[name] = entries
        print_table(f"{name}: levers vs v3 at the SPEC's defaults (points; paired by seed)",
                    [{"lever": e["config"], "accuracy": f"{100 * e['accuracy'][0]:.1f}",
                      "vs v3 (paired)": _points(e["vs_v3"], "+"),
                      "better applied": f"{e['better_applied'][0]:.1f}",
                      "leak": f"{e['leak'][0]:.1f}", "wall h": f"{e['wall_h'][0]:.1f}"}
                     for e in entries])
    return out


# ---- what FUTILE's cooldown costs ----------------------------------------------------------

FUTILE_FREE = Config("v3 n_max 40, no cooldown after FUTILE", futile_cooldown=False)
"""v3 at the SPEC's gate defaults whose FUTILE exits charge no cooldown (`init
--no-futile-cooldown`): the prefix rule's futility stop comes before a ladder's end, where the
old gate's blocks mostly end INERTIA, which charges none."""
FUTILE_FREE_LONGER = replace(LONGER, name=f"v3 n_max 40, {2 * EPOCHS} epochs, no cooldown after "
                                          "FUTILE", futile_cooldown=False)
"""Both uses of the speed at once: no FUTILE cooldown and twice the epochs (today's world)."""


def _recorded(result: dict[str, Any], seeds: list[int], ex: Executor | None,
              worlds: dict[str, dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Per world: the baselines' per-seed accuracies (no gate, oracle, old, v3) recorded by
    the ``baselines`` and ``harmful`` sections, run again where they hold fewer seeds."""
    recorded = {**{f"p_harmful {p['p_harmful']:.1f}": p
                   for p in result.get("harmful_sweep", {}).get("points", [])},
                **result.get("baselines", {})}
    out, missing = {}, {}
    for name, w in worlds.items():
        r = recorded.get(name)
        if r and r["seeds"] >= len(seeds) and r["world"] == w:
            out[name] = {k: v[:len(seeds)] for k, v in r["per_seed"].items()}
        else:
            missing[name] = w
    if missing:
        out |= {k: v["per_seed"] for k, v in run_baselines(missing, seeds, ex).items()}
    return out


def cooldown_section(result: dict[str, Any], worlds: dict[str, dict[str, Any]],
                     seeds: list[int], ex: Executor | None) -> dict[str, Any]:
    """`FUTILE_FREE` on today's world, the presets and the harmful shares, paired by seed with
    v3 at the SPEC's defaults, the old gate and no gate; and the harmful share from which it
    beats no gate (bootstrap over seeds)."""
    from vtrm_gate.sim import sweep_map

    named = {**{k: worlds[k] for k in ("default", *PRESET_WORLDS) if k in worlds},
             **{f"p_harmful {s:.1f}": harmful_world(s) for s in HARMFUL_SHARES}}
    ref = _recorded(result, seeds, ex, named)
    rows = sweep_map(_run_star, [(FUTILE_FREE, s, w) for w in named.values() for s in seeds],
                     ex)
    out: dict[str, Any] = {}
    runs = {name: rows[i * len(seeds):(i + 1) * len(seeds)] for i, name in enumerate(named)}
    for name, rs in runs.items():
        acc = [r["accuracy"] for r in rs]
        out[name] = {"world": named[name], "seeds": len(seeds), "per_seed": acc,
                     "accuracy": boot(acc),
                     **{f"vs_{k}": boot(np.subtract(acc, ref[name][k]).tolist())
                        for k in ("v3", "old", "no_gate", "oracle")},
                     "better_applied": boot([r["better_applied"] for r in rs]),
                     "leak": boot([r["leak"] for r in rs]),
                     "wall_h": boot([r["wall_h"] for r in rs]),
                     "violations": sum(r["violations"] for r in rs)}
    print_table(f"{FUTILE_FREE.name}: paired by seed with v3 at the SPEC's defaults, the old "
                f"gate and no gate (points; mean [95% bootstrap over {len(seeds)} seeds])",
                [{"world": k, "accuracy": f"{100 * e['accuracy'][0]:.1f}",
                  **{f"vs {g}": _points(e[f"vs_{g}"], "+") for g in ("v3", "old", "no_gate")},
                  "better applied": f"{e['better_applied'][0]:.1f}",
                  "leak": f"{e['leak'][0]:.2f}", "wall h": f"{e['wall_h'][0]:.1f}"}
                 for k, e in out.items()])
    shares = [f"p_harmful {s:.1f}" for s in HARMFUL_SHARES]
    diffs = np.array([np.subtract(out[w]["per_seed"], ref[w]["no_gate"]) for w in shares])
    cross = crossover_interval(list(HARMFUL_SHARES), diffs)
    print(f"{FUTILE_FREE.name} pays for itself (beats no gate) from a harmful share of "
          f"{_share(cross[0])} [95%: {_share(cross[1])}, {_share(cross[2])}]")
    front = _frontier_pairs(result, runs.get("default", []), ex)
    return {"config": FUTILE_FREE.name, "worlds": out, "crossover": cross,
            "frontier": front}


def _frontier_pairs(result: dict[str, Any], have: list[dict[str, Any]], ex: Executor | None
                    ) -> dict[str, Any] | None:
    """`FUTILE_FREE` (and `FUTILE_FREE_LONGER`, under ``six_epochs``) on today's world on
    every seed of the recorded frontier, paired with its v3 default, old gate and
    twice-the-epochs runs (None without a recorded frontier)."""
    from vtrm_gate.sim import sweep_map

    runs = result.get("runs") or []
    by = {c.name: {r["seed"]: r for r in runs if r["config"] == c.name}
          for c in (LONGER, OLD, DEFAULT)}
    front_seeds = sorted(by[DEFAULT.name])
    if not front_seeds or not have:
        return None
    mine = {r["seed"]: r for r in have}
    extra = [(FUTILE_FREE, s, None) for s in front_seeds if s not in mine]
    longer = [(FUTILE_FREE_LONGER, s, None) for s in front_seeds]
    rows = sweep_map(_run_star, extra + longer, ex)
    mine |= {r["seed"]: r for r in rows[:len(extra)]}
    out = _paired_with_frontier(FUTILE_FREE, mine, by, front_seeds)
    out["six_epochs"] = _paired_with_frontier(
        FUTILE_FREE_LONGER, {r["seed"]: r for r in rows[len(extra):]}, by, front_seeds)
    return out


def _paired_with_frontier(cfg: Config, mine: dict[int, dict[str, Any]],
                          by: dict[str, dict[int, dict[str, Any]]], seeds: list[int]
                          ) -> dict[str, Any]:
    """``cfg``'s runs on ``seeds`` summarised, and paired by seed with the frontier's v3
    default, old gate and twice-the-epochs runs (``by``: configuration -> seed -> run)."""
    out = {"config": cfg.name, "seeds": len(seeds),
           **{m: boot([mine[s][m] for s in seeds])
              for m in ("accuracy", "wall_h", "better_applied", "leak")},
           **{f"vs_{k}": boot([mine[s]["accuracy"] - by[c.name][s]["accuracy"] for s in seeds])
              for k, c in (("v3", DEFAULT), ("old", OLD), ("v3_6_epochs", LONGER))}}
    print(f"today's world, the frontier's {len(seeds)} seeds: {cfg.name} "
          + ", ".join(f"{k.replace('_', ' ')} {_points(out[k], '+', 2)}"
                      for k in ("vs_v3", "vs_old", "vs_v3_6_epochs"))
          + f" points, {out['wall_h'][0]:.1f} simulated hours")
    return out


# ---- the fitted world ranks the configurations as the true world does ---------------------

RANKED = (OLD, DEFAULT, Config("v3 n_max 80", n_max=80))
"""The configurations ranked under a preset world and under the world fitted to one of its
runs (no gate comes with the v3 runs)."""
RANK_LABELS = ("no_gate", "old", "v3", "v3_n_max_80")
FIT_SEED = 1
"""The seed of the 3 x 5 run each world is fitted to (the recovery tests' run)."""


def fitted_world(world: dict[str, Any], seed: int = FIT_SEED) -> dict[str, Any]:
    """The `World` (JSON object) that `fit_world` estimates from one simulated 3 x 5 run of
    ``world`` at the SPEC's defaults."""
    from vtrm_gate.backends import run_simulated_training
    from vtrm_gate.sim import SimConfig, fit_world

    with tempfile.TemporaryDirectory() as d:
        ws, _, _ = run_simulated_training(Path(d) / "ws", SimConfig(seed=seed, world=world),
                                          EPOCHS, STEPS, probation_rule="e_continue")
        try:
            return fit_world(ws).world.to_dict()
        finally:
            ws.close()


def rank_means(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean final true accuracy per `RANK_LABELS` entry over the runs' seeds."""
    by = dict(zip(RANK_LABELS[1:], (c.name for c in RANKED), strict=True))
    out = {k: statistics.mean(r["accuracy"] for r in rows if r["config"] == name)
           for k, name in by.items()}
    out["no_gate"] = statistics.mean(r["no_gate"] for r in rows if r["config"] == DEFAULT.name)
    return {k: out[k] for k in RANK_LABELS}


def rank_agreement(true: dict[str, float], fitted: dict[str, float]) -> dict[str, Any]:
    """Both orders (best first), whether they are the same, and the pairs of configurations
    the two worlds order alike (of all pairs)."""
    pairs = [(a, b) for i, a in enumerate(RANK_LABELS) for b in RANK_LABELS[i + 1:]]
    alike = [(a, b) for a, b in pairs
             if (true[a] - true[b]) * (fitted[a] - fitted[b]) > 0]
    order = lambda m: sorted(m, key=lambda k: -m[k])  # noqa: E731
    return {"true_order": order(true), "fitted_order": order(fitted),
            "same_order": order(true) == order(fitted), "pairs_alike": len(alike),
            "pairs": len(pairs)}


def _fit_star(world: dict[str, Any]) -> dict[str, Any]:
    return fitted_world(world)


def ranking(worlds: dict[str, dict[str, Any]], seeds: list[int], ex: Executor | None
            ) -> dict[str, Any]:
    """Per world: fit a 3 x 5 run, then rank `RANKED` and no gate by mean final true accuracy
    over ``seeds`` under the true and under the fitted world (the same seeds)."""
    from vtrm_gate.sim import sweep_map

    fitted = dict(zip(worlds, sweep_map(_fit_star, list(worlds.values()), ex), strict=True))
    work = [(c, s, w) for name in worlds for w in (worlds[name], fitted[name])
            for c in RANKED for s in seeds]
    rows = sweep_map(_run_star, work, ex)
    k = len(RANKED) * len(seeds)
    out = {}
    for i, name in enumerate(worlds):
        true, fit = rank_means(rows[2 * i * k:(2 * i + 1) * k]), \
            rank_means(rows[(2 * i + 1) * k:(2 * i + 2) * k])
        out[name] = {"world": worlds[name], "fitted": fitted[name], "seeds": len(seeds),
                     "true": true, "fitted_means": fit, **rank_agreement(true, fit)}
        print_table(f"{name}: mean final true accuracy (points, {len(seeds)} seeds) under the "
                    f"true world and under the world fitted to its seed-{FIT_SEED} run",
                    [{"configuration": lab, "true world": f"{100 * true[lab]:.1f}",
                      "fitted world": f"{100 * fit[lab]:.1f}"} for lab in RANK_LABELS])
        e = out[name]
        print(f"  order true {e['true_order']}, fitted {e['fitted_order']}: same order "
              f"{e['same_order']}, {e['pairs_alike']} of {e['pairs']} pairs alike")
    return out


# ---- the benchmark ------------------------------------------------------------------------


def frontier(n: int, nt: int, ex: Executor | None) -> dict[str, Any]:
    """The power frontier on today's world: configurations tuned on seeds 100+, reported on
    seeds 0..n-1."""
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
    return {"dispatch": "every configuration, the old gate's and the tuning runs included, "
                        "with the default dispatch (expected_need)",
            "seeds": n, "tune_seeds": nt, "best_lambda": best_lam.lambda_dir,
            "recommended": rec.name, "old": OLD.name, "summary": summary,
            "initial": boot([r["initial"] for r in rows if r["config"] == OLD.name]),
            "oracle": boot([r["oracle"] for r in rows if r["config"] == OLD.name]),
            "runs": [{k: v for k, v in r.items() if k not in ("pools", "probes")}
                     for r in rows],
            "tuning": [{k: v for k, v in r.items() if k not in ("pools", "probes")}
                       for r in tune_rows]}


def read_worlds(sources: list[str]) -> dict[str, dict[str, Any]]:
    """``--world`` values (a preset name or a JSON file) as name -> the world's JSON object;
    a bad file raises `ConfigError` naming the file and the field."""
    from vtrm_gate.sim import World

    return {(s if not s.endswith(".json") else Path(s).stem): World.from_json(s).to_dict()
            for s in sources}


def _levers(result: dict[str, Any], worlds: dict[str, dict[str, Any]], seeds: list[int],
            ex: Executor | None) -> dict[str, Any]:
    """The levers on the preset worlds, paired with the baselines section's v3 runs on the
    same seeds 0..n-1 (run again when that section has fewer)."""
    presets = {k: worlds[k] for k in PRESET_WORLDS}
    base = result.get("baselines", {})
    v3 = {}
    for name, w in presets.items():
        b = base.get(name)
        v3[name] = (b["per_seed"]["v3"][:len(seeds)] if b and b["seeds"] >= len(seeds) else
                    [r["accuracy"] for r in run_all([DEFAULT], seeds, ex, w)])
    return run_levers(presets, seeds, ex, v3)


def main(quick: bool = False, seeds: int | None = None, tune_seeds: int | None = None,
         jobs: int | None = None, out: Path | None = None, scheduler: str | None = None,
         worlds: list[str] | None = None, sections: list[str] | None = None) -> None:
    """Run ``sections`` (default: all; ``--quick``: the baselines on the preset worlds, 3
    seeds) and write their results; a section not run keeps its result in ``out``."""
    out = out or (QUICK_RESULTS if quick else RESULTS)
    sections = list(sections or (["baselines"] if quick else SECTIONS))
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        raise ConfigError(f"--sections: unknown section {bad[0]!r}; choose from {SECTIONS}")
    world_set = read_worlds([*([] if quick else ["default"]), *PRESET_WORLDS, *(worlds or [])])
    n = seeds or (3 if quick else 20)
    nt = tune_seeds or (2 if quick else 8)
    print(f"machine: {machine()}")
    print(f"{EPOCHS} epochs x {STEPS} steps, 12 types, e_continue, 20% held out, virtual "
          f"clock; sections {', '.join(sections)}; seeds 0-{n - 1}; runs on "
          f"{where(jobs, scheduler)}")
    result = (json.loads(out.read_text()) if out.is_file() and set(sections) != set(SECTIONS)
              else {})
    t0 = time.perf_counter()
    with engine(jobs, scheduler) as ex:
        if "frontier" in sections:
            result.update(frontier(n, nt, ex))
        if "baselines" in sections:
            result["baselines"] = run_baselines(world_set, list(range(n)), ex)
        if "harmful" in sections:
            result["harmful_sweep"] = harmful_sweep(list(range(n)), ex)
        if "levers" in sections:
            result["levers"] = _levers(result, world_set, list(range(n)), ex)
        if "cooldown" in sections:
            result["cooldown"] = cooldown_section(result, world_set, list(range(n)), ex)
        if "ranking" in sections:
            result["ranking"] = ranking({k: world_set[k] for k in PRESET_WORLDS},
                                        list(range(n)), ex)
    print(f"wall time of this benchmark: {time.perf_counter() - t0:.0f} s")
    result.update({"machine": machine(), "epochs": EPOCHS, "steps": STEPS})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
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
    ap.add_argument("--world", action="append", default=None, metavar="FILE|PRESET",
                    help="also run the baselines on this world (repeatable)")
    ap.add_argument("--sections", default=None,
                    help=f"comma-separated, of {','.join(SECTIONS)} (default: all)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    try:
        main(quick=a.quick, seeds=a.seeds, tune_seeds=a.tune_seeds, jobs=a.jobs, out=a.out,
             scheduler=a.scheduler, worlds=a.world,
             sections=a.sections.split(",") if a.sections else None)
    except VtrmError as e:
        print(f"bench_power: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(0)
