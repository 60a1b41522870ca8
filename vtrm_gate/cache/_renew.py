"""TTL renewal (SCAN + one round trip per batch, never KEYS) and key statistics, for the
``vtrm-gate cache`` commands.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, fields
from typing import Any, Literal, cast

from redis.exceptions import NoPermissionError

from ..errors import ConfigError, is_whole, shown
from . import _cluster as cluster
from ._keys import DEFAULT_PREFIX

# ---- TTL renewal ----------------------------------------------------------------------

RenewMethod = Literal["auto", "lua", "pipeline", "gt", "naive"]
RENEW_METHODS: tuple[str, ...] = ("auto", "lua", "pipeline", "gt", "naive")
# Measured by benchmarks/bench_cache.py (200,000 keys, batch 1000, unix socket, 2-core box,
# Redis 6.2 and 7.0): lua ~390k keys/s; TTL-then-EXPIRE pipelines ~75k; EXPIRE GT pipelined
# ~95k (7.0 only); the naive per-key loop ~10-15k. The pipelines are bound by the client's
# per-command cost, the script does the work server-side.
DEFAULT_RENEW_METHOD = "lua"

# For each key: 0 < TTL < target => EXPIRE target (unless dry run). Returns the count.
_RENEW_LUA = """
local target = tonumber(ARGV[1])
local apply = ARGV[2] == '1'
local n = 0
for _, k in ipairs(KEYS) do
  local t = redis.call('TTL', k)
  if t > 0 and t < target then
    if apply then redis.call('EXPIRE', k, target) end
    n = n + 1
  end
end
return n
"""


@dataclass(frozen=True)
class RenewProgress:
    """Progress of a renewal, reported after every batch."""

    scanned: int
    extended: int
    elapsed_s: float


@dataclass(frozen=True)
class RenewReport:
    """What a renewal did: keys scanned, extended (0 < ttl < target), untouched (the rest)."""

    scanned: int
    extended: int
    untouched: int
    ttl: int
    pattern: str
    dry_run: bool
    method: str
    elapsed_s: float

    @property
    def keys_per_s(self) -> float:
        return self.scanned / self.elapsed_s if self.elapsed_s > 0 else float("inf")

    def as_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["keys_per_s"] = round(self.keys_per_s, 1)
        return d


async def server_version(client: cluster.Client) -> tuple[int, ...]:
    """The server's ``redis_version`` as a tuple, e.g. (6, 2, 14) (a cluster: its lowest)."""
    if cluster.is_cluster(client):
        return await cluster.cluster_version(client)
    return cluster.version_of(await client.info("server"))


async def _scan_batches(client: cluster.Client, pattern: str,
                        batch: int) -> AsyncIterator[list[bytes]]:
    if cluster.is_cluster(client):  # every primary in turn
        async for keys in cluster.scan_batches(client, pattern, batch):
            yield keys
        return
    cursor = 0
    while True:
        cursor, found = await client.scan(cursor, match=pattern, count=batch)
        if found:
            yield cast(list[bytes], found)  # no decode_responses: keys are bytes
        if int(cursor) == 0:
            return


def _unseen(found: list[bytes], seen: set[int]) -> list[bytes]:
    """The keys of ``found`` not seen before (by hash), now marked seen."""
    out = []
    for k in found:
        h = hash(k)
        if h not in seen:
            seen.add(h)
            out.append(k)
    return out


async def renew_ttl(client: cluster.Client, ttl: int, pattern: str = f"{DEFAULT_PREFIX}:*",
                    dry_run: bool = False, batch: int = 1000,
                    progress: Callable[[RenewProgress], Any] | None = None,
                    method: RenewMethod = "auto") -> RenewReport:
    """Set TTL = ``ttl`` on the keys matching ``pattern`` whose TTL is in (0, ttl).

    Keys without expiry (TTL -1) and keys with a TTL >= ``ttl`` are untouched. SCAN with
    ``batch`` as the COUNT hint, then one round trip per batch: a Lua script (``lua``,
    default), a TTL pipeline then an EXPIRE pipeline (``pipeline``), or ``EXPIRE key ttl
    GT`` pipelined (``gt``, Redis >= 7). ``naive`` is the seed note's per-key loop, kept
    for the benchmark. ``auto`` is ``lua``, or ``pipeline`` for a user whose ACL forbids
    scripts (and for a dry run, which reads TTLs only). Never KEYS. A key SCAN returns
    twice (it may, while Redis resizes a table) is counted once (`_unseen`); one that
    expires between SCAN and its TTL counts as scanned and untouched.
    """
    if not is_whole(ttl) or ttl <= 0:
        raise ConfigError(f"ttl must be an integer number of seconds > 0, got {shown(ttl)}")
    if not is_whole(batch) or batch < 1:
        raise ConfigError(f"batch must be an integer >= 1, got {shown(batch)}")
    auto = method == "auto"
    method = await _resolve_method(client, method, dry_run)
    t0 = time.perf_counter()
    scanned = extended = 0
    seen: set[int] = set()
    if method == "naive":
        async for k in client.scan_iter(match=pattern, count=batch):
            if not _unseen([k], seen):
                continue
            scanned += 1
            extended += await _renew_one(client, k, ttl, dry_run)
            if progress is not None and scanned % batch == 0:
                progress(RenewProgress(scanned, extended, time.perf_counter() - t0))
    else:
        script = client.register_script(_RENEW_LUA) if method == "lua" else None
        async for found in _scan_batches(client, pattern, batch):
            if not (keys := _unseen(found, seen)):
                continue
            scanned += len(keys)
            try:
                extended += await _renew_batch(client, script, method, keys, ttl, dry_run)
            except NoPermissionError:
                if not (auto and script is not None):
                    raise
                # an ACL user without scripting rights: the pipelines do the same work
                method, script = "pipeline", None
                extended += await _renew_batch(client, script, method, keys, ttl, dry_run)
            if progress is not None:
                progress(RenewProgress(scanned, extended, time.perf_counter() - t0))
    return RenewReport(scanned, extended, scanned - extended, ttl, pattern, dry_run, method,
                       time.perf_counter() - t0)


