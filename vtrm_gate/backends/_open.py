"""`open_backend(workspace, options)`: the one opener of the agent that drives a workspace.

Every command and the Python API reach the agent through it, for every kind of workspace:
simulated (the workspace's `SimWorld`), llm (one endpoint, several, or an endpoints file;
media units), and bring-your-own (``options.backend`` or the workspace's ``agent.backend``
names a factory). It settles the run's options against the workspace once (the probation
rule fixed at ``init``; the slot count of several endpoints) and hands back a `Backend`
whose ``options`` every step, settlement and evaluation then takes unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._env import api_key, environment
from ..cache import ResponseCache, check_redis_access
from ..errors import EndpointUnreachableError, WorkspaceError
from ..gate import Infer
from ..harness import CaseSource, Evolver, Workspace
from ..llm import (
    PROBE_TIMEOUT_S,
    AgentEvent,
    BackendContext,
    Endpoint,
    agent_endpoints,
    check_llm_agent,
    endpoint_pool,
    gate_concurrency,
    is_factory_spec,
    llm_backend,
    open_factory_backend,
    probe_endpoint,
    rollout_cases,
)
from ..options import UNSET, RunOptions
from ..sim import SimWorld, simulated_backend

Rollout = Callable[[int, int], Awaitable[Mapping[str, Sequence[str]]]]


@dataclass(frozen=True)
class Backend:
    """An opened agent: what `run_step`, `train` and `settle_probation` are driven with."""

    kind: str
    """``simulated``, ``llm`` or ``factory`` (your own agent)."""
    options: RunOptions
    """The run's options settled against this workspace: pass these on, whole."""
    infer: Infer
    evolver: Evolver
    rollout: Rollout | None = None
    """``await rollout(epoch, step)``: the step's evolution cases (run before the step)."""
    cases: CaseSource | None = None
    cache_stats: Callable[[str], Any] | None = None
    world: SimWorld | None = None
    """The simulator's world (simulated workspaces: the ground truth)."""
    report: Callable[[], dict[str, Any]] | None = None
    """Response-cache and endpoint counters so far (plain values, password masked)."""

    async def step_cases(self, epoch: int, step: int) -> Any:
        """What `run_step` takes as ``cases`` for (epoch, step)."""
        return dict(await self.rollout(epoch, step)) if self.rollout else self.cases


def uses_virtual_clock(workspace: Workspace, options: RunOptions) -> bool:
    """True when the run goes on the simulator's virtual clock: a simulated workspace with
    its built-in agent and no ``time_scale``."""
    return (workspace.config.kind == "simulated" and options.time_scale is None
            and _factory_spec(workspace, options) is None)


def _factory_spec(workspace: Workspace, options: RunOptions) -> str | None:
    spec = options.backend or workspace.config.agent.get("backend")
    return spec if options.backend or is_factory_spec(spec) else None


def _pooled(options: RunOptions, endpoints: Sequence[Endpoint]) -> RunOptions:
    """Several endpoints: the slot pool is the sum of their caps, unless asked for fewer."""
    total = gate_concurrency(None, endpoints)
    if len(endpoints) <= 1 or (options.concurrency is not UNSET and options.slots <= total):
        return options
    return options.replace("endpoint caps", concurrency=total)


def workspace_options(workspace: Workspace, options: RunOptions) -> RunOptions:
    """The options a run of ``workspace`` takes (``vtrm-gate options`` shows them): settled
    against workspace.json, and with the built-in LLM agent on several endpoints, their
    summed caps as the slot pool."""
    return _settled(workspace, options)[0]


def _settled(workspace: Workspace, options: RunOptions
             ) -> tuple[RunOptions, tuple[Endpoint, ...]]:
    """`workspace_options`, and the built-in LLM agent's endpoints it read (none for other
    agents): the run's one reading of an endpoints file."""
    options = options.with_workspace(workspace.config.probation_rule)
    if workspace.config.kind != "llm" or _factory_spec(workspace, options) is not None:
        return options, ()
    endpoints = _llm_endpoints(workspace)
    return _pooled(options, endpoints), endpoints


def _llm_endpoints(ws: Workspace) -> tuple[Endpoint, ...]:
    """The built-in agent's endpoints; its settings refused as a step refuses them."""
    try:
        check_llm_agent(ws.config.agent)
    except ValueError as exc:
        raise WorkspaceError(f"workspace.json: {exc}") from None
    return agent_endpoints(ws.config.agent, ws.root)


