"""The OpenAI-compatible agent against a real local HTTP server speaking chat completions
(deterministic answers, injected 503/429 with Retry-After, timeouts, usage) and a real Redis.
The server and its ``chat_server`` fixture live in `vtrm_gate.testing.chat`."""

from __future__ import annotations

import asyncio
import email.utils
import gzip
import json
import logging
import random
import re
import time
import zlib
from typing import Any

import pytest

from vtrm_gate.cache import RedisServer, ResponseCache, scrub_credentials
from vtrm_gate.gate import GateResult, TypePlan, UnitTask, run_gate
from vtrm_gate.llm import (
    ANSWER_PROMPT,
    MCQ,
    AgentEvent,
    LLMAgent,
    LLMInfraError,
    RetryPolicy,
    parse_choice,
    parse_retry_after,
)
from vtrm_gate.testing import ChatServer, Fault, RedisTarget

UNITS = {f"u{i}": MCQ(f"Question {i}: what happens in the clip?",
                      ("a cat", "a dog running across the whole field", "a bird"),
                      "B" if i % 4 else "A")
         for i in range(8)}
FAST = RetryPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=0.05, max_total_s=10.0)


def task(unit: str = "u1", run_id: str = "s1_gate_ocr_base", skill: str = "strategy: longest",
         arm: str = "base") -> UnitTask:
    return UnitTask("OCR", unit, arm, 0, run_id, skill)  # type: ignore[arg-type]


def agent(server: ChatServer, cache: ResponseCache | None = None, **kw: Any) -> LLMAgent:
    kw.setdefault("retry", FAST)
    kw.setdefault("rng", random.Random(0))
    return LLMAgent(UNITS, base_url=server.url, model="test-model", cache=cache, **kw)


def infer(a: LLMAgent, *tasks: UnitTask) -> list[Any]:
    async def go() -> list[Any]:
        try:
            return [await a.infer(t) for t in tasks]
        finally:
            await a.aclose()

    return asyncio.run(go())


# ---- parsing --------------------------------------------------------------------------


@pytest.mark.parametrize("text, letter", [
    ("B", "B"), ("(C)", "C"), ("b.", "B"), ("A) a cat", "A"), ("The answer is (B).", "B"),
    ("Answer: C", "C"), ("**B**", "B"), ("answer is b", "B"), ("A good guess is hard", None),
    ("I cannot decide.", None), ("", None), ("E", None), ("Answer: E", None),
])
def test_parse_choice(text: str, letter: str | None) -> None:
    assert parse_choice(text, 4) == letter


def test_mcq_is_validated() -> None:
    assert MCQ("q", ("x", "y"), "b").answer == "B"
    with pytest.raises(ValueError, match="answer"):
        MCQ("q", ("x", "y"), "C")
    with pytest.raises(ValueError, match="options"):
        MCQ("q", ("x",), "A")


def test_retry_after_parsing() -> None:
    assert parse_retry_after("2") == 2.0 and parse_retry_after(None) is None
    assert parse_retry_after("soon") is None and parse_retry_after("0.3") == 0.3
    # not a delay: the usual backoff, where each had meant "retry at once" (h16)
    for v in ("-5", "nan", "inf", "1_0", "1e400", "Wed, 21 Oct 2015 07:28:00 GMT"):
        assert parse_retry_after(v) is None, v
    assert parse_retry_after("9" * 30) == 1e18  # past any deadline: the call gives up
    ahead = parse_retry_after(email.utils.formatdate(time.time() + 30, usegmt=True))
    assert ahead is not None and 20 < ahead <= 30


