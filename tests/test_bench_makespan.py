"""Smoke test of the dispatch-policy benchmark (issues 10, 17) on one seed: the numbers it
reports obey the bounds they claim; timings are for `make bench`, never asserted here."""

from __future__ import annotations

from benchmarks.bench_makespan import WORLDS, compare_policies, summarise


def test_policy_benchmark_reports_consistent_ratios_on_one_seed():
    rows = compare_policies(WORLDS["12x32"], [0])
    assert set(rows) == {"clairvoyant", "clairvoyant_rr", "round_robin+wait", "round_robin",
                         "round_robin+cancel", "need_aware+wait", "need_aware",
                         "need_aware+cancel", "expected_need", "expected_need+cancel"}
    for name, (r,) in rows.items():
        assert r["same_decisions"], name  # the order never changes a decision
        assert r["vs_bound"] >= 1.0, name  # makespan * slots >= busy time >= needed work
        if name.endswith("+wait") or name.startswith("clairvoyant"):
            assert r["cancelled"] == 0, name
        assert r["cancelled"] <= r["calls_past_stop"]
    # not waiting for calls past every stop never makes a step longer
    for d in ("round_robin", "need_aware"):
        assert rows[d][0]["makespan_h"] <= rows[f"{d}+wait"][0]["makespan_h"]
    ref = rows["clairvoyant"][0]
    assert ref["vs_clairvoyant"] == 1.0
    assert ref["calls_past_stop"] == 0 and abs(ref["wasted_share"]) < 1e-6  # float clock sums
    assert rows["round_robin"][0]["calls_past_stop"] > 0
    summary = {s["policy"]: s for s in summarise(rows)}
    assert "expected_need+cancel (default)" in summary
    assert summary["round_robin"]["bound med"] == rows["round_robin"][0]["vs_bound"]
    # need_aware's starvation bound: max_wait + K - 1 with max_wait = 2K, K = 12 types
    assert summary["need_aware"]["max wait"] <= 3 * 12 - 1