@contextlib.asynccontextmanager
async def open_backend(workspace: Workspace, options: RunOptions, *,
                       on_agent_event: Callable[[AgentEvent], Any] | None = None,
                       env: Mapping[str, str] | None = None) -> AsyncIterator[Backend]:
    """The workspace's agent for a run with ``options``, closed when the block ends.

    Refuses (before anything is written) a probation rule that differs from the
    workspace's, an llm workspace whose agent settings are invalid or none of whose
    endpoints answers, and a factory that cannot be used.
    """
    options, endpoints = _settled(workspace, options)
    spec = _factory_spec(workspace, options)
    env = environment(env)
    opened: tuple[Backend, Callable[[], Awaitable[None]] | None]
    if spec is not None:
        opened = await _factory(workspace, spec, options, env)
    elif workspace.config.kind == "simulated":
        opened = _simulated(workspace, options), None
    elif workspace.config.kind == "llm":
        opened = await _llm(workspace, options, endpoints, env, on_agent_event)
    else:
        raise WorkspaceError(f"{workspace.root}: a {workspace.config.kind!r} workspace has no "
                             f"built-in agent; drive it from Python (vtrm_gate.harness) or "
                             f"name your own with --backend package.module:function")
    backend, close = opened
    try:
        yield backend
    finally:
        if close is not None:
            await close()


def _simulated(ws: Workspace, options: RunOptions) -> Backend:
    sb = simulated_backend(ws, time_scale=1.0 if options.time_scale is None
                           else options.time_scale)
    return Backend("simulated", options, sb.infer, sb.evolver,
                   rollout=sb.rollout(ws, options.slots), world=sb.world)


async def _llm(ws: Workspace, options: RunOptions, endpoints: Sequence[Endpoint],
               env: Mapping[str, str], on_agent_event: Callable[[AgentEvent], Any] | None
               ) -> tuple[Backend, Callable[[], Awaitable[None]]]:
    # before anything starts or is written (embedded Redis, rows); all at once: a connection
    # within the probe's timeout, the answer's head within one attempt's (a busy single-slot
    # server answers between generations, as it would the first call)
    probes = await asyncio.gather(*(probe_endpoint(ep.url, min(options.timeout, options.deadline),
                                                   PROBE_TIMEOUT_S)
                                    for ep in endpoints), return_exceptions=True)
    down = [str(p) for p in probes if isinstance(p, EndpointUnreachableError)]
    for p in probes:
        if isinstance(p, BaseException) and not isinstance(p, EndpointUnreachableError):
            raise p
    if len(down) == len(endpoints):
        raise EndpointUnreachableError("; ".join(down))
    await _check_cache(options)
    cache = ResponseCache.from_options(options, workspace=ws.root,
                                       workspace_id=ws.workspace_id)
    lb = llm_backend(ws, options, cache=cache, api_key=api_key(env), env=env,
                     on_event=on_agent_event, endpoints=endpoint_pool(ws, options, endpoints))

    async def rollout(epoch: int, step: int) -> dict[str, Any]:
        return await rollout_cases(lb, ws, epoch, step, options.guard)

    def report() -> dict[str, Any]:
        return {**_cache_report(cache), "http_requests": lb.agent.http_requests,
                "http_cancelled": lb.agent.http_cancelled,
                "endpoints": [e.as_dict() for e in lb.endpoint_stats]}

    return Backend("llm", options, lb.infer, lb.evolver, rollout=rollout,
                   cache_stats=lb.cache_stats, report=report), lb.aclose


async def _check_cache(options: RunOptions) -> None:
    """Refuse (exit 2) a Redis that answers but refuses the cache, before any call; one that
    cannot be reached fails open (the cache warns once and calls go uncached)."""
    if options.redis_url is None or not options.cache_enabled:
        return
    await check_redis_access(options.redis_url, options.cache_prefix,
                             where=options.sources.get("redis_url", "redis_url"))


async def _factory(ws: Workspace, spec: str, options: RunOptions, env: Mapping[str, str]
                   ) -> tuple[Backend, Callable[[], Awaitable[None]]]:
    await _check_cache(options)
    cache = ResponseCache.from_options(options, workspace=ws.root,
                                       workspace_id=ws.workspace_id)
    try:
        ab = await open_factory_backend(ws, spec, BackendContext(
            ws, cache, options.slots, env, timeout=options.timeout, deadline=options.deadline),
            options.deadline)
    except BaseException:
        await cache.aclose()
        raise

    async def close() -> None:
        try:
            if ab.aclose is not None:
                await ab.aclose()
        finally:
            await cache.aclose()

    def report() -> dict[str, Any]:
        return {**_cache_report(cache), "backend": spec}

    return Backend("factory", options, ab.infer, ab.evolver, rollout=ab.rollout,
                   cases=ab.cases, cache_stats=ab.cache_stats, report=report), close


def _cache_report(cache: ResponseCache) -> dict[str, Any]:
    return {"url": cache.masked_url, "prefix": cache.prefix, "enabled": cache.enabled,
            "runs": {r: cache.stats(r).as_dict() for r in sorted(cache.runs())}}
