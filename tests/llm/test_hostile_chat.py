"""Hostile pass (h8): a chat endpoint that answers with a redirect (``http://`` behind an
``https://`` redirect, a moved API) is an INFRA error at once naming the target, not a
'malformed JSON body' retried until the attempts run out."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from test_llm import FAST, UNITS, infer, task

from vtrm_gate import GateParams, GateResult, TypePlan, run_gate
from vtrm_gate.cache import validate_response
from vtrm_gate.gate import GuardParams, UnitResult, UnitTask, checked_result
from vtrm_gate.llm import MCQ, LLMAgent, LLMInfraError, RetryPolicy, ToolAgent
from vtrm_gate.testing import ChatServer, Fault
from vtrm_gate.testing.chat import ToolChatServer


@pytest.fixture
def redirecting() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(308)
            self.send_header("Location", "https://bob:hunter2@127.0.0.1:9/v1/chat/completions")
            self.send_header("Content-Length", "0")
            self.end_headers()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_redirect_is_infra_at_once_naming_the_target(redirecting: str) -> None:
    a = LLMAgent(UNITS, base_url=redirecting, model="m", retry=FAST, rng=random.Random(0))

    async def go() -> None:
        try:
            await a.chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        finally:
            await a.aclose()

    with pytest.raises(LLMInfraError) as err:
        asyncio.run(go())
    assert a.http_requests == 1  # a redirect is not transient: no retries
    msg = str(err.value)
    assert "308" in msg and "redirect" in msg and "https://bob:***@127.0.0.1:9/v1" in msg
    assert "hunter2" not in msg


PORTAL = "<html><head><title>Sign in to the proxy</title></head><body>...</body></html>"


def _answer(chat_server: ChatServer, *faults: Fault) -> UnitResult:
    """One unit answered by the built-in agent (no think call), the server saying
    ``faults`` in turn."""
    chat_server.inject(*faults)
    a = LLMAgent(UNITS, base_url=chat_server.url, model="m", retry=FAST,
                 rng=random.Random(0), think=False)
    [res] = infer(a, task())
    return res


def _tool_answer(*faults: Fault, retry: RetryPolicy | None = None
                 ) -> tuple[UnitResult, list[dict[str, Any]]]:
    """One unit answered by `ToolAgent`, the server saying ``faults`` in turn: the result
    and the requests the server saw."""
    with ToolChatServer() as server:
        server.inject(*faults)

        async def go() -> UnitResult:
            async with httpx.AsyncClient(base_url=server.url + "/") as client:
                agent = ToolAgent({"c0": MCQ("Context.\n\nHow many?", ("1", "2"), "B")},
                                  client, model="tiny", retry=retry)
                return await agent.infer(UnitTask("Counting", "c0", "base", 0, "r", "s"))

        return asyncio.run(go()), server.requests


@pytest.mark.parametrize("content_type", ["text/html; charset=utf-8", "text/plain"])
def test_a_200_that_is_not_json_is_infra_at_once_quoting_it(chat_server: ChatServer,
                                                            content_type: str) -> None:
    # A captive portal or a proxy's login page answers 200 with HTML: not transient, so
    # retrying it until the attempts run out only wastes the call's deadline.
    res = _answer(chat_server,
                  *[Fault(body=PORTAL, content_type=content_type)] * FAST.max_attempts)
    assert len(chat_server.requests) == 1  # no retries
    assert res.infra and content_type.split(";")[0] in (res.error or "")
    assert "Sign in to the proxy" in (res.error or "")


def test_a_truncated_json_200_is_still_retried(chat_server: ChatServer) -> None:
    # A JSON body cut short (a proxy reset mid-body) is transient: the next attempt answers.
    res = _answer(chat_server, Fault(body='{"choices": [{"index": 0, "mess'))
    assert len(chat_server.requests) == 2 and not res.infra


def _reply(usage: object) -> str:
    return json.dumps({"id": "x", "object": "chat.completion", "usage": usage, "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "B"}}]})


@pytest.mark.parametrize("usage", [
    {"total_tokens": -5}, {"total_tokens": 1e30}, {"total_tokens": 10**30},
    {"total_tokens": "lots"}, {"total_tokens": True}, {"total_tokens": 12.5},
    {"prompt_tokens": -30, "completion_tokens": 2}, [3], "12"])
def test_a_server_that_lies_about_its_usage_costs_its_tokens_not_the_answer(
        chat_server: ChatServer, usage: object) -> None:
    """A negative, huge, fractional or non-numeric token count is unknown (0): it made a
    UnitResult the gate refuses (tokens outside 0..2**63-1), so one lying reply failed the
    whole gate step."""
    res = _answer(chat_server, Fault(body=_reply(usage)))
    assert (res.correct, res.infra, res.tokens) == (True, False, 0), res
    assert len(chat_server.requests) == 1


def test_an_honest_usage_is_counted(chat_server: ChatServer) -> None:
    res = _answer(chat_server,
                  Fault(body=_reply({"prompt_tokens": 30, "completion_tokens": 2})))
    assert (res.correct, res.tokens) == (True, 32)


def _said(message: dict[str, object]) -> str:
    return json.dumps({"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", **message}}]})


MALFORMED_CALLS = [5, "B", {"name": "answer"}, [5], [{"function": "B"}],
                   [{"function": ["answer"]}]]


@pytest.mark.parametrize("calls", MALFORMED_CALLS, ids=lambda c: json.dumps(c))
def test_a_reply_whose_tool_calls_are_malformed_is_infra_not_a_crash(
        chat_server: ChatServer, calls: object) -> None:
    """``tool_calls`` that is no list of calls (a number, a string, an object, a call that
    is no object or whose function is no object) is a server breaking the protocol: INFRA
    naming it. It raised TypeError / AttributeError inside infer, which the gate takes for a
    programming error and fails the whole step over (a string was read as no answer)."""
    res = _answer(chat_server, *[Fault(body=_said({"content": "", "tool_calls": calls}))]
                  * FAST.max_attempts)
    assert res.infra and "malformed tool calls" in (res.error or ""), res


def test_a_gate_step_survives_a_server_whose_tool_calls_are_malformed(
        chat_server: ChatServer) -> None:
    """The same replies inside a gate: the arms they answer are INFRA, the step decides."""
    chat_server.inject(*[Fault(body=_said({"content": "", "tool_calls": c}))
                         for c in MALFORMED_CALLS])
    a = LLMAgent(UNITS, base_url=chat_server.url, model="m", rng=random.Random(0),
                 think=False, retry=RetryPolicy(max_attempts=1))

    async def go() -> GateResult:
        try:
            return await run_gate([TypePlan("OCR", list(UNITS), base_skill="s",
                                            cand_skill="strategy: longest")],
                                  a.infer, GateParams(), concurrency=1,
                                  guard=GuardParams(max_ratio=1.0))
        finally:
            await a.aclose()

    out = asyncio.run(go())
    assert out.aborted is None
    assert out.counters["OCR"].infra_calls == len(MALFORMED_CALLS)


@pytest.mark.parametrize("calls", MALFORMED_CALLS, ids=lambda c: json.dumps(c))
def test_the_tool_agent_takes_malformed_tool_calls_for_infra(calls: object) -> None:
    res, _ = _tool_answer(*[Fault(body=_said({"content": "", "tool_calls": calls}))] * 2,
                          retry=RetryPolicy(max_attempts=2, base_delay_s=0.0))
    assert res.infra and "malformed tool calls" in (res.error or ""), res


PARTS = [{"type": "text", "text": "The answer is "}, {"type": "text", "text": "(B)."}]


def test_an_answer_in_content_parts_is_read(chat_server: ChatServer) -> None:
    """A server that answers with a list of text parts (Mistral's, a gateway's) said B:
    it was graded as an empty reply, a wrong answer, and cached so."""
    res = _answer(chat_server, Fault(body=_said({"content": PARTS})))
    assert (res.correct, res.infra, res.prediction) == (True, False, "B"), res


def test_content_parts_without_text_are_an_empty_reply() -> None:
    def said(content: object) -> dict[str, object]:
        return json.loads(_said({"content": content}))

    assert validate_response(said(PARTS)) is None
    for empty in ([], [{"type": "image_url", "image_url": {"url": "x"}}],
                  [{"type": "text", "text": "  "}], [{"type": "text", "text": 5}], [7], 5):
        assert validate_response(said(empty)) == "empty message content", empty


def test_a_lone_surrogate_in_a_reply_reads_as_a_replacement_character() -> None:
    from vtrm_gate.llm._agent import parse_body

    body = rb'{"a": "x\ud83d", "\udc00k": ["\ud83d\ude00", "\\ud800 is text", "\uDBFFz"]}'
    assert parse_body(body) == {"a": "x\ufffd", "\ufffdk": ["\U0001f600", "\\ud800 is text",
                                                              "\ufffdz"]}
    assert parse_body(b'{"a": "\\u00e9"}') == {"a": "\u00e9"}


def _call(name: str, arguments: object, call_id: str = "c1") -> dict[str, object]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _look_then_answer(letter: str) -> tuple[Fault, Fault]:
    """A tool trajectory whose arguments are objects: look at part 1, then answer."""
    return (Fault(body=_said({"content": "", "tool_calls": [_call("look", {"part": 1})]})),
            Fault(body=_said({"content": "", "tool_calls": [
                _call("answer", {"letter": letter}, "c2")]})))


@pytest.mark.parametrize("arguments", [{"letter": "B"}, '{"letter": "B"}', "B"])
def test_a_tool_call_answer_whose_arguments_are_an_object_is_read(
        chat_server: ChatServer, arguments: object) -> None:
    """Some servers (text-generation-inference's OpenAI layer among them) send a call's
    ``arguments`` as a JSON object, not a string holding one: the answer it carried read
    as "{'letter': 'B'}", no answer, a wrong one."""
    res = _answer(chat_server, Fault(body=_said({"content": None,
                                                 "tool_calls": [_call("answer", arguments)]})))
    assert (res.correct, res.infra, res.prediction) == (True, False, "B"), res


def test_the_tool_agent_reads_arguments_given_as_an_object() -> None:
    """The same for `ToolAgent`: its look read part {} (an error) and its answer no letter."""
    res, requests = _tool_answer(*_look_then_answer("B"))
    assert requests[1]["messages"][-1] == {"role": "tool", "tool_call_id": "c1",
                                           "content": "Context."}
    assert (res.correct, res.prediction) == (True, "B"), res


def test_an_answer_given_as_the_options_text_is_graded_by_it(chat_server: ChatServer) -> None:
    """A model that answers with the option's words ("A dog running across the whole
    field.") chose B: it was "unparseable answer", a wrong one."""
    res = _answer(chat_server,
                  Fault(body=_said({"content": "A dog running across the whole field."})))
    assert (res.correct, res.prediction, res.error) == (True, "B", None), res


def test_the_tool_agents_answer_naming_the_options_text_is_read() -> None:
    """A model that puts the option's words in the answer tool's ``letter`` ("2" for the
    option "2") chose that option, as a reply in words does."""
    res, _ = _tool_answer(*_look_then_answer("2"))
    assert (res.correct, res.prediction) == (True, "B"), res


SSE = ('data: {"id":"x","choices":[{"index":0,"delta":{"content":"B"}}]}\n\n'
       'data: [DONE]\n\n')


def test_a_streamed_reply_nobody_asked_for_is_named_as_such(chat_server: ChatServer) -> None:
    """A gateway that forces streaming answers with Server-Sent Events though the request
    did not ask to stream: the error said "check base_url", which is not what is wrong."""
    res = _answer(chat_server, *[Fault(body=SSE, content_type="text/event-stream")] * 4)
    assert res.infra and len(chat_server.requests) == 1  # not transient: asked once
    assert "streamed its reply" in (res.error or "") and "check base_url" not in (res.error or "")
    assert "stream" not in chat_server.requests[0] or not chat_server.requests[0]["stream"]


def test_the_tool_agent_names_a_streamed_reply_too() -> None:
    res, _ = _tool_answer(Fault(body=SSE, content_type="text/event-stream"))
    assert res.infra and "streamed its reply" in (res.error or ""), res


def test_an_error_message_escaping_a_lone_surrogate_reads_with_a_replacement(
        chat_server: ChatServer) -> None:
    """A 400 whose JSON message escapes a lone surrogate: the INFRA error carried it, and
    the step stopped writing it to SQLite (UnicodeEncodeError)."""
    res = _answer(chat_server, Fault(status=400, message="bad request \ud800 here"))
    assert res.infra and "bad request \ufffd here" in (res.error or ""), res
    (res.error or "").encode()  # Unicode text


def _first_call_then_answer(name: str, arguments: object) -> tuple[str, UnitResult]:
    """`ToolAgent`'s trajectory when its first turn calls ``name(arguments)`` and its
    second answers B: what the tool said to the first call, and the result."""
    res, requests = _tool_answer(
        Fault(body=_said({"content": "", "tool_calls": [_call(name, arguments)]})),
        _look_then_answer("B")[1])
    said = requests[1]["messages"][-1]
    assert (said["role"], said["tool_call_id"]) == ("tool", "c1"), said
    return said["content"], res


@pytest.mark.parametrize("part", ["1", " 1 ", 1.0])
def test_the_tool_agents_look_reads_a_part_number_given_as_text(part: object) -> None:
    """A server without constrained decoding sends ``{"part": "1"}``: the model was told
    part must be an integer from 1 to 1, got '1', and spent a turn on it."""
    said, res = _first_call_then_answer("look", {"part": part})
    assert said == "Context."
    assert (res.correct, res.prediction) == (True, "B"), res


@pytest.mark.parametrize("part", ["one", "1.5", 1.5, True, None, "", "0", 2, "9" * 5000])
def test_the_tool_agents_look_still_refuses_a_part_that_is_none(part: object) -> None:
    said, _ = _first_call_then_answer("look", {"part": part})
    assert said.startswith("error: part must be an integer from 1 to 1"), said


def test_the_tool_agent_names_a_tool_it_does_not_have() -> None:
    """A model that calls a tool it was not given (``search``) was answered as if it had
    called ``look`` without a part: "part must be an integer", which misleads it."""
    said, res = _first_call_then_answer("search", {"q": "dogs"})
    assert "no tool named 'search'" in said, said
    assert "look(part)" in said and "answer(letter)" in said
    assert (res.correct, res.prediction) == (True, "B"), res


@pytest.mark.parametrize("arguments", [{"answer": "B"}, {"option": "(B)"}, {"Letter": "B"}])
def test_the_tool_agents_answer_under_another_argument_name_is_read(arguments: object) -> None:
    """A server without constrained decoding lets the model name the answer's one
    argument as it likes: ``answer({"answer": "B"})`` read as no letter, a wrong answer."""
    res, _ = _tool_answer(_look_then_answer("B")[0], Fault(body=_said({
        "content": "", "tool_calls": [_call("answer", arguments, "c2")]})))
    assert (res.correct, res.prediction) == (True, "B"), res


def test_the_tool_agents_answer_with_two_other_arguments_is_no_letter() -> None:
    res, _ = _tool_answer(_look_then_answer("B")[0], Fault(body=_said({
        "content": "", "tool_calls": [_call("answer", {"a": "B", "b": "C"}, "c2")]})))
    assert (res.correct, res.prediction) == (False, None), res


LLAMA_SERVER_OVERFLOW = "request (2100 tokens) exceeds the available context size (2048 tokens)"


def test_the_tool_agents_context_overflow_is_the_arms_wrong_answer_not_infra() -> None:
    """A trajectory that grows past the model's context (llama-server's 2048 tokens by
    default: the skill, the tools and every part looked at) is the arm's own doing, like
    the built-in agent's: it was INFRA, so a verbose candidate skipped its pairs (a harmful
    skill escaped its losses) and a run of them tripped the INFRA guard."""
    res, requests = _tool_answer(_look_then_answer("B")[0],
                                 Fault(status=400, message=LLAMA_SERVER_OVERFLOW))
    assert len(requests) == 2  # not retried: the same conversation cannot fit next time
    assert (res.infra, res.correct, res.prediction) == (False, False, None), res
    assert res.error is not None and "turn 2: context overflow" in res.error, res.error
    assert LLAMA_SERVER_OVERFLOW in res.error and not res.cached
    assert [t["source"] for t in res.trace["turns"]] == ["uncached", "refused"]


@pytest.mark.parametrize("status", [520, 521, 522, 523, 524, 529])
def test_a_cloudflare_or_overloaded_status_is_retried(chat_server: ChatServer,
                                                      status: int) -> None:
    """A server behind Cloudflare answers 520-524 when its origin stalls or drops (524:
    no reply within 100 s, a long generation), and an overloaded one 529: transient. They
    were not retried, so one blip made the unit INFRA."""
    res = _answer(chat_server, Fault(status=status))
    assert (res.infra, res.correct) == (False, True), res
    assert len(chat_server.requests) == 2


@pytest.mark.parametrize("status", [524, 529])
def test_the_tool_agent_retries_them_too(status: int) -> None:
    res, requests = _tool_answer(Fault(status=status), *_look_then_answer("B"),
                                 retry=RetryPolicy(max_attempts=2, base_delay_s=0.0))
    assert (res.infra, res.correct) == (False, True), res
    assert len(requests) == 3


def test_the_tool_agents_prompt_refused_by_a_content_filter_is_the_arms_wrong_answer() -> None:
    from test_replies import AZURE_FILTER

    res, requests = _tool_answer(_look_then_answer("B")[0],
                                 Fault(status=400, message=AZURE_FILTER))
    assert len(requests) == 2
    assert (res.infra, res.correct, res.prediction) == (False, False, None), res
    assert res.error is not None and "turn 2: the server's content filter refused" in res.error


def _in_process_chat(content_length: bytes) -> LLMAgent:
    """An agent whose server (in process, through httpx's own ASGI transport, which does not
    check headers as h11 does) declares ``content_length`` and answers "B"."""
    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "B"}}]})

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", content_length)]})
        await send({"type": "http.response.body", "body": body.encode()})

    return LLMAgent(UNITS, base_url="http://in-process/v1", model="m", retry=FAST,
                    rng=random.Random(0), transport=httpx.ASGITransport(app=app))


