"""The agent's settings are one frozen value (`AgentSettings`), its two calls per unit are
call kinds (``think``, ``answer``), not "steps", and neither rename moves a cache key or a
stored trace."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

from tests.llm.test_llm import FAST, UNITS, agent, infer, task
from vtrm_gate.cache import KeyParts, ResponseCache
from vtrm_gate.gate import UnitTask
from vtrm_gate.llm import MCQ, AgentEvent, AgentSettings, LLMAgent, RetryPolicy
from vtrm_gate.testing import ChatServer, Fault, RedisTarget

MCQ_1 = MCQ("How many cats?", ("one", "two", "three"), "B")
TASK_1 = UnitTask("Counting Problem", "u1", "base", 0, "e1_s1_gate_counting-problem_base",
                  skill="# Skill\n- count twice")
# computed before the rename (commit da1f929): the keys of the think and the answer call
KEYS = ("llm_cache:e0d8c573f68a521d38fe983a3625ad113f46af3bac7d26f7afbf53e21166eeb9",
        "llm_cache:3e4186725b7764a255478a780cdcd475f3fe421f0b92a2439be1bc95d29727c4")


def test_the_cache_key_of_a_known_call_is_unchanged() -> None:
    a = LLMAgent({"u1": MCQ_1}, base_url="http://127.0.0.1:9/v1", model="m")
    first = a.messages(TASK_1, MCQ_1)
    answer = [*first, {"role": "assistant", "content": "two cats"},
              {"role": "user", "content": "Answer with the letter of the correct option only."}]
    keys = tuple(KeyParts.from_request(a.body(kind, m), a.base_url, "salt-1").key()
                 for kind, m in (("think", first), ("answer", answer)))
    assert keys == KEYS


def test_settings_are_one_frozen_value_given_whole_or_as_keywords() -> None:
    s = AgentSettings(base_url="http://h/v1", model="m", think=False, timeout=7.0,
                      max_tokens=32, params={"seed": 1}, retry=FAST)
    whole = LLMAgent(UNITS, s)
    fields = LLMAgent(UNITS, base_url="http://h/v1", model="m", think=False, timeout=7.0,
                      max_tokens=32, params={"seed": 1}, retry=FAST)
    assert whole.settings == fields.settings == s
    assert (whole.model, whole.think, whole.timeout, whole.retry) == ("m", False, 7.0, FAST)
    assert whole.max_tokens == {"think": 32, "answer": 32}
    assert whole.params == {"temperature": 0.0, "seed": 1}
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.timeout = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError, match="not both"):
        LLMAgent(UNITS, s, model="other")
    with pytest.raises(ValueError, match=r"LLMAgent\.timeout must be a finite number of "
                                         r"seconds > 0"):
        AgentSettings(base_url="http://h/v1", model="m", timeout=0)
    assert LLMAgent(UNITS, base_url="http://h/v1", model="m", retry=None).retry == RetryPolicy()
    # the constructor's own parameters: units, settings, and the collaborators (was 19)
    assert list(inspect.signature(LLMAgent.__init__).parameters)[1:] == [
        "units", "settings", "api_key", "cache", "on_event", "rng", "transport", "endpoints",
        "media", "secrets", "fields"]


def test_the_trace_and_events_name_the_call_kind_and_the_stored_trace_keeps_its_keys(
        chat_server: ChatServer, redis_target: RedisTarget) -> None:
    events: list[AgentEvent] = []
    chat_server.inject(Fault(status=503, retry_after="0.01", step="answer"))
    cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
    [res] = infer(agent(chat_server, cache, on_event=events.append), task())
    assert [s["step"] for s in res.trace["steps"]] == ["think", "answer"]  # stored as before
    assert json.dumps(res.trace["steps"][0]).startswith('{"step": "think", "source": ')
    retry = next(e for e in events if e.kind == "retry")
    assert retry.call_kind == "answer"
    with pytest.warns(DeprecationWarning, match=r"AgentEvent\.step .* 0\.3\.0.*call_kind"):
        assert retry.step == "answer"


def test_chat_takes_call_kind_and_the_old_step_keyword_warns(chat_server: ChatServer) -> None:
    import asyncio

    events: list[AgentEvent] = []
    a = agent(chat_server, on_event=events.append)
    body = a.body("answer", a.messages(task(), UNITS["u1"]))

    async def go() -> None:
        try:
            await a.chat(body, call_kind="evolve")
            with pytest.warns(DeprecationWarning, match=r"chat\(step=\.\.\.\).*call_kind"):
                await a.chat(body, step="think")
            with pytest.raises(TypeError, match="'stp'"):
                await a.chat(body, stp="think")
        finally:
            await a.aclose()

    asyncio.run(go())
    assert [e.call_kind for e in events if e.kind == "request"] == ["evolve", "think"]
