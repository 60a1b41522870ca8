"""Information ladder (SPEC §2)."""

from __future__ import annotations

import numpy as np
import pytest

from vtrm_gate import build_ladder
from vtrm_gate.gate import ladder_units

POOL = [f"u{i:02d}" for i in range(30)]
SEED = {u: (i % 3 != 0) for i, u in enumerate(POOL[:24])}  # u24..u29 have no seed record


def test_tiers_wrong_then_unknown_then_right():
    ladder = build_ladder(POOL, SEED, n_max=100)
    tiers = [e.tier for e in ladder]
    n_wrong = sum(not v for v in SEED.values())
    assert tiers[:n_wrong] == [0] * n_wrong
    assert tiers[n_wrong:n_wrong + 6] == [None] * 6
    assert tiers[n_wrong + 6:] == [1] * (24 - n_wrong)
    assert [e.ladder_rank for e in ladder] == list(range(30))


def test_case_units_excluded_and_truncated_to_n_max():
    cases = [u for u, ok in SEED.items() if not ok][:3]
    ladder = build_ladder(POOL, SEED, exclude=cases, n_max=10)
    units = ladder_units(ladder)
    assert len(units) == 10 and not set(cases) & set(units)


def test_shuffle_is_deterministic_and_keyed_by_seed():
    a = ladder_units(build_ladder(POOL, SEED, seed=1))
    assert a == ladder_units(build_ladder(list(reversed(POOL)), SEED, seed=1))
    b = ladder_units(build_ladder(POOL, SEED, seed=2))
    assert a != b and sorted(a) == sorted(b)
    # inside a tier the order is not just the input order
    wrong = [u for u in a if SEED.get(u) is False]
    assert wrong != sorted(wrong)


def test_no_seed_record_at_all_is_a_plain_shuffle():
    ladder = build_ladder(POOL, None, n_max=40)
    assert {e.tier for e in ladder} == {None} and len(ladder) == 30


def test_empty_pool_gives_an_empty_ladder():
    assert build_ladder([], {}) == []


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="duplicate unit id"):
        build_ladder(["a", "a"])
    with pytest.raises(ValueError, match="n_max"):
        build_ladder(["a"], n_max=-1)
    with pytest.raises(ValueError, match="unit ids"):
        build_ladder(["a", ""])


def test_the_seed_record_only_orders_it_never_measures():
    """Independence rule: the ladder carries no correctness, only ids, ranks and tiers."""
    entry = build_ladder(POOL, SEED)[0]
    assert set(entry.__dataclass_fields__) == {"unit_id", "ladder_rank", "tier"}


def test_a_seed_record_read_as_text_is_refused_not_ordered_by_its_truth_value():
    """``{"u0": "False"}`` (a CSV read as text) put every unit in the "seed answered right"
    tier, since the text is true: the ladder's order was not the wrong-first one asked for."""
    pool = [f"u{i}" for i in range(10)]
    truth = {u: i % 2 == 0 for i, u in enumerate(pool)}
    want = build_ladder(pool, truth, seed="s")
    for same in ({u: int(v) for u, v in truth.items()}, {u: np.bool_(v) for u, v in truth.items()}):
        assert build_ladder(pool, same, seed="s") == want
    with pytest.raises(ValueError, match=r"^seed_correct\['u0'\] must be True or False \(or 1 "
                                         r"or 0\), got 'True' \(a str\)"):
        build_ladder(pool, {u: str(v) for u, v in truth.items()}, seed="s")


def test_one_excluded_id_given_as_text_is_refused_not_split_into_characters():
    """``exclude="u3"`` went through ``set()``: the characters were excluded and the
    evolution case u3 stayed in the ladder, where it must never be gated."""
    with pytest.raises(TypeError, match=r"exclude must be a sequence of unit ids, got a str "
                                        r"\('u3'\): pass \['u3'\]"):
        build_ladder(["u1", "u2", "u3"], exclude="u3")
    assert [e.unit_id for e in build_ladder(["u1", "u3"], exclude=None)] != []
    assert "u3" not in [e.unit_id for e in build_ladder(["u1", "u2", "u3"], exclude=["u3"])]
