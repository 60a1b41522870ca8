"""The old gate's decisions as a rule (opt-in, for comparison): blocks of ``block`` units are
all counted, then one decision at the block end (and at the ladder's end).

The e-processes are the SPEC's; deciding only at block ends is optional stopping at fewer
times, so the 1/e_confirm guarantee holds unchanged. `replay_blocks` replays the same
semantics offline; this rule lets a whole training run use them (the design review's "old
gate" point: the same statistics, fewer chances to stop, more units spent).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import is_whole, plain_fields
from ._params import Action, GateParams, Pair
from ._process import GateState, gate_decision, update_state


@dataclass(frozen=True)
class BlockEnd:
    """SPEC §1 decisions, evaluated only after every ``block``-th unit and at exhaustion."""

    block: int = 8
    name: str = "old_blocks"

    def __post_init__(self) -> None:
        plain_fields(self)
        if not is_whole(self.block) or self.block < 1:
            raise ValueError(f"BlockEnd.block must be an integer >= 1, got {self.block!r}")

    def update(self, state: GateState, pair: Pair, params: GateParams) -> GateState:
        return update_state(state, pair, params)

    def decide(self, state: GateState, n_remaining: int, params: GateParams) -> Action:
        if n_remaining > 0 and state.n_consumed % self.block:
            return Action.CONTINUE
        return gate_decision(state, n_remaining, params)
