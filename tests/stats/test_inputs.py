"""What the statistics take from a researcher's hands: outcomes read from a CSV as text, a
dict of parameters, a ladder far too long for the exact recursion. Each was taken silently
(a wrong number) or failed far from its cause; each is refused naming what is wrong."""

from __future__ import annotations

import numpy as np
import pytest

from vtrm_gate import GateParams, operating_characteristics, replay_blocks, replay_prefix
from vtrm_gate.stats import (
    MAX_OC_UNITS,
    replay_arrival,
    replay_arrival_batch,
    replay_blocks_batch,
    replay_prefix_batch,
)

WINS = [(False, True)] * 10


@pytest.mark.parametrize("bad, shown", [
    ("False", "'False' (a str)"),  # a CSV column read as text: "False" is truthy
    (0.7, "0.7 (a float)"),
    (2, "2 (an int)"),
    (np.float64(0.5), "0.5 (a float64)")])
@pytest.mark.parametrize("replay", [
    replay_prefix, replay_blocks, lambda o: replay_arrival(o, list(range(len(o))))])
def test_an_outcome_that_is_not_a_boolean_is_refused_naming_it(replay, bad, shown):
    """``replay_prefix([("False", "True")] * 10)`` counted ten ties (both strings are true):
    INERTIA where the researcher's data said ACCEPT."""
    outcomes = [*WINS[:3], (False, bad), *WINS[4:]]
    with pytest.raises(ValueError) as err:
        replay(outcomes)
    assert str(err.value) == (f"outcome 3: cand_correct must be True or False (or 1 or 0), "
                              f"got {shown}; text such as 'True' must be read as a boolean "
                              f"first")


def test_booleans_of_every_kind_read_alike():
    """Python and numpy booleans, 0 and 1 (Python or numpy numbers) and None (INFRA) stay
    accepted, with one meaning."""
    want = replay_prefix([*WINS[:5], None, *WINS[5:]])
    kinds = [(np.bool_(False), np.bool_(True)), (0, 1), (np.int64(0), np.int8(1)), [False, 1],
             (0.0, np.float64(1.0))]
    for k in kinds:
        assert replay_prefix([k] * 5 + [None] + [k] * 5) == want


@pytest.mark.parametrize("batch", [
    replay_prefix_batch, replay_blocks_batch,
    lambda b, c: replay_arrival_batch(b, c, np.tile(np.arange(b.shape[1]), (b.shape[0], 1)))])
def test_a_batch_of_text_or_fractions_is_refused_naming_the_array(batch):
    base = np.zeros((2, 10), dtype=bool)
    cand = np.ones((2, 10), dtype=bool)
    text = np.where(cand, "True", "False")
    with pytest.raises(ValueError, match=r"^cand must hold booleans \(or 1 and 0\), got dtype "
                                         r"<U5: text such as 'True' must be read as a boolean"):
        batch(base, text)
    with pytest.raises(ValueError, match=r"^base must hold booleans \(or 1 and 0\), got 0\.7 "
                                         r"at \(0, 3\)"):
        batch(np.where(np.arange(10) == 3, 0.7, 0.0)[None].repeat(2, 0), cand)
    with pytest.raises(ValueError, match=r"got dtype object: None marks no unit here: INFRA "
                                         r"units go in infra="):
        batch(np.full((2, 10), None), cand)
    ints = batch(base.astype(np.int64), cand.astype(np.int8))
    assert ints.action.tolist() == batch(base, cand).action.tolist()


@pytest.mark.parametrize("call", [
    lambda p: replay_prefix(WINS, p),
    lambda p: replay_blocks(WINS, p),
    lambda p: replay_prefix_batch(np.zeros((1, 4), bool), np.ones((1, 4), bool), p),
    lambda p: operating_characteristics(p, p_win=0.8, discordance=0.5, n_units=40)])
def test_params_that_are_not_gate_params_are_refused(call):
    """A dict of parameters was an AttributeError deep in the kernel, and an empty dict ran
    silently on the defaults."""
    for bad in ({"e_confirm": 5.0}, {}):
        with pytest.raises(TypeError, match=r"^params must be a GateParams \(or None for the "
                                            r"defaults\), got dict: GateParams\(\*\*d\)"):
            call(bad)
    call(None)  # the defaults, as documented


def test_an_operating_characteristic_too_long_to_hold_is_refused_before_allocating():
    """``n_units=10**6`` raised MemoryError ("Unable to allocate 7.28 TiB")."""
    with pytest.raises(ValueError, match=rf"^n_units must be at most {MAX_OC_UNITS:,} "
                                         r"\(the exact recursion keeps \(n\+1\)² states\), "
                                         r"got 1,000,000"):
        operating_characteristics(GateParams(), p_win=0.8, discordance=0.5, n_units=10**6)
    oc = operating_characteristics(GateParams(), p_win=0.8, discordance=0.5, n_units=40)
    assert round(oc.p_accept, 2) == 0.73  # the README's number, unchanged


@pytest.mark.parametrize("times, message", [
    ([float("nan")] + [1.0] * 9, "completion_times: entry 0 must be a finite number of "
                                 "seconds, got nan"),
    ([float("inf")] * 10, "entry 0 must be a finite number of seconds, got inf"),
    (["1"] * 10, "entry 0 must be a finite number of seconds, got '1'"),
    ([True] * 10, "entry 0 must be a finite number of seconds, got True")])
def test_completion_times_that_do_not_order_are_refused_naming_the_entry(times, message):
    """A NaN time sorted nowhere in particular and text sorted as text ("10" before "9"):
    the arrival order, the very thing this replay shows, came out silently wrong."""
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        replay_arrival(WINS, times)
    arr = np.ones((2, 10))
    arr[1, 3] = np.nan
    with pytest.raises(ValueError, match=r"completion_times: entry \(1, 3\) must be a finite "
                                         r"number of seconds, got nan"):
        replay_arrival_batch(np.zeros((2, 10), bool), np.ones((2, 10), bool), arr)
    with pytest.raises(ValueError, match="completion_times must hold numbers, got dtype <U2"):
        replay_arrival_batch(np.zeros((1, 2), bool), np.ones((1, 2), bool), [["10", "9"]])


