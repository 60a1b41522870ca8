"""The agent against third-party fault injection: ``llmock`` (PyPI, the ``model`` extra) serves
OpenAI chat completions and breaks them on request (429 with a real ``Retry-After``, 503
bursts, slow answers, context overflow), and grades the client from what it saw: its verdict
must find nothing wrong (no retry before Retry-After, no retry of a 4xx, no retry storm)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import random
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vtrm_gate.cache import ResponseCache
from vtrm_gate.gate import UnitResult, UnitTask
from vtrm_gate.harness import StepResult, run_step
from vtrm_gate.llm import (
    MCQ,
    AgentEvent,
    LLMAgent,
    LLMEvolver,
    RetryPolicy,
    init_llm,
    llm_backend,
    rollout_cases,
)
from vtrm_gate.options import RunOptions
from vtrm_gate.testing import RedisTarget

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llmock") is None,
                                reason="llmock is in the model extra (make test installs it)")

UNITS = {f"u{i}": MCQ(f"Question {i}?", ("a cat", "a dog"), "A") for i in range(8)}


class Llmock:
    """``llmock serve`` on a free loopback port, driven over its ``/_llmock`` API."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmock.cli", "serve", "--host", "127.0.0.1", "--port",
             str(self.port), "--log-level", "warning", "--tool-mode", "off"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                self.get("/_llmock/scenario")
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("llmock did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
            return json.loads(r.read())

    def post(self, path: str, doc: Any) -> Any:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                     data=json.dumps(doc).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read() or b"null")

    def scenario(self, *behaviours: dict[str, Any]) -> None:
        self.post("/_llmock/reset", {})
        self.post("/_llmock/scenario", {"behaviors": list(behaviours)})

    def verdict(self) -> Any:
        return self.get("/_llmock/verdict")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def llmock() -> Iterator[Llmock]:
    server = Llmock()
    yield server
    server.close()


def answer(server: Llmock, n: int = 1, **kw: Any) -> list[UnitResult]:
    agent = LLMAgent(UNITS, base_url=server.url, model="gpt-4o-mini", think=False,
                     api_key="sk-test-llmock-0001", rng=random.Random(0),
                     retry=kw.pop("retry", RetryPolicy(max_attempts=6, base_delay_s=0.05,
                                                       max_total_s=30)), **kw)

    async def go() -> list[UnitResult]:
        try:
            return list(await asyncio.gather(*(
                agent.infer(UnitTask("OCR", f"u{i}", "base", i, "e1_s1_gate_ocr_base", "s"))
                for i in range(n))))
        finally:
            await agent.aclose()

    return asyncio.run(go())


def findings(server: Llmock) -> list[Any]:
    """What llmock's verdict holds against the client (errors; [] when it passed)."""
    v = server.verdict()
    bad = [f for f in v["findings"] if f["severity"] == "error"]
    assert v["passed"] == (not bad)
    return bad


def test_429_with_retry_after_is_waited_for_and_llmock_finds_nothing_wrong(
        llmock: Llmock) -> None:
    llmock.scenario({"type": "fail", "status": 429, "retry_after": 1, "times": 2})
    events: list[AgentEvent] = []
    [res] = answer(llmock, on_event=events.append)
    assert not res.infra  # llmock's text: no letter, but an answer (not INFRA)
    # each 429 was waited out for the server's Retry-After (1 s), not the client's backoff
    retries = [(e.status, e.delay_s) for e in events if e.kind == "retry"]
    assert retries == [(429, 1.0), (429, 1.0)]
    assert sum(e.kind == "request" for e in events) == 3
    assert findings(llmock) == []


def test_a_burst_of_503s_is_ridden_out_with_backoff(llmock: Llmock) -> None:
    llmock.scenario({"type": "fail", "status": 503, "times": 4})
    results = answer(llmock, n=2)
    assert all(not r.infra for r in results)
    assert findings(llmock) == []


def test_a_slow_answer_past_the_attempt_timeout_is_retried(llmock: Llmock) -> None:
    llmock.scenario({"type": "delay", "seconds": 3, "times": 1})
    [res] = answer(llmock, timeout=1.0)
    assert not res.infra
    assert findings(llmock) == []


def test_a_4xx_is_not_retried_and_its_text_is_quoted(llmock: Llmock) -> None:
    llmock.scenario({"type": "fail", "status": 401, "times": 3})
    [res] = answer(llmock)
    assert res.infra and "HTTP 401" in (res.error or "") and len(res.error or "") > 12
    reqs = llmock.get("/_llmock/requests")
    assert len(reqs if isinstance(reqs, list) else reqs.get("requests", [])) == 1
    assert findings(llmock) == []


def test_a_context_overflow_is_the_arms_wrong_answer(llmock: Llmock) -> None:
    llmock.scenario({"type": "fail", "status": 400, "times": 1,
                     "code": "context_length_exceeded",
                     "message": "This model's maximum context length was exceeded."})
    [res] = answer(llmock)
    assert not res.infra and not res.correct and "context overflow" in (res.error or "")


def test_llmocks_canned_reply_is_never_gated(llmock: Llmock, tmp_path: Path,
                                             redis_target: RedisTarget) -> None:
    """Issue 26 #3: the evolver's reply is llmock's canned chat text ("Hello! LLMock handled
    this request..."), re-sampled and never a skill: the type is skipped naming why, with
    zero gate calls and no cooldown."""
    llmock.post("/_llmock/reset", {})  # no faults: every reply is canned text
    T = "Counting Problem"
    lines = [{"unit_id": f"u{i:02d}", "task_type": T, "question": f"How many cats, {i}?",
              "options": ["one", "two", "three"], "answer": "B"} for i in range(12)]
    units = tmp_path / "units.jsonl"
    units.write_text("".join(json.dumps(x) + "\n" for x in lines))
    ws = init_llm(tmp_path / "ws", units, base_url=llmock.url, model="gpt-4o-mini", seed=1,
                  cooldown_steps=2)
    backend = llm_backend(ws, RunOptions(),
                          cache=ResponseCache(redis_target.url, prefix=redis_target.prefix),
                          api_key="sk-test-llmock-0001", env={},
                          retry=RetryPolicy(max_attempts=2, base_delay_s=0.01, max_total_s=20))
    gate_calls: list[UnitTask] = []

    async def infer(task: UnitTask) -> UnitResult:
        gate_calls.append(task)
        return await backend.infer(task)

    async def go() -> StepResult:
        try:
            cases = await rollout_cases(backend, ws, 1, 1)
            assert cases[T], "llmock's reply names no letter: every rollout unit is wrong"
            return await run_step(ws, 1, 1, infer=infer, evolver=backend.evolver, cases=cases,
                                  options=RunOptions(concurrency=4))
        finally:
            await backend.aclose()

    res = asyncio.run(go())
    evolve = [r for r in _requests(llmock) if "skill file" in json.dumps(r)]
    assert len(evolve) == 1 + LLMEvolver.REPEAT_RETRIES  # re-sampled, then given up
    assert res.types[T].status == "skipped" and gate_calls == []
    note = res.types[T].note or ""
    assert "no skill to gate in all 3 samples" in note and "not a skill" in note, note
    assert "gpt-4o-mini" in note  # the canned text is quoted
    assert ws.state.cooldown_until.get(T, 0) == 0 and ws.state.last_step == (1, 1)


def _requests(server: Llmock) -> list[Any]:
    reqs = server.get("/_llmock/requests")
    return reqs if isinstance(reqs, list) else reqs.get("requests", [])
