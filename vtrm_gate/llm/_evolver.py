"""`LLMEvolver`: proposes candidate skill texts with the agent's endpoint and cache."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._ids import evolve_run_id
from ..cache import KeyParts, protocol_failure, validate_response
from ..errors import CandidateRefused, EvolveError, LLMInfraError, RepeatedCandidate
from ..harness import candidate_problem
from ._agent import MCQ, VIDEO_TASK, LLMAgent
from ._replies import content_text, finish_reason, without_thinking

# ---- the evolver ----------------------------------------------------------------------

EVOLVE_PREFIX = "You improve the skill file that an agent follows as its instructions"
"""How every evolution prompt's system message starts (a test server tells them by it)."""


def evolve_system(task: str) -> str:
    """The evolver's system message for agents that answer ``task``."""
    return (f"{EVOLVE_PREFIX} when it answers {task}. Reply with the complete new skill file "
            f"in Markdown and nothing else.")


EVOLVE_SYSTEM = evolve_system(VIDEO_TASK)
EVOLVE_TASK = ("Write an improved skill file for this question type: keep what works, fix what "
               "made the agent fail on the cases above, and do not propose any rejected "
               "candidate again (nor a close variant of one).")


@dataclass(frozen=True)
class ErrorCase:
    """A unit the current skill got wrong in the step's rollout (an evolution case)."""

    unit_id: str
    mcq: MCQ
    prediction: str | None
    """The letter the agent chose, or None when it gave no usable answer."""


def strip_fences(text: str) -> str:
    """The skill text inside a reply, its thinking (``<think>...</think>``) set aside: a
    reply that is one fenced block (```markdown ... ```) or holds exactly one such block
    yields its content; otherwise the reply itself. Read with string searches, in linear
    time (a lazy pattern before optional spaces was quadratic in a run of spaces)."""
    t = without_thinking(text).strip()
    whole = _whole_block(t)
    if whole is not None and "```" not in whole:
        return whole.strip()
    blocks = [b for m in _MD_FENCE.finditer(t) if (b := _block_after(t, m.end())) is not None]
    if len(blocks) == 1:
        return blocks[0].strip()
    return t


_FENCE_TAG = re.compile(r"```[\w+-]*[ \t]*")
_MD_FENCE = re.compile(r"```(?:markdown|md)[ \t]*\n", re.IGNORECASE)


def _whole_block(t: str) -> str | None:
    """The content of ``t`` when it is one fenced block from its first line to its end."""
    first = t.find("\n")
    if first < 0 or not t.endswith("```") or not _FENCE_TAG.fullmatch(t, 0, first):
        return None
    return t[first + 1:len(t) - 3] if len(t) - 3 >= first + 1 else ""


def _block_after(t: str, start: int) -> str | None:
    """The content of the fenced block opened just before ``start``, up to its fence."""
    end = t.find("```", start)
    return None if end < 0 else t[start:end]


ErrorCases = Callable[[str, str, int, int], Awaitable[Sequence[ErrorCase]]]
"""``error_cases(task_type, current_skill, epoch, step)``: the step's rollout errors."""




