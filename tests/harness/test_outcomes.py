"""Outcomes tables: a simulated workspace's outcomes written in the schema and read back give
the decisions the live gate recorded; a complete table replays exactly as `replay_prefix` /
`replay_blocks` of its rows in ladder order, whatever the rows' order in the file."""

from __future__ import annotations

import random
from pathlib import Path

import polars as pl
import pytest

from vtrm_gate.cli._main import main
from vtrm_gate.harness import (
    Workspace,
    read_outcomes,
    replay_outcomes,
    replay_step,
    workspace_outcomes,
    write_outcomes,
)
from vtrm_gate.sim import SimConfig, init_simulated
from vtrm_gate.stats import GateParams, replay_blocks, replay_prefix

POOLS = {"Action Reasoning": 90, "Counting Problem": 70, "OCR Problems": 60,
         "Spatial Reasoning": 23}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 x 3 steps of a 4-type per-candidate world with INFRA (seed 1: 12 gates, 6 INFRA
    units, blocks that would need unrun units)."""
    root = tmp_path_factory.mktemp("outcomes") / "ws"
    init_simulated(root, SimConfig(seed=1, pool_sizes=POOLS, infra_rate=0.01,
                                   world="mostly_neutral"), heldout_fraction=0.2).close()
    assert main(["train", "--workspace", str(root), "--epochs", "2", "--steps-per-epoch",
                 "3", "--no-eval", "--json"]) == 0
    return root


@pytest.mark.parametrize("ext", ["csv", "parquet", "jsonl"])
def test_a_workspaces_outcomes_round_trip_to_the_recorded_decisions(
        trained: Path, tmp_path: Path, ext: str) -> None:
    frame = workspace_outcomes(trained)
    path = write_outcomes(trained, tmp_path / f"outcomes.{ext}")
    back = read_outcomes(path)
    assert back.select(frame.columns).equals(frame)
    assert frame["infra"].sum() >= 1 and frame.filter("infra")["base_correct"].null_count() \
        == frame["infra"].sum()
    replayed = replay_outcomes(path)
    ws = Workspace.open(trained, readonly=True)
    try:
        live = {(e, s, t): (a, r) for e, s, t, a, r in ws.log.select(
            "step_report", ["epoch", "step", "task_type", "action", "stop_rank"],
            status="gated")}
    finally:
        ws.close()
    got = {(r["epoch"], r["step"], r["task_type"]): (r["prefix_action"], r["prefix_stop_rank"])
           for r in replayed.to_dicts()}
    assert got == live and len(got) == 12
    cols = [c for c in replayed.columns if c.startswith(("prefix_", "block_"))]
    for (e, s), rows in replayed.group_by(["epoch", "step"], maintain_order=True):
        want = replay_step(trained, int(e), int(s)).sort("task_type")  # type: ignore[call-overload]
        assert rows.sort("task_type").select(cols).equals(want.select(cols))
    assert (replayed["block_unrun_needed"] > 0).sum() >= 1  # UNKNOWN, never invented


def _random_table(seed: int, gates: int = 30) -> tuple[pl.DataFrame, dict]:
    rng = random.Random(seed)
    rows, truth = [], {}
    for g in range(gates):
        key = (1 + g // 12, 1 + g % 4, f"Type {g % 12}")
        if key in truth:
            continue
        n = rng.randint(1, 40)
        p_win = rng.choice((0.2, 0.5, 0.85))
        pairs = []
        for rank in range(n):
            if rng.random() < 0.05:
                pairs.append(None)
            elif rng.random() < 0.3:
                pairs.append((False, True) if rng.random() < p_win else (True, False))
            else:
                same = rng.random() < 0.5
                pairs.append((same, same))
            p = pairs[-1]
            rows.append({"epoch": key[0], "step": key[1], "task_type": key[2],
                         "unit_id": f"u{rank}", "ladder_rank": rank,
                         "base_correct": None if p is None else int(p[0]),
                         "cand_correct": None if p is None else int(p[1]),
                         "infra": int(p is None)})
        truth[key] = pairs
    rng.shuffle(rows)
    return pl.DataFrame(rows), truth


@pytest.mark.parametrize("block", [1, 5, 8])
def test_a_complete_table_replays_exactly_as_replay_prefix_and_replay_blocks(
        tmp_path: Path, block: int) -> None:
    table, truth = _random_table(block)
    path = tmp_path / "o.csv"
    table.write_csv(path)
    rows = replay_outcomes(read_outcomes(path), block=block).to_dicts()
    assert len(rows) == len(truth)
    for r in rows:
        pairs = truth[(r["epoch"], r["step"], r["task_type"])]
        p, b = replay_prefix(pairs, GateParams()), replay_blocks(pairs, GateParams(), block)
        assert (r["prefix_action"], r["prefix_stop_rank"], r["prefix_W"], r["prefix_L"]) == (
            str(p.action), p.stop_rank, p.W, p.L)
        assert (r["block_action"], r["block_stop_rank"], r["block_W"], r["block_L"]) == (
            str(b.action), b.stop_rank, b.W, b.L)
        assert r["units_saved"] == (b.stop_rank or 0) - (p.stop_rank or 0)


def test_outcomes_accept_true_false_and_empty_infra_outcomes(tmp_path: Path) -> None:
    path = tmp_path / "o.jsonl"
    path.write_text(
        '{"epoch": 1, "step": 2, "task_type": "OCR", "unit_id": "a", "ladder_rank": 0, '
        '"base_correct": false, "cand_correct": true, "infra": false, "latency_s": 3.5}\n'
        '{"epoch": 1, "step": 2, "task_type": "OCR", "unit_id": "b", "ladder_rank": 1, '
        '"base_correct": null, "cand_correct": null, "infra": true, "latency_s": null}\n')
    df = read_outcomes(path)
    assert df["base_correct"].to_list() == [False, None]
    assert df["infra"].to_list() == [False, True] and df["latency_s"][0] == 3.5
    r = replay_outcomes(df).row(0, named=True)
    assert (r["prefix_W"], r["prefix_L"], r["prefix_action"]) == (1, 0, "INERTIA")
