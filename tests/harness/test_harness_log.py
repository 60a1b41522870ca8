"""HarnessLog: one SQLite file (WAL), unique keys + upserts, the literal-prefix clear_step."""

from __future__ import annotations

import asyncio
import sqlite3

import polars as pl
import pytest

from vtrm_gate.gate import PrefixAdvanced, UnitResult, UnitTask
from vtrm_gate.harness import TABLES, GateSink, HarnessLog
from vtrm_gate.stats import Action


def _task(run_id: str, unit: str = "u1", arm: str = "base") -> UnitTask:
    return UnitTask("Counting Problem", unit, arm, 0, run_id, "skill", "h" * 64)  # type: ignore[arg-type]


def _ev(rank: int, action: Action = Action.CONTINUE) -> PrefixAdvanced:
    return PrefixAdvanced(0.0, "Counting Problem", f"u{rank}", rank, UnitResult(correct=False),
                          UnitResult(correct=True), 1, 1, 0, 1, 1.5, 0.5, 3, action)


def test_log_is_one_wal_sqlite_file_with_every_table(tmp_path):
    log = HarnessLog(tmp_path / "h.sqlite")
    mode = log.query("PRAGMA journal_mode")[0][0]
    names = {r[0] for r in log.query("SELECT name FROM sqlite_master WHERE type='table'")}
    assert mode == "wal"
    assert set(TABLES) <= names
    assert {"predictions", "traces", "gate_evidence", "quadrant_pairs", "step_report",
            "candidate_correctness", "baseline_cache"} <= set(TABLES)


def test_a_late_result_never_lands_twice(tmp_path):
    log = HarnessLog(tmp_path / "h.sqlite")
    task = _task("e1_s1_gate_counting-problem_base")
    log.write_result(1, 1, task, UnitResult(correct=False, tokens=5), discarded=False)
    log.write_result(1, 1, task, UnitResult(correct=True, tokens=7), discarded=True)
    log.write_consumed(1, 1, _ev(0))
    log.write_consumed(1, 1, _ev(0))
    assert log.count("predictions") == 1 and log.count("traces") == 1
    assert log.count("gate_evidence") == 1 and log.count("quadrant_pairs") == 1
    row = log.frame("predictions").row(0, named=True)
    assert row["correct"] == 1 and row["discarded"] == 1 and row["tokens"] == 7


def test_clear_step_prefix_is_literal_not_a_like_pattern(tmp_path):
    log = HarnessLog(tmp_path / "h.sqlite")
    ids = ["e1_s1_gate_a_base", "e1_s1_gate_a_cand",          # the step's own rows
           "e1xs1_gate_a_base", "e1_s1xgate_a_base",           # '_' as a wildcard would match
           "e1_s10_gate_a_base", "e1_s1_rollout_a",            # longer id / other prefix
           "e1%s1_gate_a_base", "E1_S1_GATE_A_BASE"]           # '%' and case-insensitive LIKE
    for rid in ids:
        log.write_result(1, 1, _task(rid), UnitResult(correct=True), discarded=False)
    log.write_consumed(1, 1, _ev(0))
    log.write_consumed(1, 10, _ev(0))
    log.write_report(1, 1, "Counting Problem", "skipped")
    log.write_report(1, 10, "Counting Problem", "skipped")
    deleted = log.clear_step(1, 1, "e1_s1")
    left = set(log.frame("predictions")["run_id"].to_list())
    assert left == set(ids[2:])
    assert set(log.frame("traces")["run_id"].to_list()) == set(ids[2:])
    assert deleted["predictions"] == 2 and deleted["traces"] == 2
    assert log.frame("gate_evidence")["step"].to_list() == [10]
    assert log.frame("step_report")["step"].to_list() == [10]
    # A step id that itself holds '%' and '_' is matched literally too.
    log.write_result(2, 1, _task("e%_s_gate_x_base"), UnitResult(), discarded=False)
    log.clear_step(2, 1, "e%_s")
    assert set(log.frame("predictions")["run_id"].to_list()) == set(ids[2:])


def test_clear_step_is_one_transaction(tmp_path, monkeypatch):
    log = HarnessLog(tmp_path / "h.sqlite")
    log.write_result(1, 1, _task("e1_s1_gate_a_base"), UnitResult(), discarded=False)
    log.write_consumed(1, 1, _ev(0))
    import vtrm_gate.harness._log as logmod

    monkeypatch.setattr(logmod, "STEP_TABLES", ("gate_evidence", "no_such_table"))
    with pytest.raises(sqlite3.OperationalError):
        log.clear_step(1, 1, "e1_s1")
    assert log.count("predictions") == 1 and log.count("gate_evidence") == 1


def test_frames_are_typed_even_when_empty(tmp_path):
    log = HarnessLog(tmp_path / "h.sqlite")
    df = log.frame("gate_evidence")
    assert df.height == 0
    assert df.schema["e_plus"] == pl.Float64 and df.schema["ladder_rank"] == pl.Int64
    with pytest.raises(ValueError, match="unknown table"):
        log.frame("nope")


def test_gate_sink_writes_results_units_and_decisions(tmp_path):
    log = HarnessLog(tmp_path / "h.sqlite")
    sink = GateSink(log, 1, 2, {"Counting Problem": {"base_version": 3}})

    async def go():
        await sink.on_result(_task("e1_s2_gate_counting-problem_cand", arm="cand"),
                             UnitResult(correct=True, trace={"steps": 4}), counted=False)
        await sink.on_consumed(_ev(0, Action.ACCEPT))
        from vtrm_gate.stats import replay_prefix

        await sink.on_decided("Counting Problem", replay_prefix([(False, True)] * 8))

    asyncio.run(go())
    pred = log.frame("predictions").row(0, named=True)
    assert pred["discarded"] == 1 and pred["epoch"] == 1 and pred["step"] == 2
    assert log.frame("traces")["trace"].to_list() == ['{"steps": 4}']
    assert log.frame("candidate_correctness")["correct"].to_list() == [1]
    q = log.frame("quadrant_pairs").row(0, named=True)
    assert q["quadrant"] == "cand_only"
    rep = log.frame("step_report").row(0, named=True)
    assert rep["action"] == "ACCEPT" and rep["base_version"] == 3 and rep["status"] == "gated"


def test_text_holding_a_lone_surrogate_is_stored_with_a_replacement_character(tmp_path):
    """Hostile pass: a server's error message escaping a lone surrogate became a result's
    error text, and writing it stopped the step (UnicodeEncodeError in SQLite); so would a
    researcher's own infer returning one. Stored with U+FFFD in its place (a trace is JSON,
    which escapes it); the other rows of the write land too."""
    log = HarnessLog(tmp_path / "h.sqlite")
    first, second = _task("e1_s1_gate_counting-problem_base"), _task(
        "e1_s1_gate_counting-problem_base", unit="u2")
    log.write_result(1, 1, first, UnitResult(infra=True, correct=None, error="bad \ud800 req",
                                             trace={"said": "x\udfff"}), discarded=False)
    log.write_result(1, 1, second, UnitResult(correct=True, prediction="B"), discarded=False)
    preds = log.frame("predictions").sort("unit_id")
    assert preds["error"].to_list() == ["bad \ufffd req", None]
    assert log.frame("traces")["trace"].to_list()[0] == '{"said": "x\\udfff"}'  # JSON: escaped