async def _hi(a: LLMAgent) -> dict[str, Any]:
    try:
        return await a.chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    finally:
        await a.aclose()


def test_a_content_length_that_is_a_digit_but_not_a_number_is_not_a_crash() -> None:
    # "Content-Length: ²": str.isdigit() says yes and int() raised ValueError out of the
    # agent. Now the declaration is ignored and the body is read under the cap.
    a = _in_process_chat(b"\xb2")
    assert asyncio.run(_hi(a))["choices"][0]["message"]["content"] == "B"
    assert a.http_requests == 1


def test_a_content_length_of_5000_digits_is_too_large_not_a_crash() -> None:
    # int() of more than 4,300 digits raises ValueError: was a crash, now over the cap
    a = _in_process_chat(b"9" * 5000)
    with pytest.raises(LLMInfraError, match=r"larger than max_response_bytes=\d+ "
                                            r"\(Content-Length 9{8}\.\.\."):
        asyncio.run(_hi(a))


def _told(content: str, total: int) -> Fault:
    return Fault(body=json.dumps({"id": "x", "object": "chat.completion",
                                  "usage": {"total_tokens": total}, "choices": [
        {"index": 0, "finish_reason": "stop",
         "message": {"role": "assistant", "content": content}}]}))


@pytest.mark.parametrize("total", [2**63 - 1, 2**62 + 1, 10**12])
def test_counts_each_in_range_that_sum_past_the_gates_cap_cost_their_tokens_only(
        chat_server: ChatServer, total: int) -> None:
    """Each reply's usage was taken up to 2**63-1 (an int64 "unknown" sentinel some servers
    send), so think + answer summed past it: the gate refused the UnitResult and the whole
    step failed, one call's lie costing every type's decision."""
    chat_server.inject(_told("Let me think.", total), _told("B", total))
    a = LLMAgent(UNITS, base_url=chat_server.url, model="m", retry=FAST,
                 rng=random.Random(0), think=True)
    [res] = infer(a, task())
    assert (res.correct, res.infra, res.tokens) == (True, False, 0)
    assert checked_result(task(), res) is res