def test_an_asctime_retry_after_is_gmt_whatever_the_local_zone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its form carries no zone and was read as local time: 60 s ahead read as 18,059 s in
    New York (h18)."""
    asctime = time.strftime("%a %b %d %H:%M:%S %Y", time.gmtime(time.time() + 60))
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        ahead = parse_retry_after(asctime)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert ahead is not None and 50 < ahead <= 60


# ---- answering ------------------------------------------------------------------------


def test_agent_answers_in_two_steps_with_the_skill_as_instructions(
        chat_server: ChatServer) -> None:
    [res] = infer(agent(chat_server), task("u1"))
    assert (res.correct, res.infra, res.cached, res.prediction) == (True, False, False, "B")
    assert chat_server.steps() == ["think", "answer"]
    first, second = chat_server.requests
    assert first["messages"][0]["role"] == "system"
    assert "strategy: longest" in first["messages"][0]["content"]
    assert second["messages"][:2] == first["messages"][:2]  # the answer step extends it
    assert second["messages"][-1]["content"] == ANSWER_PROMPT
    assert first["model"] == "test-model" and first["temperature"] == 0.0


def test_tokens_come_from_usage(chat_server: ChatServer) -> None:
    [res] = infer(agent(chat_server), task("u1"))
    assert res.tokens == sum(s["tokens"] for s in res.trace["steps"]) > 0
    assert res.latency_s > 0


def test_single_step_agent(chat_server: ChatServer) -> None:
    [res] = infer(agent(chat_server, think=False), task("u0", skill="plain"))
    assert (res.correct, res.prediction) == (True, "A") and chat_server.steps() == ["answer"]


def test_api_key_is_sent_and_never_shown(chat_server: ChatServer) -> None:
    a = LLMAgent.from_env(UNITS, {"OPENAI_API_KEY": "sk-secret", "VTRM_MODEL": "m",
                                  "VTRM_BASE_URL": chat_server.url}, retry=FAST)
    infer(a, task())
    assert chat_server.auth == ["Bearer sk-secret"] * 2
    assert "sk-secret" not in repr(a)
    with pytest.raises(ValueError, match="model"):
        LLMAgent.from_env(UNITS, {})


# ---- through the cache ----------------------------------------------------------------


def test_replay_in_the_same_run_is_served_from_the_cache(chat_server: ChatServer,
                                                         redis_target: RedisTarget) -> None:
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
    first, second = infer(agent(chat_server, cache), task(), task())
    assert len(chat_server.requests) == 2
    assert second.cached and second.tokens == 0 and second.prediction == first.prediction
    assert cache.stats("s1_gate_ocr_base").hits == 2


def test_a_new_run_id_makes_fresh_calls(chat_server: ChatServer,
                                        redis_target: RedisTarget) -> None:
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
    infer(agent(chat_server, cache), task(run_id="s1_gate_ocr_base"),
          task(run_id="s2_gate_ocr_base"))
    assert len(chat_server.requests) == 4


def test_each_request_names_its_run_so_one_body_under_two_keys_is_told_apart(
        chat_server: ChatServer, redis_target: RedisTarget) -> None:
    """The rollout and a gate arm send the same body under their own keys: the X-Vtrm-Run
    header (%-encoded, never part of the key) tells a server which call each is."""
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
    odd = "e1_s1_rollout_naïve/x y"
    infer(agent(chat_server, cache), task(run_id=odd), task(run_id="e1_s1_gate_ocr_base"),
          task(run_id=odd))
    assert chat_server.requests[:2] == chat_server.requests[2:]  # one body, two keys
    assert chat_server.run_ids == [odd, odd, "e1_s1_gate_ocr_base", "e1_s1_gate_ocr_base"]
    assert cache.stats(odd).hits == 2  # the third task: served, nothing sent
    chat_server.requests.clear()
    chat_server.run_ids.clear()
    infer(agent(chat_server), task(run_id=odd))  # no cache: still named
    a = agent(chat_server, think=False)
    asyncio.run(a.chat(a.body("answer", a.messages(task(), UNITS["u1"]))))  # of no run
    assert chat_server.run_ids == [odd, odd, ""]


def test_replay_reuses_the_longest_cached_prefix(chat_server: ChatServer,
                                                redis_target: RedisTarget) -> None:
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
    chat_server.inject(*[Fault(status=503, step="answer")] * FAST.max_attempts)
    crashed, replay = infer(agent(chat_server, cache), task(), task())
    assert crashed.infra
    assert chat_server.steps() == ["think"] + ["answer"] * (FAST.max_attempts + 1)
    assert [s["source"] for s in replay.trace["steps"]] == ["hit", "miss"]
    assert replay.correct and not replay.cached


def test_concurrent_identical_units_share_one_request(chat_server: ChatServer,
                                                      redis_target: RedisTarget) -> None:
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
    a = agent(chat_server, cache)

    async def go() -> list[Any]:
        try:
            return await asyncio.gather(*(a.infer(task()) for _ in range(5)))
        finally:
            await a.aclose()

    out = asyncio.run(go())
    assert len(chat_server.requests) == 2 and all(r.correct for r in out)


# ---- retries and INFRA ----------------------------------------------------------------


def test_503_with_retry_after_is_retried_after_the_delay(chat_server: ChatServer) -> None:
    events: list[AgentEvent] = []
    chat_server.inject(Fault(status=503, retry_after="0.3"))
    [res] = infer(agent(chat_server, on_event=events.append), task())
    assert res.correct and not res.infra
    retries = [e for e in events if e.kind == "retry"]
    assert len(retries) == 1 and retries[0].status == 503 and retries[0].delay_s == 0.3
    assert retries[0].call_kind == "think" and retries[0].unit_id == "u1"


def test_a_retry_after_past_the_deadline_gives_up_at_once_saying_why(
        chat_server: ChatServer) -> None:
    # A server asking for an hour's wait cannot be honoured within the call's deadline: INFRA
    # after one request, and the reason names Retry-After (not a bare "HTTP 429").
    chat_server.inject(Fault(status=429, retry_after="3600"))
    [res] = infer(agent(chat_server), task())
    assert res.infra and len(chat_server.requests) == 1
    assert "Retry-After 3600s" in res.error and "max_total_s" in res.error


def test_429_is_retried_with_backoff(chat_server: ChatServer) -> None:
    events: list[AgentEvent] = []
    chat_server.inject(Fault(status=429), Fault(status=429))
    [res] = infer(agent(chat_server, on_event=events.append), task())
    assert res.correct and len(chat_server.requests) == 4
    delays = [e.delay_s for e in events if e.kind == "retry"]
    assert len(delays) == 2 and all(0 < d <= FAST.max_delay_s for d in delays)


def test_a_timeout_is_retried(chat_server: ChatServer) -> None:
    chat_server.inject(Fault(sleep=0.6))
    [res] = infer(agent(chat_server, timeout=0.2), task())
    assert res.correct and not res.infra and len(chat_server.requests) == 3


def test_exhausted_retries_are_infra_and_never_cached(chat_server: ChatServer,
                                                      redis_target: RedisTarget) -> None:
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
    events: list[AgentEvent] = []
    chat_server.inject(*[Fault(status=502)] * FAST.max_attempts)
    first, second = infer(agent(chat_server, cache, on_event=events.append), task(), task())
    assert first.infra and "gave up after 4 attempt(s)" in (first.error or "")
    assert "HTTP 502" in (first.error or "") and not first.cached
    assert [e.kind for e in events].count("give_up") == 1
    assert second.correct and not second.cached  # the failure was not cached
    assert cache.stats().writes == 2


def test_total_retry_time_is_capped(chat_server: ChatServer) -> None:
    events: list[AgentEvent] = []
    chat_server.inject(Fault(status=503, retry_after="30"))
    [res] = infer(agent(chat_server, retry=RetryPolicy(max_total_s=5.0),
                        on_event=events.append), task())
    assert res.infra and "gave up after 1 attempt(s)" in (res.error or "")
    assert len(chat_server.requests) == 1
    assert [e.kind for e in events] == ["request", "give_up"]  # never slept 30 s


def test_a_non_retryable_error_is_infra_at_once(chat_server: ChatServer) -> None:
    chat_server.inject(Fault(status=400))
    [res] = infer(agent(chat_server), task())
    assert res.infra and "HTTP 400" in (res.error or "") and len(chat_server.requests) == 1


def test_unreachable_endpoint_is_infra(chat_server: ChatServer) -> None:
    a = LLMAgent(UNITS, base_url="http://127.0.0.1:9/v1", model="m", retry=FAST)
    [res] = infer(a, task())
    assert res.infra and "ConnectError" in (res.error or "")


def test_a_garbled_body_is_retried(chat_server: ChatServer) -> None:
    chat_server.inject(Fault(body="<html>bad gateway</html>"))
    [res] = infer(agent(chat_server), task())
    assert res.correct and len(chat_server.requests) == 3


def test_empty_choices_are_infra_and_not_cached(chat_server: ChatServer,
                                                redis_target: RedisTarget) -> None:
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
    res, again = infer(agent(chat_server, cache), task(skill="mode: empty"),
                       task(skill="mode: empty"))
    assert res.infra and again.infra and "empty choices" in (res.error or "")
    assert len(chat_server.requests) == 2 and cache.stats().writes == 0


@pytest.mark.parametrize("mode, why", [("mode: filter", "content filtered"),
                                       ("mode: ramble", "unparseable answer")])
def test_unusable_answers_are_wrong_and_a_rerun_replays_them_with_zero_requests(
        chat_server: ChatServer, redis_target: RedisTarget, mode: str, why: str) -> None:
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
    [res] = infer(agent(chat_server, cache), task(skill=mode))
    assert not res.infra and not res.correct and res.prediction is None
    assert why in (res.error or "") and not res.cached
    assert chat_server.steps() == ["think", "answer"] and cache.stats().writes == 2
    rerun_cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
    [again] = infer(agent(chat_server, rerun_cache), task(skill=mode))
    assert len(chat_server.requests) == 2  # the re-run made zero HTTP requests
    assert (again.correct, again.infra, again.prediction, again.error) == \
        (res.correct, res.infra, res.prediction, res.error) and again.cached


def test_a_rerun_with_the_same_cache_replays_every_outcome_exactly(
        chat_server: ChatServer, redis_target: RedisTarget) -> None:
    skills = ["strategy: longest", "mode: ramble", "strategy: last", "mode: filter", "plain"]
    tasks = [task(f"u{i}", skill=sk) for i in range(8) for sk in skills]
    first = infer(agent(chat_server, ResponseCache(redis_target.url,
                                                   prefix=redis_target.prefix)), *tasks)
    n = len(chat_server.requests)
    again = infer(agent(chat_server, ResponseCache(redis_target.url,
                                                   prefix=redis_target.prefix)), *tasks)
    assert len(chat_server.requests) == n == 2 * len(tasks)
    outcome = [(r.correct, r.infra, r.prediction, r.error) for r in first]
    assert [(r.correct, r.infra, r.prediction, r.error) for r in again] == outcome
    assert all(r.cached for r in again)


# ---- malformed and oversized responses ------------------------------------------------

VALID = ('{"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant",'
         ' "content": "B"}}], "usage": {"total_tokens": %s}%s}')


@pytest.mark.parametrize("body, reason", [
    (VALID % ("NaN", ""), "non-finite number NaN"),
    (VALID % ("-Infinity", ""), "non-finite number -Infinity"),
    (VALID % ("1", ', "extra": [1, Infinity]'), "non-finite number Infinity"),
    # a number past every float: it had been accepted, never cached, and served by the
    # cached client as invalid JSON (h16); now malformed, like NaN
    (VALID % ("1", ', "created": 1e999'), "non-finite number 1e999"),
    ("[" * 200_000 + "]" * 200_000, "nested too deeply"),
    (VALID % ("1", ', "extra": ' + "[" * 200_000 + "]" * 200_000), "nested too deeply"),
])
def test_a_malformed_200_is_infra_with_its_reason_never_an_exception(
        chat_server: ChatServer, redis_target: RedisTarget, body: str, reason: str) -> None:
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
    chat_server.inject(*[Fault(body=body)] * FAST.max_attempts)
    [res] = infer(agent(chat_server, cache, think=False), task())
    assert res.infra and reason in (res.error or "") and "gave up" in (res.error or "")
    assert cache.stats().writes == 0


def test_a_deep_but_parseable_response_never_breaks_the_cache_encoder(
        chat_server: ChatServer, redis_target: RedisTarget) -> None:
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
    deep = VALID % ("1", ', "extra": ' + "[" * 990 + "]" * 990)
    chat_server.inject(Fault(body=deep))

    async def go() -> Any:  # a deeper call stack than a bare asyncio.run
        a = agent(chat_server, cache, think=False)

        async def nest(k: int) -> Any:
            return await (nest(k - 1) if k else a.infer(task()))

        try:
            return await nest(40)
        finally:
            await a.aclose()

    res = asyncio.run(go())
    assert not res.infra or "nested too deeply" in (res.error or "")


def test_no_semaphore_of_its_own(chat_server: ChatServer) -> None:
    # Requests wait until 40 are in flight together. The hold's timeout and the call deadline
    # are generous safety nets only (a loaded 2-core machine can take seconds to open 40
    # connections); the assertion is on the peak the server saw, never on time.
    chat_server.hold_until(40, timeout=120)
    a = agent(chat_server, think=True, retry=RetryPolicy(max_attempts=4, base_delay_s=0.01,
                                                         max_delay_s=0.05, max_total_s=300.0))
    tasks = [task(f"u{i % 8}", run_id=f"r{i}") for i in range(40)]

    async def go() -> list[Any]:
        try:
            return await asyncio.gather(*(a.infer(t) for t in tasks))
        finally:
            await a.aclose()

    results = asyncio.run(go())
    assert chat_server.peak_in_flight == 40  # all 40 calls overlapped: no hidden cap
    assert not any(r.infra for r in results) and len(chat_server.requests) == 80


# ---- end to end through run_gate ------------------------------------------------------


def gate_plans(step: str) -> list[TypePlan]:
    units = sorted(UNITS)
    return [TypePlan(t, units[k::2], base_skill="plain", cand_skill="strategy: longest",
                     step_run_id=step) for k, t in enumerate(["Counting", "OCR"])]


def run(a: LLMAgent, step: str) -> GateResult:
    # 16 slots = every task of both ladders dispatched at once, and every call finishing (none
    # cancelled past a stop), so the set of calls made does not depend on timing (with fewer
    # slots, a type that freezes early discards a timing-dependent number of in-flight calls).
    async def go() -> GateResult:
        try:
            return await run_gate(gate_plans(step), a.infer, concurrency=16, past_stop="wait",
                                  cancel_after_freeze=False)
        finally:
            await a.aclose()

    return asyncio.run(go())


def test_run_gate_end_to_end_and_a_rerun_hits_the_cache(chat_server: ChatServer,
                                                        redis_target: RedisTarget) -> None:
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
    first = run(agent(chat_server, cache), "step3")
    requests = len(chat_server.requests)
    assert requests == 2 * 16 and first.tokens > 0 and first.peak_in_flight == 16
    rerun = run(agent(chat_server, cache), "step3")  # a crashed step, re-run
    assert len(chat_server.requests) == requests  # every call served by Redis
    assert rerun.decisions() == first.decisions() and rerun.tokens == 0
    assert {o.W for o in rerun.outcomes.values()} == {o.W for o in first.outcomes.values()}
    base = cache.stats("step3_gate_ocr_base")
    assert base.hits > 0 and base.hits == base.misses
    fresh = run(agent(chat_server, cache), "step4")  # a new step: no reuse across steps
    assert len(chat_server.requests) == 2 * requests and fresh.tokens == first.tokens
    assert cache.stats("step4_gate_ocr_base").hits == 0


def test_calls_cancelled_past_a_stop_leave_nothing_cached_and_a_rerun_agrees(
        chat_server: ChatServer, redis_target: RedisTarget) -> None:
    """The defaults (issue 17): calls of a frozen type and calls past every stop are
    cancelled mid-request. The re-run decides the same and asks again exactly for what the
    first run never finished: every completed call is a hit, no cancelled one is."""
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)

    async def go(step: str) -> GateResult:
        a = agent(chat_server, cache)
        try:  # all 16 calls dispatched at once: the same calls start in both runs
            return await run_gate(gate_plans(step), a.infer, concurrency=16)
        finally:
            await a.aclose()

    chat_server.inject(*[Fault(sleep=1.0, step="answer")] * 8)  # half the answers are slow
    first = asyncio.run(go("step5"))
    cancelled = first.total("cancelled_in_flight")
    assert first.total("completed") + cancelled == first.total("started") == 16
    written = cache.stats().writes  # whole responses: think and answer of each call
    assert 2 * first.total("completed") <= written <= 2 * first.total("completed") + cancelled
    misses, before = cache.stats().misses, len(chat_server.requests)
    rerun = asyncio.run(go("step5"))
    assert rerun.decisions() == first.decisions()
    for t, o in rerun.outcomes.items():
        assert o.same_decision(first.outcomes[t])
    asked = cache.stats().misses - misses
    assert asked <= 2 * cancelled  # only what a cancelled call had not finished
    # a miss cancelled again before its request left (its type froze on cached answers)
    assert len(chat_server.requests) - before <= asked


def crash_then_rerun(chat_server: ChatServer, cache: ResponseCache,
                     crash_at: int) -> dict[str, set[tuple[str, str]] | int]:
    """A gate (4 slots, 16 calls, one request each) killed when its ``crash_at``-th request
    is sent, then re-run on the same cache. Which calls completed, were in flight at the
    crash, never started; which calls the re-run sent to the endpoint."""
    started: set[tuple[str, str]] = set()
    done: set[tuple[str, str]] = set()
    sent: list[tuple[str, str]] = []
    chat_server.inject(*[Fault(sleep=0.05)] * 64)  # calls overlap: some are in flight

    async def first() -> None:
        gate: asyncio.Task[GateResult] | None = None
        requests = [0]

        def crash(ev: AgentEvent) -> None:
            requests[0] += ev.kind == "request"
            if ev.kind == "request" and requests[0] == crash_at and gate is not None:
                gate.cancel()  # as a kill: nothing in flight finishes or is cached

        a = agent(chat_server, cache, think=False, on_event=crash)

        async def tracked(task: UnitTask) -> Any:
            started.add((task.run_id, task.unit_id))
            res = await a.infer(task)
            done.add((task.run_id, task.unit_id))
            return res

        gate = asyncio.ensure_future(run_gate(gate_plans("crash"), tracked, concurrency=4))
        try:
            await gate
        except (asyncio.CancelledError, Exception):  # cancelled (or aborted): the crash
            pass
        finally:
            await a.aclose()

    started2: set[tuple[str, str]] = set()

    async def rerun() -> GateResult:
        a = agent(chat_server, cache, think=False,
                  on_event=lambda ev: ev.kind == "request" and sent.append((ev.run_id,
                                                                           ev.unit_id)))

        async def tracked(task: UnitTask) -> Any:
            started2.add((task.run_id, task.unit_id))
            return await a.infer(task)

        try:
            return await run_gate(gate_plans("crash"), tracked, concurrency=4)
        finally:
            await a.aclose()

    asyncio.run(first())
    n_first = len(chat_server.requests)
    asyncio.run(rerun())
    return {"completed": done, "in_flight": started - done, "started": started,
            "rerun_started": started2, "rerun_sent": set(sent), "rerun_requests": len(sent),
            "first_requests": n_first}


@pytest.mark.parametrize("crash_at", [5, 8])
def test_a_rerun_costs_the_calls_in_flight_at_the_crash_plus_the_work_never_started(
        chat_server: ChatServer, redis_target: RedisTarget, crash_at: int) -> None:
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
    m = crash_then_rerun(chat_server, cache, crash_at)
    # 4 slots: a 5th request is only sent after a call completed; the call that sent it is
    # in flight when the crash comes
    assert m["in_flight"] and m["completed"] and m["first_requests"] >= 4
    assert not m["rerun_sent"] & m["completed"]  # nothing completed is asked again
    never_started = m["rerun_started"] - m["started"]
    needed_in_flight = m["in_flight"] & m["rerun_started"]  # a frozen type may not need all
    # A call in flight at the crash may already have written its answer to Redis (the write
    # reached the server, the cancellation came before the call returned): then the re-run
    # gets it for free. Everything else in flight, and all work never started, is sent once.
    assert never_started <= m["rerun_sent"] <= needed_in_flight | never_started
    assert m["rerun_requests"] == len(m["rerun_sent"])


def test_redis_outage_mid_step_then_recovery(chat_server: ChatServer,
                                            fresh_redis_server: RedisServer,
                                            caplog: pytest.LogCaptureFixture) -> None:
    server = fresh_redis_server
    cache = ResponseCache(server.url, retry_interval=0.05)
    seen = {"n": 0}

    def kill_after_some(ev: AgentEvent) -> None:
        seen["n"] += ev.kind == "request"
        if seen["n"] == 6 and server.running:
            server.kill()

    with caplog.at_level(logging.WARNING, "vtrm_gate.cache"):
        healthy = run(agent(chat_server, ResponseCache(server.url)), "ref")
        chat_server.requests.clear()
        during = run(agent(chat_server, cache, on_event=kill_after_some), "step5")
        assert not server.running
        assert during.decisions() == healthy.decisions()  # correct results, nothing lost
        assert all(c.infra_units == 0 for c in during.counters.values())
        assert cache.stats().errors >= 1 and cache.stats().bypassed > 0
        server.start()
        time.sleep(0.06)
        again = run(agent(chat_server, cache), "step5")
        assert cache.stats().writes > 0
        replay = run(agent(chat_server, cache), "step5")
    unavailable = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(unavailable) == 1
    assert again.decisions() == replay.decisions() == healthy.decisions()
    assert replay.tokens == 0  # caching resumed after the restart


def test_retrying_state_shows_in_the_gates_event_stream(chat_server: ChatServer) -> None:
    """An agent retrying a 503 reports it through `report_progress`: the gate publishes a
    `TaskProgress` event for that very task (outside a gate the call is a no-op)."""
    from vtrm_gate import TaskProgress, report_progress

    assert report_progress("retrying") is False  # no gate running here
    chat_server.inject(Fault(status=503, retry_after="0"))
    events: list[TaskProgress] = []

    async def go() -> GateResult:
        a = agent(chat_server)
        try:
            return await run_gate(gate_plans("step9"), a.infer, concurrency=1,
                                  subscribers=[lambda ev: isinstance(ev, TaskProgress)
                                               and events.append(ev)])
        finally:
            await a.aclose()

    asyncio.run(go())
    assert len(events) == 1
    ev = events[0]
    assert ev.status == "retrying" and ev.info["status"] == 503 and ev.info["attempt"] == 1
    assert ev.task.arm == "base" and ev.task.ladder_rank == 0  # the first call made


# ---- secrets --------------------------------------------------------------------------

SECRET = "sk-test-0123456789abcdefSECRET"


@pytest.mark.parametrize("status", [401, 503])
def test_an_echoed_api_key_is_scrubbed_from_every_error_text(
        chat_server: ChatServer, caplog: pytest.LogCaptureFixture, status: int) -> None:
    events: list[AgentEvent] = []
    chat_server.inject(*[Fault(status=status, echo_auth=True)] * FAST.max_attempts)
    a = agent(chat_server, api_key=SECRET, on_event=events.append)
    with caplog.at_level(logging.DEBUG):
        [res] = infer(a, task())
    assert res.infra and f"HTTP {status}" in (res.error or "")
    texts = [res.error or "", *(e.error or "" for e in events), caplog.text, repr(res)]
    assert chat_server.auth[0] == f"Bearer {SECRET}"
    for text in texts:
        assert SECRET not in text and "Bearer sk-" not in text


def test_chat_raises_with_the_key_scrubbed(chat_server: ChatServer) -> None:
    chat_server.inject(Fault(status=401, echo_auth=True))
    a = agent(chat_server, api_key=SECRET)

    async def go() -> str:
        try:
            await a.chat({"model": "m", "messages": [{"role": "user", "content": "q"}]})
        except LLMInfraError as exc:
            return str(exc)
        finally:
            await a.aclose()
        return ""

    text = asyncio.run(go())
    assert "HTTP 401" in text and "invalid credentials" in text and SECRET not in text


@pytest.mark.parametrize("text", [
    f"Authorization: Bearer {SECRET}", f'{{"authorization": "Bearer {SECRET}"}}',
    f"api-key={SECRET}", f"'api-key': '{SECRET}'", f"x-api-key: {SECRET} more",
    f"a token: Bearer {SECRET[::-1]}.", f"url?api-key={SECRET}&x=1",
])
def test_scrub_credentials_removes_header_values_and_the_key(text: str) -> None:
    out = scrub_credentials(text, [SECRET])
    assert SECRET not in out and SECRET[::-1] not in out and "***" in out


def _b64(text: str) -> str:
    import base64

    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize("form", [
    _b64(SECRET), _b64(SECRET).rstrip("="), _b64(f"Bearer {SECRET}"), _b64(f"user:{SECRET}"),
    _b64(f"xx{SECRET}yy").replace("+", "-").replace("/", "_"),
    "".join(f"%{b:02X}" for b in SECRET.encode()), "".join(f"%{b:02x}" for b in SECRET.encode()),
    SECRET[::-1]])
def test_encoded_and_reversed_copies_of_a_secret_are_scrubbed(form: str) -> None:
    # Issue 27 #14: a base64, %-encoded or reversed copy of the key in an error body passed
    import base64

    out = scrub_credentials(f"upstream said: {form}.", [SECRET])
    assert "***" in out and SECRET not in out and SECRET[::-1] not in out
    for k in range(3):  # nothing of the key's base64 left, at whatever offset it started
        core = base64.b64encode(b"\0" * k + SECRET.encode()).decode()[4 if k else 0:24]
        assert core not in out and core.replace("+", "-").replace("/", "_") not in out


def test_an_echoed_key_in_a_200_reply_never_reaches_the_result(chat_server: ChatServer,
                                                                redis_target: RedisTarget
                                                                ) -> None:
    # Issue 27 #2: the agent scrubs every reply (a 200 too) before it is parsed or cached
    chat_server.echo = lambda auth: f" (request was signed with {auth}; {_b64(SECRET)})"
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
    [res] = infer(agent(chat_server, cache=cache, api_key=SECRET), task())
    assert res.prediction == "B" and res.correct
    text = json.dumps(res.trace)
    assert "signed with Bearer ***; ***" in text and SECRET not in text
    assert _b64(SECRET).rstrip("=") not in text


def _escaped(text: str, every: int = 1, upper: bool = False) -> str:
    """``text`` as JSON spells it with every ``every``-th character ``\\u``-escaped."""
    return "".join((f"\\u{ord(c):04X}" if upper else f"\\u{ord(c):04x}") if i % every == 0
                   else c for i, c in enumerate(text))


@pytest.mark.parametrize("form", [
    _escaped(SECRET), _escaped(SECRET, upper=True), _escaped(SECRET, 2),
    _escaped(SECRET, 3, upper=True), SECRET[:5] + _escaped(SECRET[5]) + SECRET[6:],
    _escaped(SECRET, 2).replace("\\", "\\\\"),  # escaped twice: JSON inside JSON
    SECRET.encode().hex(), SECRET.encode().hex().upper()])
def test_json_escaped_and_hex_copies_of_a_secret_are_scrubbed(form: str) -> None:
    # Issue 27: a \u-escaped (any mix of escaped and plain characters, hex digits in
    # either case) or hex copy of the key passed the scrubber
    out = scrub_credentials(f'upstream said: "{form}" and caf\\u00e9.', [SECRET])
    assert out == 'upstream said: "***" and caf\\u00e9.', out


def test_json_short_escapes_and_surrogate_pairs_of_a_secret_are_scrubbed() -> None:
    slash, emoji = "tok/planted/4711", "\U0001F600-planted-key"
    text = ("tok\\/planted\\u002F4711 and "
            "\\ud83d\\uDE00-planted-\\u006bey; 0123 \\/ \\ud83d.")
    assert scrub_credentials(text, [slash, emoji]) == "*** and ***; 0123 \\/ \\ud83d."


@pytest.mark.parametrize("key", ["x", "sk", "local", "1234567"])
def test_a_short_key_is_scrubbed_as_a_whole_token_only(key: str) -> None:
    text = (f"This model's maximum context length is 2048 tokens; sk-x1 local-model 1234567890. "
            f"Authorization: Bearer {key}; the key was {key}.")
    out = scrub_credentials(text, [key])
    assert "maximum context length" in out and "sk-x1 local-model 1234567890" in out
    assert out.endswith("Authorization: Bearer ***; the key was ***.")


def test_a_short_key_leaves_the_error_text_readable(chat_server: ChatServer) -> None:
    chat_server.inject(Fault(status=401, message="invalid key x: expected the maximum "
                                                 "prefix 'sk-' (check the proxy)"))
    [res] = infer(agent(chat_server, api_key="x", think=False), task())
    assert res.infra and "expected the maximum prefix 'sk-'" in (res.error or "")
    assert "invalid key ***:" in (res.error or "")  # the key itself, a whole token, is hidden


def test_a_trickled_body_hits_the_call_deadline_and_the_connection_is_closed(
        chat_server: ChatServer) -> None:
    # 1 byte/s: every read gets a byte within the 5 s read timeout, only the deadline ends it
    chat_server.inject(*[Fault(trickle_s=1.0)] * 4)
    policy = RetryPolicy(max_attempts=4, base_delay_s=0.01, max_total_s=1.0)
    [res] = infer(agent(chat_server, think=False, timeout=5.0, retry=policy), task())
    assert res.infra and "deadline of 1s" in (res.error or "")
    assert chat_server.client_left.wait(10)  # the server saw the connection closed
    assert len(chat_server.requests) == 1  # the deadline covers the attempt and every retry
    assert chat_server.body_bytes_sent < 10  # abandoned near the deadline, not read on


def test_a_huge_chunked_body_is_aborted_at_the_size_cap(chat_server: ChatServer) -> None:
    cap = 1 << 20
    chat_server.inject(Fault(chunked_bytes=600 << 20))
    [res] = infer(agent(chat_server, think=False, max_response_bytes=cap), task())
    assert res.infra and f"larger than max_response_bytes={cap}" in (res.error or "")
    read = int(re.search(r"aborted after (\d+) bytes", res.error or "")[1])
    assert cap < read <= cap + (64 << 10) + 16  # stops within one chunk of the cap
    assert chat_server.client_left.wait(10)
    assert chat_server.body_bytes_sent < 64 << 20  # the server was stopped, far from 600 MB
    assert len(chat_server.requests) == 1  # too large is not retried


def test_a_gzip_encoded_completion_is_decoded_under_the_cap(chat_server: ChatServer) -> None:
    chat_server.inject(Fault(gzip=True))
    [res] = infer(agent(chat_server, think=False), task())
    assert res.correct and not res.infra and len(chat_server.requests) == 1


def _zeros_gzip(n: int) -> bytes:
    """gzip of ``n`` zero bytes, made a MiB at a time."""
    c = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    return b"".join([*(c.compress(bytes(1 << 20)) for _ in range(n >> 20)), c.flush()])


BOMB = gzip.compress(_zeros_gzip(64 << 20))
"""A 64 MiB body in ~1 KB: two gzip layers (``Content-Encoding: gzip, gzip``)."""


def test_stacked_gzip_is_decoded_under_the_cap_not_after_it(chat_server: ChatServer) -> None:
    """httpx undoes each network chunk whole and stacked codings multiply: a 1,827-byte
    reply became 1 GiB in one chunk before the 1 MiB cap saw it (2 GiB of RSS)."""
    cap = 1 << 20
    chat_server.inject(Fault(raw=BOMB, encoding="gzip, gzip"))
    [res] = infer(agent(chat_server, think=False, max_response_bytes=cap), task())
    assert res.infra and f"max_response_bytes={cap} (decoding gzip passed {cap + 1} bytes)" \
        in (res.error or "")
    assert len(chat_server.requests) == 1  # too large is not retried


@pytest.mark.parametrize("raw, encoding, why", [
    (b'{"id": "x", "choices": []}', "gzip", "not valid gzip"),
    (gzip.compress(b'{"id": "x", "choices": []}', mtime=0)[:-12], "gzip",
     "gzip body is cut short"),
    (b"{}", "br", "Content-Encoding br is not supported"),
], ids=["plain", "cut", "br"])
def test_a_body_that_is_not_what_its_encoding_says_is_infra_not_a_crash(
        chat_server: ChatServer, raw: bytes, encoding: str, why: str) -> None:
    """A proxy labelling plain JSON gzip raised httpx.DecodingError out of `infer`: the
    step ended "this is a bug in vtrm_gate"."""
    chat_server.inject(*[Fault(raw=raw, encoding=encoding)] * 2)
    policy = RetryPolicy(max_attempts=2, base_delay_s=0.01)
    [res] = infer(agent(chat_server, think=False, retry=policy), task())
    assert res.infra and why in (res.error or "")
    assert len(chat_server.requests) == 2  # a mislabelled body is retried like a torn one


def test_the_agent_accepts_only_the_encodings_it_decodes(chat_server: ChatServer) -> None:
    [res] = infer(agent(chat_server, think=False), task())
    assert res.correct
    assert chat_server.accept_encoding == ["gzip, deflate"]


def test_the_deadline_and_the_size_cap_are_validated() -> None:
    with pytest.raises(ValueError, match="max_total_s"):
        RetryPolicy(max_total_s=0)
    with pytest.raises(ValueError, match="max_response_bytes"):
        LLMAgent(UNITS, base_url="http://127.0.0.1:9/v1", model="m", max_response_bytes=0)


def test_a_declared_content_length_over_the_cap_is_refused_before_reading(
        chat_server: ChatServer) -> None:
    chat_server.inject(Fault(trickle_s=0.05))  # declares 1,000,000 bytes
    [res] = infer(agent(chat_server, think=False, max_response_bytes=1000), task())
    assert res.infra and "Content-Length 1000000" in (res.error or "")
    assert chat_server.body_bytes_sent <= 2
