"""An evolver that re-proposes a rejected candidate (issue 19 #4): it is asked again with a
fresh sample a bounded number of times (the retry index is in the cache salt, so a re-run
replays the same retries from Redis), then the type is skipped for the step with a note and
the training run moves on instead of stopping at the same step forever."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from vtrm_gate.cache import ResponseCache
from vtrm_gate.errors import RepeatedCandidate
from vtrm_gate.harness import StepResult, Workspace, run_step
from vtrm_gate.llm import LLMEvolver, RetryPolicy, init_llm, llm_backend, rollout_cases
from vtrm_gate.options import RunOptions
from vtrm_gate.testing import ChatServer, RedisTarget
from vtrm_gate.testing.chat import HELPFUL_MARKER

FAST = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.02, max_total_s=10.0)
T = "Counting Problem"
HARMFUL = "mode: ramble"


def make_ws(tmp_path: Path, server: ChatServer) -> Workspace:
    lines = []
    for i in range(12):  # the base skill answers A: always wrong
        options = [f"opt {k}" for k in range(4)]
        options[1 + i % 3] = "the longest option, by a clear margin"
        lines.append({"unit_id": f"u{i:02d}", "task_type": T, "question": f"q {i}?",
                      "options": options, "answer": "ABCD"[1 + i % 3]})
    units = tmp_path / "units.jsonl"
    units.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return init_llm(tmp_path / "ws", units, base_url=server.url, model="m", seed=1,
                    cooldown_steps=0)


def fenced(skill: str, line: str) -> str:
    return f"```markdown\n{skill.rstrip()}\n- {line}\n```"


def step(ws: Workspace, target: RedisTarget, n: int) -> StepResult:
    cache = ResponseCache(target.url, prefix=target.prefix)
    backend = llm_backend(ws, RunOptions(), cache=cache, api_key="k", env={}, retry=FAST)

    async def go() -> StepResult:
        try:
            cases = await rollout_cases(backend, ws, 1, n)
            return await run_step(ws, 1, n, infer=backend.infer, evolver=backend.evolver,
                                  cases=cases, options=RunOptions(concurrency=8))
        finally:
            await backend.aclose()

    return asyncio.run(go())


@pytest.fixture
def rejected_once(tmp_path: Path, chat_server: ChatServer, redis_target: RedisTarget
                  ) -> tuple[Workspace, ChatServer]:
    """A workspace whose step e1 s1 rejected the candidate the evolver keeps proposing."""
    chat_server.evolve_reply = lambda t, skill, body: fenced(skill, HARMFUL)
    ws = make_ws(tmp_path, chat_server)
    first = step(ws, redis_target, 1)
    assert first.types[T].action in ("FUTILE", "REJECT")
    assert ws.state.rejected_texts(T) and HARMFUL in ws.state.rejected_texts(T)[0]
    return ws, chat_server


def test_a_type_whose_evolver_only_repeats_a_rejected_candidate_is_skipped_and_the_run_goes_on(
        rejected_once: tuple[Workspace, ChatServer], redis_target: RedisTarget) -> None:
    ws, server = rejected_once
    before = len(server.of_step("evolve"))
    res = step(ws, redis_target, 2)  # main: StepUnmeasuredError (exit 3), every time
    assert res.types[T].status == "skipped"
    note = res.types[T].note
    assert "rejected candidate" in note and "3 samples" in note, note
    assert len(server.of_step("evolve")) - before == 1 + LLMEvolver.REPEAT_RETRIES
    # each sample names its own key's run (X-Vtrm-Run): the same body, salted /retry{k}
    runs = [r for b, r in zip(server.requests, server.run_ids, strict=True)
            if server.step_of(b) == "evolve"][before:]
    assert runs == [LLMEvolver.run_id(T, 1, 2) + s for s in ("", "/retry1", "/retry2")]
    assert ws.state.last_step == (1, 2)  # applied: the next step can run
    n = len(server.requests)
    again = step(ws, redis_target, 2)  # a re-run replays the manifest: no request
    assert len(server.requests) == n and again.types[T].status == "skipped"
    # the evolver itself, asked again (a step that crashed before its manifest): every
    # sample, the retries included, comes from Redis
    backend = llm_backend(ws, RunOptions(),
                          cache=ResponseCache(redis_target.url, prefix=redis_target.prefix),
                          api_key="k", env={}, retry=FAST)

    async def evolve_again() -> None:
        try:
            await rollout_cases(backend, ws, 1, 2)
            with pytest.raises(RepeatedCandidate):
                await backend.evolver.evolve(T, ws.skill_text(T), ws.state.rejected_texts(T),
                                             1, 2)
        finally:
            await backend.aclose()

    asyncio.run(evolve_again())
    assert len(server.requests) == n


def test_a_fresh_sample_that_differs_from_the_rejected_ones_is_gated(
        rejected_once: tuple[Workspace, ChatServer], redis_target: RedisTarget) -> None:
    ws, server = rejected_once
    calls: list[int] = []

    def reply(t: str, skill: str, body: dict[str, Any]) -> str:
        calls.append(1)  # the first two samples repeat the rejected text, the third not
        return fenced(skill, HARMFUL if len(calls) <= 2 else HELPFUL_MARKER)

    server.evolve_reply = reply
    res = step(ws, redis_target, 2)
    assert res.types[T].status == "gated" and len(calls) == 3
    cand = json.loads(res.manifest_path.read_text())["candidates"][T]["file"]
    assert HELPFUL_MARKER in (ws.root / cand).read_text()
    n = len(server.requests)
    again = step(ws, redis_target, 2)
    assert len(server.requests) == n and again.types[T].cand_hash == res.types[T].cand_hash


def test_a_chat_reply_is_sampled_again_and_a_later_skill_is_gated(
        tmp_path: Path, chat_server: ChatServer, redis_target: RedisTarget) -> None:
    """Issue 26 #3: a reply that is no skill ("The correct option is B.", an empty skill
    file) is re-sampled like a repeat; the first real skill is gated, and a re-run replays
    them all."""
    replies = iter(["The correct option is B.", "```markdown\n\n```"])

    def reply(t: str, skill: str, body: dict[str, Any]) -> str:
        return next(replies, None) or fenced(skill, HELPFUL_MARKER)

    chat_server.evolve_reply = reply
    ws = make_ws(tmp_path, chat_server)
    res = step(ws, redis_target, 1)
    assert len(chat_server.of_step("evolve")) == 3
    assert res.types[T].status == "gated" and res.types[T].action is not None
    n = len(chat_server.requests)
    backend = llm_backend(ws, RunOptions(),
                          cache=ResponseCache(redis_target.url, prefix=redis_target.prefix),
                          api_key="k", env={}, retry=FAST)

    async def evolve_again() -> str:
        try:
            await rollout_cases(backend, ws, 1, 1)
            return await backend.evolver.evolve(T, ws.skill_text(T, ws.state.before_last),
                                                [], 1, 1)
        finally:
            await backend.aclose()

    assert HELPFUL_MARKER in asyncio.run(evolve_again())
    assert len(chat_server.requests) == n  # all three samples came from Redis


def test_an_evolver_that_only_chats_skips_the_type_without_a_gate_call(
        tmp_path: Path, chat_server: ChatServer, redis_target: RedisTarget) -> None:
    chat_server.evolve_reply = lambda t, skill, body: "Hello! How can I help you today?"
    ws = make_ws(tmp_path, chat_server)
    res = step(ws, redis_target, 1)
    assert res.types[T].status == "skipped"
    assert res.types[T].note.startswith(f"the evolver's reply for {T!r} was no skill to gate "
                                        f"in all 3 samples (a chat reply ('Hello! How can I")
    # the rollout's 8 units (think + answer) and 3 evolver samples: not one gate call
    assert len(chat_server.requests) == 16 + 3 and res.gate is None
    assert ws.state.cooldown_until.get(T, 0) == 0


def test_a_proposal_holding_a_lone_surrogate_is_gated_with_it_replaced(
        tmp_path: Path, redis_target: RedisTarget) -> None:
    """A reply whose JSON escapes a lone surrogate (a gateway that cut an emoji's UTF-16
    pair) is no Unicode text: the candidate skill reached Phase B and the step died there
    writing it (UnicodeEncodeError), and the reply was never cached. Each lone surrogate
    now reads as U+FFFD, as a broken UTF-8 byte would: the step gates the candidate, and a
    re-run replays it from Redis."""
    def reply(task_type: str, skill: str, body: Any) -> str:
        return f"{skill.rstrip()}\n- {HELPFUL_MARKER} \ud83d\n"

    with ChatServer(evolve_reply=reply) as server:
        ws = make_ws(tmp_path, server)
        first = step(ws, redis_target, 1)
        assert first.types[T].status == "gated"
        cand = [p.read_text() for p in ws.candidates_dir(1, 1).rglob("*") if p.is_file()]
        assert any(f"{HELPFUL_MARKER} \ufffd" in text for text in cand), cand
