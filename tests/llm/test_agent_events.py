"""What the agent reports matches what it did (issue 26 #4): every event that ends a call
carries the HTTP status that ended it (a 400 or 401 give-up too, not only retries), and the
step's request count agrees with the endpoints' call count or says what the difference is
(a request cancelled before its reply: sent, but no endpoint counts it)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from vtrm_gate.cli._step import cache_lines
from vtrm_gate.errors import LLMInfraError
from vtrm_gate.gate import UnitResult, UnitTask
from vtrm_gate.llm import MCQ, AgentEvent, LLMAgent, RetryPolicy
from vtrm_gate.testing import ChatServer, Fault

UNITS = {"u0": MCQ("How many cats?", ("one", "two"), "B")}
TASK = UnitTask("OCR", "u0", "base", 0, "e1_s1_gate_ocr_base", "skill")


def agent(server: ChatServer, events: list[AgentEvent], **kw: Any) -> LLMAgent:
    return LLMAgent(UNITS, base_url=server.url, model="m", think=False, api_key="k",
                    rng=random.Random(0), on_event=events.append,
                    retry=kw.pop("retry", RetryPolicy(max_attempts=3, base_delay_s=0.01,
                                                      max_total_s=10)), **kw)


def body(a: LLMAgent) -> dict[str, Any]:
    return a.body("answer", a.messages(TASK, UNITS["u0"]))


def infer(a: LLMAgent) -> UnitResult:
    async def go() -> UnitResult:
        try:
            return await a.infer(TASK)
        finally:
            await a.aclose()

    return asyncio.run(go())


def test_a_give_up_on_401_or_400_carries_its_status(chat_server: ChatServer) -> None:
    for status in (401, 400, 403):
        chat_server.inject(Fault(status=status, message="refused"))
        events: list[AgentEvent] = []
        res = infer(agent(chat_server, events))
        assert res.infra and f"HTTP {status}" in (res.error or "")
        assert [(e.kind, e.status) for e in events] == [("request", None),
                                                        ("give_up", status)]


def test_a_give_up_after_retries_carries_the_last_status(chat_server: ChatServer) -> None:
    chat_server.inject(*[Fault(status=503)] * 3)
    events: list[AgentEvent] = []
    assert infer(agent(chat_server, events)).infra
    assert [(e.kind, e.status) for e in events if e.kind != "request"] == [
        ("retry", 503), ("retry", 503), ("give_up", 503)]


def test_a_give_up_at_the_deadline_carries_the_last_replys_status(
        chat_server: ChatServer) -> None:
    chat_server.inject(Fault(status=503, retry_after="0"), Fault(sleep=3.0))
    events: list[AgentEvent] = []
    a = agent(chat_server, events, retry=RetryPolicy(max_attempts=5, base_delay_s=0.0,
                                                     max_total_s=1.0), timeout=5.0)
    res = infer(a)
    assert res.infra
    give_up = [e for e in events if e.kind == "give_up"]
    assert len(give_up) == 1 and give_up[0].status == 503, events


def test_a_request_cancelled_before_its_reply_is_counted_and_explained(
        chat_server: ChatServer) -> None:
    """The LiteLLM step's "224 HTTP requests sent in all" against 223 endpoint calls: the
    gate cancelled one call past every stop after it was sent, before its reply."""
    chat_server.inject(Fault(sleep=2.0))
    a = agent(chat_server, [])

    async def go() -> None:
        try:
            call = asyncio.ensure_future(a.chat(body(a)))
            while not chat_server.requests:  # the request reached the server
                await asyncio.sleep(0.01)
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
            await a.chat(body(a))
        finally:
            await a.aclose()

    asyncio.run(go())
    calls = sum(s.calls for s in a.pool.stats())
    assert (a.http_requests, a.http_cancelled, calls) == (2, 1, 1)
    assert a.http_requests == calls + a.http_cancelled
    text = cache_lines({"url": "redis://x", "prefix": "p", "enabled": True, "runs": {},
                        "http_requests": a.http_requests, "http_cancelled": a.http_cancelled,
                        "endpoints": [s.as_dict() for s in a.pool.stats()]})
    assert ("2 HTTP requests sent in all (retries included; 1 cancelled before the reply "
            "came, so the endpoints count 1 calls)") in text
    assert f"calls {calls:>6}" in text


def test_a_call_that_never_got_an_endpoint_is_no_request(chat_server: ChatServer) -> None:
    a = agent(chat_server, [], max_concurrency=1)

    async def go() -> None:
        try:
            chat_server.inject(Fault(sleep=1.0))
            first = asyncio.ensure_future(a.chat(body(a)))
            while not chat_server.requests:
                await asyncio.sleep(0.01)
            waiting = asyncio.ensure_future(a.chat(body(a)))
            await asyncio.sleep(0.1)  # queued behind the cap of 1, never sent
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            await first
        finally:
            await a.aclose()

    asyncio.run(go())
    assert len(chat_server.requests) == 1
    assert (a.http_requests, a.http_cancelled) == (1, 0)


def test_llm_infra_error_status_defaults_to_none() -> None:
    assert LLMInfraError("x").status is None
