"""Kill the process in the middle of Phase C, run the step again: same decisions, no
duplicates, nothing lost (a real subprocess, a real SIGKILL, a real SQLite file)."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from vtrm_gate.gate import UnitResult, UnitTask
from vtrm_gate.harness import Workspace, run_step_sync
from vtrm_gate.options import RunOptions
from vtrm_gate.sim import SimConfig, init_simulated, simulated_backend

CONFIG = SimConfig(
    seed=7,
    pool_sizes={"Action Reasoning": 60, "Counting Problem": 60, "OCR Problems": 40,
                "Spatial Reasoning": 23},
    effects={"Action Reasoning": "helpful", "Counting Problem": "harmful",
             "OCR Problems": "neutral", "Spatial Reasoning": "helpful"},
    infra_rate=0.01, no_change_rate=0.0,
    time_scale=0.004,  # ~0.5 s per call on real time: Phase C takes several seconds
)

CHILD = textwrap.dedent("""
    import sys
    from vtrm_gate.harness import run_step_sync
    from vtrm_gate.options import RunOptions
    from vtrm_gate.sim import simulated_backend
    be = simulated_backend(sys.argv[1])
    run_step_sync(sys.argv[1], 1, 1, infer=be.infer, evolver=be.evolver,
                  options=RunOptions(concurrency=8))
    print("finished")
""")


def _rows(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return con.execute(sql).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        con.close()


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_killed_in_phase_c_then_rerun_matches_an_uninterrupted_run(tmp_path):
    ws = init_simulated(tmp_path / "ws", CONFIG)
    root = ws.root
    ws.close()
    twin = shutil.copytree(root, tmp_path / "twin")
    state0 = (root / "state.json").read_bytes()

    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=Path(__file__).resolve().parents[2])
    db = root / "harness.sqlite"
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:  # wait until Phase C has persisted some work
            n = _rows(db, "SELECT COUNT(*) FROM predictions")
            if n and n[0][0] >= 24:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        else:
            pytest.fail("the child never reached Phase C")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL, "the step finished before it was killed"

    # Killed mid-Phase C: the manifest exists, training state does not move.
    assert (root / "manifests/e1_s1.json").is_file()
    assert (root / "state.json").read_bytes() == state0
    killed_cache = set(_rows(db, "SELECT task_type, unit_id, skill_hash FROM baseline_cache"))
    killed_preds = _rows(db, "SELECT COUNT(*) FROM predictions")[0][0]
    assert killed_cache and killed_preds >= 24
    assert not _rows(db, "SELECT * FROM step_report WHERE applied IS NOT NULL")
    spent = _rows(db, "SELECT COUNT(*), SUM(cached = 0), SUM(tokens), SUM(latency_s) FROM "
                      "predictions")[0]

    fast = simulated_backend(root, time_scale=0.0)  # latency only: outcomes are unchanged
    base_calls: list[UnitTask] = []

    async def infer(task: UnitTask) -> UnitResult:
        if task.arm == "base":
            base_calls.append(task)
        return await fast.infer(task)

    again = run_step_sync(root, 1, 1, infer=infer, evolver=fast.evolver,
                          options=RunOptions(concurrency=8))
    ref_be = simulated_backend(twin, time_scale=0.0)
    reference = run_step_sync(twin, 1, 1, infer=ref_be.infer, evolver=ref_be.evolver,
                              options=RunOptions(concurrency=8))

    assert again.reused_candidates  # the killed run's manifest candidates were replayed
    assert again.decisions == reference.decisions
    for t, o in reference.gate.outcomes.items():
        assert again.gate.outcomes[t].same_decision(o), t
    a, b = Workspace.open(root), Workspace.open(twin)
    # what the killed process spent is kept (it never finished: no time recorded)
    assert a.log.frame("replaced_runs").rows() == [(1, 1, 1, *spent, None)]
    assert b.log.frame("replaced_runs").height == 0
    assert a.log.step_frame("gate_evidence", 1, 1).equals(b.log.step_frame("gate_evidence", 1, 1))
    cols = ("task_type", "status", "action", "W", "L", "n_used", "stop_rank", "applied")
    assert a.log.step_frame("step_report", 1, 1).select(cols).equals(
        b.log.step_frame("step_report", 1, 1).select(cols))
    assert (root / "state.json").read_bytes() == (twin / "state.json").read_bytes()
    assert a.log.query("SELECT run_id, unit_id, COUNT(*) c FROM predictions "
                       "GROUP BY run_id, unit_id HAVING c > 1") == []
    # Nothing lost: every base measurement the killed run made is reused, not re-run.
    rerun = {(t.task_type, t.unit_id, t.skill_hash) for t in base_calls}
    assert not rerun & killed_cache
    assert again.gate.total("cache_hits") >= 1
    assert killed_cache <= set(a.log.query(
        "SELECT task_type, unit_id, skill_hash FROM baseline_cache"))
