"""A seeded simulated world for tests: small pools, no sleeping."""

from __future__ import annotations

import pytest

from ..sim import SimConfig, SimWorld

SMALL_POOLS = {"Action Reasoning": 40, "Counting Problem": 9, "OCR Problems": 23}


@pytest.fixture
def sim_world() -> SimWorld:
    """Three types (40, 9 and 23 units), seed 0, no INFRA, zero-time inference."""
    return SimWorld(SimConfig(seed=0, pool_sizes=SMALL_POOLS, infra_rate=0.0, time_scale=0.0))
