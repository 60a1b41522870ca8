"""The real inference backend of an ``llm`` workspace (SPEC §6): agent, evolver, rollout cases.

`llm_backend(ws)` wires the OpenAI-compatible `LLMAgent` (the gate's ``infer``), the
`LLMEvolver` and the step's rollout to one Redis `ResponseCache` (``REDIS_URL``, else the
embedded server inside the workspace). Every call is cached under a run id naming the step,
so re-running a step replays rollout, evolution and gate calls from Redis:

- rollout ``{step_run_id}_rollout_{slug}``: the current skill on a seeded batch of the pool;
  the units it gets wrong are the evolution cases (excluded from the ladder);
- evolution ``{step_run_id}_evolve_{slug}``;
- gate arms ``{step_run_id}_gate_{slug}_base`` / ``_cand`` (the scheduler's run ids).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from .._api import deprecated
from .._env import DEFAULT_CONCURRENCY, environment, mask_url, secret_values
from .._env import api_key as _api_key
from .._ids import content_hash, rollout_run_id, step_run_id
from .._sync import run_sync
from ..cache import CacheStats, ResponseCache, cache_namespace
from ..errors import CasesUnavailable, EndpointUnreachableError, WorkspaceError
from ..gate import GuardParams, Infer, UnitTask, shuffle_key
from ..harness import MediaOptions, Workspace, step_input_state
from ..options import RunOptions, resolve_options
from ._agent import AGENT_VERSION, MCQ, AgentEvent, AgentSettings, LLMAgent, RetryPolicy
from ._endpoints import Endpoint, EndpointPool, EndpointStats, agent_endpoints, endpoint_url
from ._evolver import ErrorCase, LLMEvolver
from ._media import MediaResolver

ROLLOUT_UNITS = 8



PROBE_TIMEOUT_S = 5.0
"""How long the endpoint probe waits for a connection (and, by default, for everything)."""


async def probe_endpoint(base_url: str, timeout: float = PROBE_TIMEOUT_S,
                         connect_timeout: float | None = None) -> int:
    """The HTTP status ``base_url``'s ``GET /models`` answers with (any status proves the
    server is there: a 401 or 404 too). Only the head is read, never the body. The
    connection must open within ``connect_timeout`` (default ``timeout``) and the whole
    probe ends within ``timeout`` seconds (a busy single-slot server, llama.cpp's, answers
    ``/models`` only between generations): `EndpointUnreachableError` (URL masked)
    otherwise. Sends no key and costs no tokens."""
    url = endpoint_url(base_url, "models")
    connect = min(timeout, connect_timeout or timeout)
    limits = httpx.Timeout(timeout, connect=connect)
    try:
        async with asyncio.timeout(timeout), httpx.AsyncClient(timeout=limits) as client, \
                client.stream("GET", url) as r:
            return r.status_code  # leaving the block closes the connection unread
    except httpx.ConnectTimeout:
        why = f"no connection within {connect:g} s"
    except TimeoutError:
        why = f"no answer within {timeout:g} s"
    except httpx.HTTPError as exc:
        why = f"{type(exc).__name__}: {str(exc) or 'no answer'}"
    raise EndpointUnreachableError(f"chat endpoint {mask_url(base_url)} is unreachable "
                                   f"({why})")


def check_endpoint(base_url: str, timeout: float = PROBE_TIMEOUT_S,
                   connect_timeout: float | None = None) -> int:
    """`probe_endpoint`, from sync code (a script or a notebook cell)."""
    return run_sync(probe_endpoint(base_url, timeout, connect_timeout))


@dataclass(frozen=True)
class Rollout:
    """The step's rollout: the current skill on a seeded batch of ``size`` units of the
    type's pool (keyed by seed, epoch, step); its wrong answers are the evolution cases.

    Results are memoised per (type, epoch, step, skill hash), so the evolver reads the cases
    the ladder excluded without a second call.
    """

    agent: LLMAgent
    pool: Mapping[str, Sequence[str]]
    units: Mapping[str, MCQ]
    seed: int
    size: int = ROLLOUT_UNITS
    concurrency: int = DEFAULT_CONCURRENCY
    _memo: dict[tuple[str, int, int, str], tuple[ErrorCase, ...]] = field(
        default_factory=dict, repr=False, compare=False)
    _infra: dict[tuple[str, int, int, str], tuple[int, int, str | None]] = field(
        default_factory=dict, repr=False, compare=False)
    fault: Callable[[str], str | None] | None = field(default=None, repr=False,
                                                      compare=False)
    """Why a unit's frames cannot be sent (`Workspace.media_fault`): such units are skipped."""

    def __post_init__(self) -> None:
        if self.size < 1 or self.concurrency < 1:
            raise ValueError(f"Rollout: size and concurrency must be >= 1, got {self.size}, "
                             f"{self.concurrency}")

    def batch(self, task_type: str, epoch: int, step: int) -> list[str]:
        """The units rolled out: ``min(size, pool)`` by a deterministic shuffle."""
        key = f"{self.seed}:rollout:{step_run_id(epoch, step)}"
        units = sorted(self.pool[task_type],
                       key=lambda u: shuffle_key(key, f"{task_type}\x1f{u}"))
        if self.fault is None:
            return units[:self.size]
        out: list[str] = []
        for u in units:  # lazily: only as many frame checks as the batch needs
            if len(out) == self.size:
                break
            if self.fault(u) is None:
                out.append(u)
        return out

    async def errors(self, task_type: str, skill: str, epoch: int, step: int,
                     slots: asyncio.Semaphore | None = None) -> tuple[ErrorCase, ...]:
        """The batch units ``skill`` answered wrong (INFRA answers are neither)."""
        memo_key = (task_type, epoch, step, content_hash(skill))
        if memo_key in self._memo:
            return self._memo[memo_key]
        slots = slots or asyncio.Semaphore(self.concurrency)
        run_id = rollout_run_id(task_type, epoch, step)
        batch = self.batch(task_type, epoch, step)

        async def one(rank: int, unit: str) -> Any:
            async with slots, self.agent.slot():  # the endpoints' adaptive limit, too
                return await self.agent.infer(UnitTask(task_type, unit, "base", rank, run_id,
                                                       skill, content_hash(skill)))

        results = await asyncio.gather(*(one(r, u) for r, u in enumerate(batch)))
        out = tuple(ErrorCase(u, self.units[u], res.prediction)
                    for u, res in zip(batch, results, strict=True)
                    if not res.infra and not res.correct)
        infra = [res for res in results if res.infra]
        self._infra[memo_key] = (len(infra), len(results),
                                 infra[-1].error if infra else None)
        self._memo[memo_key] = out
        return out

    def infra(self, task_type: str, skill: str, epoch: int,
              step: int) -> tuple[int, int, str | None]:
        """(INFRA units, units, last INFRA error) of a computed rollout."""
        return self._infra.get((task_type, epoch, step, content_hash(skill)), (0, 0, None))

    def cases(self, task_type: str, epoch: int, step: int, current_skill: str) -> list[str]:
        """A `CaseSource` over the computed rollouts (run `rollout_cases` first)."""
        memo_key = (task_type, epoch, step, content_hash(current_skill))
        if memo_key not in self._memo:
            raise RuntimeError(f"no rollout of {task_type!r} for e{epoch} s{step} with this "
                               f"skill: await rollout_cases(backend, workspace, {epoch}, "
                               f"{step}) before run_step")
        return [c.unit_id for c in self._memo[memo_key]]


