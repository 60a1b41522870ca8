"""Outcomes tables: a simulated workspace's outcomes written in the schema and read back give
the decisions the live gate recorded; a complete table replays exactly as `replay_prefix` /
`replay_blocks` of its rows in ladder order, whatever the rows' order in the file."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from vtrm_gate.cli._main import main
from vtrm_gate.harness import (
    OutcomesError,
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


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_column_of_objects_or_lists_is_refused_naming_it(tmp_path: Path, fmt: str) -> None:
    """``"task_type": {"a": 1}`` became the gate type ``"{1}"``, and a parquet struct column
    ``{"Action Reasoning"}``, without a word."""
    rows = [{"epoch": 1, "step": 2, "task_type": {"a": 1}, "unit_id": u, "ladder_rank": i,
             "base_correct": False, "cand_correct": True, "infra": False}
            for i, u in enumerate("ab")]
    path = tmp_path / f"o.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    else:
        pl.DataFrame(rows).write_parquet(path)
    with pytest.raises(OutcomesError, match="column 'task_type' holds"):
        read_outcomes(path)


@pytest.mark.parametrize("block", [1, 8])
def test_a_frame_replays_as_its_file_does_whatever_its_row_order(tmp_path: Path,
                                                                  block: int) -> None:
    """A notebook's frame (rows shuffled, as `_random_table` leaves them) was replayed in row
    order, not ladder order: a reversed 40-unit gate accepted at unit 28, not 8."""
    table, _ = _random_table(block + 10)
    path = tmp_path / "o.csv"
    table.write_csv(path)
    want = replay_outcomes(read_outcomes(path), block=block)
    assert replay_outcomes(table, block=block).equals(want)
    assert replay_outcomes(table.reverse(), block=block).equals(want)
    text = table.with_columns(pl.col(c).cast(pl.String).replace({"1": "True", "0": "False"})
                              for c in ("base_correct", "cand_correct", "infra"))
    assert replay_outcomes(text, block=block).equals(want)  # read as a file reads them


def _gate(n: int = 4, **cols: list) -> pl.DataFrame:
    return pl.DataFrame({"epoch": [1] * n, "step": [1] * n, "task_type": ["OCR"] * n,
                         "unit_id": [f"u{i}" for i in range(n)], "ladder_rank": list(range(n)),
                         "base_correct": [False] * n, "cand_correct": [True] * n,
                         "infra": [False] * n} | cols, strict=False)


@pytest.mark.parametrize(("frame", "message"), [
    (_gate(ladder_rank=[1, 2, 3, 4]), "row 1, column 'ladder_rank': its gate has no rank 0"),
    (_gate(ladder_rank=[0, 1, 1, 2]), "row 3, column 'ladder_rank': duplicate rank"),
    (_gate(cand_correct=[1.0, 0.7, 1.0, 1.0]), "row 2, column 'cand_correct': must be 0/1"),
    (_gate(base_correct=[False, None, False, False]), "row 2, column 'base_correct'"),
    (_gate().drop("infra"), "missing column 'infra'"),
    (_gate(unit_id=["a", "b", "a", "c"]), "row 3, column 'unit_id': unit twice"),
    (_gate(n_ladder=[40, 40, 39, 40]), "row 3, column 'n_ladder': differs from most rows of "
                                       "its gate"),
    (_gate(n_ladder=[40, 40, 40, None]), "row 4, column 'n_ladder': differs from most"),
    (_gate(n_ladder=[None, 40, 40, 40]), "row 1, column 'n_ladder': differs from most"),
    (_gate(n_ladder=[40, 40, 40, 41], ladder_rank=[1, 2, 3, 0]),  # rank 0 is the odd one
     "row 4, column 'n_ladder': differs from most .* got 41"),
])
def test_a_bad_frame_is_refused_naming_its_row_and_column(
        tmp_path: Path, frame: pl.DataFrame, message: str) -> None:
    from vtrm_gate.harness import OutcomesError
    from vtrm_gate.sim import fit_world

    out = tmp_path / "o.csv"
    out.write_text("kept\n")
    for call in (lambda: replay_outcomes(frame), lambda: fit_world(frame, n_boot=10),
                 lambda: write_outcomes(frame, out)):
        with pytest.raises(OutcomesError, match=message) as info:
            call()
        assert str(info.value).startswith("outcomes frame (rows from 1): ")
    assert out.read_text() == "kept\n"  # nothing written over a good file


def test_fit_of_a_shuffled_frame_is_the_fit_of_its_file(tmp_path: Path) -> None:
    from vtrm_gate.sim import fit_world

    table, _ = _random_table(7, gates=48)
    path = tmp_path / "o.parquet"
    table.write_parquet(path)
    a, b = fit_world(table, n_boot=20), fit_world(path, n_boot=20)
    assert (a.p_harmful, a.p_neutral, a.p_helpful, a.n_gates) == (
        b.p_harmful, b.p_neutral, b.p_helpful, b.n_gates)


def test_fit_checks_its_table_once_whatever_the_source(
        tmp_path: Path, trained: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file, a frame and a workspace are each checked once (a 2,000,000-row table's check
    is seconds: the fit's replay had checked the table it was handed again)."""
    import vtrm_gate.harness._outcomes as outcomes
    from vtrm_gate.sim import fit_world

    table, _ = _random_table(7, gates=48)
    path = tmp_path / "o.parquet"
    table.write_parquet(path)
    calls: list[str] = []
    real = outcomes._check_gates

    def counted(*args: Any, **kw: Any) -> pl.DataFrame:
        calls.append("check")
        return real(*args, **kw)

    monkeypatch.setattr(outcomes, "_check_gates", counted)
    for source in (table, path, trained):
        calls.clear()
        fit_world(source, n_boot=5)
        assert calls == ["check"], source


