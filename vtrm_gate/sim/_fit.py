"""Fit a `World` to a run: per-type baseline accuracy and discordance, and the shares of
harmful / neutral / helpful candidates by empirical Bayes across gates (docs/worlds.md
states every assumption), with bootstrap intervals over gates.

Each gate contributes the paired outcomes its prefix replay consumed (ranks up to its stop),
the data its stopping rule saw; its likelihood in the candidate's effect does not depend on
that rule. The effect scale of the fit is theta, the log-odds that the candidate wins a
discordant pair; the fitted `World` converts it to the simulator's ability (logit) scale with
``logit_per_theta``, measured on the simulator itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._env import DEFAULT_BOOT, user_path
from ..errors import InputError, is_real, is_whole, shown
from ..harness import (
    Workspace,
    check_outcomes,
    read_outcomes,
    workspace_outcomes,
)
from ..harness._outcomes import replay_checked
from ..stats import BOOT_GROUP, GateParams, as_params, bootstrap_effects, check_n_boot, fit_effects
from ._effects import SHARES, World
from ._sweep import sweep_map
from ._world import SimConfig, SimWorld

if TYPE_CHECKING:
    import polars as pl

GATE = ["epoch", "step", "task_type"]
_PROBE_SHIFT = 0.6


@dataclass(frozen=True)
class TypeFit:
    """One type's figures: its gates' base-arm accuracy and discordance on the consumed
    ladder units (percentile bootstrap over its gates), and its gates' mean posterior class
    probabilities under the shared fit."""

    task_type: str
    n_gates: int
    n_units: int
    base_accuracy: float
    base_accuracy_ci: tuple[float, float]
    discordance: float
    discordance_ci: tuple[float, float]
    p_harmful: float
    p_neutral: float
    p_helpful: float


@dataclass(frozen=True)
class WorldFit:
    """A fitted world: shares with bootstrap intervals, |theta| bounds, the `World`."""

    source: str
    n_gates: int
    p_harmful: float
    p_neutral: float
    p_helpful: float
    intervals: Mapping[str, tuple[float, float]]
    theta_min: float
    theta_max: float
    logit_per_theta: float
    world: World
    types: tuple[TypeFit, ...]
    n_boot: int
    level: float
    seed: int
    free_sizes: bool
    scale: str = field(default="theta: log-odds that the candidate wins a discordant pair")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (``world``: the `World` file's object)."""
        out = asdict(replace(self, world=None))  # type: ignore[arg-type]  # set just below
        out["world"] = self.world.to_dict()
        out["intervals"] = {k: list(v) for k, v in self.intervals.items()}
        return out


def logit_per_theta(config: SimConfig | None = None) -> float:
    """theta per unit of the simulator's ability shift: the mean over its types of
    ``logit(p_win) / shift`` at a shift of 0.6 (about 1.9 at ``unit_correlation`` 0.7)."""
    world = SimWorld(config or SimConfig())
    ratios = []
    for t in world.task_types:
        base = world.initial_skill(t)
        cand = base.replace("ability=+0.000", f"ability={_PROBE_SHIFT:+.3f}")
        p = world.true_effect(t, base, cand).p_win
        ratios.append(math.log(p / (1 - p)) / _PROBE_SHIFT)
    return float(np.mean(ratios))


def _gates(frame: pl.DataFrame, params: GateParams) -> pl.DataFrame:
    """Per gate: W, L, pairs and base-arm successes over the ranks its prefix consumed."""
    import polars as pl

    stops = replay_checked(frame, 8, params).select(  # the block replay is not read
        *GATE, pl.col("prefix_stop_rank").alias("_stop"))
    used = frame.join(stops, on=GATE, how="left", maintain_order="left").filter(
        (pl.col("_stop").is_null() | (pl.col("ladder_rank") <= pl.col("_stop")))
        & ~pl.col("infra"))
    return used.group_by(GATE, maintain_order=True).agg(
        (pl.col("cand_correct") & ~pl.col("base_correct")).sum().alias("W"),
        (pl.col("base_correct") & ~pl.col("cand_correct")).sum().alias("L"),
        pl.len().alias("n"), pl.col("base_correct").sum().alias("base"))


def _ratio_ci(num: np.ndarray, den: np.ndarray, rng: np.random.Generator, n_boot: int,
              level: float) -> tuple[float, float]:
    """Percentile bootstrap over gates of sum(num) / sum(den); resampled `BOOT_GROUP` at a
    time (the same draws as all at once), so memory does not grow with ``n_boot``."""
    parts = []
    for start in range(0, n_boot, BOOT_GROUP):
        idx = rng.integers(0, len(num), (min(BOOT_GROUP, n_boot - start), len(num)))
        parts.append(num[idx].sum(axis=1) / np.maximum(den[idx].sum(axis=1), 1))
    stats = np.concatenate(parts)
    q = (1 - level) / 2
    return float(np.quantile(stats, q)), float(np.quantile(stats, 1 - q))


