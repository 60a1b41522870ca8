"""BaselineCache (SPEC §3–§4): reuse of *fresh* base-arm measurements, content-addressed.

Key: (task_type, unit_id, baseline skill content hash, agent/model config hash, unit content
hash). After an ACCEPT the baseline content changes, so the new baseline gets new keys by
construction; a unit whose question, options, media or answer changed (a relabel) is a miss.
One upsert per entry (one SQLite transaction: atomic), INFRA results are never written.

Why there is no way to pre-fill it (the v1 failure, design note §7): v1 pre-filled this
cache from the seed-baseline record, the same samples the ladder used to *select* units
(seed-wrong units first). The base arm was then pinned wrong on exactly the units chosen
because it was wrong, while the fresh candidate answered them right with its real
probability: W inflated systematically and a candidate with no improvement could be
accepted. On resume it also filed v1's old predictions under the evolved skills' hashes.
So the only writer is `put`, called by the gate after a fresh, non-INFRA base-arm run; this
class has no bulk-load method, and `put` refuses anything that is not such a result.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._ids import content_hash
from ..errors import MediaError, shown
from ..gate import UnitResult, UnitTask
from ._log import HarnessLog, encode_trace

if TYPE_CHECKING:
    from ._workspace import Workspace


@dataclass(frozen=True)
class BaselineKey:
    """The content address of one base-arm measurement."""

    task_type: str
    unit_id: str
    skill_hash: str
    config_hash: str
    unit_hash: str = ""

    @property
    def stored_config(self) -> str:
        """The ``config_hash`` column: the agent config hash, then ``:unit hash`` if any."""
        return f"{self.config_hash}:{self.unit_hash}" if self.unit_hash else self.config_hash


class BaselineCache:
    """`BaselineStore` backed by the ``baseline_cache`` table of the step's HarnessLog.

    ``config_hash`` identifies the agent/model configuration (model, sampling, agent code
    version...): a different agent never reuses another's measurements. ``unit_hash(task)``
    is the hash of the unit's content (question, options, media, answer): a changed unit
    misses. `for_workspace` wires both from a workspace.
    """

    def __init__(self, log: HarnessLog, config_hash: str,
                 unit_hash: Callable[[UnitTask], str | None] | None = None):
        if not isinstance(config_hash, str) or not config_hash:
            raise ValueError(f"config_hash must be a non-empty string, got {shown(config_hash)}")
        self.log = log
        self.config_hash = config_hash
        self.unit_hash = unit_hash
        self.hits = 0
        self.misses = 0
        self.writes = 0

    @classmethod
    def for_workspace(cls, ws: Workspace) -> BaselineCache:
        """The workspace's BaselineCache: its log, its agent hash, and (``llm`` workspaces)
        the content hash of each unit's record in units.jsonl. A simulated world's units are
        fixed by its config, which the agent hash already covers."""
        if not ws.units:
            return cls(ws.log, ws.config.agent_hash)
        memo: dict[str, str] = {}

        def unit_hash(task: UnitTask) -> str | None:  # media: path + content hash, or URL
            h = memo.get(task.unit_id)
            if h is None:
                try:
                    h = memo[task.unit_id] = ws.unit_key(task.task_type, task.unit_id)
                except MediaError:  # a frame gone since the ladder: no key, the call is INFRA
                    return None
            return h

        return cls(ws.log, ws.config.agent_hash, unit_hash)

    def key(self, task: UnitTask) -> BaselineKey | None:
        """The entry's key (the skill hash is recomputed when the task does not carry one);
        None when the unit's content cannot be hashed (a frame gone): nothing to look up."""
        unit = self.unit_hash(task) if self.unit_hash is not None else ""
        if unit is None:
            return None
        return BaselineKey(task.task_type, task.unit_id,
                           task.skill_hash or content_hash(task.skill), self.config_hash, unit)

    async def get(self, task: UnitTask) -> UnitResult | None:
        """The stored fresh base-arm result for this content, or None (a miss)."""
        if task.arm != "base":
            return None
        k = self.key(task)
        row = None if k is None else self.log.baseline_row(k.task_type, k.unit_id,
                                                            k.skill_hash, k.stored_config)
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        correct, prediction, trace = row
        # A hit costs nothing: tokens and latency stay with the fresh run's own rows.
        return UnitResult(correct=bool(correct), cached=True, prediction=prediction,
                          trace=None if trace is None else json.loads(trace))

    async def put(self, task: UnitTask, result: UnitResult) -> None:
        """Store a fresh base-arm result (one atomic upsert). INFRA is never written."""
        if task.arm != "base":
            raise ValueError(f"BaselineCache stores base-arm results only, got arm "
                             f"{task.arm!r} for {task.task_type!r}/{task.unit_id!r}")
        if result.infra:
            return
        if result.cached:
            # A cached result is not a fresh measurement of this run; nothing new to store.
            return
        k = self.key(task)
        if k is None:
            return
        self.log.upsert("baseline_cache", [(
            k.task_type, k.unit_id, k.skill_hash, k.stored_config, int(bool(result.correct)),
            result.prediction, int(result.tokens), float(result.latency_s),
            encode_trace(result.trace), task.run_id)])
        self.writes += 1

    def __len__(self) -> int:
        return self.log.baseline_count(self.config_hash)