@dataclass(frozen=True)
class LLMBackend:
    """infer, evolver, case source and cache counters of an ``llm`` workspace."""

    agent: LLMAgent
    evolver: LLMEvolver
    rollout: Rollout
    cache: ResponseCache

    @property
    def infer(self) -> Infer:
        """The gate's ``infer``: the agent answering a unit with the arm's skill (callable;
        its ``admission`` is the adaptive limit the gate consults before each dispatch)."""
        return self.agent

    @property
    def cases(self) -> Callable[[str, int, int, str], list[str]]:
        """A `CaseSource` reading the rollouts `rollout_cases` computed."""
        return self.rollout.cases

    @property
    def endpoint_stats(self) -> tuple[EndpointStats, ...]:
        """Per-endpoint counters (the one ``base_url``'s too)."""
        return self.agent.pool.stats()

    @property
    def cache_stats(self) -> Callable[[str], CacheStats]:
        """Response-cache counters per run id (``run_step(cache_stats=...)``)."""
        return self.cache.stats

    async def aclose(self) -> None:
        """Close the HTTP client and the Redis client of the running loop."""
        await self.agent.aclose()
        await self.cache.aclose()


def workspace_units(ws: Workspace) -> dict[str, MCQ]:
    """The workspace's units as `MCQ`s, by unit id."""
    return {u: MCQ(r.question, r.options, r.answer, r.media) for u, r in ws.units.items()}


