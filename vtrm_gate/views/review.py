"""The design-review figures as reproducible artefacts: one builder per figure.

Notebook 03 calls the builders; ``make figures`` (``python -m vtrm_gate.views.review --out
figures``) regenerates the committed PNG + SVG files at full size and writes
``figures/README.md`` listing each figure with the command and parameters that made it.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from .._env import DEFAULT_CONCURRENCY, user_path
from ..errors import ConfigError, is_real, is_whole, plain_fields, shown
from ..gate import GateEvent, run_gate
from ..sim import block_serial_schedule, continuous_schedule, no_early_stop, run_virtual, sim_step
from ..stats import GateParams, as_params, false_accept_curve, units_curve
from ._figures import (
    plot_false_accept,
    plot_makespan,
    plot_operating_characteristics,
    plot_prefix_vs_block,
    plot_token_savings,
    plot_waste,
    save,
)
from ._frames import call_accounting, compare_replays, oc_grid
from ._style import SLIDE_DPI, figure_problems


@dataclass(frozen=True)
class ReviewParams:
    """Everything the review figures depend on (recorded in figures/README.md)."""

    n_rep: int = 20_000
    seed: int = 2024
    sim_seed: int = 2
    correlations: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 0.95)
    p_wins: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9)
    discordances: tuple[float, ...] = (0.3, 0.5, 0.7)
    concurrency: int = DEFAULT_CONCURRENCY
    epochs: int = 3
    steps_per_epoch: int = 5
    params: GateParams = field(default_factory=GateParams)
    power_results: str = "benchmarks/results/bench_power.json"
    """`python -m benchmarks.bench_power`'s output: the frontier figure's data."""

    def __post_init__(self) -> None:
        """Each field checked here, naming it, not in a figure cell later with a value the
        user never wrote (``n_rep=1`` failed as "n_rep ... got 0": the token figure halves
        it)."""
        plain_fields(self)
        for name, low in (("n_rep", 2), ("seed", 0), ("sim_seed", 0), ("concurrency", 1),
                          ("epochs", 1), ("steps_per_epoch", 1)):
            v = getattr(self, name)
            if not is_whole(v) or v < low:
                raise ConfigError(f"ReviewParams.{name} must be an integer >= {low}, got "
                                  f"{shown(v)}")
        for name in ("correlations", "p_wins", "discordances"):
            v = getattr(self, name)
            if isinstance(v, str) or not v or not all(is_real(x) for x in v):
                raise ConfigError(f"ReviewParams.{name} must be a non-empty sequence of "
                                  f"numbers, got {shown(v)}")
        as_params(self.params)


@functools.lru_cache(maxsize=4)
def simulated_step(sim_seed: int, concurrency: int = DEFAULT_CONCURRENCY,
                   params: GateParams | None = None) -> dict[str, Any]:
    """The step of ``sim_seed`` under the old gate, the v3 gate (virtual clock, events
    recorded) and no early stop."""
    params = as_params(params)
    st = sim_step(sim_seed, wall_seconds=None, params=params)
    plans = list(st.plans)
    events: list[GateEvent] = []
    gate = run_virtual(run_gate(plans, st.world.infer, params, concurrency,
                                subscribers=[events.append]))
    outcome_sets = st.outcome_sets
    pairs = [p for ps in outcome_sets.values() for p in ps if p is not None]
    return {"step": st, "events": events, "gate": gate,
            "old": block_serial_schedule(st.world, plans, params),
            "new": continuous_schedule(st.world, plans, params, concurrency),
            "full": no_early_stop(st.world, plans), "outcome_sets": outcome_sets,
            "discordance": sum(b != c for b, c in pairs) / max(len(pairs), 1),
            "units_saving": 1 - sum(o.n_consumed for o in gate.outcomes.values())
            / max(sum(len(p.units) for p in plans), 1)}


def false_accept(rp: ReviewParams) -> Figure:
    curve = false_accept_curve(rp.params, rp.correlations, rp.n_rep, seed=rp.seed)
    return plot_false_accept(curve)


def operating_characteristics(rp: ReviewParams) -> Figure:
    oc = oc_grid(rp.params, [0.3 + 0.05 * i for i in range(15)], rp.discordances,
                 rp.params.n_max)
    return plot_operating_characteristics(oc, rp.params)


def token_savings(rp: ReviewParams) -> Figure:
    step = simulated_step(rp.sim_seed, rp.concurrency, rp.params)
    curve = units_curve(rp.params, rp.p_wins, rp.n_rep // 2, seed=rp.seed)
    return plot_token_savings(curve, step_saving=(step["units_saving"], step["discordance"],
                                                  rp.sim_seed, len(step["gate"].outcomes)))


def makespan(rp: ReviewParams) -> Figure:
    step = simulated_step(rp.sim_seed, rp.concurrency, rp.params)
    old, new = step["old"], step["new"]
    n = len(step["step"].plans)
    return plot_makespan(old["makespan_s"] / 3600, new["makespan_s"] / 3600,
                         new["lower_bound_s"] / 3600,
                         labels=[f"simulated {n}-type step, seed {rp.sim_seed}, virtual clock"])


def waste(rp: ReviewParams) -> Figure:
    step = simulated_step(rp.sim_seed, rp.concurrency, rp.params)
    return plot_waste(call_accounting(step["events"]))


@functools.lru_cache(maxsize=2)
def simulated_training(sim_seed: int, epochs: int, steps_per_epoch: int,
                       concurrency: int = DEFAULT_CONCURRENCY) -> dict[str, Any]:
    """A simulated training run (virtual clock, recommended probation rule) of the 12-type
    world of ``sim_seed``: its training curve and its old-vs-v3 time per phase."""
    import tempfile

    from ..backends import run_simulated_training
    from ..harness import read_heldout
    from ..options import RunOptions
    from ..sim import SimConfig, SimWorld, training_curve

    sim = SimConfig(seed=sim_seed)
    with tempfile.TemporaryDirectory() as tmp:
        ws, _, summary = run_simulated_training(Path(tmp) / "ws", sim, epochs,
                                                steps_per_epoch,
                                                RunOptions(concurrency=concurrency),
                                                probation_rule="e_continue")
        try:
            curve = training_curve(ws, SimWorld(sim))
            n_heldout = {t: len(u) for t, u in read_heldout(ws).items()}
        finally:
            ws.close()
    return {"curve": curve, "n_heldout": n_heldout, "old": summary["old_phases_s"],
            "new": summary["v3_phases_s"]}


def training_curve(rp: ReviewParams) -> Figure:
    from ._train_figures import plot_training_curve

    run = simulated_training(rp.sim_seed, rp.epochs, rp.steps_per_epoch, rp.concurrency)
    return plot_training_curve(run["curve"], n_heldout=run["n_heldout"], run=_run_name(rp))


def _run_name(rp: ReviewParams) -> str:
    """The deck's training run, as its figures' titles name it."""
    return f"seed {rp.sim_seed}, {rp.epochs} epochs × {rp.steps_per_epoch} steps"


def training_phase_times(rp: ReviewParams) -> Figure:
    from ._train_figures import plot_phase_times

    run = simulated_training(rp.sim_seed, rp.epochs, rp.steps_per_epoch, rp.concurrency)
    return plot_phase_times(run["old"], run["new"], run=_run_name(rp))


def _power_results(rp: ReviewParams) -> dict[str, Any]:
    import json

    path = Path(rp.power_results)
    checkout = Path(__file__).resolve().parents[2] / path  # run from outside the checkout
    if not path.is_file() and not path.is_absolute() and checkout.is_file():
        path = checkout
    if not path.is_file():
        raise FileNotFoundError(f"{path}: run python -m benchmarks.bench_power first (it "
                                f"writes the frontier's data there)")
    return json.loads(path.read_text(encoding="utf-8"))


def power_frontier(rp: ReviewParams) -> Figure:
    from ._train_figures import plot_power_frontier

    return plot_power_frontier(_power_results(rp))


def harmful_crossover(rp: ReviewParams) -> Figure:
    from ._train_figures import plot_harmful_crossover

    return plot_harmful_crossover(_power_results(rp))


def prefix_vs_block(rp: ReviewParams) -> Figure:
    step = simulated_step(rp.sim_seed, rp.concurrency, rp.params)
    return plot_prefix_vs_block(compare_replays(step["outcome_sets"], rp.params))


def headlines(rp: ReviewParams) -> dict[str, str]:
    """The deck's headline numbers, as the figures print them: written into
    figures/README.md by `build`, quoted by the README (a test keeps the three in step)."""
    from ..stats import operating_characteristics as oc

    step = simulated_step(rp.sim_seed, rp.concurrency, rp.params)
    old, new = step["old"]["makespan_s"] / 3600, step["new"]["makespan_s"] / 3600
    lb = step["new"]["lower_bound_s"] / 3600
    calls = call_accounting(step["events"])
    n = rp.params.n_max
    train = simulated_training(rp.sim_seed, rp.epochs, rp.steps_per_epoch, rp.concurrency)
    t_old, t_new = sum(train["old"].values()) / 3600, sum(train["new"].values()) / 3600
    return {
        "step_old_h": f"{old:.2f} h", "step_v3_h": f"{new:.2f} h",
        "step_speedup": f"×{old / new:.1f}", "step_lower_bound": f"{new / lb:.2f}×",
        "waste": f"{int(calls['past_stop_calls'].sum())} of {int(calls['started'].sum())}",
        "units_saving": f"{step['units_saving']:.0%}",
        "p_accept_0.8": f"{oc(rp.params, 0.8, 0.5, n).p_accept:.0%}",
        "p_provisional_0.8": f"{oc(rp.params, 0.8, 0.5, n).p_provisional:.0%}",
        "false_accept_h0": f"{oc(rp.params, 0.5, 0.5, n).p_accept:.2%}",
        "training_old_h": f"{t_old:.1f} h", "training_v3_h": f"{t_new:.1f} h",
        "training_speedup": f"×{t_old / t_new:.1f}",
    }


FIGURES = {
    "03_false_accept_h0": (false_accept, "False accept under H0: arrival order vs ladder "
                                         "prefix (Monte Carlo, n_rep per correlation)"),
    "03_operating_characteristics": (operating_characteristics,
                                     "Exact exit probabilities, one panel per exit"),
    "03_token_savings": (token_savings, "Units saved by early stopping (Monte Carlo, n_rep/2 "
                                        "per p_win) vs the simulated step"),
    "03_makespan": (makespan, "Makespan: old serial gate vs v3 vs the lower bound"),
    "03_waste": (waste, "Calls started past each type's stop rank"),
    "02_prefix_vs_block": (prefix_vs_block, "Block vs prefix replay of the same outcomes"),
    "06_training_curve": (training_curve, "Training run (epochs x steps_per_epoch, sim_seed): "
                                          "held-out accuracy per type and epoch, true and "
                                          "measured"),
    "06_phase_times": (training_phase_times, "Training run: old serial vs v3 time per phase"),
    "06_power_frontier": (power_frontier, "What the speed-up buys: final true accuracy vs "
                                          "simulated training time per configuration "
                                          "(benchmarks/results/bench_power.json)"),
    "06_harmful_crossover": (harmful_crossover, "When the gate pays for itself: final true "
                                                "accuracy of no gate / old / v3 / oracle / v3 "
                                                "without FUTILE's cooldown as the share of "
                                                "harmful candidates grows (bench_power.json's "
                                                "harmful_sweep and cooldown)"),
}


def build(out: str | Path, rp: ReviewParams | None = None,
          names: Sequence[str] | None = None, formats: Sequence[str] = ("png", "svg"),
          command: str = "make figures") -> list[Path]:
    """Write each figure as PNG (1280×720 at 100 dpi) and SVG, then ``README.md``; a figure
    that fails `figure_problems` is refused (ValueError naming what is wrong)."""
    rp = rp or ReviewParams()
    out = user_path(out)
    paths = []
    for name in names or FIGURES:
        fn, _ = FIGURES[name]
        fig = fn(rp)
        problems = figure_problems(fig)
        if problems:  # the deck's checks: size, title, labels, colours, no overlaps
            raise ValueError(f"{name}: " + "; ".join(problems))
        paths.append(save(fig, name, out, dpi=SLIDE_DPI, formats=formats))
    lines = ["# Design-review figures", "",
             f"Regenerate all of them with `{command}` "
             "(= `python -m vtrm_gate.views.review --out figures`). PNG at 1280×720 (100 dpi) "
             "and SVG. Notebooks never write here: they save to a temporary or ignored "
             "directory.", "", "Parameters:", ""]
    for k, v in asdict(rp).items():
        lines.append(f"- `{k}`: {v}")
    lines += ["", "Headline numbers (`vtrm_gate.views.review.headlines`; the README quotes them, "
              "a test keeps them in step):", ""]
    lines += [f"- `{k}`: {v}" for k, v in headlines(rp).items()]
    lines += ["", "| file | what | builder |", "|---|---|---|"]
    for name in FIGURES:  # the directory's index: every figure, even with --only
        fn, what = FIGURES[name]
        lines.append(f"| `{name}.png` / `.svg` | {what} | `vtrm_gate.views.review.{fn.__name__}` |")
    (out / "README.md").write_text("\n".join(lines) + "\n")
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vtrm_gate.views.review",
                                description="Regenerate the design-review figures.")
    p.add_argument("--out", default="figures")
    p.add_argument("--n-rep", type=int, default=ReviewParams.n_rep)
    p.add_argument("--only", nargs="*", choices=list(FIGURES))
    args = p.parse_args(argv)
    if args.n_rep < 1:
        print("--n-rep must be >= 1", file=sys.stderr)
        return 2
    for path in build(args.out, ReviewParams(n_rep=args.n_rep), args.only):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
