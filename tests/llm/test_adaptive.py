"""Adaptive per-endpoint concurrency: the gradient limiter against modelled servers (one slot,
four slots, unbounded; a discrete-event model, no clock), its back-off and probe, and the
whole path against a real single-slot loopback server, where the gate (not the agent) holds
back the calls the server would only queue."""

from __future__ import annotations

import asyncio
import heapq
import json
import random
import statistics
from typing import Any

import pytest

from vtrm_gate.gate import GateResult, TypePlan, run_gate
from vtrm_gate.llm import MCQ, GradientLimit, LLMAgent, RetryPolicy
from vtrm_gate.stats import GateParams
from vtrm_gate.testing import Fault
from vtrm_gate.testing.farm import SingleSlotChatServer


def closed_loop(slots: int, n: int = 3000, max_limit: int = 32,
                seed: int = 0) -> tuple[float, float, GradientLimit]:
    """A server with ``slots`` FIFO slots fed as many calls as the limiter allows; each
    task is a think call (20-300 tokens) then an answer call (1-10 tokens), service time
    0.4 s + 16 ms per token, like SmolLM2 on one CPU thread. Returns (the second half's
    throughput / the server's capacity, mean limit over the second half, the limiter)."""
    rng = random.Random(seed)
    now = [0.0]
    lim = GradientLimit(max_limit, clock=lambda: now[0])
    events: list[tuple[float, int]] = []
    queue: list[int] = []
    info: dict[int, tuple[str, float, int, float, int]] = {}
    busy = in_flight = sent = done = 0
    answers_due = 0
    limits: list[int] = []
    work = half_time = half_work = 0.0

    def send(kind: str) -> None:
        nonlocal busy, in_flight, sent
        tokens = rng.randint(20, 300) if kind == "think" else rng.randint(1, 10)
        in_flight += 1
        info[sent] = (kind, now[0], in_flight, 0.4 + 0.016 * tokens, tokens)
        if busy < slots:
            busy += 1
            heapq.heappush(events, (now[0] + info[sent][3], sent))
        else:
            queue.append(sent)
        sent += 1

    while done < n:
        while in_flight < lim.limit:
            if answers_due:
                answers_due -= 1
                send("answer")
            else:
                send("think")
        now[0], rid = heapq.heappop(events)
        kind, t0, n_sent, service, tokens = info.pop(rid)
        work += service
        busy -= 1
        if queue:
            nxt = queue.pop(0)
            busy += 1
            heapq.heappush(events, (now[0] + info[nxt][3], nxt))
        in_flight -= 1
        lim.on_answer(kind, now[0] - t0, tokens, n_sent, in_flight)
        answers_due += kind == "think"
        limits.append(lim.limit)
        done += 1
        if done == n // 2:
            half_time, half_work = now[0], work
    # the second half's throughput over the server's capacity (calls/s, every slot busy)
    capacity = min(slots, max_limit) * (done - n // 2) / (work - half_work)
    tail = limits[len(limits) // 2:]
    return (done - n // 2) / (now[0] - half_time) / capacity, sum(tail) / len(tail), lim


@pytest.mark.parametrize("seed", [0, 1])
def test_one_slot_server_is_kept_busy_with_a_short_queue(seed: int) -> None:
    use, mean_limit, _ = closed_loop(1, seed=seed)
    assert use > 0.98  # the server never idles
    assert mean_limit < 3.5  # ~1-2 waiting at the server, not 31


def test_four_slot_server_is_kept_busy_without_a_long_queue() -> None:
    use, mean_limit, _ = closed_loop(4)
    assert use > 0.97 and 4 <= mean_limit < 10


def test_an_unbounded_server_gets_every_slot() -> None:
    use, mean_limit, lim = closed_loop(10_000)
    assert lim.limit == 32 and mean_limit > 31 and use > 0.97


def test_overload_halves_the_limit_once_per_round_trip() -> None:
    now = [0.0]
    lim = GradientLimit(32, clock=lambda: now[0])
    lim.estimate = 16.0
    now[0] = 10.0
    lim.on_overload(sent_at=9.0)
    lim.on_overload(sent_at=9.5)  # sent before the cut: the same congestion, no second cut
    assert (lim.limit, lim.decreases) == (8, 1)
    lim.on_overload(sent_at=10.5)  # sent after the cut: a new signal
    assert (lim.limit, lim.decreases) == (4, 2)
    for _ in range(5):
        lim.on_overload(sent_at=now[0] + 1)
        now[0] += 2
    assert lim.limit == 1  # never below 1


def test_a_probe_is_asked_for_when_no_request_was_alone_for_long() -> None:
    lim = GradientLimit(32)
    lim.estimate = 4.0
    answers = 0
    while not lim.probing and answers < 10_000:  # never alone: 4 in flight at each send
        lim.on_answer("think", 1.0, 10, 4, 3)
        answers += 1
    assert lim.probing and lim.limit == 1 and answers <= 50 * 8
    lim.on_answer("think", 0.3, 10, 1, 0)  # the lone request: the no-load latency
    assert not lim.probing and lim.no_load("think") == pytest.approx(0.3 / (1 + 10 / 32))


PATIENT = GateParams(e_confirm=1e9, e_reject=1e9, e_provisional=1.0, w_net_min_provisional=0)
UNITS = {f"u{i}": MCQ(f"Question {i}?", ("a cat", "a dog", "a bird"), "A") for i in range(40)}


def gate_over(server: SingleSlotChatServer, *, adaptive: bool, units: int = 20,
              **kw: Any) -> tuple[GateResult, LLMAgent]:
    agent = LLMAgent(UNITS, base_url=server.url, model="m", think=False, adaptive=adaptive,
                     retry=RetryPolicy(max_attempts=4, base_delay_s=0.01, max_total_s=60),
                     rng=random.Random(0), **kw)
    plans = [TypePlan("OCR", [f"u{i}" for i in range(units)], "skill", "skill 2")]

    async def go() -> GateResult:
        try:
            return await run_gate(plans, agent, PATIENT, concurrency=32)
        finally:
            await agent.aclose()

    return asyncio.run(go()), agent


def test_against_a_single_slot_server_the_gate_holds_back_what_would_only_queue() -> None:
    # 50 ms a request: a loaded client still sends its 32 faster than the server answers
    # them (at 20 ms, load ~20 let only 18-28 of 32 queue: issue 27 row 18)
    with SingleSlotChatServer(service_s=0.05) as fixed_server:
        fixed, _ = gate_over(fixed_server, adaptive=False)
    with SingleSlotChatServer(service_s=0.05) as server:
        res, agent = gate_over(server, adaptive=True)
    # the control: without the limit most of the 32 slots' requests wait at the server
    assert fixed.peak_in_flight == 32
    assert fixed_server.peak_waiting >= fixed.peak_in_flight // 2
    # With it, the queue a request finds is a quarter of the control's or less, on average
    # over the 40 requests (measured side by side: 1.4-2.9 against 18.6 on a quiet
    # machine). The peaks are bounded loosely: a fixed `<= 5` in flight failed at load ~10
    # and a quarter of the slots at load ~20, before the limit had followed the latencies.
    assert statistics.mean(server.queued_on_arrival) \
        <= statistics.mean(fixed_server.queued_on_arrival) / 4
    assert res.peak_in_flight <= fixed.peak_in_flight // 2
    assert res.outcomes["OCR"].n_used == fixed.outcomes["OCR"].n_used == 20
    [st] = agent.pool.stats()
    assert st.limit is not None and 1 <= st.limit <= fixed.peak_in_flight // 4
    assert st.errors == 0


@pytest.mark.parametrize("status", [429, 503, 529])
def test_overload_statuses_cut_the_limit_and_it_grows_back(status: int) -> None:
    """429, 503 and 529 (overloaded: Anthropic's, and gateways') each say "fewer at once"."""
    with SingleSlotChatServer(service_s=0.0) as server:
        server.inject(*[Fault(status=status, retry_after="0")] * 6)
        res, agent = gate_over(server, adaptive=True, units=40)
    [st] = agent.pool.stats()
    assert st.limit_cuts >= 1 and res.outcomes["OCR"].n_used == 40


def test_rollout_and_evolver_calls_wait_for_room_before_their_deadline_starts(
        tmp_path: Any, redis_target: Any) -> None:
    from tests.llm.test_backends import evolve_reply, write_units
    from vtrm_gate.cache import ResponseCache
    from vtrm_gate.llm import init_llm, llm_backend, rollout_cases
    from vtrm_gate.options import RunOptions

    with SingleSlotChatServer(service_s=0.03, evolve_reply=evolve_reply) as server:
        ws = init_llm(tmp_path / "ws", write_units(tmp_path / "u.jsonl"),
                      base_url=server.url, model="m", seed=1)
        # 32 rollout units (64 calls, ~2 s on one slot) against a 1 s deadline per call:
        # waiting for the endpoint must not eat a call's deadline
        backend = llm_backend(ws, RunOptions(deadline=1.0), env={},
                              cache=ResponseCache(redis_target.url, prefix=redis_target.prefix))

        async def go() -> Any:
            try:
                cases = await rollout_cases(backend, ws, 1, 1)
                evolved = await asyncio.gather(*(
                    backend.evolver.evolve(t, ws.skill_text(t), [], 1, 1)
                    for t in ("Action Reasoning", "Counting Problem")))
                return cases, evolved
            finally:
                await backend.aclose()

        cases, evolved = asyncio.run(go())
    assert all(isinstance(c, list) for c in cases.values())  # no rollout_error
    # no request waited at the server as long as a call's 1 s deadline (measured; 64 calls
    # sent at once would queue ~1.9 s): a fixed `peak_waiting <= 4` is load-sensitive
    assert len(evolved) == 2 and server.peak_wait_s < 1.0


def test_attempt_timeouts_follow_the_observed_latency_and_the_reply_budget() -> None:
    import httpx

    from vtrm_gate.llm import Endpoint, EndpointPool, Exchange

    url = "http://127.0.0.1:9/v1"
    pool = EndpointPool([Endpoint(url, 4)])
    assert pool.attempt_timeout(url, "think", 60.0, 2048) == 60.0  # nothing seen: the floor
    state = pool._states[0]
    for _ in range(10):  # think replies of 32 tokens in 2 s: 1 s per prefill-equivalent
        state.in_flight += 1
        pool._settle(state, state.generation, Exchange(httpx.Response(200), url, 2.0, "ok", 32),
                     "think", 1, 0.0)
        state.in_flight -= 1
    assert pool.attempt_timeout(url, "think", 1.0) == pytest.approx(6.0)  # 3 x p95
    assert pool.attempt_timeout(url, "think", 60.0) == 60.0  # never below the floor
    # an evolver reply of up to 2048 tokens: 2 x 1 s x (1 + 2048 / 32)
    assert pool.attempt_timeout(url, "evolve", 60.0, 2048) == pytest.approx(130.0)
    assert pool.attempt_timeout(url, "evolve", 60.0) == 60.0


def test_a_default_step_on_a_slow_single_slot_server_completes_and_its_rerun_asks_nothing(
        tmp_path: Any, redis_target: Any) -> None:
    """The issue's storm, scaled down: 32 slots queue ~32 x 0.15 s = 4.8 s at a one-slot
    server, past a 3 s attempt timeout; the adaptive limit keeps the queue short."""
    from tests.llm.test_backends import cli, evolve_reply, write_units
    from vtrm_gate._ids import canonical_json

    with SingleSlotChatServer(service_s=0.15, evolve_reply=evolve_reply) as server:
        units = write_units(tmp_path / "units.jsonl")
        assert cli("init", "ws", "--llm", "--units", str(units), "--base-url", server.url,
                   "--model", "m", cwd=tmp_path).returncode == 0
        env = {"REDIS_URL": redis_target.url, "VTRM_CACHE_PREFIX": redis_target.prefix}
        step = ("step", "--workspace", "ws", "--epoch", "1", "--step", "1", "--timeout", "3",
                "--json")
        first = cli(*step, cwd=tmp_path, env=env)
        assert first.returncode == 0, first.stderr[-1500:]
        n = len(server.requests)
        again = cli(*step, cwd=tmp_path, env=env)
        assert again.returncode == 0, again.stderr[-1500:]
    out = json.loads(first.stdout)
    [ep] = out["llm_cache"]["endpoints"]
    assert ep["transport_failures"] == 0 and ep["errors"] == 0  # no timeout, no retry
    # The queue stayed shorter than the 3 s attempt timeout's worth of requests, at the
    # service time measured (issue 27 row 18: a fixed `<= 4` failed at load ~20; 32 slots
    # without the adaptive limit queue 31, 4.65 s at 0.15 s each). Measured, not assumed.
    assert server.peak_wait_s < 3.0
    fits = 3.0 / max(0.15, server.peak_service_s)
    assert server.peak_waiting < fits and out["peak_in_flight"] <= fits + 1
    assert {t["task_type"]: t["action"] for t in out["types"]}["Action Reasoning"] == "ACCEPT"
    done = {canonical_json(b) for b in server.requests[:n]}
    # asked again: only the requests of calls the first run cancelled past a stop (their
    # answers were never stored), at most one request each
    assert len(done & {canonical_json(b) for b in server.requests[n:]}) \
        <= out["cancelled_in_flight"]
    assert decisions(json.loads(again.stdout)) == decisions(out)


def decisions(out: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    """What a step decided per type (its counters of calls differ on a re-run)."""
    return {t["task_type"]: (t["status"], t["action"], t["W"], t["L"], t["n_used"],
                             t["stop_rank"], t["version"]) for t in out["types"]}
