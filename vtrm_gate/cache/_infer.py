"""Any ``infer`` behind the response cache (`cached_infer`): a second launch is served from it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..gate import UnitResult, UnitTask

from ._keys import KeyParts, Response, protocol_failure
from ._response import (
    ResponseCache,
)

# ---- any infer behind the cache -------------------------------------------------------


class _InfraResult(Exception):
    """Carries an INFRA result out of a cached call, so it is never written."""

    def __init__(self, result: UnitResult):
        super().__init__(result.error or "INFRA")
        self.result = result


@dataclass
class CachedInfer:
    """An ``infer`` whose answers go through the response cache, keyed like an LLM call.

    The key is (model, base URL, ``prompt(task)`` messages, salt = the cache's namespace and
    ``task.run_id``), so a re-run of the same arm run replays its answers and a new run never
    reuses them. A hit costs no call and no tokens and is graded with ``grade(task, answer)``
    (no answer is a wrong answer, cached and replayed like any other); INFRA results are
    never cached.
    ``calls`` and ``tokens`` count the fresh (paid) calls.
    """

    cache: ResponseCache
    infer: Callable[[UnitTask], Awaitable[UnitResult]]
    model: str
    prompt: Callable[[UnitTask], Sequence[Mapping[str, Any]]]
    grade: Callable[[UnitTask, str], bool]
    base_url: str = "local://infer"
    calls: int = 0
    tokens: int = 0

    async def __call__(self, task: UnitTask) -> UnitResult:
        parts = KeyParts(self.model, self.base_url, tuple(self.prompt(task)),
                         salt=self.cache.salt(task.run_id))
        fresh: list[UnitResult] = []

        async def call() -> Response:
            res = await self.infer(task)
            fresh.append(res)
            self.calls += 1
            self.tokens += res.tokens
            if res.infra:
                raise _InfraResult(res)
            return {"choices": [{"message": {"role": "assistant",
                                             "content": res.prediction or ""},
                                 "finish_reason": "stop"}],
                    "usage": {"total_tokens": res.tokens}}

        try:  # "no valid answer" is cached too: a re-run replays it as a wrong answer
            got = await self.cache.get_or_call(parts, call, validate=protocol_failure,
                                               run_id=task.run_id)
        except _InfraResult as exc:
            return exc.result
        if fresh:
            return fresh[0]
        from ..gate import UnitResult  # lazily: `vtrm-gate cache` must not load numpy

        answer = got.response["choices"][0]["message"].get("content") or None
        return UnitResult(correct=answer is not None and self.grade(task, answer),
                          cached=True, prediction=answer)


def cached_infer(cache: ResponseCache, infer: Callable[[UnitTask], Awaitable[UnitResult]], *,
                 model: str, prompt: Callable[[UnitTask], Sequence[Mapping[str, Any]]],
                 grade: Callable[[UnitTask, str], bool],
                 base_url: str = "local://infer") -> CachedInfer:
    """Put any ``infer`` (the simulator, a local model) behind the Redis response cache."""
    return CachedInfer(cache, infer, model, prompt, grade, base_url)



