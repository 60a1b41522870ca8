"""Throughput at scale: the scheduler + LLM agent + Redis response cache against a loopback
chat server with a simulated per-call latency, at concurrency 32, 256 and 1024, side by side
with a bare ``httpx`` + ``asyncio.Semaphore`` client making the same calls.

Reports calls/s, the overhead per call of the full path over the bare client (wall time,
median over repeats), and the peak Python memory of one full run (tracemalloc, untimed).
The server is an asyncio HTTP/1.1 keep-alive server in its own process.
Run: ``python -m benchmarks.bench_throughput [--quick]`` (or ``make bench``).
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

from vtrm_gate._reaper import forget, stop_at_exit

from ._common import machine, median_time, parser, print_table

LATENCY_S = 0.02
SINGLE_POOL_MAX = 256
REPLY = {"id": "x", "object": "chat.completion", "model": "bench",
         "choices": [{"index": 0, "finish_reason": "stop",
                      "message": {"role": "assistant", "content": "A"}}],
         "usage": {"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41}}


# ---- the server (its own process) ---------------------------------------------------------


async def _serve(port: int, latency: float) -> None:
    body = json.dumps(REPLY).encode()
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n")

    async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                headers = await reader.readuntil(b"\r\n\r\n")
                n = 0
                for line in headers.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        n = int(line[15:])
                if n:
                    await reader.readexactly(n)
                await asyncio.sleep(latency)
                writer.write(head + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(conn, "127.0.0.1", port, backlog=4096)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


class Server:
    """The chat server process on a free loopback port."""

    def __init__(self, latency: float) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_throughput", "--serve", str(self.port),
             str(latency)], stdout=subprocess.PIPE, text=True)
        self.reaped = stop_at_exit(self.close)  # also on SIGTERM
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        forget(self.reaped)
        self.proc.kill()
        self.proc.wait()


# ---- the two clients ----------------------------------------------------------------------


def _body(i: int) -> dict[str, Any]:
    return {"model": "bench", "temperature": 0.0,
            "messages": [{"role": "system", "content": "Answer with one letter."},
                         {"role": "user", "content": f"Question {i}?\n\nA. yes\nB. no"}]}


def bare(url: str, n: int, concurrency: int, sharded: bool = False) -> int:
    """n calls with httpx + asyncio.Semaphore + gather: the floor the full path is held to.

    ``sharded``: the same over `ShardedClient` (pools of 16 connections, like the agent), to
    separate the scheduler + agent + cache overhead from httpcore's pool."""
    import httpx

    from vtrm_gate.llm import ShardedClient

    def client_of(size: int | None) -> httpx.AsyncClient:
        return httpx.AsyncClient(limits=httpx.Limits(max_connections=size,
                                                     max_keepalive_connections=size),
                                 timeout=300)

    async def go() -> int:
        sem = asyncio.Semaphore(concurrency)
        client: Any = ShardedClient(client_of) if sharded else client_of(None)
        try:
            async def one(i: int) -> int:
                async with sem:
                    r = await client.post(url + "/chat/completions", json=_body(i))
                    return len(r.json()["choices"])

            return sum(await asyncio.gather(*(one(i) for i in range(n))))
        finally:
            await client.aclose()

    return asyncio.run(go())


def full(url: str, redis_url: str | None, n: int, concurrency: int) -> int:
    """n calls through run_gate + LLMAgent + ResponseCache (all misses: a fresh prefix)."""
    from vtrm_gate import GateParams, TypePlan, run_gate
    from vtrm_gate.cache import ResponseCache
    from vtrm_gate.llm import MCQ, LLMAgent

    never_stop = GateParams(e_confirm=1e300, e_reject=1e300, e_provisional=1.0,
                            w_net_min_provisional=0, n_max=10**6)
    n_types, per_type = 8, n // 16
    units = {f"T{t}-u{i}": MCQ(f"Question {t}/{i}?", ("yes", "no"), "A")
             for t in range(n_types) for i in range(per_type)}
    plans = [TypePlan(f"T{t}", [f"T{t}-u{i}" for i in range(per_type)], "skill v1",
                      "skill v2") for t in range(n_types)]
    cache = None if redis_url is None else ResponseCache(
        redis_url, prefix=f"bench{uuid.uuid4().hex[:8]}", socket_timeout=30.0)
    agent = LLMAgent(units, base_url=url, model="bench", think=False, cache=cache,
                     api_key="k")

    async def go() -> int:
        try:
            res = await run_gate(plans, agent.infer, never_stop, concurrency)
        finally:
            await agent.aclose()
            if cache is not None:
                await cache.aclose()
        return res.total("completed")

    return asyncio.run(go())


def peak_memory_mb(fn: Any) -> float:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def main(quick: bool = False, only: tuple[int, ...] = ()) -> None:
    from vtrm_gate.cache import RedisServer

    repeats = 1 if quick else 3
    levels = only or ((32, 256) if quick else (32, 256, 1024))
    print(f"machine: {machine()}")
    print(f"simulated latency {LATENCY_S * 1000:.0f} ms per call; medians of {repeats}")
    server = Server(LATENCY_S)
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp), persist=False)
        redis.start()
        rows = []
        try:
            for c in levels:
                n = max(1024, 4 * c) // 16 * 16 if not quick else max(512, 2 * c) // 16 * 16
                bare(server.url, min(n, 512), c)  # warm up connections and imports
                t_bare = float("nan")
                if c <= SINGLE_POOL_MAX:  # beyond, one httpcore pool takes minutes (O(c^2))
                    try:
                        t_bare, got = median_time(lambda c=c, n=n: bare(server.url, n, c),
                                                  repeats)
                        assert got == n
                    except Exception as exc:
                        print(f"bare client at concurrency {c} failed: {type(exc).__name__}")
                t_shard, got = median_time(lambda c=c, n=n: bare(server.url, n, c, True),
                                           repeats)
                assert got == n
                t_nc, got = median_time(lambda c=c, n=n: full(server.url, None, n, c),
                                        repeats)
                assert got == n, got
                t_full, got = median_time(
                    lambda c=c, n=n: full(server.url, redis.url, n, c), repeats)
                assert got == n, got
                mem = peak_memory_mb(lambda c=c, n=n: full(server.url, redis.url, n, c))
                ideal = n * LATENCY_S / c
                rows.append({
                    "concurrency": c, "calls": n,
                    "ideal s": ideal,
                    "bare calls/s": n / t_bare,
                    "bare sharded calls/s": n / t_shard,
                    "gate+agent calls/s": n / t_nc,
                    "gate+agent+cache calls/s": n / t_full,
                    "µs/call vs bare": (t_full - t_bare) / n * 1e6,
                    "µs/call vs sharded (no cache)": (t_nc - t_shard) / n * 1e6,
                    "µs/call vs sharded (cache)": (t_full - t_shard) / n * 1e6,
                    "ratio full/bare": t_full / t_bare,
                    "peak MB (full)": mem,
                })
                print_table(f"concurrency {c}", rows[-1:])
                sys.stdout.flush()
        finally:
            redis.close()
            server.close()
    print_table("Throughput: scheduler + agent + response cache vs bare httpx + Semaphore",
                rows)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--serve":
        asyncio.run(_serve(int(sys.argv[2]), float(sys.argv[3])))
    else:
        ap = parser()
        ap.add_argument("levels", nargs="*", type=int, help="concurrency levels to run")
        args = ap.parse_args()
        t0 = time.perf_counter()
        main(quick=args.quick, only=tuple(args.levels))
        print(f"\n({time.perf_counter() - t0:.0f} s)")
