"""The cached client for any agent: the official openai SDK (and plain httpx) through
`cached_http_client` against a real loopback server that counts requests."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import redis

from vtrm_gate import GateParams, TypePlan, UnitResult, UnitTask, run_gate
from vtrm_gate.cache import KeyParts, ResponseCache
from vtrm_gate.gate import TaskFinished
from vtrm_gate.llm import (
    MCQ,
    LLMAgent,
    cached_http_client,
    current_run_id,
    run_scope,
    tool_schemas,
)
from vtrm_gate.testing import RedisTarget
from vtrm_gate.testing.chat import Fault, ToolChatServer

RUN = "e1_s1_gate_counting_base"
SKILL = "Read every part."
OPTIONS = ["no", "maybe", "certainly the answer", "yes"]
KEY = "sk-test-0123456789abcdef"


def new_cache(target: RedisTarget) -> ResponseCache:
    """A cache on the suite's Redis with fresh counters (same keys, same namespace)."""
    return ResponseCache(target.url, prefix=target.prefix, namespace="ws:test")


def sdk(server: ToolChatServer, client: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url, api_key=KEY, http_client=client,
                              max_retries=0)


async def trajectory(ai: openai.AsyncOpenAI, skill: str, options: list[str]) -> str:
    """A multi-step agent written against the SDK: look until the model answers."""
    opts = "\n".join(f"{'ABCD'[i]}. {o}" for i, o in enumerate(options))
    messages: list[dict[str, Any]] = [{"role": "system", "content": skill},
                                      {"role": "user", "content": f"Options:\n{opts}"}]
    for _ in range(8):
        r = await ai.chat.completions.create(model="tiny", messages=messages, tools=tool_schemas(4),
                                             temperature=0.0)
        call = r.choices[0].message.tool_calls[0]
        if call.function.name == "answer":
            return json.loads(call.function.arguments)["letter"]
        messages += [r.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "part text"}]
    raise AssertionError("no answer in 8 turns")


def failing_options(server: ToolChatServer) -> list[str]:
    """Options on which the plain skill's trajectory fails (4 turns: 3 looks, an answer)."""
    return next(opts for i in range(100)
                if not server.succeeds(SKILL, opts := [f"no {i}", "maybe", "surely so", "y"]))


def run_trajectory(server: ToolChatServer, cache: ResponseCache, options: list[str]) -> str:
    async def go() -> str:
        async with cached_http_client(cache) as client:
            with run_scope(RUN):
                return await trajectory(sdk(server, client), SKILL, options)
    return asyncio.run(go())


def test_a_second_run_sends_zero_requests_and_a_deleted_middle_turn_refreshes_it_and_later_ones(
        redis_target: RedisTarget) -> None:
    with ToolChatServer() as server:
        options = failing_options(server)
        first = new_cache(redis_target)
        assert run_trajectory(server, first, options) == "D"  # the shortest option: wrong
        assert len(server.requests) == 4
        assert first.stats(RUN).misses == 4 and first.stats(RUN).writes == 4

        second = new_cache(redis_target)
        assert run_trajectory(server, second, options) == "D"
        assert len(server.requests) == 4  # zero requests
        assert second.stats(RUN).hits == 4

        # the keys are the built-in agent's: KeyParts of each request body, salted by the run
        keys = [KeyParts.from_request(b, server.url, first.salt(RUN)).key(first.prefix)
                for b in server.requests]
        r = redis.Redis.from_url(redis_target.url)
        assert all(r.exists(k) for k in keys)
        stored = json.loads(r.get(keys[0]))
        assert stored["digest"] == KeyParts.from_request(server.requests[0], server.url,
                                                         first.salt(RUN)).digest
        r.delete(keys[1])
        third = new_cache(redis_target)
        assert run_trajectory(server, third, options) == "D"
        # turn 1 a hit; turn 2 fresh, and its new tool-call id makes turns 3 and 4 fresh
        assert len(server.requests) == 7
        assert (third.stats(RUN).hits, third.stats(RUN).misses) == (1, 3)
        assert server.requests[4] == server.requests[1]