async def _resolve_method(client: cluster.Client, method: str, dry_run: bool) -> RenewMethod:
    """The method to use; a dry run reads TTLs only (no script: it needs no scripting
    rights), and ``gt`` needs Redis >= 7."""
    if method not in RENEW_METHODS:
        raise ConfigError(f"method must be one of {', '.join(RENEW_METHODS)}, got {shown(method)}")
    if method == "auto":
        method = DEFAULT_RENEW_METHOD
    if dry_run and method == "lua":
        return "pipeline"
    if method == "gt":
        version = await server_version(client)
        if version < (7,):
            raise ConfigError(f"EXPIRE ... GT needs Redis >= 7; the server is "
                             f"{'.'.join(map(str, version))}")
    return method  # type: ignore[return-value]  # one of RENEW_METHODS (checked above)


async def _renew_one(client: cluster.Client, key: bytes, ttl: int, dry_run: bool) -> int:
    """The seed note's per-key loop body: 1 if the key's TTL is in (0, ttl) (and extended)."""
    t = await client.ttl(key)
    if not 0 < t < ttl:
        return 0
    if not dry_run:
        await client.expire(key, ttl)
    return 1


async def _renew_batch(client: cluster.Client, script: Any, method: str, keys: list[bytes],
                       ttl: int, dry_run: bool) -> int:
    """One round trip (two for ``pipeline``) for a batch of keys; returns keys extended."""
    if script is not None and cluster.is_cluster(client):  # one slot per script
        return int(await cluster.renew_lua_batch(client, _RENEW_LUA, keys, [ttl, 1]))
    if script is not None:
        return int(await script(keys=keys, args=[ttl, 1]))
    pipe = client.pipeline(transaction=False)
    if method == "gt" and not dry_run:
        for k in keys:
            pipe.expire(k, ttl, gt=True)
        return sum(bool(x) for x in await pipe.execute())
    for k in keys:
        pipe.ttl(k)
    due = [k for k, t in zip(keys, await pipe.execute(), strict=True) if 0 < t < ttl]
    if not due or dry_run:
        return len(due)
    pipe = client.pipeline(transaction=False)
    for k in due:
        pipe.expire(k, ttl)
    return sum(bool(x) for x in await pipe.execute())


# ---- key statistics -------------------------------------------------------------------

TTL_BUCKETS: tuple[tuple[str, float], ...] = (
    ("< 1 h", 3600), ("1 h - 1 d", 86400), ("1 d - 7 d", 604800), ("> 7 d", float("inf")))


@dataclass(frozen=True)
class KeyStats:
    """The keys under one prefix: count, memory, TTL histogram (and the server's memory)."""

    prefix: str
    keys: int
    memory_bytes: int
    no_expiry: int
    ttl_histogram: tuple[tuple[str, int], ...]
    server_used_memory: int
    server_version: str

    def as_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["ttl_histogram"] = dict(self.ttl_histogram)
        return d


async def cache_stats(client: cluster.Client, prefix: str = DEFAULT_PREFIX,
                      batch: int = 1000) -> KeyStats:
    """Count, memory (MEMORY USAGE, summed) and TTL histogram of ``{prefix}:*`` via SCAN; a
    key SCAN returns twice (it may, while Redis resizes a table) is counted once (by its
    64-bit hash: ~70 bytes a key, not the key itself)."""
    counts = dict.fromkeys((b for b, _ in TTL_BUCKETS), 0)
    keys = memory = no_expiry = 0
    seen: set[int] = set()
    async for found in _scan_batches(client, f"{prefix}:*", batch):
        batch_keys = _unseen(found, seen)
        if not batch_keys:
            continue
        pipe = client.pipeline(transaction=False)
        for k in batch_keys:
            pipe.ttl(k)
            pipe.memory_usage(k)
        out = await pipe.execute()
        for t, mem in zip(out[::2], out[1::2], strict=True):
            if t == -2:
                continue  # expired between SCAN and TTL
            keys += 1
            memory += int(mem or 0)
            if t == -1:
                no_expiry += 1
                continue
            for label, upper in TTL_BUCKETS:
                # a range's upper end is its own ("1 h - 1 d" holds 1 d); "< 1 h" holds none
                if t < upper or (t == upper and label != TTL_BUCKETS[0][0]):
                    counts[label] += 1
                    break
    if cluster.is_cluster(client):
        used = await cluster.cluster_memory(client)
        version = ".".join(map(str, await cluster.cluster_version(client))) + " (cluster)"
    else:
        used = int((await client.info("memory")).get("used_memory", 0))
        version = str((await client.info("server")).get("redis_version", "?"))
    return KeyStats(prefix, keys, memory, no_expiry, tuple(counts.items()), used, version)


