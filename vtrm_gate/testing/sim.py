"""A seeded simulated world for tests: small pools, no sleeping."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ..sim import SimConfig, SimWorld

if TYPE_CHECKING:
    from ..harness import TrainResult

SMALL_POOLS = {"Action Reasoning": 40, "Counting Problem": 9, "OCR Problems": 23}


@pytest.fixture
def sim_world() -> SimWorld:
    """Three types (40, 9 and 23 units), seed 0, no INFRA, zero-time inference."""
    return SimWorld(SimConfig(seed=0, pool_sizes=SMALL_POOLS, infra_rate=0.0, time_scale=0.0))


TRAIN_POOLS = {"Action Reasoning": 60, "Counting Problem": 50, "OCR Problems": 40}
TRAIN_EFFECTS = {"Action Reasoning": "helpful", "Counting Problem": "harmful",
                 "OCR Problems": "helpful"}


def train_small_workspace(path: Path, epochs: int = 3, steps_per_epoch: int = 5, *,
                          seed: int = 5, probation_rule: str = "e_continue",
                          ) -> tuple[Path, TrainResult]:
    """A simulated workspace of three types (60, 50, 40 units, 20% held out) trained for
    ``epochs`` x ``steps_per_epoch`` on the virtual clock (~10 s for 3 x 5); returns its
    path and the `TrainResult`."""
    from ..backends import run_simulated_training
    from ..options import RunOptions

    config = SimConfig(seed=seed, pool_sizes=TRAIN_POOLS, effects=TRAIN_EFFECTS)
    ws, result, _ = run_simulated_training(path, config, epochs, steps_per_epoch,
                                           RunOptions(concurrency=16),
                                           probation_rule=probation_rule)
    ws.close()
    return path, result


@pytest.fixture(scope="session")
def trained_workspace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TrainResult]:
    """One simulated 3-type workspace after a 3 x 5 training run (read it, never write it):
    ``(path, TrainResult)``."""
    return train_small_workspace(tmp_path_factory.mktemp("trained") / "ws")
