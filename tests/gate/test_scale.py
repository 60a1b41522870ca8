"""Regressions found by benchmarks/bench_throughput.py: what made the per-call overhead grow
with concurrency (or turned load into a cache outage)."""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

from vtrm_gate.cache import KeyParts, ResponseCache
from vtrm_gate.gate import UnitTask
from vtrm_gate.llm import MCQ, LLMAgent, RetryPolicy, ShardedClient, init_llm
from vtrm_gate.options import RunOptions
from vtrm_gate.testing import ChatServer, Fault, RedisTarget


def test_three_hundred_concurrent_cache_calls_are_no_outage(redis_target: RedisTarget) -> None:
    """redis-py's default async pool raises "Too many connections" past 100 commands in
    flight; the cache must wait for a connection instead of going uncached."""
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)

    async def call() -> dict[str, Any]:
        await asyncio.sleep(0.01)
        return {"choices": [{"message": {"content": "A"}, "finish_reason": "stop"}]}

    async def go() -> None:
        try:
            await asyncio.gather(*(cache.get_or_call(
                KeyParts("m", "http://x", ({"role": "user", "content": str(i)},), salt="r"),
                call) for i in range(300)))
        finally:
            await cache.aclose()

    asyncio.run(go())
    s = cache.stats()
    assert (s.errors, s.bypassed, s.misses, s.writes) == (0, 0, 300, 300)


def test_the_agent_spreads_connections_over_small_pools(chat_server: ChatServer) -> None:
    """One httpcore pool scans all its connections for every waiting request (quadratic in
    the concurrency); the agent keeps each pool at 16 connections or fewer."""
    n = 100
    chat_server.inject(*[Fault(sleep=0.2)] * n)
    units = {f"u{i}": MCQ(f"q{i}?", ("a", "b"), "A") for i in range(n)}
    agent = LLMAgent(units, base_url=chat_server.url, model="m", think=False,
                     retry=RetryPolicy(max_attempts=1))
    sizes: list[int] = []

    async def go() -> list[Any]:
        try:
            out = await asyncio.gather(*(agent.infer(UnitTask("T", f"u{i}", "base", i, "r",
                                                               "s")) for i in range(n)))
            client = agent._client()
            assert isinstance(client, ShardedClient)
            sizes.extend(len(s.client._transport._pool.connections) for s in client._shards)
            return out
        finally:
            await agent.aclose()

    results = asyncio.run(go())
    assert not any(r.infra for r in results)
    assert len(sizes) >= n // 16 and max(sizes) <= 16


def test_sniffio_is_installed() -> None:
    """httpcore imports sniffio on every request; without it each failed import searches
    sys.path (about a millisecond per call in the benchmark)."""
    assert importlib.util.find_spec("sniffio") is not None


def test_a_step_with_media_three_endpoints_and_a_redis_cluster_runs_end_to_end(
        tmp_path: Any, redis_cluster: Any) -> None:
    """Everything at once on loopback: media units, three chat servers of different speeds
    behind one agent, and the response cache on a three-primary Redis Cluster; the re-run
    is served from the cluster."""
    import redis as sync_redis

    from tests.llm.test_media import evolve, write_units
    from vtrm_gate.harness import run_step
    from vtrm_gate.llm import Endpoint, EndpointPool, llm_backend, rollout_cases
    from vtrm_gate.testing.farm import SlowChatServer
    from vtrm_gate.testing.media import MediaChatServer

    class Server(SlowChatServer, MediaChatServer):
        pass

    servers = [Server(d, evolve_reply=evolve).start() for d in (0.0, 0.01, 0.03)]
    try:
        ws = init_llm(tmp_path / "ws", write_units(tmp_path),
                                base_url=[s.url for s in servers], model="vision-model",
                                seed=1, media={"max_frames": 3, "max_side": 128})

        def once() -> Any:
            cache = ResponseCache(redis_cluster.url, prefix=redis_cluster.prefix)
            pool = EndpointPool([Endpoint(s.url, 3) for s in servers])
            backend = llm_backend(ws, RunOptions(),
                                  cache=cache, api_key="k", env={}, endpoints=pool)

            async def go() -> Any:
                try:
                    cases = await rollout_cases(backend, ws, 1, 1)
                    return await run_step(ws, 1, 1, infer=backend.infer,
                                          evolver=backend.evolver, cases=cases,
                                          cache_stats=backend.cache_stats,
                                          options=RunOptions(concurrency=9))
                finally:
                    await backend.aclose()

            return asyncio.run(go()), cache, pool

        first, cache, pool = once()
        asked = sum(len(s.requests) for s in servers)
        second, cache2, _ = once()
        ws.close()
    finally:
        for s in servers:
            s.close()
    assert first.decisions == second.decisions == {"Counting Problem": "PROVISIONAL"}
    assert all(s.calls > 0 for s in pool.stats())  # every endpoint served
    assert all(s.peak_active <= 3 for s in servers)
    frames = [r for s in servers for r in s.received if r]
    assert frames and all(len(r) == 3 and all(g.kind in ("data", "url") for g in r)
                          for r in frames)
    assert sum(len(s.requests) for s in servers) == asked  # the re-run asked nothing
    assert cache.stats().errors == 0 and cache2.stats().misses == 0
    r = sync_redis.RedisCluster(host="127.0.0.1", port=redis_cluster.cluster.nodes[0].port)
    try:
        assert sum(1 for _ in r.scan_iter(match=f"{redis_cluster.prefix}:*")) == \
            cache.stats().writes
    finally:
        r.close()
