"""bench_power's honest baselines (issue 25, item 4): the four rows of a world, their
seed-paired differences, the crossover where a gate starts beating no gate, and bad worlds.
The training runs themselves are exercised by tests/sim/test_sweep.py (tiny runs)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks.bench_power import (
    BASELINES,
    DEFAULT,
    FUTILE_FREE,
    FUTILE_FREE_LONGER,
    HARMFUL_SHARES,
    LEVERS,
    LONGER,
    OLD,
    PRESET_WORLDS,
    RANK_LABELS,
    RANKED,
    Config,
    baseline_rows,
    crossover,
    crossover_interval,
    fitted_world,
    harmful_world,
    rank_agreement,
    rank_means,
    read_worlds,
    run,
    summarise,
)
from vtrm_gate.errors import ConfigError
from vtrm_gate.sim import PRESETS, World

ROOT = Path(__file__).resolve().parents[1]


def _row(cfg, seed, acc, no_gate, oracle):
    return {"config": cfg.name, "seed": seed, "accuracy": acc, "no_gate": no_gate,
            "oracle": oracle, "better_applied": 2, "leak": 1, "no_gate_better": 5,
            "no_gate_leak": 7, "oracle_better": 4}


def test_the_four_baselines_come_from_the_same_seeds_paired():
    rows = [_row(DEFAULT, 0, 0.60, 0.50, 0.70), _row(DEFAULT, 1, 0.62, 0.58, 0.72),
            _row(OLD, 1, 0.64, 0.58, 0.72), _row(OLD, 0, 0.61, 0.50, 0.70)]
    out = {e["label"]: e for e in baseline_rows(rows)}
    assert tuple(out) == BASELINES == ("no_gate", "oracle", "old", "v3")
    assert out["no_gate"]["accuracy"][0] == pytest.approx(0.54)
    assert out["oracle"]["accuracy"][0] == pytest.approx(0.71)
    # paired by seed: old - no gate = (0.11 + 0.06) / 2, old - v3 = (0.01 + 0.02) / 2
    assert out["old"]["vs_no_gate"][0] == pytest.approx(0.085)
    assert out["old"]["vs_v3"][0] == pytest.approx(0.015)
    assert out["v3"]["vs_v3"] == (0.0, 0.0, 0.0)
    assert out["no_gate"]["vs_no_gate"] == (0.0, 0.0, 0.0)
    lo, hi = out["old"]["vs_no_gate"][1:]
    assert 0.06 <= lo <= hi <= 0.11  # a percentile interval of the two paired differences
    assert out["no_gate"]["leak"][0] == 7 and out["oracle"]["leak"][0] == 0
    assert out["oracle"]["better_applied"][0] == 4


def test_the_frontier_pairs_every_configuration_with_the_old_gate_by_seed():
    """The frontier's title quotes each configuration's difference from the old gate with its
    interval; it must be paired by seed, not a difference of two means' intervals."""
    rows = [{**_row(c, seed, acc, 0.5, 0.7), "probe_units": 40, "wall_h": w, "violations": 0}
            for c, w, accs in ((OLD, 95.0, (0.60, 0.70)), (DEFAULT, 8.0, (0.59, 0.71)),
                               (LONGER, 14.0, (0.62, 0.73)))
            for seed, acc in enumerate(accs)]
    out = {e["config"]: e for e in summarise(rows, [OLD, DEFAULT, LONGER])}
    assert out[OLD.name]["delta_vs_old"] == (0.0, 0.0, 0.0)
    d, lo, hi = out[LONGER.name]["delta_vs_old"]
    assert d == pytest.approx(0.025) and lo == pytest.approx(0.02) and hi == pytest.approx(0.03)
    assert out[DEFAULT.name]["delta_vs_old"][0] == pytest.approx(0.0)