def test_the_built_in_agents_entry_is_a_hit_through_the_client(
        redis_target: RedisTarget) -> None:
    """Same key material: a call the built-in agent made is served to the SDK for free."""
    with ToolChatServer() as server:
        cache = new_cache(redis_target)
        mcq = MCQ("How many?", tuple(OPTIONS), "C")
        agent = LLMAgent({"u1": mcq}, base_url=server.url, model="tiny", api_key=KEY,
                         cache=cache, think=False)
        task = UnitTask("Counting", "u1", "base", 0, RUN, "skill", "h")
        body = agent.body("answer", agent.messages(task, mcq))

        async def go() -> tuple[Any, Any]:
            await agent.infer(task)
            async with cached_http_client(new_cache(redis_target)) as client:
                with run_scope(RUN):
                    raw = await sdk(server, client).chat.completions.with_raw_response.create(
                        **body)
            return raw.headers["x-vtrm-cache"], raw.parse()

        server.answer = lambda body, step: server.completion(body, "B")  # type: ignore
        source, reply = asyncio.run(go())
        assert (source, reply.choices[0].message.content) == ("hit", "B")
        assert len(server.requests) == 1  # the agent's only


def test_the_gate_salts_each_call_with_its_arms_run_id(redis_target: RedisTarget) -> None:
    """No run id passed: the gate sets it per task; a second gate is all hits."""
    with ToolChatServer() as server:
        seen: list[str | None] = []

        def infer_with(client: httpx.AsyncClient) -> Any:
            ai = sdk(server, client)

            async def infer(task: UnitTask) -> UnitResult:
                seen.append(current_run_id())
                opts = [f"o{task.unit_id}", f"option {task.unit_id} long"]
                letter = await trajectory(ai, task.skill, opts)
                return UnitResult(correct=letter == "B", prediction=letter)
            return infer

        async def gate(cache: ResponseCache) -> Any:
            async with cached_http_client(cache) as client:
                plan = TypePlan("Counting", [f"u{i}" for i in range(12)],
                                base_skill="plain", cand_skill="plain strategy: longest")
                return await run_gate([plan], infer_with(client), GateParams(),
                                      concurrency=4)

        first = new_cache(redis_target)
        out = asyncio.run(gate(first)).outcomes["Counting"]
        assert None not in seen and len(set(seen)) == 2  # the two arms' run ids
        assert {s.rsplit("_", 1)[-1] for s in seen} == {"base", "cand"}  # type: ignore
        assert set(first.runs()) == set(seen)
        sent = len(server.requests)
        assert set(server.run_ids) == set(seen)  # each request names its arm (X-Vtrm-Run)
        again = new_cache(redis_target)
        out2 = asyncio.run(gate(again)).outcomes["Counting"]
        assert (out2.action, out2.W, out2.L) == (out.action, out.W, out.L)
        # nothing the first gate asked is asked again (a unit it never started, past the
        # stop, may be: how far the slots reach past it depends on timing)
        first_bodies = {json.dumps(b, sort_keys=True) for b in server.requests[:sent]}
        assert not first_bodies & {json.dumps(b, sort_keys=True)
                                   for b in server.requests[sent:]}
        assert again.stats().hits >= out.n_consumed * 2 and \
            again.stats().misses == len(server.requests) - sent


def test_streaming_and_other_endpoints_pass_through_and_failures_are_never_stored(
        redis_target: RedisTarget) -> None:
    with ToolChatServer() as server:
        cache = new_cache(redis_target)
        body = {"model": "tiny", "messages": [{"role": "user", "content": "A. x\nB. yy"}]}

        async def go() -> list[tuple[int, str]]:
            out = []
            async with cached_http_client(cache, base_url=server.url + "/") as c:
                for _ in range(2):  # streaming: uncached, sent each time
                    r = await c.post("chat/completions", json={**body, "stream": True})
                    out.append((r.status_code, r.headers["x-vtrm-cache"]))
                for _ in range(2):  # another endpoint
                    r = await c.post("embeddings", json={"input": "x"})
                    out.append((r.status_code, r.headers["x-vtrm-cache"]))
                server.inject(Fault(status=500), Fault(status=429, retry_after="0"),
                              Fault(body="not json"))
                for _ in range(4):  # 500, 429, a 200 that is no JSON (a 502): never stored
                    r = await c.post("chat/completions", json=body)
                    out.append((r.status_code, r.headers["x-vtrm-cache"]))
                r = await c.post("chat/completions", json=body)
                out.append((r.status_code, r.headers["x-vtrm-cache"]))
            return out

        got = asyncio.run(go())
        assert got == [(200, "pass"), (200, "pass"), (404, "pass"), (404, "pass"),
                       (500, "uncached"), (429, "uncached"), (502, "uncached"), (200, "miss"),
                       (200, "hit")]
        assert cache.stats().writes == 1
        assert len(server.requests) == 6  # chat requests (the server records no others)


