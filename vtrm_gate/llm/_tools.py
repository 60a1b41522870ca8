"""`ToolAgent`: a multi-step reference agent (OpenAI function calling) on the cached client.

Each unit is a trajectory of at most ``max_turns`` chat turns: the model reads the unit's
context part by part with the ``look(part)`` tool (a frame's description, or a slice of the
question's text before the question asked) and ends with the ``answer(letter)`` tool or a
reply naming a letter. The first turn must look and the last must answer (``tool_choice``),
as must the turn after a reply in words that names no letter (llama.cpp constrains a forced
tool's arguments to its schema, so a small model too walks a trajectory and ends on one of
the letters). Every turn is a call through `cached_http_client`, salted with the
run being answered, so a re-run after a crash replays each trajectory's cached turns and goes
fresh from its first miss.
`tool_backend` ships it as a bring-your-own backend (``--backend vtrm_gate.llm:tool_backend``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any, NamedTuple, cast

import httpx

from .._env import api_key as _api_key
from .._ids import content_hash, rollout_run_id
from ..cache import protocol_failure, tool_calls
from ..errors import (
    BackendError,
    CasesUnavailable,
    ContextOverflowError,
    LLMInfraError,
    PromptFilteredError,
    described,
    is_whole,
)
from ..gate import GuardParams, UnitResult, UnitTask
from ..harness import step_input_state
from ._agent import MCQ, RetryPolicy, parse_body, parse_retry_after
from ._backend import ROLLOUT_UNITS, Rollout, workspace_units
from ._client import CACHE_HEADER
from ._endpoints import base_and_query
from ._evolver import EVOLVE_SYSTEM, EVOLVE_TASK, strip_fences
from ._plugin import AgentBackend, BackendContext
from ._replies import (
    LETTERS,
    answer_argument,
    call_arguments,
    call_name,
    content_text,
    error_detail,
    non_json_reply,
    parse_choice,
    refusal,
    refusal_text,
    refused_reply,
    usage_tokens,
)

TOOL_AGENT_VERSION = 3
"""Bumped on every change to the prompts, tools or grading: it joins the agent's identity.
2: a reply in content parts, in Chinese, in full-width letters, boxed or after a
``<think>`` block, and arguments given as an object, are read. 3: ``look``'s part given as
text ("2") is read, a call to a tool it was not given is named as such, and ``answer``'s
letter under another argument name is read; a context overflow or a content filter's
refusal of the prompt is the arm's wrong answer, not INFRA."""
TOOL_SYSTEM = ("You answer a multiple-choice question. Its content comes in numbered parts: "
               "read them with the look tool, then call the answer tool with the letter of "
               "the correct option. Follow the skill instructions below.\n\n")
PART_CHARS = 400
"""A question's paragraph longer than this is read in slices of this many characters."""
ANSWER_NUDGE = "Call the answer tool with the letter of the correct option."


def tool_schemas(n_options: int) -> list[dict[str, Any]]:
    """The two tools: ``look(part)`` and ``answer(letter)``, the letter one of the unit's
    ``n_options`` (a server that constrains arguments to the schema, as llama.cpp does for a
    forced tool, can only answer with a valid letter)."""
    return [
        {"type": "function", "function": {
            "name": "look", "description": "Read one numbered part of the question's content.",
            "parameters": {"type": "object", "required": ["part"],
                           "properties": {"part": {"type": "integer", "minimum": 1}}}}},
        {"type": "function", "function": {
            "name": "answer", "description": "Give the final answer: the option's letter.",
            "parameters": {"type": "object", "required": ["letter"], "properties": {
                "letter": {"type": "string", "enum": list(LETTERS[:n_options])}}}}},
    ]


