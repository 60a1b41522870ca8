"""A disk that fills in the middle of a step: the step stops with one line naming the file
and what to do (exit 2, no traceback), and running the same command again, with room to
write, ends where an uninterrupted step does: the same decisions and training state.

The "full disk" is the kernel's: a file size limit (``RLIMIT_FSIZE``) in the child, so a
write past it fails with EFBIG, as a write to a full disk fails with ENOSPC."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from test_ws_init import cli

from vtrm_gate.sim import SimConfig, init_simulated

CONFIG = SimConfig(seed=3, pool_sizes={"Action Reasoning": 60, "Counting Problem": 60,
                                       "OCR Problems": 40, "Spatial Reasoning": 23})


def _step(ws: Path, fsize: int | None = None):
    return cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "1", fsize=fsize)


def _decisions(ws: Path) -> tuple[list[tuple], list[tuple]]:
    """Each type's decision and the pairs it consumed, in ladder order."""
    con = sqlite3.connect(f"file:{ws / 'harness.sqlite'}?mode=ro", uri=True)
    try:
        return (con.execute("SELECT task_type, status, action, W, L, n_used, e_plus, stop_rank "
                            "FROM step_report ORDER BY task_type").fetchall(),
                con.execute("SELECT task_type, ladder_rank, unit_id, d, W, L, e_plus, action "
                            "FROM gate_evidence ORDER BY task_type, ladder_rank").fetchall())
    finally:
        con.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A fresh workspace, and its twin after one uninterrupted step."""
    root = tmp_path_factory.mktemp("disk")
    init_simulated(root / "ws", CONFIG).close()
    shutil.copytree(root / "ws", root / "twin")
    assert _step(root / "twin").returncode == 0
    return root / "ws", root / "twin"


@pytest.mark.parametrize("fsize", [20_000, 150_000, 300_000])
def test_a_step_that_fills_the_disk_stops_cleanly_and_its_rerun_matches(
        reference: tuple[Path, Path], tmp_path: Path, fsize: int) -> None:
    fresh, twin = reference
    ws = Path(shutil.copytree(fresh, tmp_path / "ws"))
    r = _step(ws, fsize)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith(f"vtrm-gate: error: {ws / 'harness.sqlite'}: disk I/O error"), line
    assert "the disk may be full" in line and "run the same command again" in line, line
    again = _step(ws)
    assert again.returncode == 0, again.stderr
    assert json.loads((ws / "state.json").read_text()) == \
        json.loads((twin / "state.json").read_text())
    decided, pairs = _decisions(ws)
    assert len(decided) == 4 and len(pairs) > 40
    assert (decided, pairs) == _decisions(twin)
