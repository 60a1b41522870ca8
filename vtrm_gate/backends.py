"""The real inference backend of an ``llm`` workspace (SPEC §6): agent, evolver, rollout cases.

`llm_backend(ws)` wires the OpenAI-compatible `LLMAgent` (the gate's ``infer``), the
`LLMEvolver` and the step's rollout to one Redis `ResponseCache` (``REDIS_URL``, else the
embedded server inside the workspace). Every call is cached under a run id naming the step,
so re-running a step replays rollout, evolution and gate calls from Redis:

- rollout ``{step_run_id}_rollout_{slug}``: the current skill on a seeded batch of the pool;
  the units it gets wrong are the evolution cases (excluded from the ladder);
- evolution ``{step_run_id}_evolve_{slug}``;
- gate arms ``{step_run_id}_gate_{slug}_base`` / ``_cand`` (the scheduler's run ids).

``run_step`` takes cases synchronously, so compute them first::

    backend = llm_backend(ws)
    try:
        cases = await rollout_cases(backend, ws, epoch, step)
        res = await run_step(ws, epoch, step, infer=backend.infer, evolver=backend.evolver,
                             cases=cases, cache_stats=backend.cache_stats)
    finally:
        await backend.aclose()

Layering: imports harness, cache, llm and redis_server (via cache); only the CLI and
notebooks import this module.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .cache import CacheStats, ResponseCache, cache_namespace, environment, mask_url
from .endpoints import EndpointPool, EndpointStats, agent_endpoints
from .harness import (
    CaseSource,
    CasesUnavailable,
    Evolver,
    Workspace,
    WorkspaceConfig,
    WorkspaceError,
    step_input_state,
    step_run_id,
)
from .ladder import shuffle_key
from .llm import MCQ, AgentEvent, ErrorCase, LLMAgent, LLMEvolver, RetryPolicy
from .media import MediaOptions, MediaResolver
from .scheduler import GuardParams, Infer, UnitTask, content_hash, slugify
from .sim import SimConfig, SimEvolver, SimWorld

ROLLOUT_UNITS = 8


class EndpointUnreachableError(ConnectionError):
    """The chat endpoint did not answer at all (connection refused, DNS, timeout)."""


def check_endpoint(base_url: str, timeout: float = 5.0) -> None:
    """Raise `EndpointUnreachableError` unless ``base_url`` answers HTTP (any status counts:
    a 401 or 404 still proves the server is there). Sends no key and costs no tokens."""
    url = base_url.rstrip("/") + "/models"
    try:
        httpx.get(url, timeout=timeout)
    except httpx.HTTPError as exc:
        raise EndpointUnreachableError(
            f"chat endpoint {mask_url(base_url)} is unreachable ({type(exc).__name__}: "
            f"{str(exc) or 'no answer'})") from None


def rollout_run_id(task_type: str, epoch: int, step: int) -> str:
    """The rollout's run id (and cache salt) for one type of one step."""
    return f"{step_run_id(epoch, step)}_rollout_{slugify(task_type)}"


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
    concurrency: int = 32
    _memo: dict[tuple[str, int, int, str], tuple[ErrorCase, ...]] = field(
        default_factory=dict, repr=False, compare=False)
    _infra: dict[tuple[str, int, int, str], tuple[int, int, str | None]] = field(
        default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.size < 1 or self.concurrency < 1:
            raise ValueError(f"Rollout: size and concurrency must be >= 1, got {self.size}, "
                             f"{self.concurrency}")

    def batch(self, task_type: str, epoch: int, step: int) -> list[str]:
        """The units rolled out: ``min(size, pool)`` by a deterministic shuffle."""
        key = f"{self.seed}:rollout:{step_run_id(epoch, step)}"
        units = sorted(self.pool[task_type],
                       key=lambda u: shuffle_key(key, f"{task_type}\x1f{u}"))
        return units[:self.size]

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
            async with slots:
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
        """The gate's ``infer``: the agent answering a unit with the arm's skill."""
        return self.agent.infer

    @property
    def cases(self) -> Callable[[str, int, int, str], list[str]]:
        """A `CaseSource` reading the rollouts `rollout_cases` computed."""
        return self.rollout.cases

    @property
    def endpoint_stats(self) -> tuple[EndpointStats, ...]:
        """Per-endpoint counters (empty with a single ``base_url``)."""
        return () if self.agent.endpoints is None else self.agent.endpoints.stats()

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


def llm_backend(workspace: Workspace, *, cache: ResponseCache | None = None,
                api_key: str | None = None, env: Mapping[str, str] | None = None,
                on_event: Callable[[AgentEvent], Any] | None = None,
                retry: RetryPolicy | None = None, timeout: float = 60.0,
                rollout_units: int = ROLLOUT_UNITS, concurrency: int = 32,
                evolver_model: str | None = None,
                evolver_temperature: float = 0.7, share: str | None = None,
                endpoints: EndpointPool | None = None) -> LLMBackend:
    """The backend of an ``llm`` workspace, from its agent config (``workspace.json``).

    ``cache`` defaults to `ResponseCache.from_env` (``REDIS_URL``, ``REDIS_CACHE_TTL``,
    ``VTRM_CACHE``...) with the embedded Redis inside the workspace when no URL is set. The
    API key is ``api_key``, else ``OPENAI_API_KEY`` / ``VTRM_API_KEY`` from ``env`` (default:
    ``.env`` + the process environment); it is sent as a header and stored nowhere.
    ``concurrency`` caps the rollout's calls (the gate has its own slot pool).
    Cached samples are salted with the workspace's id, so no other workspace reuses them;
    ``share`` (else ``VTRM_CACHE_SHARE``) opts in to sharing them with every workspace using
    the same name. A ``cache`` passed with a namespace of its own keeps it. Several
    endpoints (``base_url`` a list, or ``endpoints_file``) go through one `EndpointPool`
    (``endpoints`` overrides it, e.g. with other failure settings).
    """
    if workspace.config.kind != "llm":
        raise WorkspaceError(f"workspace.json: {workspace.root} is not an llm workspace "
                             f"(kind {workspace.config.kind!r})")
    e = environment(env)
    if cache is None:
        cache = ResponseCache.from_env(e, workspace=workspace.root)
    if not cache.namespace:
        cache.namespace = cache_namespace(workspace.workspace_id,
                                          share or e.get("VTRM_CACHE_SHARE") or None)
    if api_key is None:
        api_key = e.get("OPENAI_API_KEY") or e.get("VTRM_API_KEY") or ""
    a = dict(workspace.config.agent)
    if endpoints is None and (isinstance(a.get("base_url"), list) or a.get("endpoints_file")):
        endpoints = EndpointPool(agent_endpoints(a, workspace.root))
    media = None
    if any(u.media is not None for u in workspace.units.values()):
        media = MediaResolver(MediaOptions.from_agent(a, workspace.root))
    agent = LLMAgent(workspace_units(workspace), base_url=None if endpoints else a["base_url"],
                     model=a["model"], endpoints=endpoints, media=media,
                     api_key=api_key, cache=cache, timeout=timeout, retry=retry,
                     think=bool(a.get("think", True)),
                     temperature=float(a.get("temperature", 0.0)),
                     max_tokens=a.get("max_tokens"), params=a.get("params"),
                     on_event=on_event)
    rollout = Rollout(agent, workspace.pool, agent.units, workspace.config.seed,
                      rollout_units, concurrency)

    async def error_cases(task_type: str, skill: str, epoch: int,
                          step: int) -> tuple[ErrorCase, ...]:
        return await rollout.errors(task_type, skill, epoch, step)

    evolver = LLMEvolver(agent, error_cases, model=evolver_model,
                         temperature=evolver_temperature)
    return LLMBackend(agent, evolver, rollout, cache)


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


# ---- simulated workspaces -------------------------------------------------------------


def sim_json(sim_config: SimConfig) -> dict[str, Any]:
    """A SimConfig as plain JSON values (mappings become objects)."""
    out = {}
    for f in dataclasses.fields(sim_config):
        v = getattr(sim_config, f.name)
        out[f.name] = dict(v) if isinstance(v, Mapping) else v
    return out


def init_simulated(path: str | Path, sim_config: SimConfig | None = None,
                   **config: Any) -> Workspace:
    """A workspace over a `vtrm_gate.sim.SimWorld`: its pools, seed record, v0 skills.

    ``config`` sets other `WorkspaceConfig` fields (cooldown_steps, seed, ...).
    """
    sim_config = sim_config or SimConfig()
    world = SimWorld(sim_config)
    sim = sim_json(sim_config)
    agent = {"backend": "sim", "model": "sim-agent",
             **{k: v for k, v in sim.items() if k != "time_scale"}}
    cfg = WorkspaceConfig(kind="simulated", agent=agent, sim=sim,
                          **{"seed": sim_config.seed, **config})
    return Workspace.create(
        path, pool={t: world.pool(t) for t in world.task_types},
        skills={t: world.initial_skill(t) for t in world.task_types},
        seed_record={t: world.seed_record(t) for t in world.task_types}, config=cfg)


@dataclass(frozen=True)
class SimBackend:
    """infer, evolver and case source of a simulated workspace's world."""

    world: SimWorld
    infer: Infer
    evolver: Evolver
    cases: CaseSource


def simulated_backend(workspace: Workspace | str | Path, *,
                      time_scale: float | None = None) -> SimBackend:
    """Rebuild the `SimWorld` a simulated workspace was created from (optionally with
    another ``time_scale``: latency only, outcomes are unchanged)."""
    ws = workspace if isinstance(workspace, Workspace) else Workspace.open(workspace)
    try:
        if ws.config.kind != "simulated" or ws.config.sim is None:
            raise WorkspaceError(f"workspace.json: {ws.root} is not a simulated workspace "
                                 f"(kind {ws.config.kind!r})")
        sim = dict(ws.config.sim)
    finally:
        if ws is not workspace:
            ws.close()
    if time_scale is not None:
        sim["time_scale"] = time_scale
    try:
        world = SimWorld(SimConfig(**sim))
    except (TypeError, ValueError) as exc:
        raise WorkspaceError(f"workspace.json: sim: {exc}") from None
    return SimBackend(world, world.infer, SimEvolver(world), world.error_cases)