OVERFLOW = ("This model's maximum context length is 4096 tokens. However, your messages "
            "resulted in 5000 tokens. Please reduce the length of the messages.")


def test_a_refusal_of_the_conversation_is_stored_and_replayed_as_the_server_said_it(
        redis_target: RedisTarget) -> None:
    """Only 200s were stored, so a re-run asked every overflowing or filtered conversation
    again (a ToolAgent's refused turn, an SDK agent's BadRequestError): a crashed step's
    re-run was not near-free. A refusal of the conversation is the arm's answer and now
    stored: the re-run gets the same status and body with no request; another 400 is not."""
    with ToolChatServer() as server:
        cache = new_cache(redis_target)
        body = {"model": "tiny", "messages": [{"role": "user", "content": "A. x\nB. yy"}]}
        other = {**body, "temperature": 0.5}

        async def go() -> list[Any]:
            out: list[Any] = []
            async with cached_http_client(cache, base_url=server.url + "/") as c:
                server.inject(Fault(status=400, message=OVERFLOW),
                              Fault(status=400, message="invalid model tiny"))
                for b in (body, body, other, other):
                    r = await c.post("chat/completions", json=b)
                    out.append((r.status_code, r.headers["x-vtrm-cache"], r.json()))
                ai = sdk(server, c)
                with pytest.raises(openai.BadRequestError) as err:
                    await ai.chat.completions.create(**body)
                out.append(err.value.message)
            return out

        (s1, h1, d1), (s2, h2, d2), (s3, h3, _), (s4, h4, _), sdk_message = asyncio.run(go())
        assert (s1, h1) == (400, "miss") and (s2, h2) == (400, "hit") and d2 == d1
        assert d1 == {"error": {"message": OVERFLOW}}
        assert (s3, h3, s4, h4) == (400, "uncached", 200, "miss")  # not a refusal: asked again
        assert OVERFLOW in sdk_message
        assert len(server.requests) == 3  # the overflow once, the other 400 and its retry


def test_a_transport_failure_is_never_stored(redis_target: RedisTarget) -> None:
    cache = new_cache(redis_target)

    async def go() -> None:
        async with cached_http_client(cache) as client:
            ai = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key=KEY,
                                    http_client=client, max_retries=0)
            with pytest.raises(openai.APIConnectionError):
                await ai.chat.completions.create(model="tiny", messages=[
                    {"role": "user", "content": "hi"}])

    asyncio.run(go())
    assert cache.stats().misses == 1 and cache.stats().writes == 0