def llm_backend(workspace: Workspace, options: RunOptions | None = None, *,
                cache: ResponseCache | None = None, api_key: str | None = None,
                env: Mapping[str, str] | None = None,
                on_event: Callable[[AgentEvent], Any] | None = None,
                retry: RetryPolicy | None = None, timeout: float | None = None,
                rollout_units: int = ROLLOUT_UNITS, evolver_model: str | None = None,
                evolver_temperature: float = 0.7,
                endpoints: EndpointPool | None = None) -> LLMBackend:
    """The backend of an ``llm`` workspace, from its agent config (``workspace.json``).

    ``options`` (the run's, resolved once by `vtrm_gate.options.resolve_options`; omitting it is
    deprecated: it is then resolved here from ``env``) names the response cache (``redis_url``
    ... ``cache_share``) and the rollout's slots; ``cache`` overrides it (a ``cache`` with a
    namespace of its own keeps it). Without a Redis URL the embedded Redis inside the workspace
    serves. Cached samples are salted with the workspace's id, so no other workspace reuses them
    unless ``cache_share`` opts in. The API key is ``api_key``, else ``OPENAI_API_KEY`` /
    ``VTRM_API_KEY`` from ``env`` (default: ``.env`` + the process environment); it is sent as a
    header and stored nowhere. Several endpoints (``base_url`` a list, or ``endpoints_file``) go
    through one `EndpointPool` (``endpoints`` overrides it, e.g. with other failure settings).

    The calls follow ``options``: adaptive concurrency within ``options.slots``, ``timeout``,
    ``deadline`` and ``max_retries`` (``retry`` / ``timeout`` override them), each step's
    ``max_tokens``. The steps' budgets and `AGENT_VERSION` join the workspace's agent config
    (in memory): they key the BaselineCache and the step manifest, so a base arm measured
    or graded another way is never reused.
    """
    if workspace.config.kind != "llm":
        raise WorkspaceError(f"workspace.json: {workspace.root} is not an llm workspace "
                             f"(kind {workspace.config.kind!r})")
    e = environment(env)
    if options is None:
        deprecated("llm_backend(workspace) without options",
                   "llm_backend(workspace, resolve_options(...)) or RunOptions()")
        options = resolve_options(env=e, dotenv=None)
    if cache is None:
        cache = ResponseCache.from_options(options, workspace=workspace.root)
    if not cache.namespace:
        cache.namespace = cache_namespace(workspace.workspace_id, options.cache_share)
    if api_key is None:
        api_key = _api_key(e)
    a = dict(workspace.config.agent)
    budgets = options.max_tokens(a)
    agent = _agent(workspace, options, budgets, endpoints, api_key=api_key, cache=cache,
                   retry=retry, timeout=timeout, on_event=on_event, env=e)
    rollout = Rollout(agent, workspace.pool, agent.units, workspace.config.seed,
                      rollout_units, options.slots,
                      fault=workspace.media_fault if agent.media is not None else None)

    async def error_cases(task_type: str, skill: str, epoch: int,
                          step: int) -> tuple[ErrorCase, ...]:
        return await rollout.errors(task_type, skill, epoch, step)

    evolver = LLMEvolver(agent, error_cases, model=evolver_model,
                         temperature=evolver_temperature,
                         max_tokens=budgets["evolve"] or None)
    workspace.config = dataclasses.replace(workspace.config, agent={
        **a, "agent_version": AGENT_VERSION, "max_tokens": budgets})
    return LLMBackend(agent, evolver, rollout, cache)