def _forced(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def _paragraphs(mcq: MCQ) -> list[str]:
    return [p.strip() for p in mcq.question.split("\n\n") if p.strip()]


def content_parts(mcq: MCQ, size: int = PART_CHARS) -> list[str]:
    """What ``look(part)`` reads: each frame of the unit's media (its time and file), then
    the question's context (its paragraphs before the last, the question asked), a long one
    in slices of ``size`` characters; a unit with neither: the question itself."""
    parts = []
    frames = mcq.media.frames if mcq.media is not None else ()
    for i, f in enumerate(frames, 1):
        at = f" at {f.t:g} s" if f.t is not None else ""
        parts.append(f"frame {i} of {len(frames)}{at}: {PurePosixPath(f.image).name}")
    for para in _paragraphs(mcq)[:-1]:
        parts += [para[i:i + size] for i in range(0, len(para), size)]
    return parts or [mcq.question.strip()]


DEFAULT_MAX_TURNS = 6
"""A trajectory's turns unless ``max_turns`` (``VTRM_MAX_TURNS`` for the tool backend) says."""


class _Retry(NamedTuple):
    """An attempt that may be retried: why, and the server's Retry-After (None: back off)."""

    why: str
    wait: float | None


class ToolAgent:
    """Answers `MCQ` units in multi-turn tool-using trajectories through ``client`` (an
    `httpx.AsyncClient`, normally `cached_http_client` / `BackendContext.http_client`, whose
    ``base_url`` is the OpenAI-compatible endpoint). 429, 5xx and dropped connections are
    retried (``retry``); a turn that still fails makes the unit INFRA; a trajectory that
    names no letter within ``max_turns`` is a wrong answer (cached like any answer)."""

    def __init__(self, units: Mapping[str, MCQ], client: httpx.AsyncClient, *, model: str,
                 max_turns: int = DEFAULT_MAX_TURNS, temperature: float = 0.0,
                 max_tokens: int | None = 256,
                 params: Mapping[str, Any] | None = None, retry: RetryPolicy | None = None,
                 rng: random.Random | None = None) -> None:
        if not is_whole(max_turns) or max_turns < 1:
            raise ValueError(f"ToolAgent.max_turns must be an integer >= 1, got {max_turns!r}")
        if not model:
            raise ValueError("ToolAgent needs a model")
        self.units, self.client, self.model, self.max_turns = units, client, model, max_turns
        self.params: dict[str, Any] = {"temperature": temperature, **(params or {})}
        if max_tokens:
            self.params["max_tokens"] = max_tokens
        self.retry = retry or RetryPolicy(max_attempts=3, max_total_s=120.0)
        self._rng = rng or random.Random()

    @property
    def identity(self) -> dict[str, Any]:
        """What keys the BaselineCache: the agent, its version, model and call settings."""
        return {"agent": "ToolAgent", "tool_agent_version": TOOL_AGENT_VERSION,
                "model": self.model, "max_turns": self.max_turns, "params": self.params}

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Room for a call outside the gate (`Rollout` asks): the rollout's own semaphore is
        the limit here."""
        yield

    def messages(self, task: UnitTask, mcq: MCQ, n_parts: int) -> list[dict[str, Any]]:
        """The first turn: the skill as system instructions, the question asked, its
        options and how many parts its content has."""
        opts = "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(mcq.options))
        asked = (_paragraphs(mcq) or [""])[-1]
        return [{"role": "system", "content": TOOL_SYSTEM + task.skill},
                {"role": "user", "content": f"{asked}\n\nOptions:\n{opts}\n\nThe question's "
                                            f"content has {n_parts} part(s): read them with "
                                            f"look(part)."}]

    async def infer(self, task: UnitTask) -> UnitResult:
        """Answer ``task``'s unit with ``task.skill``: INFRA when a turn's call fails."""
        mcq = self.units.get(task.unit_id)
        if mcq is None:
            raise KeyError(f"ToolAgent has no unit {task.unit_id!r}")
        t0, parts = time.perf_counter(), content_parts(mcq)
        messages = self.messages(task, mcq, len(parts))
        turns: list[dict[str, Any]] = []
        letter: str | None = None
        nudged = False
        for turn in range(1, self.max_turns + 1):
            body = self.body(messages, len(mcq.options), turn, nudged)
            try:
                doc, source = await self.chat(body)
            except (ContextOverflowError, PromptFilteredError) as exc:  # the arm's answer
                turns.append({"turn": turn, "source": "refused", "tokens": 0, "tools": []})
                why = refusal_text(refused_reply(self.model, exc))
                return self._result(task, t0, turns, error=f"turn {turn}: {why}")
            except LLMInfraError as exc:
                return self._result(task, t0, turns, infra=True, error=f"turn {turn}: {exc}")
            msg = doc["choices"][0]["message"]
            calls = tool_calls(msg) or []  # never None: `protocol_failure` refused those
            turns.append({"turn": turn, "source": source, "tokens": usage_tokens(doc),
                          "tools": [call_name(c) for c in calls]})
            if not calls:  # a reply in words: its letter, else one more turn to name it
                letter = parse_choice(content_text(doc), len(mcq.options),
                                      options=mcq.options)
                if letter is not None or nudged:
                    break
                nudged = True
                messages = [*messages, {"role": "assistant", "content": content_text(doc)},
                            {"role": "user", "content": ANSWER_NUDGE}]
                continue
            # "" not null: a chat template that concatenates content (SmolLM2's) fails on null
            messages = [*messages, {"role": "assistant", "content": content_text(doc),
                                    "tool_calls": calls}]
            answered = [c for c in calls if call_name(c) == "answer"]
            if answered:
                letter = parse_choice(answer_argument(call_arguments(answered[0])),
                                      len(mcq.options), options=mcq.options)
                break
            messages += [{"role": "tool", "tool_call_id": c.get("id", ""),
                          "content": _tool_result(parts, c)} for c in calls]
        error = None if letter is not None else \
            f"no answer within {len(turns)} turn(s) (max_turns={self.max_turns})"
        return self._result(task, t0, turns, prediction=letter, error=error,
                            correct=letter == mcq.answer)

    __call__ = infer

    def body(self, messages: list[dict[str, Any]], n_options: int, turn: int,
             nudged: bool) -> dict[str, Any]:
        """One turn's request: the first turn must look, a turn after a reply in words
        without a letter and the last turn must answer; the others choose."""
        body = {"model": self.model, "messages": messages, "tools": tool_schemas(n_options),
                **self.params}
        if nudged or (turn == self.max_turns and turn > 1):
            body["tool_choice"] = _forced("answer")
        elif turn == 1:
            body["tool_choice"] = _forced("look")
        return body

    async def chat(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
        """One turn: (the chat completion, how the cached client served it); 429, 5xx and
        dropped connections retried, anything else `LLMInfraError` with the server's words.
        ``retry.max_total_s`` bounds the turn, attempts and waits together: httpx's timeout
        is per read, so a reply trickling a byte a second never tripped it (h16)."""
        loop = asyncio.get_running_loop()
        t0, attempt, last = loop.time(), 0, ""
        try:
            async with asyncio.timeout(self.retry.max_total_s):
                while True:
                    attempt += 1
                    out = await self._attempt(body)
                    if not isinstance(out, _Retry):
                        return out
                    last = f"; attempt {attempt}: {out.why}"
                    delay = (out.wait if out.wait is not None
                             else self.retry.backoff(attempt, self._rng))
                    if attempt == self.retry.max_attempts or \
                            loop.time() - t0 + delay > self.retry.max_total_s:
                        raise LLMInfraError(f"gave up after {attempt} attempt(s): {out.why}")
                    await asyncio.sleep(delay)
        except TimeoutError:
            raise LLMInfraError(f"deadline of {self.retry.max_total_s:g}s exceeded during "
                                f"attempt {attempt} (retry.max_total_s{last})") from None

    async def _attempt(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], str] | _Retry:
        """One request: the reply and how it was served, or a `_Retry`; a refusal or a
        status not to retry raises."""
        try:
            r = await self.client.post("chat/completions", json=body)
        except httpx.TransportError as exc:
            return _Retry(described(exc), None)
        if r.status_code == 200:
            return self._reply(r)
        detail = error_detail(r.content)
        refused = refusal(r.status_code, detail)
        if refused is not None:
            raise refused
        why = f"HTTP {r.status_code}: {detail}"
        if r.status_code not in self.retry.retry_statuses:
            raise LLMInfraError(why)
        return _Retry(why, parse_retry_after(r.headers.get("retry-after")))

    @staticmethod
    def _reply(r: httpx.Response) -> tuple[dict[str, Any], str]:
        not_json = non_json_reply(r.status_code, r.headers.get("content-type", ""), r.content)
        if not_json is not None:
            raise LLMInfraError(not_json)
        try:
            doc = parse_body(r.content)
        except ValueError as exc:
            raise LLMInfraError(f"HTTP 200 with a malformed JSON body: {exc}") from None
        why = protocol_failure(doc)
        if why is not None:
            raise LLMInfraError(f"HTTP 200 that is no chat completion: {why}")
        return doc, r.headers.get(CACHE_HEADER, "uncached")

    def _result(self, task: UnitTask, t0: float, turns: list[dict[str, Any]], *,
                infra: bool = False, correct: bool = False, prediction: str | None = None,
                error: str | None = None) -> UnitResult:
        cached = bool(turns) and not infra and all(
            t["source"] in ("hit", "coalesced") for t in turns)
        tokens = sum(t["tokens"] for t in turns if t["source"] not in ("hit", "coalesced"))
        trace = {"run_id": task.run_id, "unit_id": task.unit_id, "model": self.model,
                 "tool_agent_version": TOOL_AGENT_VERSION, "turns": turns}
        return UnitResult(correct=correct, infra=infra, cached=cached, prediction=prediction,
                          latency_s=time.perf_counter() - t0, tokens=tokens, trace=trace,
                          error=error)


def _tool_result(parts: Sequence[str], call: Mapping[str, Any]) -> str:
    """A call's result: ``look``'s part, or what was wrong with the call (a tool it was not
    given is named as such, not answered as a ``look`` without a part)."""
    name = call_name(call)
    if name != "look":
        return f"error: there is no tool named {name!r}; the tools are look(part) and " \
               "answer(letter)"
    return _look(parts, call_arguments(call))


def _look(parts: Sequence[str], args: Mapping[str, Any]) -> str:
    """The tool's result: the part asked for, or what was wrong with the request. A whole
    number sent as text or as a float ("2", 2.0: a server without constrained decoding)
    is that part."""
    part = _part_number(args.get("part"))
    if part is None or not 1 <= part <= len(parts):
        return f"error: part must be an integer from 1 to {len(parts)}, " \
               f"got {args.get('part')!r}"
    return parts[part - 1]


def _part_number(value: object) -> int | None:
    """``value`` as a whole number, if it is one: an int, a float without a fraction, or
    decimal digits as text; anything else (a bool, "1.5", "one") is None."""
    if is_whole(value):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdecimal() and len(value.strip()) <= 9:
        return int(value.strip())  # bounded: int() of 4,301 digits raises
    return None


class ToolEvolver:
    """Proposes a type's candidate skill with one chat call through the cached client (the
    harness runs it under the type's evolver run id)."""

    def __init__(self, agent: ToolAgent, rollout: Rollout, max_tokens: int = 1024,
                 seed: int | None = None) -> None:
        self.agent, self.rollout, self.max_tokens = agent, rollout, max_tokens
        self.seed = seed
        """The workspace's seed: each proposal asks the server for a sampling seed derived
        from it and the step, so two workspaces of one seed propose alike (a server that
        honours ``seed``, as llama.cpp does); None sends none."""

    def sampling_seed(self, task_type: str, epoch: int, step: int) -> int | None:
        """The request's ``seed`` for ``task_type``'s proposal at (epoch, step)."""
        if self.seed is None:
            return None
        return int(content_hash(f"{self.seed}\x1f{task_type}\x1f{epoch}\x1f{step}")[:8], 16)

    async def evolve(self, task_type: str, current_skill: str, rejected: Sequence[str],
                     epoch: int, step: int) -> str:
        cases = await self.rollout.errors(task_type, current_skill, epoch, step)
        lines = [f"Question type: {task_type}", "",
                 f"<current_skill>\n{current_skill.strip()}\n</current_skill>", ""]
        lines += [f"Wrong: {c.mcq.prompt()}\nAgent answered: {c.prediction or 'nothing'}. "
                  f"Correct answer: {c.mcq.answer}." for c in cases[:8]]
        lines += [f"Rejected: {r.strip()}" for r in list(rejected)[-5:]]
        body: dict[str, Any] = {
            "model": self.agent.model, "temperature": 0.7, "max_tokens": self.max_tokens,
            "messages": [{"role": "system", "content": EVOLVE_SYSTEM},
                         {"role": "user", "content": "\n".join([*lines, EVOLVE_TASK])}]}
        seed = self.sampling_seed(task_type, epoch, step)
        if seed is not None:
            body["seed"] = seed
        doc, _ = await self.agent.chat(body)
        return strip_fences(content_text(doc)) + "\n"


def _turns(env: Mapping[str, str]) -> int:
    """``VTRM_MAX_TURNS``: a whole number >= 1 (default `DEFAULT_MAX_TURNS`); BackendError
    naming it."""
    text = (env.get("VTRM_MAX_TURNS") or "").strip()
    if not text:
        return DEFAULT_MAX_TURNS
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise BackendError(f"VTRM_MAX_TURNS must be an integer >= 1, got {text!r}")
    return value


def tool_backend(ctx: BackendContext) -> AgentBackend:
    """A bring-your-own backend running `ToolAgent` on the cached client: endpoint, model
    and key from the environment (``VTRM_BASE_URL`` / ``OPENAI_BASE_URL``, ``VTRM_MODEL`` /
    ``OPENAI_MODEL``, ``OPENAI_API_KEY`` / ``VTRM_API_KEY``) and ``VTRM_MAX_TURNS`` (6); each
    request's timeout is the run's (``ctx.timeout``)."""
    e = ctx.env
    base_url = e.get("VTRM_BASE_URL") or e.get("OPENAI_BASE_URL")
    model = e.get("VTRM_MODEL") or e.get("OPENAI_MODEL")
    if not base_url or not model:
        raise BackendError("vtrm_gate.llm:tool_backend needs VTRM_BASE_URL and VTRM_MODEL")
    key = _api_key(e)
    bare, query = base_and_query(base_url)
    client = ctx.http_client(base_url=bare.rstrip("/") + "/", params=dict(query),
                             headers={"Authorization": f"Bearer {key}"} if key else None)
    ws = ctx.workspace
    agent = ToolAgent(workspace_units(ws), client, model=model, max_turns=_turns(e),
                      retry=RetryPolicy(max_attempts=3, max_total_s=ctx.deadline))
    roll = Rollout(cast(Any, agent), ws.pool, agent.units, ws.config.seed, ROLLOUT_UNITS,
                   ctx.concurrency)

    async def rollout(epoch: int, step: int) -> dict[str, Any]:
        state = step_input_state(ws, epoch, step)
        types = [t for t in ws.task_types if not state.in_cooldown(t)]
        await asyncio.gather(*(roll.errors(t, ws.skill_text(t, state), epoch, step)
                               for t in types))
        out: dict[str, Any] = {}
        for t in types:
            n_infra, n, last = roll.infra(t, ws.skill_text(t, state), epoch, step)
            out[t] = roll.cases(t, epoch, step, ws.skill_text(t, state))
            if n and n_infra / n > GuardParams().max_ratio:
                out[t] = CasesUnavailable(f"rollout INFRA ({rollout_run_id(t, epoch, step)}): "
                                          f"{n_infra} of {n} units failed; last: {last}")
        return out

    return AgentBackend(infer=agent.infer, evolver=ToolEvolver(agent, roll, seed=ws.config.seed),
                        rollout=rollout,
                        identity=agent.identity, cache_stats=ctx.cache.stats,
                        aclose=client.aclose)