def _type_rows(gates: pl.DataFrame, post: np.ndarray, rng: np.random.Generator, n_boot: int,
               level: float) -> tuple[TypeFit, ...]:
    rows = []
    types = gates["task_type"].to_list()
    for t in sorted(set(types)):
        mask = np.array([x == t for x in types])
        g = gates.filter(mask)
        n = g["n"].to_numpy().astype(float)
        base = g["base"].to_numpy().astype(float)
        disc = (g["W"] + g["L"]).to_numpy().astype(float)
        p = post[mask].mean(axis=0)
        rows.append(TypeFit(t, g.height, int(n.sum()), float(base.sum() / max(n.sum(), 1)),
                            _ratio_ci(base, n, rng, n_boot, level),
                            float(disc.sum() / max(n.sum(), 1)),
                            _ratio_ci(disc, n, rng, n_boot, level),
                            float(p[0]), float(p[1]), float(p[2])))
    return tuple(rows)


def _frame(source: pl.DataFrame | Workspace | str | Path,
           params: GateParams) -> tuple[pl.DataFrame, str]:
    import polars as pl

    if isinstance(source, pl.DataFrame):
        return check_outcomes(source, params=params), "frame"
    if isinstance(source, Workspace) or user_path(source).is_dir():
        root = source.root if isinstance(source, Workspace) else source
        recorded = workspace_outcomes(source)  # none yet: "nothing measured", said below
        return (check_outcomes(recorded, params=params) if recorded.height else recorded,
                str(root))
    return read_outcomes(source, params=params), str(source)


def _check_fit_args(seed: int, level: float, free_sizes: bool,
                    executor: Executor | None) -> None:
    """`fit_world`'s settings, each refused naming it (``free_sizes="false"`` is truthy)."""
    if not is_whole(seed) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {shown(seed)}")
    if not (is_real(level) and 0 < level < 1):
        raise ValueError(f"level must be a number between 0 and 1 (exclusive), got "
                         f"{shown(level)}")
    if not isinstance(free_sizes, bool):
        raise ValueError(f"free_sizes must be True or False, got {shown(free_sizes)}")
    if executor is not None and not isinstance(executor, Executor):
        raise ValueError(f"executor must be a concurrent.futures Executor (sim.sweep_executor) "
                         f"or None, got {type(executor).__name__}")


def fit_world(source: pl.DataFrame | Workspace | str | Path, *, n_boot: int = DEFAULT_BOOT,
              seed: int = 0, level: float = 0.95, params: GateParams | None = None,
              free_sizes: bool = False, executor: Executor | None = None,
              progress: Callable[[int], None] | None = None) -> WorldFit:
    """Fit the world behind an outcomes table, a file of one, or a workspace's gates; the
    bootstrap's refits run on ``executor`` (`sweep_executor`; None: here), same result.

    Effect sizes are the simulator's default ones (0.3..0.9 logit) unless ``free_sizes``: then
    they are profiled too and replace the reference when a likelihood ratio test rejects it
    (unstable below a few hundred gates: docs/worlds.md). ``n_boot``: 1 to `MAX_BOOT`
    resamples; ``progress(done)`` hears how many are refitted, a group at a time."""
    check_n_boot(n_boot)  # before reading the source: a typo costs nothing
    _check_fit_args(seed, level, free_sizes, executor)
    params = as_params(params)
    frame, name = _frame(source, params)
    gates = _gates(frame, params) if frame.height else frame
    if gates.height == 0:  # the user's source: bad input (exit 2), not a bug
        raise InputError(f"{name}: no gate with a measured pair to fit (every pair of its "
                         f"gates is INFRA, or nothing was gated yet)")
    w, l = gates["W"].to_numpy(), gates["L"].to_numpy()
    if not (w + l).any():  # only ties: every world fits, and the bootstrap cannot tell
        raise InputError(f"{name}: no discordant pair in any gate (every measured pair is a "
                         f"tie), so nothing tells helpful, neutral and harmful candidates "
                         f"apart")
    k = logit_per_theta()
    sizes = World()
    ref = (sizes.size_min * k, sizes.size_max * k)
    bounds = None if free_sizes else ref
    fit = fit_effects(w, l, bounds, ref)
    boot = bootstrap_effects(w, l, n_boot, seed, bounds, ref,
                             lambda fn, items: sweep_map(fn, items, executor), progress)
    q = (1 - level) / 2
    intervals = {s: (round(float(np.quantile(boot[:, i], q)), 4),
                     round(float(np.quantile(boot[:, i], 1 - q)), 4))
                 for i, s in enumerate(SHARES)}
    world = World(p_harmful=fit.p_harmful, p_neutral=fit.p_neutral, p_helpful=fit.p_helpful,
                  size_min=round(fit.theta_min / k, 4), size_max=round(fit.theta_max / k, 4))
    rng = np.random.default_rng(seed + 1)
    return WorldFit(name, gates.height, fit.p_harmful, fit.p_neutral, fit.p_helpful,
                    intervals, fit.theta_min, fit.theta_max, round(k, 4), world,
                    _type_rows(gates, fit.posterior, rng, n_boot, level), n_boot, level, seed,
                    free_sizes)