def endpoint_pool(workspace: Workspace, options: RunOptions,
                  endpoints: Sequence[Endpoint] | None = None) -> EndpointPool | None:
    """The `EndpointPool` of an agent with several endpoints (``base_url`` a list, or an
    ``endpoints_file``), None for one ``base_url``. ``endpoints``: those the run already read,
    so an endpoints file edited while a step starts is read once, one version for all."""
    a = workspace.config.agent
    if not (isinstance(a.get("base_url"), list) or a.get("endpoints_file")):
        return None
    if endpoints is None:
        endpoints = agent_endpoints(a, workspace.root)
    return EndpointPool(endpoints, adaptive=options.adaptive, max_limit=options.slots)


def _agent(workspace: Workspace, options: RunOptions, budgets: Mapping[str, int],
           endpoints: EndpointPool | None, **kw: Any) -> LLMAgent:
    """The workspace's `LLMAgent` with the run's call settings (``kw``: key, cache, on_event,
    the environment whose secrets every reply is scrubbed of, ``retry`` / ``timeout``)."""
    a = workspace.config.agent
    if endpoints is None:
        endpoints = endpoint_pool(workspace, options)
    media = None
    if any(u.media is not None for u in workspace.units.values()):
        media = MediaResolver(MediaOptions.from_agent(a, workspace.root))
    settings = AgentSettings(
        base_url=None if endpoints else a["base_url"], model=a["model"],
        think=bool(a.get("think", True)), temperature=float(a.get("temperature", 0.0)),
        max_tokens={k: budgets[k] for k in ("think", "answer")}, params=a.get("params"),
        timeout=kw.pop("timeout") or options.timeout,
        retry=kw.pop("retry") or RetryPolicy(max_attempts=options.max_retries + 1,
                                             max_total_s=options.deadline),
        adaptive=options.adaptive, max_concurrency=options.slots,
        task_description=a.get("task_description"))
    return LLMAgent(workspace_units(workspace), settings, endpoints=endpoints, media=media,
                    secrets=secret_values(kw.pop("env")), **kw)


async def rollout_cases(backend: LLMBackend, workspace: Workspace, epoch: int, step: int,
                        guard: GuardParams | None = None
                        ) -> dict[str, list[str] | CasesUnavailable]:
    """The step's evolution cases per type (pass as ``run_step(cases=...)``).

    Rolls out the skill each type has at the start of the step (the state before it, when
    re-running the last applied step), all types concurrently, types in cooldown skipped.
    Calls go through the cache under the rollout run id, so a re-run costs nothing.
    The INFRA guard applies to each type's rollout: more than ``guard.max_ratio`` of its
    units INFRA (a wrong key, a dead model) makes it `CasesUnavailable` (``rollout_error``),
    not "no cases".
    """
    guard = guard or GuardParams()
    state = step_input_state(workspace, epoch, step)
    slots = asyncio.Semaphore(backend.rollout.concurrency)
    types = [t for t in workspace.task_types if not state.in_cooldown(t)]
    found = await asyncio.gather(*(
        backend.rollout.errors(t, workspace.skill_text(t, state), epoch, step, slots)
        for t in types))
    out: dict[str, list[str] | CasesUnavailable] = {}
    for t, cs in zip(types, found, strict=True):
        n_infra, n, last = backend.rollout.infra(t, workspace.skill_text(t, state), epoch, step)
        if n and n_infra / n > guard.max_ratio:
            out[t] = CasesUnavailable(f"rollout INFRA: {n_infra} of {n} units failed "
                                      f"({n_infra / n:.0%} > {guard.max_ratio:.0%}); last "
                                      f"error: {last}")
        else:
            out[t] = [c.unit_id for c in cs]
    return out




