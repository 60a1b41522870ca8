"""Issue 27 row 17: every benchmark answers ``--help`` with its usage and does not start
(``bench_core``, ``bench_oc``, ``bench_cache`` and ``bench_adaptive`` ran instead)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = ["benchmarks", *sorted(f"benchmarks.{p.stem}"
                                 for p in (ROOT / "benchmarks").glob("bench_*.py"))]


def test_every_benchmark_module_is_listed() -> None:
    assert len(MODULES) >= 13 and "benchmarks.bench_cache" in MODULES


@pytest.mark.parametrize("module", MODULES)
def test_help_prints_the_usage_and_starts_nothing(module: str) -> None:
    r = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: ") and "--quick" in r.stdout, r.stdout
    assert "machine:" not in r.stdout and "===" not in r.stdout  # what a run prints first
    assert r.stderr == ""
