"""bench_small_types in a world (issue 25, item 5): each member's effect is drawn from the
world's shares per candidate, today's per-type world stays the default run for run, and a bad
world file is exit 2 naming the file and the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.bench_small_types import Member, _effect_shift, compare, run_seed
from vtrm_gate.sim import PRESETS, SimConfig, SimWorld, World

ROOT = Path(__file__).resolve().parents[1]
SMALL = ("Spatial Perception", "Spatial Reasoning", "Temporal Perception")
STEPS = [(e, s) for e in (1, 2, 3) for s in range(1, 6)]


def _shifts(world: World | None, mode: str, seed: int = 0) -> list[dict[str, float]]:
    w = SimWorld(SimConfig(seed=seed, world=world))
    group = [Member(t, [], {}) for t in SMALL]
    return [d for e, s in STEPS if (d := _effect_shift(w, group, e, s, mode)) is not None]


def test_every_member_draws_its_class_from_the_worlds_shares():
    helpful = _shifts(World(p_harmful=0, p_neutral=0, p_helpful=1), "independent")
    harmful = _shifts(World(p_harmful=1, p_neutral=0, p_helpful=0), "independent")
    assert len(helpful) == len(harmful) >= 10  # 15 steps, 10% unchanged
    assert all(0.3 <= v <= 0.9 for d in helpful for v in d.values())
    assert all(-0.9 <= v <= -0.3 for d in harmful for v in d.values())
    # one size per candidate, the sign from each member's class
    assert [set(d.values()) for d in helpful] == [{-v for v in d.values()} for d in harmful]
    mixed = [d for seed in range(4) for d in _shifts(PRESETS["mostly_neutral"], "independent",
                                                     seed)]
    assert any(len(set(d.values())) > 1 for d in mixed)  # members disagree on some candidate
    shared = [d for seed in range(4) for d in _shifts(PRESETS["mostly_neutral"], "shared", seed)]
    assert all(len(set(d.values())) == 1 for d in shared)


def test_in_todays_world_each_member_keeps_its_types_class_for_the_run():
    w = SimWorld(SimConfig(seed=3))
    sign = {"helpful": 1, "neutral": 0, "harmful": -1}
    for d in _shifts(None, "independent", seed=3):
        for t, v in d.items():
            assert (v > 0) - (v < 0) == sign[w.effects[t]]
    default = PRESETS["default"].to_dict()
    assert run_seed(3, "B") == run_seed(3, "B", world_spec=default)


def test_when_every_candidate_helps_the_two_b_variants_are_one_run():
    w = World(p_harmful=0, p_neutral=0, p_helpful=1).to_dict()
    for seed in (0, 1):
        ind, sh = run_seed(seed, "B", "independent", w), run_seed(seed, "B", "shared", w)
        assert ind == sh
        assert ind["applied_worse"] == ind["applied_neutral"] == ind["subgroup_harm"] == 0


def test_b_minus_a_is_paired_by_seed_in_a_world():
    rows = compare(2, PRESETS["mostly_harmful"].to_dict())
    assert [r["option"] for r in rows] == ["A", "B (independent effects)",
                                          "B (shared effects)"]
    assert rows[0]["minus_A_paired"] == "0 [0, 0]"
    a = [run_seed(s, "A", world_spec=PRESETS["mostly_harmful"].to_dict()) for s in (0, 1)]
    assert rows[0]["true_accuracy"].startswith(
        f"{(a[0]['accuracy'] + a[1]['accuracy']) / 2:.3g} [")


def test_a_bad_world_file_is_exit_2_naming_file_and_field(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"p_harmful": 0.5, "p_neutral": 0.5, "p_helpful": 0.5}))
    p = subprocess.run([sys.executable, "-m", "benchmarks.bench_small_types", "--world",
                        str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "bad.json" in p.stderr and "sum to 1" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert p.stdout == ""  # nothing ran

