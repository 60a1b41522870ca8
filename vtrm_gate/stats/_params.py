"""The kernel's values: a unit's outcome, the gate's actions, `GateParams` and the bet."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import is_number, is_real, is_whole, plain_fields, shown

Pair = tuple[bool, bool] | None
"""One unit's outcome in ladder order: ``(base_correct, cand_correct)``, or None for INFRA."""


class Action(enum.StrEnum):
    """What the gate says after a consumed unit."""

    ACCEPT = "ACCEPT"
    REJECT = "REJECT"
    FUTILE = "FUTILE"
    PROVISIONAL = "PROVISIONAL"
    INERTIA = "INERTIA"
    CONTINUE = "CONTINUE"

    def __str__(self) -> str:
        return self.value


Decision = Action
"""`gate_decision` returns one Action; the alias keeps the SPEC's wording."""

# Stable integer codes for the vectorised replays (index into ACTION_CODES).
ACTION_CODES: tuple[Action, ...] = (
    Action.CONTINUE,
    Action.ACCEPT,
    Action.REJECT,
    Action.FUTILE,
    Action.PROVISIONAL,
    Action.INERTIA,
)
_CODE = {a: i for i, a in enumerate(ACTION_CODES)}


def _check(cond: bool, name: str, allowed: str, value: object) -> None:
    if not cond:
        raise ValueError(f"GateParams.{name} must be {allowed}, got {shown(value)}")


@dataclass(frozen=True)
class GateParams:
    """Decision-rule parameters (SPEC §1); every field is validated on construction."""

    e_confirm: float = 20.0
    lambda_dir: float = 0.5
    delta_min: float = 0.0
    w_net_min: int = 3
    e_reject: float = 20.0
    e_provisional: float = 2.0
    w_net_min_provisional: int = 2
    n_max: int = 40

    def __post_init__(self) -> None:
        plain_fields(self)
        _check(is_real(self.e_confirm) and self.e_confirm > 1, "e_confirm", "a number > 1",
               self.e_confirm)
        _check(is_real(self.delta_min) and 0 <= self.delta_min < 1, "delta_min",
               "a number in [0, 1)", self.delta_min)
        lam_max = 1.0 / (1.0 + (self.delta_min if is_real(self.delta_min) else 0.0))
        _check(is_real(self.lambda_dir) and 0 < self.lambda_dir <= lam_max, "lambda_dir",
               f"in (0, 1/(1+delta_min)] = (0, {lam_max:.6g}]", self.lambda_dir)
        _check(is_whole(self.w_net_min) and self.w_net_min >= 0, "w_net_min",
               "an integer >= 0", self.w_net_min)
        _check(is_real(self.e_reject) and self.e_reject > 1, "e_reject", "a number > 1",
               self.e_reject)
        _check(is_real(self.e_provisional) and self.e_provisional >= 1, "e_provisional",
               "a number >= 1", self.e_provisional)
        _check(is_whole(self.w_net_min_provisional) and self.w_net_min_provisional >= 0,
               "w_net_min_provisional", "an integer >= 0", self.w_net_min_provisional)
        _check(is_whole(self.n_max) and self.n_max >= 1, "n_max", "an integer >= 1", self.n_max)
        # not a field (no equality, hash, repr or asdict): derived once, read per unit
        object.__setattr__(self, "_log_win_factor", math.log(self.win_factor))

    @property
    def win_factor(self) -> float:
        """E+ multiplier of a win (d=+1): the best case used by the futility check."""
        return bet_factors(self, 1)[0]

    @property
    def log_win_factor(self) -> float:
        """``log(win_factor)``, computed once (on construction): the futility check takes it
        on every unit."""
        return self._log_win_factor  # type: ignore[attr-defined, no-any-return]  # set in __post_init__


def bet_factors(params: GateParams, d: int) -> tuple[float, float]:
    """(E+ factor, E- factor) of one paired unit with difference ``d``.

    The one place the factors are computed, so the live update, the batch replays and the
    exact operating characteristics multiply bit-identical numbers.
    """
    return 1.0 + params.lambda_dir * (d - params.delta_min), 1.0 - params.lambda_dir * d


def as_params(params: GateParams | None) -> GateParams:
    """``params``, or the defaults for None. Anything else (a dict) is refused here: it was
    an AttributeError deep in the kernel, and an empty dict ran on the defaults unsaid."""
    if params is None:
        return GateParams()
    if isinstance(params, GateParams):
        return params
    raise TypeError(f"params must be a GateParams (or None for the defaults), got "
                    f"{type(params).__name__}: GateParams(**d) builds one from a dict d")


READ_AS_BOOLEAN = "text such as 'True' must be read as a boolean first"


def as_correct(value: object, what: str) -> bool:
    """One arm's answer as a bool: True/False, numpy's, or 1/0 (an int or a float). Text
    ("False" is truthy) and fractions are refused naming ``what``, never taken by their truth
    value."""
    if value is True or value is False:
        return value
    if isinstance(value, np.bool_) or (isinstance(value, int | float | np.integer | np.floating)
                                       and value in (0, 1)):
        return bool(value)
    kind = type(value).__name__
    plain = value.item() if isinstance(value, np.generic) else value
    raise ValueError(f"{what} must be True or False (or 1 or 0), got {shown(plain)} "
                     f"({'an' if kind[0] in 'aeiou' else 'a'} {kind}); {READ_AS_BOOLEAN}")


def check_block(block: object) -> int:
    """``block`` (the old gate's units per block) if it is an integer >= 1, else ValueError
    naming it (``True`` is no block size; 0 would divide by zero)."""
    if not is_whole(block) or block < 1:
        raise ValueError(f"block must be an integer >= 1, got {shown(block)}")
    return block


def as_times(values: Sequence[object], n: int) -> list[float]:
    """Completion times as floats, one per outcome: each a finite number (NaN sorts nowhere
    in particular, text sorts as text: "10" before "9")."""
    if len(values) != n:
        raise ValueError(f"completion_times has {len(values)} entries, outcomes has {n}")
    out = []
    for i, t in enumerate(values):
        if not (is_number(t) and math.isfinite(t)):
            raise ValueError(f"completion_times: entry {i} must be a finite number of "
                             f"seconds, got {shown(t.item() if isinstance(t, np.generic) else t)}")
        out.append(float(t))
    return out


def as_times_array(values: object, shape: tuple[int, ...]) -> np.ndarray:
    """`as_times` over an array of ``shape``."""
    a = np.asarray(values)
    if a.dtype.kind not in "iuf":
        raise ValueError(f"completion_times must hold numbers, got dtype {a.dtype}")
    if a.shape != shape:
        raise ValueError(f"completion_times must have shape {shape}, got {a.shape}")
    bad = ~np.isfinite(a)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"completion_times: entry {at} must be a finite number of seconds, "
                         f"got {a[at].item()!r}")
    return a.astype(float)


def as_correct_array(values: object, name: str) -> np.ndarray:
    """`as_correct` over an array: booleans, or numbers that are all 1 or 0."""
    a = np.asarray(values)
    if a.dtype == bool:
        return a
    if a.dtype.kind not in "iuf":
        hint = ("None marks no unit here: INFRA units go in infra=" if a.dtype.kind == "O"
                else READ_AS_BOOLEAN)
        raise ValueError(f"{name} must hold booleans (or 1 and 0), got dtype {a.dtype}: {hint}")
    bad = (a != 0) & (a != 1)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} must hold booleans (or 1 and 0), got {a[at].item()!r} at "
                         f"{at}")
    return a.astype(bool)
