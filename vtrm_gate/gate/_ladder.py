"""Information ladder (SPEC §2): which units a type's gate consumes, in which order.

Tier 0: units the seed baseline answered wrong; tier 1: units it answered right;
units with no seed record (tier None) sit between them. Inside a tier, a deterministic
shuffle keyed by (seed, unit_id). This step's evolution cases are excluded, and the ladder
is truncated to ``n_max``.

Independence rule: the seed record only *orders* units. It is never a measurement of the
base arm; nothing here (or anywhere) turns it into a BaselineCache entry.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .._ids import is_unicode
from ..errors import is_whole, plain_number
from ..stats import as_correct


@dataclass(frozen=True)
class LadderEntry:
    """One rung: the unit, its 0-based ladder_rank and the tier it came from."""

    unit_id: str
    ladder_rank: int
    tier: int | None  # 0 seed-wrong, 1 seed-right, None no seed record


def check_unit_ids(units: Iterable[object], where: str = "") -> tuple[str, ...]:
    """The unit ids as a tuple; ValueError (prefixed by ``where``) on an empty, non-string
    or duplicate id, TypeError on a lone string (it is no list of ids). One check shared by
    ladders, gate plans and workspace pools."""
    refuse_lone_id(units, f"{where}units")
    out = tuple(units)
    seen: set[object] = set()
    for u in out:
        if not isinstance(u, str) or not u or not is_unicode(u):
            raise ValueError(f"{where}unit ids must be non-empty strings of valid Unicode, "
                             f"got {u!r}")
        if u in seen:
            raise ValueError(f"{where}duplicate unit id {u!r}")
        seen.add(u)
    return out  # type: ignore[return-value]  # each checked a str above


def refuse_lone_id(value: object, name: str) -> None:
    """TypeError for one id where a sequence of them belongs: ``set("u3")`` or
    ``tuple("u3")`` would read its characters as ids."""
    if isinstance(value, str | bytes):
        raise TypeError(f"{name} must be a sequence of unit ids, got a {type(value).__name__} "
                        f"({value[:40]!r}): pass [{value[:40]!r}]")


def shuffle_key(seed: int | str, unit_id: str) -> str:
    """Deterministic, platform-independent sort key for the in-tier shuffle."""
    return hashlib.sha256(f"{seed}\x1f{unit_id}".encode()).hexdigest()


def build_ladder(pool: Iterable[str], seed_correct: Mapping[str, bool] | None = None, *,
                 exclude: Iterable[str] | None = (), n_max: int = 40,
                 seed: int | str = 0) -> list[LadderEntry]:
    """Order ``pool`` by expected information and truncate to ``n_max``.

    ``seed_correct`` maps unit_id -> whether the *seed baseline* answered it right; it is
    used for ordering only. ``exclude`` holds this step's evolution case units (a list;
    None: none).
    """
    n_max = plain_number(n_max)
    if not is_whole(n_max) or n_max < 0:
        raise ValueError(f"n_max must be an integer >= 0, got {n_max!r}")
    units = check_unit_ids(pool, "pool: ")
    tiers = {u: int(as_correct(v, f"seed_correct[{u!r}]"))  # text is refused, not truthy
             for u, v in (seed_correct or {}).items()}
    refuse_lone_id(exclude, "exclude")
    excluded = set(exclude or ())
    kept = [u for u in units if u not in excluded]
    # wrong (0), then unknown (0.5), then right (1); a seeded shuffle inside each tier
    kept.sort(key=lambda u: (tiers.get(u, 0.5), shuffle_key(seed, u)))
    return [LadderEntry(u, rank, tiers.get(u)) for rank, u in enumerate(kept[:n_max])]


def ladder_units(entries: Iterable[LadderEntry]) -> list[str]:
    return [e.unit_id for e in entries]
