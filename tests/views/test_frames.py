"""polars conversions: decision table, trajectories, counters, events, OC grid, replays."""

from __future__ import annotations

import asyncio

import polars as pl
import pytest

from vtrm_gate import GateParams, operating_characteristics, replay_prefix, run_gate
from vtrm_gate.testing import OutcomeTable
from vtrm_gate.views import (
    compare_replays,
    counters_frame,
    events_frame,
    oc_grid,
    outcomes_frame,
    trajectory_frame,
)

WIN, LOSS, TIE = (False, True), (True, False), (True, True)

KNOWN = {
    "b-accept": [WIN] * 8 + [TIE] * 4,
    "a-futile": [LOSS, None, TIE, WIN],
    "c-empty": [],
}


def test_outcomes_frame_is_the_decision_table_sorted_by_type():
    df = outcomes_frame({t: replay_prefix(o) for t, o in KNOWN.items()})
    assert df.columns == ["task_type", "action", "W", "L", "n_used", "e_plus", "e_minus",
                          "stop_rank", "n_consumed", "n_ladder"]
    assert df["task_type"].to_list() == ["a-futile", "b-accept", "c-empty"]
    assert df["action"].to_list() == ["FUTILE", "ACCEPT", "INERTIA"]
    acc = df.row(1, named=True)
    assert (acc["W"], acc["L"], acc["n_used"], acc["stop_rank"], acc["n_consumed"],
            acc["n_ladder"]) == (8, 0, 8, 7, 8, 12)
    assert acc["e_plus"] == pytest.approx(1.5**8)
    assert df.row(2, named=True)["stop_rank"] is None


def test_empty_outcomes_still_have_the_schema():
    assert outcomes_frame({}).columns == outcomes_frame(
        {"x": replay_prefix([WIN])}).columns
    assert outcomes_frame({}).height == 0


def test_trajectory_frame_has_one_row_per_consumed_unit():
    outcomes = {t: replay_prefix(o) for t, o in KNOWN.items()}
    df = trajectory_frame(outcomes)
    assert df.height == sum(o.n_consumed for o in outcomes.values())
    acc = df.filter(pl.col("task_type") == "b-accept")
    assert acc["step"].to_list() == list(range(1, 9))
    assert acc["e_plus"].to_list() == pytest.approx([1.5**k for k in range(1, 9)])
    assert acc["action"][-1] == "ACCEPT" and set(acc["action"][:-1]) == {"CONTINUE"}


def test_trajectory_frame_marks_infra_with_null_d():
    df = trajectory_frame({"a": replay_prefix([WIN, None, WIN, WIN, WIN, WIN])})
    assert df["d"].to_list()[:3] == [1, None, 1]
    assert df["n_used"].to_list()[:3] == [1, 1, 2]


def test_compare_replays_shows_the_prefix_stopping_inside_a_block():
    sets = {"early": [WIN] * 8 + [LOSS] * 8, "late": [LOSS] * 16}
    df = compare_replays(sets, GateParams(), block=8)
    early = df.row(0, named=True)
    assert early["prefix_action"] == early["block_action"] == "ACCEPT"
    assert early["prefix_units"] == 8 and early["block_units"] == 8 and early["agree"]
    late = df.row(1, named=True)
    assert late["prefix_action"] == "FUTILE" and late["prefix_units"] < late["block_units"]
    assert late["units_saved"] == late["block_units"] - late["prefix_units"]


def test_compare_replays_flags_disagreement():
    # prefix stops FUTILE after the first loss of a 4-unit ladder; the block replay runs on
    df = compare_replays({"a": KNOWN["a-futile"]}, GateParams(), block=8)
    assert df["prefix_action"][0] == "FUTILE" and df["block_action"][0] == "INERTIA"
    assert df["agree"].to_list() == [False]


def test_oc_grid_matches_operating_characteristics():
    p = GateParams()
    df = oc_grid(p, [0.5, 0.8], [0.3, 0.5], [20, 40])
    assert df.height == 8
    row = df.filter((pl.col("p_win") == 0.8) & (pl.col("discordance") == 0.5)
                    & (pl.col("n_units") == 40)).row(0, named=True)
    oc = operating_characteristics(p, 0.8, 0.5, 40)
    assert row["p_accept"] == oc.p_accept and row["expected_units"] == oc.expected_units
    sums = df.select(pl.sum_horizontal("p_accept", "p_provisional", "p_inertia", "p_futile",
                                       "p_reject"))
    assert sums.to_series().to_list() == pytest.approx([1.0] * 8)


@pytest.fixture(scope="module")
def gate_run():
    events: list = []
    table = OutcomeTable({t: o for t, o in KNOWN.items()},
                         latency=lambda task, res: 0.002 if res.correct else 0.005)
    result = asyncio.run(run_gate(table.plans(), table, GateParams(), concurrency=4,
                                  subscribers=[events.append]))
    return result, events


def test_counters_frame_accounts_for_every_call(gate_run):
    result, _ = gate_run
    df = counters_frame(result)
    assert df["task_type"].to_list() == sorted(KNOWN)
    for r in df.iter_rows(named=True):
        c = result.counters[r["task_type"]]
        assert r["started"] == c.started and r["tokens"] == c.tokens
        assert r["counted"] + r["discarded_after_freeze"] == r["completed"]
        assert r["action"] == str(result.outcomes[r["task_type"]].action)


def test_events_frame_has_one_row_per_event_in_order(gate_run):
    result, events = gate_run
    df = events_frame(events)
    assert df.height == len(events) and df["seq"].to_list() == list(range(len(events)))
    kinds = df["kind"].value_counts()
    count = dict(zip(kinds["kind"].to_list(), kinds["count"].to_list(), strict=True))
    assert count["GateStarted"] == 1 and count["GateFinished"] == 1
    assert count["TypeDecided"] == len(KNOWN)
    assert count["PrefixAdvanced"] == sum(o.n_consumed for o in result.outcomes.values())
    assert df["kind"][0] == "GateStarted" and df["kind"][-1] == "GateFinished"