def test_many_gates_replay_field_for_field_as_the_scalar_replays() -> None:
    """The batched replay (one batch per ladder length) equals `replay_prefix` /
    `replay_blocks` gate by gate in every column: action, stop, W, L, units used, E+, units
    and tokens spent, INFRA units included; gates with unrun units still say UNKNOWN."""
    rng = random.Random(5)
    rows, truth = [], {}
    for g in range(900):
        key = (1 + g // 90, 1 + g // 9 % 10, f"T{g % 9}")
        n = rng.choice((1, 2, 7, 8, 9, 16, 40))
        p_win = rng.choice((0.1, 0.5, 0.9))
        pairs, tokens = [], []
        for rank in range(n):
            r = rng.random()
            p = (None if r < 0.04 else ((False, True) if rng.random() < p_win else (True, False))
                 if r < 0.4 else (r < 0.7, r < 0.7))
            pairs.append(p)
            tokens.append(rng.randint(0, 900))
            rows.append({"epoch": key[0], "step": key[1], "task_type": key[2],
                         "unit_id": f"u{rank}", "ladder_rank": rank,
                         "base_correct": None if p is None else p[0],
                         "cand_correct": None if p is None else p[1],
                         "infra": p is None, "tokens": tokens[-1]})
        truth[key] = pairs, tokens
    table = pl.DataFrame(rows)
    got = replay_outcomes(table, block=8)
    assert got.height == 900 and got["block_unrun_needed"].sum() == 0
    for r in got.iter_rows(named=True):
        pairs, tokens = truth[(r["epoch"], r["step"], r["task_type"])]
        for name, o in (("prefix", replay_prefix(pairs)), ("block", replay_blocks(pairs))):
            units = 0 if o.stop_rank is None else o.stop_rank + 1
            assert (r[f"{name}_action"], r[f"{name}_stop_rank"], r[f"{name}_W"],
                    r[f"{name}_L"], r[f"{name}_n_used"], r[f"{name}_e_plus"],
                    r[f"{name}_units"], r[f"{name}_tokens"]) == (
                str(o.action), o.stop_rank, o.W, o.L, o.n_used, o.e_plus, units,
                sum(tokens[:units]))
        assert r["units_saved"] == r["block_units"] - r["prefix_units"]
    # the same gates, each cut to its first half of a ladder twice as long: unrun units
    cut = (table.with_columns(pl.len().over("epoch", "step", "task_type").alias("n"))
           .filter(pl.col("ladder_rank") < (pl.col("n") + 1) // 2)
           .with_columns(pl.col("n").alias("n_ladder")).drop("n"))
    part = replay_outcomes(cut, block=8)
    assert part.height == 900 and (part["n_rows"] < part["n_ladder"]).sum() > 700
    unknown = part.filter(pl.col("prefix_action").str.starts_with("UNKNOWN"))
    assert unknown.height > 0 and unknown["prefix_units"].null_count() == unknown.height


def test_a_workspace_with_nothing_gated_writes_no_empty_table_over_a_file(
        tmp_path: Path) -> None:
    """`write_outcomes(workspace, path)` before any step replaced the file at ``path`` with
    a header, which no reader takes ("no rows")."""
    from vtrm_gate.harness import OutcomesError

    root = tmp_path / "fresh"
    init_simulated(root, SimConfig(seed=1, pool_sizes=POOLS)).close()
    out = tmp_path / "keep.csv"
    out.write_text("kept\n")
    with pytest.raises(OutcomesError, match=r"fresh: no gated step to write \(nothing was gated "
                                            r"yet\); keep\.csv is left as it was"):
        write_outcomes(root, out)
    assert out.read_text() == "kept\n"
    assert not list(tmp_path.glob(".keep.csv*"))


@pytest.mark.parametrize("block", [0, -1, True, 2.0, "8"])
def test_a_block_size_that_is_not_one_is_refused_before_anything_is_read(
        trained: Path, block: object) -> None:
    """``replay_step(ws, 1, 1, block=0)`` was "ZeroDivisionError: integer modulo by zero"
    where a block needed an unrun unit; ``True`` replayed blocks of one."""
    for call in (lambda: replay_step(trained, 1, 1, block=block),
                 lambda: replay_outcomes(Path("/nonexistent.csv"), block=block)):
        with pytest.raises(ValueError, match=f"block must be an integer >= 1, got {block!r}"):
            call()