@pytest.mark.timeout(60)
def test_a_reply_that_trickles_ends_at_the_clients_deadline_never_stored(
        redis_target: RedisTarget) -> None:
    """httpx's timeout is per read: a 200 whose body came a byte every half second held the
    call for as long as the server kept writing (h16). The whole request takes at most the
    client's ``deadline``: an `httpx.ReadTimeout` (the SDK's APITimeoutError), nothing kept."""
    cache = new_cache(redis_target)
    with ToolChatServer() as server:
        server.inject(Fault(trickle_s=0.5))

        async def go() -> None:
            async with cached_http_client(cache, timeout=1.0, deadline=1.5) as client:
                ai = openai.AsyncOpenAI(base_url=server.url, api_key=KEY, http_client=client,
                                        max_retries=0)
                with pytest.raises(openai.APITimeoutError):
                    await ai.chat.completions.create(model="tiny", messages=[
                        {"role": "user", "content": "hi"}])
                with pytest.raises(httpx.ReadTimeout, match=r"no whole reply within the "
                                   r"cached client's deadline of 1.5s \(deadline\)"):
                    server.inject(Fault(trickle_s=0.5))
                    await client.post(server.url + "/chat/completions", json={
                        "model": "tiny", "messages": [{"role": "user", "content": "hi"}]})

        asyncio.run(go())
        assert server.client_left.wait(10)
    assert cache.stats().writes == 0
    with pytest.raises(ValueError, match="deadline must be a number of seconds > 0, got 0"):
        cached_http_client(cache, deadline=0)
    # a raised read timeout raises the default deadline with it: a steady 300 s reply of a
    # slow model under timeout=600 is not cut at 180 s (h18)
    deadlines = [cached_http_client(cache, **kw)._transport.deadline  # type: ignore[attr-defined]  # the CachedTransport
                 for kw in ({}, {"timeout": 600}, {"timeout": httpx.Timeout(5, read=900)},
                            {"timeout": 600, "deadline": 30}, {"timeout": None},
                            {"timeout": np.float32(600)}, {"timeout": (5, 900, 5, 5)})]
    assert deadlines == [180.0, 600.0, 900.0, 30.0, 180.0, 600.0, 900.0]  # numpy, tuple: h19


# ---- bad input ---------------------------------------------------------------------------


def bad_requests() -> dict[str, tuple[dict[str, Any], int, str]]:
    """name -> (httpx.post kwargs, status, what the message must say)."""
    ok = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    tool = tool_schemas(4)[0]
    return {
        "non-JSON body": ({"content": b"{'model': " + KEY.encode()}, 400,
                          "request body is not JSON"),
        "NaN": ({"content": b'{"model":"tiny","messages":[],"temperature":NaN}'}, 400,
                "non-finite number NaN"),
        "a list body": ({"json": [ok]}, 400, "is a JSON list, not an object"),
        "50 MB": ({"json": {**ok, "messages": [{"role": "user", "content": "x" * (50 << 20)}]}},
                  413, "bytes is over the cached client's cap of 16777216 bytes"),
        "10,000 tools": ({"json": {**ok, "tools": [tool] * 10_000}}, 400,
                         "'tools' holds 10000 entries; the cap is 128"),
        # "²" passes str.isdigit() but not int(): was a ValueError out of the transport
        "Content-Length ²": ({"json": ok, "headers": {"content-length": b"\xb2"}}, 400,
                             "Content-Length '\u00b2' is not a whole number of bytes"),
        # int() of more than 4,300 digits raises ValueError
        "Content-Length 9 x 5000": ({"json": ok, "headers": {"content-length": "9" * 5000}},
                                    413, "is over the cached client's cap of 16777216 bytes"),
    }


@pytest.mark.parametrize("name", list(bad_requests()))
def test_bad_input_is_refused_naming_the_problem_nothing_sent_nothing_stored(
        redis_target: RedisTarget, name: str) -> None:
    kwargs, status, says = bad_requests()[name]
    with ToolChatServer() as server:
        cache = new_cache(redis_target)

        async def go() -> httpx.Response:
            async with cached_http_client(cache, base_url=server.url + "/",
                                          headers={"Authorization": f"Bearer {KEY}"}) as c:
                return await c.post("chat/completions", **kwargs)

        r = asyncio.run(go())
        assert r.status_code == status and r.headers["x-vtrm-cache"] == "refused"
        message = r.json()["error"]["message"]
        assert says in message and KEY not in message
        assert server.requests == [] and cache.stats().calls == 0


@pytest.mark.parametrize("run_id", ["", "r\udc80", None, 7])
def test_a_run_id_that_cannot_salt_a_key_is_refused_where_it_is_given(
        redis_target: RedisTarget, run_id: Any) -> None:
    """A run id with a lone surrogate was taken by the client and by `run_scope`; every
    chat call was then answered 400 "request body cannot key the response cache" (the body
    was fine: the run id could not be encoded). Refused where it is given, naming it."""
    cache = new_cache(redis_target)
    with pytest.raises(ValueError, match=r"run_id must be a non-empty string of valid "
                                         r"Unicode, got "):
        cached_http_client(cache, run_id=run_id)
    with pytest.raises(ValueError, match=r"run_scope: run_id must be a non-empty string "
                                         r"of valid Unicode, got "), run_scope(run_id):
        pass
    assert current_run_id() is None