def test_the_crossover_is_where_the_mean_paired_difference_turns_non_negative():
    shares = [0.0, 0.1, 0.2, 0.3]
    d = np.array([[-3.0, -1.0], [-1.0, -1.0], [0.0, 2.0], [2.0, 4.0]])  # means -2 -1 1 3
    assert crossover(shares, d) == pytest.approx(0.15)
    assert crossover(shares, -np.abs(d) - 1) == math.inf  # never pays on the grid
    assert crossover(shares, np.abs(d)) == 0.0  # pays from the smallest share
    c, lo, hi = crossover_interval(shares, d, reps=400)
    assert c == pytest.approx(0.15) and lo <= c <= hi
    # resampling seed 0 twice: means -3 -1 0 2 -> 0.2; seed 1 twice: -1 -1 2 4 -> 0.1 + 1/30
    assert lo == pytest.approx(0.1 + 0.1 / 3) and hi == pytest.approx(0.2)
    assert crossover_interval(shares, -np.abs(d) - 1, reps=50) == [None, None, None]


def test_the_sweep_frame_shows_the_four_baselines_per_share_as_notebook_06_prints_them():
    from vtrm_gate.views import crossover_claim, harmful_sweep_frame

    rows = [_row(DEFAULT, 0, 0.60, 0.50, 0.70), _row(DEFAULT, 1, 0.62, 0.58, 0.72),
            _row(OLD, 1, 0.64, 0.58, 0.72), _row(OLD, 0, 0.61, 0.50, 0.70)]
    sweep = {"seeds": 2, "points": [{"p_harmful": 0.3, "seeds": 2,
                                     "summary": baseline_rows(rows)}],
             "crossover": {"v3": [0.25, 0.2, 0.3], "old": [0.2, None, None]}}
    f = harmful_sweep_frame(sweep)
    assert f.columns == ["p_harmful", "seeds", "no_gate", "old", "v3", "oracle",
                         "v3_vs_no_gate", "lo", "hi"]
    r = f.row(0, named=True)
    assert (r["no_gate"], r["old"], r["v3"], r["oracle"]) == pytest.approx(
        (0.54, 0.625, 0.61, 0.71))
    assert r["v3_vs_no_gate"] == pytest.approx(0.07) and r["lo"] <= 0.07 <= r["hi"]
    claim = crossover_claim(sweep)
    assert "once ≥ 25% [95%: 20–30%]" in claim and "(the old gate: ≥ 20%)" in claim
    stored = json.loads((ROOT / "benchmarks/results/bench_power.json").read_text())["harmful_sweep"]
    assert harmful_sweep_frame(stored)["p_harmful"].to_list() == list(HARMFUL_SHARES)


def test_the_harmful_sweep_keeps_todays_helpful_to_neutral_ratio():
    for s in HARMFUL_SHARES:
        w = World.from_dict(harmful_world(s))
        assert w.p_harmful == s and w.scope == "candidate"
        assert w.p_helpful / w.p_neutral == pytest.approx(40 / 35)
    assert HARMFUL_SHARES[0] == 0.0 and HARMFUL_SHARES[-1] == 0.6


def test_worlds_come_from_presets_or_files(tmp_path):
    f = tmp_path / "lab.json"
    f.write_text(json.dumps({"p_harmful": 0.5, "p_neutral": 0.3, "p_helpful": 0.2}))
    worlds = read_worlds(["mostly_harmful", str(f)])
    assert list(worlds) == ["mostly_harmful", "lab"]
    assert worlds["lab"]["p_harmful"] == 0.5 and worlds["lab"]["size_max"] == 0.9
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"p_harmful": 0.5, "p_neutral": 0.3, "p_helpful": 0.3}))
    with pytest.raises(ConfigError, match=r"bad\.json.*sum to 1"):
        read_worlds([str(bad)])


