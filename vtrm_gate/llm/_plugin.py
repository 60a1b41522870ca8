"""Bring your own agent: a factory named ``"package.module:function"`` supplies a step's
``infer``, evolver and rollout source, and the full harness runs it unchanged.

The factory is named by the workspace setting ``agent.backend`` (``vtrm-gate init --llm
--units U --backend mypkg.agent:make_backend``) or by ``vtrm-gate step --backend ...``. It is
called with a `BackendContext` (the workspace, a configured `ResponseCache`, the gate's
concurrency, the environment, the request timeout) and returns an `AgentBackend`. Its
``identity`` joins the workspace's agent config, so the BaselineCache and the manifest tell
agents apart. A factory that cannot be imported, raises, or returns the wrong thing is a
`BackendError` (exit 2 from the CLI, one line naming the factory).

Every text a backend hands back (exception messages, ``UnitResult.error`` and traces, rollout
errors, ``identity`` values) is scrubbed like the LLM agent's (`scrub_credentials`: the
environment's secrets and any credential header value) before it is stored, reported or
printed; an ``identity`` key that names a credential is refused; a rollout of the wrong shape
is a `BackendError` naming the type.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from .._env import (
    DEFAULT_CONCURRENCY,
    DEFAULT_DEADLINE_S,
    DEFAULT_TIMEOUT_S,
    capped,
    credential_keys,
    scrub_credentials,
    scrub_json,
    secret_values,
)
from .._ids import canonical_json, evolve_run_id, step_rollout_run_id
from ..cache import CacheStats, ResponseCache, cache_namespace
from ..errors import BackendError, CandidateRefused, CasesUnavailable, EvolveError, described
from ..gate import Infer, UnitResult, UnitTask, run_scope
from ..harness import CaseSource, Evolver, Workspace
from ._client import cached_http_client

RolloutSource = Callable[[int, int], Awaitable[Mapping[str, Sequence[str]]]]
"""``await rollout(epoch, step)``: the step's evolution cases, ``{task type: [unit ids]}``
(the units the current skill got wrong; they are excluded from the ladder)."""

BackendFactory = Callable[["BackendContext"], "AgentBackend"]


@dataclass(frozen=True)
class BackendContext:
    """What a factory is given: the opened workspace, the response cache (``REDIS_URL`` or
    the workspace's embedded Redis; wrap your ``infer`` with `vtrm_gate.cached_infer`), the
    gate's concurrency and the environment (``.env`` + process)."""

    workspace: Workspace
    cache: ResponseCache
    concurrency: int = DEFAULT_CONCURRENCY
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Not in the repr: a factory's error message that shows the context shows no secret."""
    timeout: float = DEFAULT_TIMEOUT_S
    """Each request's timeout in seconds: the run's resolved ``timeout`` (``--timeout``, the
    config file, ``VTRM_TIMEOUT``), so a factory need not read it again."""
    deadline: float = DEFAULT_DEADLINE_S
    """A call's whole time in seconds, attempts and waits together: the run's ``deadline``."""

    def scrub(self, text: str) -> str:
        """``text`` without the environment's secrets or any credential header value."""
        return scrub_credentials(text, secret_values(self.env))

    def http_client(self, **kwargs: Any) -> httpx.AsyncClient:
        """An `httpx.AsyncClient` whose chat completions go through this workspace's cache,
        salted with the run being answered, each request within the run's ``timeout`` (per
        read) and ``deadline`` (whole) (`cached_http_client`; ``kwargs`` go to it).
        Pass it as ``openai.AsyncOpenAI(base_url=..., api_key=..., http_client=...)``."""
        kwargs.setdefault("secrets", secret_values(self.env))
        kwargs.setdefault("timeout", self.timeout)
        kwargs.setdefault("deadline", self.deadline)
        return cached_http_client(self.cache, **kwargs)


@dataclass(frozen=True)
class AgentBackend:
    """What a factory returns.

    ``infer(UnitTask) -> UnitResult`` answers one unit on one arm; ``evolver.evolve(task_type,
    current_skill, rejected, epoch, step) -> str`` proposes a candidate skill (checked like
    the built-in evolver's before any gate call, `vtrm_gate.harness.candidate_problem`: a
    chat reply, an empty or unchanged text... skips the type for the step; raise
    `CandidateRefused` to skip it yourself, e.g. after your own re-samples); exactly one of
    ``rollout`` (async, run before the step) or ``cases`` (a `CaseSource`) gives the
    evolution cases. ``identity`` (JSON values: model, prompt version...) keys the
    BaselineCache with the workspace's agent config; ``cache_stats(run_id)`` puts counters
    in the step report; ``aclose()`` is awaited after the step.
    """

    infer: Infer
    evolver: Evolver
    rollout: RolloutSource | None = None
    cases: CaseSource | None = None
    identity: Mapping[str, Any] = field(default_factory=dict)
    cache_stats: Callable[[str], CacheStats | Any] | None = None
    aclose: Callable[[], Awaitable[None]] | None = None

    def __post_init__(self) -> None:
        if not callable(self.infer):
            raise TypeError(f"AgentBackend.infer must be an async callable, got "
                            f"{type(self.infer).__name__}")
        if not callable(getattr(self.evolver, "evolve", None)):
            raise TypeError(f"AgentBackend.evolver must have an async evolve(task_type, "
                            f"current_skill, rejected, epoch, step) method, got "
                            f"{type(self.evolver).__name__}")
        if (self.rollout is None) == (self.cases is None):
            raise TypeError("AgentBackend needs exactly one of rollout= (async (epoch, step) "
                            "-> {type: [unit ids]}) or cases= (a CaseSource)")
        if not isinstance(self.identity, Mapping):
            raise TypeError(f"AgentBackend.identity must be a mapping, got "
                            f"{type(self.identity).__name__}")


def is_factory_spec(value: object) -> bool:
    """True for ``"package.module:function"`` (the form ``agent.backend`` names a factory)."""
    if not isinstance(value, str) or value.count(":") != 1:
        return False
    mod, attr = value.split(":")
    return all(p.isidentifier() for p in mod.split(".")) and all(
        p.isidentifier() for p in attr.split("."))


def load_factory(spec: str) -> BackendFactory:
    """Import ``"package.module:function"``; `BackendError` naming it if that fails."""
    if not is_factory_spec(spec):
        raise BackendError(f"backend {spec!r}: expected 'package.module:function'")
    mod_name, attr = spec.split(":")
    try:
        obj: Any = importlib.import_module(mod_name)
    except Exception as exc:
        raise BackendError(f"backend {spec!r}: cannot import {mod_name!r} "
                           f"({described(exc)})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise BackendError(f"backend {spec!r}: module {mod_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise BackendError(f"backend {spec!r}: {attr!r} is not callable "
                           f"({type(obj).__name__})")
    return obj


async def make_backend(spec: str, ctx: BackendContext) -> AgentBackend:
    """Load and call the factory (sync or async) and check what it returned."""
    factory = load_factory(spec)
    try:
        out = factory(ctx)
        if inspect.isawaitable(out):
            out = await out
    except BackendError as exc:
        raise BackendError(ctx.scrub(str(exc))) from None
    except Exception as exc:
        raise BackendError(ctx.scrub(f"backend {spec!r} failed: {described(exc)}")
                           ) from None
    if not isinstance(out, AgentBackend):
        raise BackendError(f"backend {spec!r} returned {type(out).__name__}, expected "
                           f"vtrm_gate.llm.AgentBackend")
    call = out.infer if inspect.isroutine(out.infer) else type(out.infer).__call__
    if not inspect.iscoroutinefunction(call):
        raise BackendError(f"backend {spec!r}: infer must be an async function "
                           f"(async def infer(task) -> UnitResult)")
    return out


def with_identity(workspace: Workspace, spec: str, backend: AgentBackend,
                  scrub: Callable[[str], str] = str) -> None:
    """Put the factory and its identity into the (in-memory) agent config, so the
    BaselineCache key and the step manifest name the agent that actually runs. The identity
    must be JSON, with no key that names a credential (its values are scrubbed)."""
    identity = dict(backend.identity)
    for k, v in identity.items():
        try:
            canonical_json(v)
        except (TypeError, ValueError):
            raise BackendError(f"backend {spec!r}: identity[{k!r}] is not a JSON value "
                               f"({type(v).__name__}); identity keys the BaselineCache and "
                               f"the manifest") from None
    secret = credential_keys(identity)
    if secret:
        raise BackendError(f"backend {spec!r}: identity must not hold credentials (found "
                           f"{', '.join(repr(k) for k in secret)}); it is written to every "
                           f"manifest: read secrets from ctx.env inside your factory")
    agent = {**workspace.config.agent, "backend": spec, **scrub_json(identity, scrub)}
    try:
        workspace.config = dataclasses.replace(workspace.config, agent=agent)
    except ValueError as exc:
        raise BackendError(f"backend {spec!r}: identity: {exc}") from None


async def open_factory_backend(workspace: Workspace, spec: str, ctx: BackendContext,
                               deadline: float | None = None) -> AgentBackend:
    """The factory's backend for ``workspace``: the cache salted with the workspace's id (as
    for the built-in agent), the factory called and checked, its identity in the agent config,
    every text it returns scrubbed and each ``infer`` call bounded by ``deadline`` (`guarded`).
    The caller awaits ``backend.aclose`` when done (`vtrm_gate.backends.open_backend` does)."""
    if not ctx.cache.namespace:
        ctx.cache.namespace = cache_namespace(workspace.workspace_id,
                                              ctx.env.get("VTRM_CACHE_SHARE") or None)
    backend = await make_backend(spec, ctx)
    try:
        with_identity(workspace, spec, backend, ctx.scrub)
    except BaseException:
        if backend.aclose is not None:
            await backend.aclose()
        raise
    return guarded(backend, workspace, spec, ctx.scrub, deadline)


# ---- what a backend hands back, scrubbed and checked ----------------------------------------


MAX_TEXT_CHARS = 1 << 16
"""A bring-your-own ``UnitResult.prediction`` or ``error`` longer than this is truncated
(the stored text ends with a note saying so): an unbounded text would stall the gate."""
MAX_TRACE_CHARS = 1 << 20
"""A bring-your-own trace whose JSON is longer than this is stored as
``{"truncated": why, "head": the start of its JSON}``."""


def _capped_text(value: Any, scrub: Callable[[str], str]) -> Any:
    return capped(value, MAX_TEXT_CHARS, scrub) if isinstance(value, str) else value


def _capped_trace(trace: Any, scrub: Callable[[str], str]) -> Any:
    """``trace`` scrubbed, or past `MAX_TRACE_CHARS` of JSON the note that replaces it."""
    if trace is None or isinstance(trace, bool | int | float):
        return trace
    try:
        text = json.dumps(trace, default=str)
    except (ValueError, RecursionError) as exc:  # circular, or nested too deeply
        return {"dropped": f"the trace is not JSON ({type(exc).__name__})"}
    if len(text) <= MAX_TRACE_CHARS:
        return scrub_json(trace, scrub)
    # the head is quoted inside the stored JSON: at most half the cap, so escapes still fit
    return {"truncated": f"trace of {len(text)} characters of JSON, over the cap of "
                         f"{MAX_TRACE_CHARS}",
            "head": capped(text, MAX_TRACE_CHARS // 2, scrub)}


_KEPT_FAMILIES = (CasesUnavailable, CandidateRefused, TypeError, AttributeError, NameError)
"""What a scrubbed exception must stay: these decide how the harness treats a failure."""


def scrubbed_exception(exc: Exception, scrub: Callable[[str], str]) -> Exception:
    """``exc``, or when its text (or a note) holds a secret, the same kind of exception
    with the text scrubbed (same type when it can be built from a message; else the nearest
    family that decides how the harness treats it, named in the text), traceback kept."""
    text, notes = str(exc), list(getattr(exc, "__notes__", ()))
    clean = scrub(text)
    if clean == text and all(scrub(n) == n for n in notes):
        return exc
    new: Exception | None = None
    for kind in (type(exc), *[k for k in _KEPT_FAMILIES if isinstance(exc, k)], RuntimeError):
        message = clean if kind is type(exc) else f"{type(exc).__name__}: {clean}"
        try:
            new = kind(message)
        except Exception:  # an exception type with other constructor arguments
            continue
        if str(new) == message:
            break
    assert new is not None  # RuntimeError(message) always builds
    for n in notes:
        new.add_note(scrub(n))
    return new.with_traceback(exc.__traceback__)


def _check_rollout(out: Any, workspace: Workspace, spec: str,
                   scrub: Callable[[str], str]) -> dict[str, Any]:
    """A rollout's result: ``{known type: [unit ids of its pool] | CasesUnavailable}``."""
    where = f"backend {spec!r}: rollout"
    if not isinstance(out, Mapping):
        raise BackendError(f"{where}: expected a mapping {{type: [unit ids]}}, got "
                           f"{type(out).__name__}")
    cases: dict[str, Any] = {}
    for t, us in out.items():
        if t not in workspace.pool:
            raise BackendError(f"{where}: unknown type {t!r} (the workspace's types: "
                               f"{', '.join(map(repr, workspace.task_types))})")
        if isinstance(us, CasesUnavailable):
            cases[t] = CasesUnavailable(scrub(str(us)))
            continue
        if isinstance(us, str | bytes) or not isinstance(us, list | tuple):
            raise BackendError(f"{where}: type {t!r}: expected a list of unit ids, got "
                               f"{scrub(repr(us))[:80]}")
        pool = set(workspace.pool[t])
        bad = [u for u in us if not isinstance(u, str) or u not in pool]
        if bad:
            raise BackendError(f"{where}: type {t!r}: {scrub(repr(bad[0]))[:80]} is not a unit "
                               f"of its pool")
        cases[t] = list(us)
    return cases


def _evolve_run(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """The evolver's run id of ``evolve(task_type, current_skill, rejected, epoch, step)``."""
    named = dict(zip(("task_type", "current_skill", "rejected", "epoch", "step"), args,
                     strict=False))
    named.update(kwargs)
    return evolve_run_id(named["task_type"], named["epoch"], named["step"])


_TIMED_OUT = object()
"""What `_bounded` returns for a call still running at its deadline."""


async def _bounded(call: Awaitable[Any], seconds: float | None) -> Any:
    """``await call``, or past ``seconds`` `_TIMED_OUT`: the call is cancelled and not
    waited for (one that ignores cancellation cannot stall the step); a cancel from the
    caller cancels the call too."""
    if seconds is None:
        return await call
    inner = asyncio.ensure_future(call)
    try:
        done, _ = await asyncio.wait({inner}, timeout=seconds)
    except asyncio.CancelledError:
        inner.cancel()
        raise
    if done:
        return inner.result()
    inner.cancel()
    inner.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: no warning
    return _TIMED_OUT


def _late(what: str, seconds: float, why: str = "the call's deadline") -> str:
    return f"{what} did not return within {why} of {seconds:g} s (--deadline)"


async def within_deadline(call: Awaitable[UnitResult], deadline: float | None) -> UnitResult:
    """``await call``, or past ``deadline`` seconds an INFRA result saying so (`_bounded`)."""
    res = await _bounded(call, deadline)
    if res is not _TIMED_OUT:
        return res
    assert deadline is not None
    return UnitResult(infra=True, latency_s=deadline,
                      error=f"TimeoutError: {_late('infer', deadline)}")


def rollout_deadline(workspace: Workspace, deadline: float | None) -> float | None:
    """A bring-your-own rollout's bound: one call's ``deadline`` per unit of the workspace's
    pools (as if it answered each in turn), so a rollout that never returns ends the step."""
    if deadline is None:
        return None
    return deadline * max(1, sum(len(us) for us in workspace.pool.values()))


def guarded(backend: AgentBackend, workspace: Workspace, spec: str,
            scrub: Callable[[str], str], deadline: float | None = None) -> AgentBackend:
    """``backend`` with every text it returns or raises scrubbed (the evolver's skill too)
    and its rollout checked;
    with a ``deadline`` (seconds, the run's ``deadline``) a call of ``infer`` still running
    past it is an INFRA result (`within_deadline`), an ``evolve`` call an `EvolveError`
    (``evolve_error``) and the rollout (bound: `rollout_deadline`) ``rollout_error``.

    A rollout that raises (not a programming error) makes every type ``rollout_error`` with
    the scrubbed reason, as the LLM rollout does for a type whose calls fail."""
    infer, evolver, rollout, cases = backend.infer, backend.evolver, backend.rollout, \
        backend.cases
    bound = rollout_deadline(workspace, deadline)

    async def scrubbed_infer(task: UnitTask) -> UnitResult:
        try:
            res = await within_deadline(infer(task), deadline)
        except Exception as exc:
            raise scrubbed_exception(exc, scrub) from None
        if not isinstance(res, UnitResult):
            return res  # the gate refuses it, naming unit and arm
        return dataclasses.replace(res, error=_capped_text(res.error, scrub),
                                   prediction=_capped_text(res.prediction, scrub),
                                   trace=_capped_trace(res.trace, scrub))

    class ScrubbedEvolver:
        async def evolve(self, *args: Any, **kwargs: Any) -> str:
            try:
                with run_scope(_evolve_run(args, kwargs)):  # a cached client salts with it
                    skill = await _bounded(evolver.evolve(*args, **kwargs), deadline)
            except Exception as exc:
                raise scrubbed_exception(exc, scrub) from None
            if skill is _TIMED_OUT:
                raise EvolveError(_late("the evolver", deadline or 0))
            return scrub(skill) if isinstance(skill, str) else skill  # else refused later

    async def checked_rollout(epoch: int, step: int) -> Mapping[str, Any]:
        try:
            with run_scope(step_rollout_run_id(epoch, step)):
                out = await _bounded(rollout(epoch, step), bound)  # type: ignore[misc]  # wrapped when given
            if out is _TIMED_OUT:
                raise TimeoutError(_late("the rollout", bound or 0, "its bound (one call's "
                                         "deadline a pool unit)"))
        except (TypeError, AttributeError, NameError) as exc:
            raise scrubbed_exception(exc, scrub) from None
        except Exception as exc:
            why = scrub(described(exc))
            return {t: CasesUnavailable(f"rollout failed: {why}") for t in workspace.task_types}
        return _check_rollout(out, workspace, spec, scrub)

    def scrubbed_cases(*args: Any) -> Sequence[str]:
        try:
            return cases(*args)  # type: ignore[misc]  # wrapped only when given
        except Exception as exc:
            raise scrubbed_exception(exc, scrub) from None

    return dataclasses.replace(
        backend, infer=scrubbed_infer, evolver=ScrubbedEvolver(),
        rollout=checked_rollout if rollout is not None else None,
        cases=scrubbed_cases if cases is not None else None)