def test_through_the_gate_a_refused_request_is_infra_and_an_unserialisable_one_stops_it(
        redis_target: RedisTarget) -> None:
    """The existing rules: a 400 (openai.BadRequestError) is INFRA and the gate goes on; a
    sampling parameter JSON cannot encode is a TypeError in the SDK, and the gate stops."""
    with ToolChatServer() as server:
        cache = new_cache(redis_target)

        finished: list[Any] = []

        async def gate(extra: dict[str, Any]) -> Any:
            async with cached_http_client(cache) as client:
                ai = sdk(server, client)

                async def infer(task: UnitTask) -> UnitResult:
                    kw = extra if task.unit_id == "u3" else {}
                    r = await ai.chat.completions.create(
                        model="tiny", messages=[{"role": "user", "content": "A. x\nB. yy"}],
                        **kw)
                    return UnitResult(correct=r.choices[0].message.tool_calls is not None)

                plan = TypePlan("T", [f"u{i}" for i in range(10)], base_skill="a",
                                cand_skill="b")
                return await run_gate([plan], infer, GateParams(), concurrency=2,
                                      subscribers=[finished.append])

        res = asyncio.run(gate({"tools": tool_schemas(4) * 5000}))
        infra = [e.result.error for e in finished
                 if isinstance(e, TaskFinished) and e.result.infra]
        assert res.aborted is None and res.counters["T"].infra_calls == len(infra) >= 1
        assert all("BadRequestError" in e and "'tools' holds 10000 entries" in e
                   for e in infra)
        assert cache.stats().writes == len(server.requests)  # the refused ones: never stored
        with pytest.raises(TypeError, match="set is not JSON serializable"):
            asyncio.run(gate({"extra_body": {"top_k": {1, 2}}}))


def test_a_request_holding_a_lone_surrogate_is_keyed_as_sent(redis_target: RedisTarget) -> None:
    """A request escaping a lone surrogate is keyed as it was sent, apart from the same text
    with U+FFFD in its place (a reply's lone surrogate reads as U+FFFD; a request's is the
    caller's own text, relayed unchanged)."""
    with ToolChatServer() as server:
        cache = new_cache(redis_target)

        async def go() -> list[str]:
            async with cached_http_client(cache, base_url=server.url + "/") as c:
                out = []
                for text in ("x\\ud83d", "x\\ufffd", "x\\ud83d"):
                    body = json.dumps({"model": "tiny", "messages": [
                        {"role": "user", "content": "@"}]}).replace("@", text).encode()
                    r = await c.post("chat/completions", content=body,
                                     headers={"content-type": "application/json"})
                    out.append(r.headers["x-vtrm-cache"])
                return out

        with run_scope("lone-surrogate-" + redis_target.prefix):
            assert asyncio.run(go()) == ["miss", "miss", "hit"]
        assert [m["messages"][0]["content"] for m in server.requests] == ["x\ud83d", "x\ufffd"]


TOKEN = "tok-planted-client-2718"


def _stored(target: RedisTarget) -> bytes:
    """Every key and string value the test wrote to Redis, in one blob."""
    r = target.sync_client()
    try:
        keys = list(r.scan_iter(match=target.pattern, count=1000))
        return b"".join(k + (r.get(k) or b"") for k in keys if r.type(k) == b"string")
    finally:
        r.close()


