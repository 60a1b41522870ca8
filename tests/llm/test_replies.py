"""Every reply a real server gives, read correctly: error bodies quoted on every status, a
server that refuses content parts named as such, ``finish_reason: length`` on the think, the
answer and the evolver step, a context overflow graded as the arm's wrong answer (cached,
never INFRA), a tool-call answer, a 200 that is no chat completion counted against its
endpoint, and an attempt that runs out the call's deadline counted as that endpoint's
timeout. Against the loopback chat server and a real Redis."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest

from vtrm_gate.cache import ResponseCache
from vtrm_gate.errors import CandidateRefused, EvolveError
from vtrm_gate.gate import UnitResult, UnitTask
from vtrm_gate.harness import MediaOptions, parse_media
from vtrm_gate.llm import (
    MCQ,
    Endpoint,
    EndpointPool,
    ErrorCase,
    LLMAgent,
    LLMEvolver,
    MediaResolver,
    RetryPolicy,
)
from vtrm_gate.testing import ChatServer, Fault, RedisTarget
from vtrm_gate.testing.farm import SlowChatServer

UNITS = {"u1": MCQ("Question 1: what happens in the clip?",
                   ("a cat", "a dog running across the whole field", "a bird", "a fish"), "D")}
FAST = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.02, max_total_s=10.0)
OVERFLOW = ("This model's maximum context length is 2048 tokens. However, you requested 2536 "
            "tokens (2531 in the messages, 5 in the completion).")


def task(run_id: str = "e1_s1_gate_ocr_base") -> UnitTask:
    return UnitTask("OCR", "u1", "base", 0, run_id, "skill text")


def agent(server: ChatServer, **kw: Any) -> LLMAgent:
    kw.setdefault("retry", FAST)
    kw.setdefault("rng", random.Random(0))
    return LLMAgent(kw.pop("units", UNITS), base_url=server.url, model="m", **kw)


def infer(a: LLMAgent, t: UnitTask | None = None) -> UnitResult:
    async def go() -> UnitResult:
        try:
            return await a.infer(t or task())
        finally:
            await a.aclose()
            if a.cache is not None:
                await a.cache.aclose()

    return asyncio.run(go())


def completion(text: str | list[Any] | None, finish: str = "stop", **message: Any) -> str:
    return json.dumps({"id": "x", "object": "chat.completion", "model": "m",
                       "choices": [{"index": 0, "finish_reason": finish,
                                    "message": {"role": "assistant", "content": text,
                                                **message}}],
                       "usage": {"prompt_tokens": 10, "completion_tokens": 5,
                                 "total_tokens": 15}})


@pytest.mark.parametrize("status", [429, 500, 503, 400, 422])
def test_the_servers_error_text_is_quoted_for_every_status(chat_server: ChatServer,
                                                          status: int) -> None:
    said = "temperature: Input should be a valid number, unable to parse string as a number"
    chat_server.inject(*[Fault(status=status, message=said, retry_after="0")] * 3)
    res = infer(agent(chat_server, think=False))
    assert res.infra and f"HTTP {status}" in (res.error or "")
    assert said in (res.error or "")


def test_a_long_error_body_is_bounded(chat_server: ChatServer) -> None:
    chat_server.inject(*[Fault(status=503, message="overloaded " * 500)] * 3)
    res = infer(agent(chat_server, think=False))
    assert res.infra and "overloaded overloaded" in (res.error or "")
    assert len(res.error or "") < 600


def test_a_server_refusing_content_parts_is_named_and_not_retried(
        chat_server: ChatServer, tmp_path: Path) -> None:
    media = parse_media({"frames": ["http://127.0.0.1:9/frame.jpg"]})
    units = {"u1": MCQ("What happens?", ("a cat", "a dog"), "B", media)}
    chat_server.inject(*[Fault(status=500, message='can only concatenate str (not "list") '
                                                   'to str')] * 3)
    res = infer(agent(chat_server, units=units, think=False,
                      media=MediaResolver(MediaOptions(root=str(tmp_path)))))
    assert res.infra and "content parts" in (res.error or "")
    assert "text-only server" in (res.error or "")
    assert len(chat_server.requests) == 1  # deterministic: not asked again
    assert isinstance(chat_server.requests[0]["messages"][1]["content"], list)


def test_text_only_units_are_sent_as_plain_strings(chat_server: ChatServer,
                                                   tmp_path: Path) -> None:
    res = infer(agent(chat_server, media=MediaResolver(MediaOptions(root=str(tmp_path)))))
    assert not res.infra
    assert all(isinstance(m["content"], str) for r in chat_server.requests
               for m in r["messages"])


def test_each_step_carries_its_own_max_tokens(chat_server: ChatServer) -> None:
    infer(agent(chat_server))
    think, answer = chat_server.requests
    assert (think["max_tokens"], answer["max_tokens"]) == (512, 64)
    chat_server.requests.clear()
    infer(agent(chat_server, max_tokens={"think": 100, "answer": 0}))
    think, answer = chat_server.requests
    assert think["max_tokens"] == 100 and "max_tokens" not in answer


def test_a_context_overflow_is_the_arms_wrong_answer_cached_not_infra(
        chat_server: ChatServer, redis_target: RedisTarget) -> None:
    chat_server.inject(Fault(status=400, message=OVERFLOW, step="answer"))
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
    res = infer(agent(chat_server, cache=cache))
    assert not res.infra and not res.correct and res.prediction is None
    assert "context overflow" in (res.error or "") and "2048 tokens" in (res.error or "")
    assert len(chat_server.requests) == 2
    again = infer(agent(chat_server, cache=ResponseCache(redis_target.url,
                                                         prefix=redis_target.prefix)))
    assert len(chat_server.requests) == 2  # the re-run asks nothing: the answer is cached
    assert (again.infra, again.correct, again.error) == (False, False, res.error)


def test_a_truncated_answer_without_a_letter_is_wrong_and_says_why(
        chat_server: ChatServer) -> None:
    chat_server.inject(Fault(body=completion("Let me think about the clip and", "length"),
                             step="answer"))
    res = infer(agent(chat_server))
    assert not res.infra and not res.correct
    assert "finish_reason length" in (res.error or "")


def test_a_truncated_think_step_still_leads_to_the_answer(chat_server: ChatServer) -> None:
    chat_server.inject(Fault(body=completion("First, the dog runs across", "length"),
                             step="think"))
    res = infer(agent(chat_server))
    assert not res.infra and res.error is None and res.prediction == "A"
    assert [s["finish_reason"] for s in res.trace["steps"]] == ["length", "stop"]


def test_a_tool_call_answer_is_read_from_its_arguments(chat_server: ChatServer) -> None:
    call = {"id": "c1", "type": "function",
            "function": {"name": "answer", "arguments": '{"letter": "D"}'}}
    chat_server.inject(Fault(body=completion(None, "tool_calls", tool_calls=[call]),
                             step="answer"))
    res = infer(agent(chat_server))
    assert not res.infra and res.prediction == "D" and res.correct


def evolve_twice(chat_server: ChatServer, redis_target: RedisTarget) -> list[Any]:
    """``LLMEvolver.evolve`` for one type, run twice on one Redis cache: each run's candidate
    text or raised error, and how many requests the server saw after each."""
    async def cases(*_: Any) -> list[ErrorCase]:
        return [ErrorCase("u1", UNITS["u1"], "A")]

    async def go() -> str | Exception:
        a = agent(chat_server, cache=ResponseCache(redis_target.url,
                                                   prefix=redis_target.prefix))
        try:
            return await LLMEvolver(a, cases, max_tokens=256).evolve(
                "OCR", "skill", [], 1, 1)
        except Exception as exc:
            return exc
        finally:
            await a.aclose()
            await a.cache.aclose()

    out = []
    for _ in range(2):
        out += [asyncio.run(go()), len(chat_server.requests)]
    return out


CUT = "1. A new skill file:\n```python\n#\n"


def test_a_truncated_evolver_reply_is_sampled_again_and_cached(
        chat_server: ChatServer, redis_target: RedisTarget) -> None:
    """A reply cut at max_tokens is the model's answer, not a fault: it is stored (a re-run
    replays it, sending nothing) and the next sample, if whole, is the candidate."""
    whole = "# OCR\n\nRead every character of the text in the frame before you answer."
    chat_server.inject(Fault(body=completion(CUT, "length")),
                       Fault(body=completion(whole, "stop")))
    first, n1, again, n2 = evolve_twice(chat_server, redis_target)
    assert first == again == whole + "\n"
    assert (n1, n2) == (2, 2) and chat_server.requests[0]["max_tokens"] == 256


def test_an_evolver_cut_at_max_tokens_every_time_skips_the_type_and_says_why(
        chat_server: ChatServer, redis_target: RedisTarget) -> None:
    """Every sample truncated: `CandidateRefused` (the type is ``skipped`` for the step, no
    cooldown) naming the cut and the setting to raise; the re-run asks nothing again."""
    chat_server.inject(*[Fault(body=completion(CUT, "length"))] * 3)
    first, n1, again, n2 = evolve_twice(chat_server, redis_target)
    assert isinstance(first, CandidateRefused) and not isinstance(first, EvolveError)
    assert "truncated (finish_reason length at max_tokens=256" in str(first)
    assert "max_tokens_evolve" in str(first) and str(again) == str(first)
    assert (n1, n2) == (LLMEvolver.REPEAT_RETRIES + 1,) * 2


def test_a_200_that_is_no_chat_completion_marks_its_endpoint_down() -> None:
    bad, good = SlowChatServer(), SlowChatServer()
    with bad, good:
        bad.inject(*[Fault(body='{"choices": [')] * 10)
        pool = EndpointPool([Endpoint(bad.url, 1), Endpoint(good.url, 1)], fail_after=2,
                            probe_after_s=60)
        a = LLMAgent(UNITS, base_url="", model="m", endpoints=pool, think=False,
                     retry=RetryPolicy(max_attempts=5, base_delay_s=0.0, max_total_s=10))
        results = [infer(a) for _ in range(4)]
    assert all(not r.infra for r in results)
    st = {s.url: s for s in pool.stats()}
    assert not st[bad.url].up and st[bad.url].errors == 2 and st[bad.url].times_down == 1
    assert len(bad.requests) == 2  # once down, nothing more went there


def test_an_attempt_that_outlives_the_deadline_counts_as_the_endpoints_timeout() -> None:
    slow, fast = SlowChatServer(delay_s=5.0), SlowChatServer()
    with slow, fast:
        pool = EndpointPool([Endpoint(slow.url, 1), Endpoint(fast.url, 1)], fail_after=1,
                            probe_after_s=60)
        a = LLMAgent(UNITS, base_url="", model="m", endpoints=pool, think=False,
                     timeout=60.0, retry=RetryPolicy(max_attempts=3, base_delay_s=0.0,
                                                     max_total_s=1.0))
        first, second = infer(a), infer(a)
    st = {s.url: s for s in pool.stats()}
    # timeout >= the deadline: the attempt still ends before the deadline, as the slow
    # endpoint's timeout, counted against it (it stayed "up, calls 0" before)
    assert first.infra and "timeout after" in (first.error or "")
    assert "deadline of 1s" in (first.error or "")
    assert st[slow.url].transport_failures == 1 and not st[slow.url].up
    assert not second.infra and second.prediction == "A" and len(fast.requests) == 1


def test_an_evolver_reply_in_content_parts_is_the_candidate(
        chat_server: ChatServer, redis_target: RedisTarget) -> None:
    """A server that answers in text parts proposed a skill: it was refused as an empty
    reply ("unusable: empty message content")."""
    whole = "# OCR\n\nRead every character of the text in the frame before you answer."
    parts = [{"type": "text", "text": whole[:10]}, {"type": "text", "text": whole[10:]}]
    chat_server.inject(Fault(body=completion(parts)))
    first, n1, again, n2 = evolve_twice(chat_server, redis_target)
    assert first == again == whole + "\n"
    assert (n1, n2) == (1, 1)  # cached like a string reply


def test_an_evolver_that_thinks_first_proposes_only_the_skill(
        chat_server: ChatServer, redis_target: RedisTarget) -> None:
    """A reasoning model served without a reasoning parser thinks in the content before the
    skill: the thinking became part of the candidate skill file (a fenced skill was spared,
    an unfenced one was not)."""
    whole = "# OCR\n\nRead every character of the text in the frame before you answer."
    reply = (f"<think>The agent misread the digits; option A was chosen when D was right. "
             f"I should tell it to read every character.</think>\n\n{whole}")
    chat_server.inject(Fault(body=completion(reply)))
    first, n1, again, n2 = evolve_twice(chat_server, redis_target)
    assert first == again == whole + "\n"
    assert (n1, n2) == (1, 1)


AZURE_FILTER = ("The response was filtered due to the prompt triggering Azure OpenAI's content "
                "management policy. Please modify your prompt and retry. To learn more about "
                "our content filtering policies please read our documentation: "
                "https://go.microsoft.com/fwlink/?linkid=2198766")


def test_a_prompt_the_content_filter_refuses_is_the_arms_wrong_answer_cached_not_infra(
        chat_server: ChatServer, redis_target: RedisTarget) -> None:
    """Azure OpenAI answers 400 when the prompt (the skill is part of it) trips its content
    filter: it was INFRA, so a candidate skill that tripped it skipped every pair it would
    have lost, and a run of them aborted the step. The arm's own prompt caused it, as a
    context overflow: its wrong answer, cached (the same prompt is refused again)."""
    chat_server.inject(Fault(status=400, message=AZURE_FILTER, step="answer"))
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
    res = infer(agent(chat_server, cache=cache))
    assert not res.infra and not res.correct and res.prediction is None
    assert "content filter refused the prompt" in (res.error or "")
    assert "content management policy" in (res.error or "")
    assert len(chat_server.requests) == 2  # think, then the refused answer: never retried
    again = infer(agent(chat_server, cache=ResponseCache(redis_target.url,
                                                         prefix=redis_target.prefix)))
    assert len(chat_server.requests) == 2
    assert (again.infra, again.correct, again.error) == (False, False, res.error)