class LLMEvolver:
    """Proposes a type's candidate skill text with the chat model (an `Evolver` for run_step).

    The prompt holds the current skill, the step's error cases (question, options, the
    agent's wrong answer, the right one) and the type's rejected buffer. The call goes
    through the agent's endpoint, retries and response cache, salted by the run id
    ``{step_run_id}_evolve_{slug}`` (a re-run proposes the same text at zero cost). A failed
    call or an unusable reply (not a chat completion, no content) raises `EvolveError`,
    which the step records per type as ``evolve_error`` with the reason (it never crashes a
    step, and a failure is never reported as "no real change"). A reply that is no skill to
    gate (cut off at ``max_tokens``, or `vtrm_gate.harness.candidate_problem`: empty,
    unchanged, a rejected candidate, a chat reply, far shorter than the current skill, over
    the size cap) is sampled again up to `REPEAT_RETRIES` times; if every sample fails the check,
    `CandidateRefused` (`RepeatedCandidate` when every one repeats a rejected candidate)
    skips the type for the step (``skipped``, with the reason) and the run goes on.
    """

    REPEAT_RETRIES = 2
    """Fresh samples asked for after a reply that fails the candidate check."""

    def __init__(self, agent: LLMAgent, error_cases: ErrorCases, *, model: str | None = None,
                 temperature: float = 0.7, max_tokens: int | None = None,
                 params: Mapping[str, Any] | None = None, max_cases: int = 8,
                 max_rejected: int = 5) -> None:
        if max_cases < 0 or max_rejected < 0:
            raise ValueError("LLMEvolver: max_cases and max_rejected must be >= 0")
        self.agent, self.error_cases = agent, error_cases
        self.model = model or agent.model
        self.params: dict[str, Any] = {"temperature": temperature}
        if max_tokens is not None:
            self.params["max_tokens"] = max_tokens
        self.params.update(params or {})
        self.max_cases, self.max_rejected = max_cases, max_rejected

    def __repr__(self) -> str:
        return f"LLMEvolver(model={self.model!r}, agent={self.agent!r})"

    @staticmethod
    def run_id(task_type: str, epoch: int, step: int) -> str:
        return evolve_run_id(task_type, epoch, step)

    def messages(self, task_type: str, current_skill: str, cases: Sequence[ErrorCase],
                 rejected: Sequence[str]) -> list[dict[str, str]]:
        """The evolution prompt: current skill, error cases, rejected candidates."""
        parts = [f"Question type: {task_type}", "",
                 f"<current_skill>\n{current_skill.strip()}\n</current_skill>", ""]
        if cases:
            parts.append(f"The agent got these {len(cases[:self.max_cases])} questions wrong "
                         f"with the current skill:")
            for i, c in enumerate(cases[:self.max_cases], 1):
                said = c.prediction or "no usable answer"
                parts += [f'<error_case n="{i}">', c.mcq.prompt(),
                          f"Agent answered: {said}. Correct answer: {c.mcq.answer}.",
                          "</error_case>"]
            parts.append("")
        kept = list(rejected)[-self.max_rejected:] if self.max_rejected else []
        if kept:
            parts.append("These candidates were tested and rejected; do not propose them "
                         "again:")
            parts += [f'<rejected_candidate n="{i}">\n{r.strip()}\n</rejected_candidate>'
                      for i, r in enumerate(kept, 1)]
            parts.append("")
        parts.append(EVOLVE_TASK)
        task = self.agent.task_framing(any(c.mcq.media is not None for c in cases))
        return [{"role": "system", "content": evolve_system(task)},
                {"role": "user", "content": "\n".join(parts)}]

    async def evolve(self, task_type: str, current_skill: str, rejected: Sequence[str],
                     epoch: int, step: int) -> str:
        """The candidate skill text; `EvolveError` when no usable proposal came back,
        `CandidateRefused` when no sample is a skill to gate. Sample ``k`` after the first is
        salted ``/retry{k}``, so a re-run of the step replays the same samples from the
        cache."""
        cases = await self.error_cases(task_type, current_skill, epoch, step)
        run_id = self.run_id(task_type, epoch, step)
        body = {"model": self.model,
                "messages": self.messages(task_type, current_skill, cases, rejected),
                **self.params}
        problems: list[str] = []
        for retry in range(self.REPEAT_RETRIES + 1):
            text, cut = await self._sample(task_type, body, run_id, retry)
            why = cut or candidate_problem(text, current_skill, rejected)
            if why is None:
                return text
            problems.append(why)
        n = len(problems)
        if set(problems) == {"repeats a rejected candidate"}:
            raise RepeatedCandidate(
                f"the evolver re-proposed a rejected candidate for {task_type!r} in all {n} "
                f"samples; the type is skipped for this step")
        raise CandidateRefused(
            f"the evolver's reply for {task_type!r} was no skill to gate in all {n} samples ("
            + "; ".join(dict.fromkeys(problems)) + "); the type is skipped for this step")

    async def _sample(self, task_type: str, body: Mapping[str, Any], run_id: str,
                      retry: int = 0) -> tuple[str, str | None]:
        """One proposal: the call through the agent's endpoint and cache, salted by the run
        id (and ``retry``, for a fresh sample), unfenced, with why it is no skill file when
        the model's reply was cut at ``max_tokens`` (the model's answer, cached like any
        other: a re-run replays it, and another sample may fit)."""

        # the sample's own run (its salt's), named in its events and its X-Vtrm-Run; its
        # counters stay with the first sample's run
        sample = run_id + (f"/retry{retry}" if retry else "")

        async def call() -> dict[str, Any]:
            async with self.agent.slot():  # every type evolves at once: wait for room here
                return await self.agent.chat(body, run_id=sample, unit_id=task_type,
                                             call_kind="evolve")

        try:
            if self.agent.cache is None:
                resp = await call()
            else:
                parts = KeyParts.from_request(body, self.agent.base_url,
                                              self.agent.cache.salt(sample))
                resp = (await self.agent.cache.get_or_call(parts, call,
                                                           validate=protocol_failure,
                                                           run_id=run_id)).response
        except LLMInfraError as exc:
            raise EvolveError(f"evolver call for {task_type!r} failed: {exc}") from None
        why = validate_response(resp)
        if why is not None:
            raise EvolveError(f"evolver reply for {task_type!r} unusable: {why}")
        cut = None
        if finish_reason(resp) == "length":  # never a cut-off skill file
            cut = (f"truncated (finish_reason length at max_tokens="
                   f"{self.params.get('max_tokens', 'the server default')}; raise "
                   f"max_tokens_evolve)")
        return strip_fences(content_text(resp)) + "\n", cut
