"""`ToolAgent`, the multi-step reference agent, against a scripted function-calling server:
trajectories whose length tracks wrongness, every turn a cached call, and a step killed with
kill -9 mid-way whose re-run replays the cached turns and decides as an uninterrupted run."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vtrm_gate import GateParams, TypePlan, UnitTask, run_gate
from vtrm_gate.cache import ResponseCache
from vtrm_gate.gate import TaskFinished
from vtrm_gate.harness import Workspace
from vtrm_gate.llm import (
    ANSWER_NUDGE,
    MCQ,
    BackendContext,
    ToolAgent,
    cached_http_client,
    content_parts,
    tool_backend,
)
from vtrm_gate.testing import RedisTarget
from vtrm_gate.testing.chat import HELPFUL_MARKER, Fault, ToolChatServer

BASE = "Read the question's parts before you answer."
CAND = f"{BASE}\n- {HELPFUL_MARKER}"


def mcqs(n: int = 40) -> dict[str, MCQ]:
    """The right answer is always the longest option (C)."""
    return {f"c{i:02d}": MCQ(f"Context of {i}.\n\nHow many? ({i})",
                             ("no", f"maybe {i}", f"certainly the answer {i}", "yes"), "C")
            for i in range(n)}


def gate(server: ToolChatServer, cache: ResponseCache, max_turns: int = 6) -> Any:
    async def go() -> Any:
        async with cached_http_client(cache, base_url=server.url + "/") as client:
            agent = ToolAgent(mcqs(), client, model="tiny", max_turns=max_turns)
            plan = TypePlan("Counting", list(mcqs()), base_skill=BASE, cand_skill=CAND)
            results: list[Any] = []
            out = await run_gate([plan], agent.infer, GateParams(), concurrency=8,
                                 subscribers=[results.append], past_stop="wait",
                                 cancel_after_freeze=False)
            return out, [e.result for e in results
                         if isinstance(e, TaskFinished) and e.result.trace is not None]
    return asyncio.run(go())


def infer_one(server: ToolChatServer, target: RedisTarget, task: UnitTask) -> Any:
    """One unit through a `ToolAgent` on ``server``, cached on the suite's Redis."""
    async def go() -> Any:
        async with cached_http_client(ResponseCache(target.url, prefix=target.prefix),
                                      base_url=server.url + "/") as client:
            return await ToolAgent(mcqs(2), client, model="tiny").infer(task)
    return asyncio.run(go())


def test_trajectories_are_longer_when_wrong_and_a_rerun_sends_nothing(
        redis_target: RedisTarget) -> None:
    with ToolChatServer() as server:
        out, results = gate(server, ResponseCache(redis_target.url, prefix=redis_target.prefix))
        o = out.outcomes["Counting"]
        assert o.action == "ACCEPT"
        turns = {(r.correct, len(r.trace["turns"])) for r in results}
        assert turns == {(True, 2), (False, 4)}  # 1 look + answer; 3 looks + answer
        assert all(r.prediction == ("C" if r.correct else "A") for r in results)
        sent = len(server.requests)
        assert sent == sum(len(r.trace["turns"]) for r in results)
        assert all(t["source"] == "miss" for r in results for t in r.trace["turns"])

        again, results2 = gate(server, ResponseCache(redis_target.url,
                                                     prefix=redis_target.prefix))
        o2 = again.outcomes["Counting"]
        assert (o2.action, o2.W, o2.L, o2.stop_rank) == (o.action, o.W, o.L, o.stop_rank)
        # every turn the first run was answered is a hit; only units it never started (how
        # far past the stop the slots reach depends on timing) are asked, turn by turn
        seen = {(r.trace["unit_id"], r.trace["run_id"]) for r in results}
        old = [r for r in results2 if (r.trace["unit_id"], r.trace["run_id"]) in seen]
        new = [r for r in results2 if (r.trace["unit_id"], r.trace["run_id"]) not in seen]
        assert old and all(r.cached and r.tokens == 0 for r in old)
        assert len(server.requests) - sent == sum(len(r.trace["turns"]) for r in new)


def test_max_turns_cuts_a_trajectory_to_a_wrong_answer(redis_target: RedisTarget) -> None:
    with ToolChatServer() as server:
        _, results = gate(server, ResponseCache(redis_target.url, prefix=redis_target.prefix),
                          max_turns=3)
        cut = [r for r in results if len(r.trace["turns"]) == 3]
        assert cut and all(not r.correct and r.prediction is None and not r.infra
                           and "no answer within 3 turn(s) (max_turns=3)" in r.error
                           for r in cut)
        assert all(r.correct for r in results if len(r.trace["turns"]) == 2)