def test_a_bad_world_file_is_exit_2_naming_file_and_field(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"p_harmful": -0.1, "p_neutral": 0.6, "p_helpful": 0.5}))
    p = subprocess.run([sys.executable, "-m", "benchmarks.bench_power", "--quick",
                        "--world", str(bad), "--out", str(tmp_path / "r.json")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "bad.json" in p.stderr and "p_harmful" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert not (tmp_path / "r.json").exists()


def test_the_longer_ladder_levers_differ_from_v3_only_in_n_max_and_are_all_recorded():
    ladders = {c.n_max: c for c in LEVERS if c.n_max != DEFAULT.n_max}
    assert sorted(ladders) == [80, 120]
    for n, c in ladders.items():
        assert c == replace(DEFAULT, name=f"v3 n_max {n}", n_max=n)
    stored = json.loads((ROOT / "benchmarks/results/bench_power.json").read_text())["levers"]
    assert tuple(stored) == PRESET_WORLDS
    for entries in stored.values():
        assert [e["config"] for e in entries] == [c.name for c in LEVERS]
        assert {e["seeds"] for e in entries} == {6} and sum(e["violations"] for e in entries) == 0


def test_the_futile_free_config_differs_from_v3_only_in_its_cooldown_and_is_recorded():
    assert replace(DEFAULT, name=FUTILE_FREE.name, futile_cooldown=False) == FUTILE_FREE
    stored = json.loads((ROOT / "benchmarks/results/bench_power.json").read_text())
    cool = stored["cooldown"]["worlds"]
    shares = [f"p_harmful {s:.1f}" for s in HARMFUL_SHARES]
    assert list(cool) == ["default", *PRESET_WORLDS, *shares]
    refs = {**{f"p_harmful {p['p_harmful']:.1f}": p["per_seed"]
               for p in stored["harmful_sweep"]["points"]},
            **{k: v["per_seed"] for k, v in stored["baselines"].items()}}
    for name, e in cool.items():  # each difference is paired with the recorded runs
        assert e["seeds"] == 6 == len(e["per_seed"]) and e["violations"] == 0
        for gate in ("v3", "old", "no_gate"):
            paired = np.subtract(e["per_seed"], refs[name][gate]).mean()
            assert e[f"vs_{gate}"][0] == pytest.approx(paired)
    front = stored["cooldown"]["frontier"]
    assert front["seeds"] == front["six_epochs"]["seeds"] == stored["seeds"] == 20
    assert replace(LONGER, name=FUTILE_FREE_LONGER.name,
                   futile_cooldown=False) == FUTILE_FREE_LONGER
    assert front["six_epochs"]["config"] == FUTILE_FREE_LONGER.name


def test_a_run_without_futiles_cooldown_gates_its_futile_types_again_at_once():
    short = {"epochs": 1, "steps": 2}
    spec, free = (run(replace(c, **short), 0) for c in (DEFAULT, FUTILE_FREE))
    assert free["wall_h"] > spec["wall_h"]  # step 2 gates the types step 1 found FUTILE


def test_rankings_compare_mean_accuracies_pair_by_pair():
    rows = [_row(c, s, acc + 0.01 * s, 0.40 + 0.02 * s, 0.9)
            for c, acc in zip(RANKED, (0.62, 0.60, 0.61), strict=True) for s in (0, 1)]
    m = rank_means(rows)
    assert tuple(m) == RANK_LABELS == ("no_gate", "old", "v3", "v3_n_max_80")
    assert m == pytest.approx({"no_gate": 0.41, "old": 0.625, "v3": 0.605,
                               "v3_n_max_80": 0.615})
    same = rank_agreement(m, m)
    assert same["same_order"] and same["pairs_alike"] == same["pairs"] == 6
    assert same["true_order"] == ["old", "v3_n_max_80", "v3", "no_gate"]
    swapped = rank_agreement(m, {**m, "v3": 0.63})  # v3 moves above old and n_max 80
    assert not swapped["same_order"] and swapped["pairs_alike"] == 4
    assert swapped["fitted_order"] == ["v3", "old", "v3_n_max_80", "no_gate"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mostly_harmful", "mostly_helpful"])
def test_the_fitted_world_orders_no_gate_and_the_gate_as_the_true_world_does(name):
    """The world fitted to one 3 x 5 run of a preset, then no gate vs v3 on the same seed
    under both (2 x 3 runs to stay short): where harmful candidates dominate the gate wins by
    tens of points, where helpful ones do no gate wins (docs/worlds.md: the full ranking of
    four configurations, 3 seeds, by `bench_power --sections ranking`)."""
    true = PRESETS[name].to_dict()
    fitted = fitted_world(true)
    assert World.from_dict(fitted) != PRESETS[name]  # estimated, not copied
    short = Config("v3 n_max 40, 2 x 3", epochs=2, steps=3)
    gap = {w: (r := run(short, 0, d))["accuracy"] - r["no_gate"]
           for w, d in (("true", true), ("fitted", fitted))}
    assert abs(gap["true"]) > 0.03 and abs(gap["fitted"]) > 0.03, gap
    assert (gap["true"] > 0) == (gap["fitted"] > 0) == (name == "mostly_harmful"), gap

