"""Bring your own agent: a factory named ``"package.module:function"`` supplies a step's
``infer``, evolver and rollout source, and the full harness runs it unchanged.

The factory is named by the workspace setting ``agent.backend`` (``vtrm-gate init --llm
--units U --backend mypkg.agent:make_backend``) or by ``vtrm-gate step --backend ...``. It is
called with a `BackendContext` (the workspace, a configured `ResponseCache`, the gate's
concurrency, the environment) and returns an `AgentBackend`. Its ``identity`` joins the
workspace's agent config, so the BaselineCache and the manifest tell agents apart.
A factory that cannot be imported, raises, or returns the wrong thing is a `BackendError`
(exit 2 from the CLI, one line naming the factory).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..cache import CacheStats, ResponseCache, cache_namespace
from ..errors import BackendError
from ..gate import Infer
from ..harness import CaseSource, Evolver, Workspace

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
    concurrency: int = 32
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AgentBackend:
    """What a factory returns.

    ``infer(UnitTask) -> UnitResult`` answers one unit on one arm; ``evolver.evolve(task_type,
    current_skill, rejected, epoch, step) -> str`` proposes a candidate skill; exactly one of
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
                           f"({type(exc).__name__}: {exc})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise BackendError(f"backend {spec!r}: module {mod_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise BackendError(f"backend {spec!r}: {attr!r} is not callable "
                           f"({type(obj).__name__})")
    return obj  # type: ignore[no-any-return]


async def make_backend(spec: str, ctx: BackendContext) -> AgentBackend:
    """Load and call the factory (sync or async) and check what it returned."""
    factory = load_factory(spec)
    try:
        out = factory(ctx)
        if inspect.isawaitable(out):
            out = await out
    except BackendError:
        raise
    except Exception as exc:
        raise BackendError(f"backend {spec!r} failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(out, AgentBackend):
        raise BackendError(f"backend {spec!r} returned {type(out).__name__}, expected "
                           f"vtrm_gate.llm.AgentBackend")
    call = out.infer if inspect.isroutine(out.infer) else type(out.infer).__call__
    if not inspect.iscoroutinefunction(call):
        raise BackendError(f"backend {spec!r}: infer must be an async function "
                           f"(async def infer(task) -> UnitResult)")
    return out


def with_identity(workspace: Workspace, spec: str, backend: AgentBackend) -> None:
    """Put the factory and its identity into the (in-memory) agent config, so the
    BaselineCache key and the step manifest name the agent that actually runs."""
    agent = {**workspace.config.agent, "backend": spec, **dict(backend.identity)}
    try:
        workspace.config = dataclasses.replace(workspace.config, agent=agent)
    except ValueError as exc:
        raise BackendError(f"backend {spec!r}: identity: {exc}") from None


async def open_factory_backend(workspace: Workspace, spec: str,
                               ctx: BackendContext) -> AgentBackend:
    """The factory's backend for ``workspace``: the cache salted with the workspace's id (as
    for the built-in agent), the factory called and checked, its identity in the agent config.
    The caller awaits ``backend.aclose`` when done (`vtrm_gate.backends.open_backend` does)."""
    if not ctx.cache.namespace:
        ctx.cache.namespace = cache_namespace(workspace.workspace_id,
                                              ctx.env.get("VTRM_CACHE_SHARE") or None)
    backend = await make_backend(spec, ctx)
    try:
        with_identity(workspace, spec, backend)
    except BaseException:
        if backend.aclose is not None:
            await backend.aclose()
        raise
    return backend