def test_look_reads_frames_then_slices_of_the_question() -> None:
    from vtrm_gate.harness import parse_media

    long = "x" * 900
    mcq = MCQ(f"First paragraph.\n\n{long}\n\nWhat is shown?", ("a", "b"), "A",
              parse_media({"frames": [{"image": "/v/f1.jpg", "t": 1.5}, "/v/f2.jpg"]}))
    assert content_parts(mcq) == ["frame 1 of 2 at 1.5 s: f1.jpg", "frame 2 of 2: f2.jpg",
                                  "First paragraph.", "x" * 400, "x" * 400, "x" * 100]
    assert content_parts(MCQ("What is shown?", ("a", "b"), "A")) == ["What is shown?"]


# ---- kill -9 in the middle of a step, then the re-run --------------------------------------


def units_file(path: Path) -> Path:
    rows = [{"unit_id": u, "task_type": "Counting", "question": m.question,
             "options": list(m.options), "answer": m.answer} for u, m in mcqs().items()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def cli_env(server: ToolChatServer, target: RedisTarget) -> dict[str, str]:
    return {**os.environ, "REDIS_URL": target.url, "VTRM_CACHE_PREFIX": target.prefix,
            "VTRM_BASE_URL": server.url, "VTRM_MODEL": "tiny"}


def cli(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "vtrm_gate", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def init_step(tmp: Path, name: str, env: dict[str, str]) -> list[str]:
    ws = tmp / name
    p = cli(["init", str(ws), "--llm", "--units", str(units_file(tmp / "units.jsonl")),
             "--backend", "vtrm_gate.llm:tool_backend"], env)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return ["step", "--workspace", str(ws), "--epoch", "1", "--step", "1", "--json"]


def finish(p: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err
    return json.loads(out)


def decisions(doc: dict[str, Any]) -> dict[str, Any]:
    return {t["task_type"]: (t["status"], t["action"], t.get("W"), t.get("L"),
                             t.get("stop_rank")) for t in doc["types"]}


def calls(doc: dict[str, Any]) -> tuple[int, int]:
    """(calls the run made, calls served from the cache) over every run id of the step."""
    runs = doc["llm_cache"]["runs"].values()
    return (sum(r["calls"] for r in runs), sum(r["hits"] + r["coalesced"] for r in runs))


@pytest.mark.slow
def test_kill_9_mid_step_then_the_rerun_replays_cached_turns_and_decides_the_same(
        tmp_path: Path, redis_target: RedisTarget) -> None:
    with ToolChatServer() as server:
        env = cli_env(server, redis_target)
        whole = finish(cli(init_step(tmp_path, "whole", env), env))
        total = len(server.requests)
        assert decisions(whole)["Counting"][:2] == ("gated", "ACCEPT")
        runs = whole["llm_cache"]["runs"]  # the rollout's and the evolver's calls: own run ids
        assert runs["e1_s1_rollout"]["writes"] > 0 and runs["e1_s1_evolve_counting"]["writes"] == 1

        step = init_step(tmp_path, "crashed", env)
        server.requests.clear()
        server.pause_after(total // 2)
        p = cli(step, env)
        assert server.paused.wait(120)
        p.send_signal(signal.SIGKILL)  # kill -9 with calls in flight, mid-trajectory
        p.wait(30)
        server.resume()
        before = len(server.requests)
        rerun = finish(cli(step, env))
        made, served = calls(rerun)
        sent = len(server.requests) - before
        assert decisions(rerun) == decisions(whole)
        # every request a miss (a miss cancelled past the stop may never have been sent)
        assert served > 0 and sent <= made - served
        assert sent < total  # the cached turns were not asked again
        print(f"\nkill -9 after {before} answered requests (an uninterrupted run: {total}); "
              f"re-run: {made} calls, {served} from the cache ({served / made:.0%}), {sent} "
              f"requests; crash + re-run: {before + sent} requests ({(before + sent) / total:.2f}x "
              f"an uninterrupted run)")


class WordyServer(ToolChatServer):
    """A model that answers in words naming no letter unless a tool is forced on it."""

    def answer(self, body: dict[str, Any], step: str) -> dict[str, Any]:
        forced = (body.get("tool_choice") or {}).get("function", {}).get("name")
        if forced == "answer":
            return self.tool_call(body, "call_x", "answer", {"letter": "C"})
        if forced == "look":
            return self.tool_call(body, "call_y", "look", {"part": 1})
        return self.completion(body, "It is hard to say.")


def test_the_first_turn_looks_and_a_reply_in_words_is_asked_for_its_letter(
        redis_target: RedisTarget) -> None:
    with WordyServer() as server:
        res = infer_one(server, redis_target, UnitTask("Counting", "c00", "base", 0, "r", BASE,
                                                       "h"))
        assert (res.correct, res.prediction, len(res.trace["turns"])) == (True, "C", 3)
        first, second, third = server.requests
        assert first["tool_choice"]["function"]["name"] == "look"
        assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_y",
                                          "content": "Context of 0."}  # part 1 of 1
        assert first["messages"][1]["content"].startswith("How many? (0)\n\nOptions:\nA. no")
        assert "tool_choice" not in second  # the model chooses
        assert third["messages"][-1]["content"] == ANSWER_NUDGE
        assert third["tool_choice"]["function"]["name"] == "answer"
        enum = third["tools"][1]["function"]["parameters"]["properties"]["letter"]["enum"]
        assert enum == ["A", "B", "C", "D"]


def test_a_turn_retries_a_503_and_a_400_makes_the_unit_infra_with_the_servers_words(
        redis_target: RedisTarget) -> None:
    from vtrm_gate.llm import RetryPolicy
    from vtrm_gate.testing.chat import Fault

    with ToolChatServer() as server:
        async def go() -> Any:
            async with cached_http_client(ResponseCache(redis_target.url,
                                                        prefix=redis_target.prefix),
                                          base_url=server.url + "/") as client:
                agent = ToolAgent(mcqs(2), client, model="tiny",
                                  retry=RetryPolicy(max_attempts=3, base_delay_s=0.0))
                task = UnitTask("Counting", "c00", "base", 0, "r", BASE, "h")
                ok = await agent.infer(task)
                server.inject(Fault(status=400, message="unknown field 'tools'"))
                bad = await agent.infer(UnitTask("Counting", "c01", "base", 1, "r", BASE, "h"))
                return ok, bad

        server.inject(Fault(status=503, retry_after="0"))
        ok, bad = asyncio.run(go())
        assert not ok.infra and len(ok.trace["turns"]) in (2, 4)
        assert len(server.requests) == len(ok.trace["turns"]) + 1 + 1  # the 503, the 400
        assert bad.infra and bad.error == "turn 1: HTTP 400: unknown field 'tools'"


@pytest.mark.timeout(60)
def test_a_reply_that_trickles_ends_at_the_turns_deadline_not_never(
        redis_target: RedisTarget) -> None:
    """A 200 whose body came a byte a second ran past ``timeout`` (httpx's is per read) and
    ``retry.max_total_s``: a 12-unit step with --timeout 2 --deadline 4 took 49 s, and at the
    defaults a 61-unit pool about 3 hours (h16). The turn ends at its deadline, INFRA."""
    from vtrm_gate.llm import RetryPolicy
    from vtrm_gate.testing.chat import Fault

    with ToolChatServer() as server:
        async def go() -> Any:
            async with cached_http_client(ResponseCache(redis_target.url,
                                                        prefix=redis_target.prefix),
                                          base_url=server.url + "/", timeout=1.0) as client:
                agent = ToolAgent(mcqs(2), client, model="tiny",
                                  retry=RetryPolicy(max_attempts=3, max_total_s=2.0))
                return await agent.infer(UnitTask("Counting", "c00", "base", 0, "r", BASE, "h"))

        server.inject(Fault(status=503, retry_after="0", message="busy"), Fault(trickle_s=0.5))
        res = asyncio.run(go())
    # the earlier attempt's cause is kept (h18: it was dropped)
    assert res.infra and res.error == ("turn 1: deadline of 2s exceeded during attempt 2 "
                                       "(retry.max_total_s; attempt 1: HTTP 503: busy)")
    assert server.client_left.wait(10)  # the client hung up: the server did not stop writing


def test_a_turn_the_server_refuses_for_its_length_is_a_wrong_answer_the_rerun_never_asks(
        redis_target: RedisTarget) -> None:
    """A context overflow is the arm's wrong answer; the cached client stored only 200s, so
    each re-run asked the refused turn again (docs/limits.md said so). Now it is a hit."""
    from vtrm_gate.testing.chat import Fault

    overflow = "This model's maximum context length is 2048 tokens. However, you requested 2536"
    task = UnitTask("Counting", "c00", "cand", 0, "r", CAND, "h")
    with ToolChatServer() as server:
        server.inject(Fault(status=400, message=overflow))
        first = infer_one(server, redis_target, task)
        sent = len(server.requests)
        again = infer_one(server, redis_target, task)
        assert not first.infra and first.correct is False
        assert first.error == again.error and "context overflow" in first.error
        assert [t["source"] for t in first.trace["turns"]] == ["refused"]
        assert sent == 1 and len(server.requests) == 1  # the re-run sent nothing


class NoCases:
    """A rollout with no wrong answers (the proposal's prompt then holds the skill only)."""

    async def errors(self, *_: Any) -> list[Any]:
        return []


def test_the_evolvers_sampling_seed_follows_the_workspace_seed_and_the_step(
        redis_target: RedisTarget) -> None:
    """A real model samples a proposal at temperature 0.7: without a seed, two workspaces of
    one seed proposed different candidates on llama.cpp and decided differently
    (bench_real_kill). Each request now carries a seed derived from the workspace's seed,
    the type and the step."""
    from vtrm_gate.llm import ToolEvolver

    with ToolChatServer() as server:
        async def propose(ws_seed: int | None, step: int, salt: str) -> None:
            cache = ResponseCache(redis_target.url, prefix=f"{redis_target.prefix}{salt}:")
            async with cached_http_client(cache, base_url=server.url + "/") as client:
                agent = ToolAgent(mcqs(1), client, model="tiny")
                ev = ToolEvolver(agent, NoCases(), seed=ws_seed)  # type: ignore[arg-type]
                await ev.evolve("Counting", BASE, [], 1, step)

        for ws_seed, step, salt in [(7, 1, "a"), (7, 1, "b"), (7, 2, "c"), (8, 1, "d"),
                                    (None, 1, "e")]:
            asyncio.run(propose(ws_seed, step, salt))
    seeds = [r.get("seed") for r in server.requests]
    assert len(seeds) == 5 and seeds[0] == seeds[1]  # two workspaces of seed 7: alike
    assert len({seeds[0], seeds[2], seeds[3]}) == 3 and seeds[4] is None
    assert all(isinstance(s, int) and 0 <= s < 2**32 for s in seeds[:4])


@pytest.mark.parametrize(("name", "value", "said"), [
    ("VTRM_MAX_TURNS", "abc", "VTRM_MAX_TURNS must be an integer >= 1, got 'abc'"),
    ("VTRM_MAX_TURNS", "0", "VTRM_MAX_TURNS must be an integer >= 1, got '0'"),
    ("VTRM_TIMEOUT", "1 min", "VTRM_TIMEOUT: timeout must be a number of seconds")])
def test_the_tool_backends_settings_are_named_when_they_are_wrong(
        tmp_path: Path, name: str, value: str, said: str) -> None:
    """``VTRM_MAX_TURNS=abc`` ended in "invalid literal for int() with base 10: 'abc'",
    naming no variable."""
    env = {**os.environ, "VTRM_BASE_URL": "http://127.0.0.1:9", "VTRM_MODEL": "tiny",
           name: value}
    env.pop("REDIS_URL", None)
    step = init_step(tmp_path, "ws", env)
    p = cli(step, env)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2 and said in out + err and "Traceback" not in err, (out, err)


def test_the_tool_backend_takes_its_request_timeout_from_the_resolved_options(
        tmp_path: Path, redis_target: RedisTarget) -> None:
    """``step --timeout`` (or a config file's ``timeout``) reached every backend but the tool
    backend, which re-read ``VTRM_TIMEOUT`` from the environment and so waited 60 s."""
    env = {**os.environ, "VTRM_BASE_URL": "http://127.0.0.1:9", "VTRM_MODEL": "tiny"}
    init_step(tmp_path, "ws", env)
    ws = Workspace.open(tmp_path / "ws", readonly=True)
    task = UnitTask("Counting", "c00", "base", 0, "tool-timeout", skill=BASE)

    async def answer(server: ToolChatServer, timeout: float) -> Any:
        cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
        ctx = BackendContext(ws, cache, 1, {
            "VTRM_BASE_URL": server.url, "VTRM_MODEL": "tiny", "VTRM_TIMEOUT": "60"},
            timeout=timeout)
        backend = tool_backend(ctx)
        try:
            return await backend.infer(task)
        finally:
            await backend.aclose()

    with ToolChatServer() as server:
        server.inject(*[Fault(sleep=0.6)] * 3)
        slow = asyncio.run(answer(server, 0.2))
    assert slow.infra and "ReadTimeout" in (slow.error or ""), slow
    with ToolChatServer() as server:
        server.inject(Fault(sleep=0.6))
        ok = asyncio.run(answer(server, 5.0))
    assert not ok.infra, ok