def test_a_tool_agents_turns_cannot_sum_past_the_gates_cap() -> None:
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "answer",
                                                      "arguments": '{"letter": "B"}'}}]}
    look = {**call, "tool_calls": [{"id": "l", "type": "function", "function": {
        "name": "look", "arguments": '{"part": 1}'}}]}
    faults = [Fault(body=json.dumps({"id": "x", "object": "chat.completion",
                                     "usage": {"total_tokens": 2**62 + 1}, "choices": [
        {"index": 0, "finish_reason": "stop", "message": m}]})) for m in (look, look, call)]
    res, _ = _tool_answer(*faults)
    assert (res.correct, res.infra, res.tokens) == (True, False, 0)


RATE_LIMITED = json.dumps({"error": {"code": 429, "message": "Rate limit exceeded: "
                                     "free-models-per-day. Add credits to continue."}})


def test_a_200_carrying_an_error_is_retried_and_quotes_the_server() -> None:
    """A gateway (OpenRouter does) answering 200 with an ``{"error": …}`` body ended the
    call at once as "response carries an error", the server's own words dropped."""
    with ChatServer() as server:
        res = _answer(server, *[Fault(body=RATE_LIMITED)] * FAST.max_attempts)
        assert len(server.requests) == FAST.max_attempts
    assert res.infra and "Rate limit exceeded: free-models-per-day" in (res.error or "")
    with ChatServer() as server:
        res = _answer(server, Fault(body=RATE_LIMITED))
    assert (res.correct, res.infra) == (True, False)  # the next attempt answered