def test_a_reply_quoting_the_key_is_stored_and_served_scrubbed(
        redis_target: RedisTarget) -> None:
    """A gateway that quotes the request's credentials in a 200 or in a refusal of the
    conversation had them stored in Redis raw through the cached client (the SDK and
    ToolAgent path), and served back on every re-run; the built-in agent scrubbed them."""
    quote = f"your request had Authorization: Bearer {KEY}; {KEY} {TOKEN}"
    reply = {"id": "c1", "object": "chat.completion", "model": "tiny", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": f"B ({quote})"},
         "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                             "total_tokens": 2}}
    with ToolChatServer() as server:
        cache = new_cache(redis_target)
        server.inject(Fault(body=json.dumps(reply)),
                      Fault(status=400, message=f"{OVERFLOW} ({quote})"))

        async def go() -> list[str]:
            async with cached_http_client(cache, base_url=server.url + "/",
                                          headers={"authorization": f"Bearer {KEY}"},
                                          secrets=[TOKEN]) as c:
                said = []
                for text in ("A. x\nB. yy", "A. x\nB. yy", "A. long\nB. y", "A. long\nB. y"):
                    r = await c.post("chat/completions", json={
                        "model": "tiny", "messages": [{"role": "user", "content": text}]})
                    said.append(r.text)
                return said

        said = asyncio.run(go())
    assert len(server.requests) == 2  # each asked once, then served from Redis
    stored = _stored(redis_target)
    assert b"***" in stored
    assert not [s for s in (KEY, TOKEN) if s.encode() in stored or any(s in t for t in said)]
    assert OVERFLOW in said[3] and "B (" in said[1]


def test_a_body_over_the_cap_once_decoded_or_not_what_it_says_is_a_502_never_stored(
        redis_target: RedisTarget) -> None:
    """Through the cached client a 1 KB two-layer gzip became 64 MiB before its cap saw it,
    and a body labelled gzip that was not raised httpx.DecodingError into the SDK agent."""
    bomb = gzip.compress(gzip.compress(bytes(64 << 20), mtime=0), mtime=0)
    with ToolChatServer() as server:
        cache = new_cache(redis_target)
        server.inject(Fault(raw=bomb, encoding="gzip, gzip"),
                      Fault(raw=b'{"choices": []}', encoding="gzip"))

        async def go() -> list[tuple[int, str, str]]:
            async with cached_http_client(cache, base_url=server.url + "/",
                                          max_response_bytes=1 << 20) as c:
                out = []
                for _ in range(3):
                    r = await c.post("chat/completions", json={
                        "model": "tiny", "messages": [{"role": "user", "content": "A. x"}]})
                    out.append((r.status_code, r.headers["x-vtrm-cache"],
                                r.json().get("error", {}).get("message", "")))
                return out

        (s1, h1, m1), (s2, h2, m2), (s3, h3, _) = asyncio.run(go())
    assert (s1, h1, s2, h2, s3, h3) == (502, "uncached", 502, "uncached", 200, "miss")
    assert "cap of 1048576 bytes (max_response_bytes; decoding gzip passed 1048577" in m1
    assert "HTTP 200: the body is not valid gzip" in m2
    assert cache.stats().writes == 1


@pytest.mark.parametrize("said", [
    '{"error": {"code": 429, "message": "Rate limit exceeded: free-models-per-day"}}',
    '{"id": "x", "object": "chat.completion", "choices": []}', "not json"])
def test_a_200_that_is_no_chat_completion_reaches_the_sdk_as_a_502(
        redis_target: RedisTarget, said: str) -> None:
    """The cached client handed a 200 with an ``{"error": …}`` body (or no choices) to the
    SDK as a 200: its reply had ``choices=None`` and the docs' own agent's ``r.choices[0]``
    raised TypeError, "a bug in vtrm_gate". A 502 makes the SDK raise its status error,
    which the gate records as INFRA."""
    with ToolChatServer() as server:
        cache = new_cache(redis_target)
        server.inject(Fault(body=said))

        async def go() -> str:
            async with cached_http_client(cache) as client:
                with pytest.raises(openai.InternalServerError) as err:
                    await sdk(server, client).chat.completions.create(
                        model="tiny", messages=[{"role": "user", "content": "A. x"}])
                return err.value.message

        message = asyncio.run(go())
    assert "HTTP 200 that is no chat completion" in message
    assert ("Rate limit exceeded" in message) == ("Rate limit" in said)
    assert cache.stats().writes == 0
