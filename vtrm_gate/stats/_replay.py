"""Offline replays of one outcome sequence: prefix (v3), blocks (the old gate), arrival order
(the rejected alternative, kept to show why it is wrong).
"""

from __future__ import annotations

from collections.abc import Sequence

from ._params import GateParams, Pair, as_correct, as_params, as_times, check_block
from ._process import (
    DecisionRule,
    SequentialTest,
    TypeOutcome,
)


def _as_pairs(outcomes: Sequence[Pair]) -> list[Pair]:
    pairs: list[Pair] = []
    for i, p in enumerate(outcomes):
        if p is None:
            pairs.append(None)
            continue
        if not (isinstance(p, tuple | list) and len(p) == 2):
            raise ValueError(
                f"outcome {i} must be (base_correct, cand_correct) or None, got {p!r}")
        pairs.append((as_correct(p[0], f"outcome {i}: base_correct"),
                      as_correct(p[1], f"outcome {i}: cand_correct")))
    return pairs


def replay_prefix(outcomes: Sequence[Pair], params: GateParams | None = None,
                  rule: DecisionRule | None = None) -> TypeOutcome:
    """v3 semantics: consume in ladder order, decide after every unit."""
    params = as_params(params)
    pairs = _as_pairs(outcomes)
    test = SequentialTest(len(pairs), params, rule)
    for rank, pair in enumerate(pairs):
        if test.decided:
            break
        test.consume(rank, pair)
    return test.outcome()


def replay_blocks(outcomes: Sequence[Pair], params: GateParams | None = None, block: int = 8,
                  rule: DecisionRule | None = None) -> TypeOutcome:
    """Old semantics: a block's units are all counted, then one decision at the block end."""
    check_block(block)
    params = as_params(params)
    pairs = _as_pairs(outcomes)
    test = SequentialTest(len(pairs), params, rule)
    n = len(pairs)
    for rank, pair in enumerate(pairs):
        if test.decided:
            break
        test.consume(rank, pair, decide=(rank + 1) % block == 0 or rank == n - 1)
    return test.outcome()


def replay_arrival(outcomes: Sequence[Pair], completion_times: Sequence[float],
                   params: GateParams | None = None,
                   rule: DecisionRule | None = None) -> TypeOutcome:
    """The rejected alternative: consume units in completion order (ties by ladder rank).

    Kept only to show why it is wrong: when wrong answers are slower, early arrivals are
    enriched in wins and E+ is inflated.
    """
    params = as_params(params)
    pairs = _as_pairs(outcomes)
    times = as_times(completion_times, len(pairs))
    order = sorted(range(len(pairs)), key=lambda i: (times[i], i))
    test = SequentialTest(len(pairs), params, rule)
    for rank in order:
        if test.decided:
            break
        test.consume(rank, pairs[rank])
    return test.outcome()



