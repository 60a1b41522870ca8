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
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .cache import CacheStats, ResponseCache, cache_namespace, environment, mask_url
from .endpoints import EndpointPool, EndpointStats, agent_endpoints
from .harness import (
    HELDOUT_FILE,
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
from .scheduler import GuardParams, Infer, TypePlan, UnitTask, content_hash, slugify
from .sim import (
    TRUE_MARGIN,
    SimConfig,
    SimEvolver,
    SimWorld,
    block_serial_schedule,
    simulate_policy,
)

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


def init_simulated(path: str | Path, sim_config: SimConfig | None = None, *,
                   heldout_fraction: float = 0.0, **config: Any) -> Workspace:
    """A workspace over a `vtrm_gate.sim.SimWorld`: its pools, seed record, v0 skills.

    ``heldout_fraction`` declares a held-out split (``heldout.json``): that seeded share of
    each type's units is left out of ``pool.json`` (never used for ladders, rollouts or
    probes) and serves the epoch-end evaluation. ``config`` sets other `WorkspaceConfig`
    fields (cooldown_steps, seed, probation_rule, ...).
    """
    if not (isinstance(heldout_fraction, int | float) and 0 <= heldout_fraction < 1):
        raise ValueError(f"heldout_fraction must be in [0, 1), got {heldout_fraction!r}")
    sim_config = sim_config or SimConfig()
    world = SimWorld(sim_config)
    sim = sim_json(sim_config)
    agent = {"backend": "sim", "model": "sim-agent",
             **{k: v for k, v in sim.items() if k != "time_scale"}}
    cfg = WorkspaceConfig(kind="simulated", agent=agent, sim=sim,
                          **{"seed": sim_config.seed, **config})
    heldout = {t: heldout_split(world, t, heldout_fraction) for t in world.task_types}
    files = {HELDOUT_FILE: json.dumps(heldout, indent=2) + "\n"} if heldout_fraction else {}
    return Workspace.create(
        path, pool={t: [u for u in world.pool(t) if u not in set(heldout[t])]
                    for t in world.task_types},
        skills={t: world.initial_skill(t) for t in world.task_types},
        seed_record={t: {u: v for u, v in world.seed_record(t).items()
                         if u not in set(heldout[t])} for t in world.task_types},
        config=cfg, files=files)


def heldout_split(world: SimWorld, task_type: str, fraction: float) -> list[str]:
    """A seeded ``fraction`` of the type's units (rounded down), in pool order."""
    units = world.pool(task_type)
    k = int(fraction * len(units))
    chosen = set(sorted(units, key=lambda u: shuffle_key(f"{world.config.seed}:heldout",
                                                         u))[:k])
    return [u for u in units if u in chosen]


@dataclass(frozen=True)
class SimBackend:
    """infer, evolver and case source of a simulated workspace's world."""

    world: SimWorld
    infer: Infer
    evolver: Evolver
    cases: CaseSource
    pools: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def rollout(self, workspace: Workspace, concurrency: int = 32
                ) -> Callable[[int, int], Any]:
        """``train``'s rollout: each step's rollout batch of every type not cooling down, run
        through ``concurrency`` slots with the simulated latency; returns the error cases."""
        world = self.world

        async def run(epoch: int, step: int) -> dict[str, list[str]]:
            state = step_input_state(workspace, epoch, step)
            slots = asyncio.Semaphore(concurrency)

            async def one(task: UnitTask, res: Any) -> None:
                async with slots:
                    await asyncio.sleep(res.latency_s * world.config.time_scale)

            out: dict[str, list[str]] = {}
            calls = []
            for t in workspace.task_types:
                if state.in_cooldown(t):
                    continue
                batch = world.rollout(t, epoch, step, workspace.skill_text(t, state),
                                      self.pools.get(t))
                out[t] = [task.unit_id for task, res in batch
                          if not res.infra and not res.correct]
                calls += [one(task, res) for task, res in batch]
            await asyncio.gather(*calls)
            return out

        return run


def simulated_backend(workspace: Workspace | str | Path, *,
                      time_scale: float | None = None) -> SimBackend:
    """Rebuild the `SimWorld` a simulated workspace was created from (optionally with
    another ``time_scale``: latency only, outcomes are unchanged). Rollouts draw from the
    workspace's pool (never from its held-out split)."""
    ws = workspace if isinstance(workspace, Workspace) else Workspace.open(workspace)
    try:
        if ws.config.kind != "simulated" or ws.config.sim is None:
            raise WorkspaceError(f"workspace.json: {ws.root} is not a simulated workspace "
                                 f"(kind {ws.config.kind!r})")
        sim = dict(ws.config.sim)
        pools = {t: list(us) for t, us in ws.pool.items()}
    finally:
        if ws is not workspace:
            ws.close()
    if time_scale is not None:
        sim["time_scale"] = time_scale
    try:
        world = SimWorld(SimConfig(**sim))
    except (TypeError, ValueError) as exc:
        raise WorkspaceError(f"workspace.json: sim: {exc}") from None

    def cases(task_type: str, epoch: int, step: int, skill: str) -> list[str]:
        return world.error_cases(task_type, epoch, step, skill, pools.get(task_type))

    return SimBackend(world, world.infer, SimEvolver(world), cases, pools)


# ---- the simulator's ground truth and the decision-quality report --------------------------


def record_ground_truth(workspace: Workspace, world: SimWorld) -> int:
    """Write the true effect of every gated candidate of every recorded step into the
    ``ground_truth`` table (simulated workspaces only; idempotent). Returns rows written."""
    if workspace.config.kind != "simulated":
        raise WorkspaceError(f"{workspace.root}: ground truth exists only for simulated "
                             f"workspaces (kind {workspace.config.kind!r})")
    rows = []
    for path in sorted((workspace.root / "manifests").glob("e*_s*.json")):
        m = json.loads(path.read_text(encoding="utf-8"))
        e, s = m["epoch"], m["step"]
        for t, c in sorted(m["candidates"].items()):
            if c.get("status") != "gated":
                continue
            base = workspace.version_text(t, m["inputs"]["base_skills"][t]["version"])
            cand = (workspace.root / c["file"]).read_text(encoding="utf-8")
            tr = world.true_effect(t, base, cand)
            rows.append((e, s, t, content_hash(base), content_hash(cand), tr.base_acc,
                         tr.cand_acc, tr.effect, tr.p_win, tr.true_class))
    workspace.log.upsert("ground_truth", rows)
    return len(rows)


CLASSES = ("better", "neutral", "worse")


def quality_report(workspace: Workspace, world: SimWorld, epochs: int,
                   steps_per_epoch: int) -> dict[str, Any]:
    """What the gate did to the skills, measured against the simulator's ground truth.

    Counts by true class: changes applied after settlement (ACCEPT, PROVISIONAL kept),
    PROVISIONAL kept / rolled back by probation, good candidates missed; and the end-of-run
    true accuracy per type against the initial skills, an "accept every candidate" run and
    an "oracle gate" run on the same seed.
    """
    record_ground_truth(workspace, world)
    log = workspace.log
    truth = {(e, s, t): c for e, s, t, c in log.query(
        "SELECT epoch, step, task_type, true_class FROM ground_truth")}
    settled = {(e, t): a for e, t, a in log.query(
        "SELECT epoch, task_type, action FROM step_report WHERE step = 0 AND "
        "status = 'probation'")}
    rows = log.query("SELECT epoch, step, task_type, action FROM step_report WHERE step >= 1 "
                     "AND status = 'gated'")
    zero = dict.fromkeys(CLASSES, 0)
    applied, missed, kept, rolled, gated = (dict(zero) for _ in range(5))
    for e, s, t, action in rows:
        cls = truth.get((e, s, t))
        if cls is None:
            continue
        gated[cls] += 1
        on = action == "ACCEPT"
        if action == "PROVISIONAL":
            fate = settled.get((e, t))
            on = fate == "PROBATION_PASSED"
            if fate is not None:
                (kept if on else rolled)[cls] += 1
        if on:
            applied[cls] += 1
        elif cls == "better":
            missed[cls] += 1
    state = workspace.state
    pools = {t: list(us) for t, us in workspace.pool.items()}
    cfg = workspace.config
    runs = {p: simulate_policy(world, epochs, steps_per_epoch, p, pools=pools,
                               cooldown_steps=cfg.cooldown_steps, rejected_max=cfg.rejected_max)
            for p in ("accept_all", "oracle")}
    acc = []
    for t in workspace.task_types:
        acc.append({
            "task_type": t,
            "initial": world.true_accuracy(t, world.initial_skill(t)),
            "gate": world.true_accuracy(t, workspace.skill_text(t, state)),
            "accept_all": world.true_accuracy(t, runs["accept_all"].skills[t]),
            "oracle": world.true_accuracy(t, runs["oracle"].skills[t]),
            "version": state.skills[t].version,
        })
    mean = {k: sum(r[k] for r in acc) / len(acc) for k in ("initial", "gate", "accept_all",
                                                           "oracle")}
    policy = {p: {"applied": dict(zero), "candidates": len(r.decisions)}
              for p, r in runs.items()}
    for p, r in runs.items():
        for *_, on, tr in r.decisions:
            if on:
                policy[p]["applied"][tr.true_class] += 1
    return {"gated": gated, "applied": applied, "missed_better": missed["better"],
            "provisional_kept": kept, "provisional_rolled_back": rolled,
            "leak": applied["neutral"] + applied["worse"], "accuracy": acc,
            "truth_rows": sorted((e, s, t, c) for (e, s, t), c in truth.items()),
            "mean_accuracy": mean, "policies": policy, "margin": TRUE_MARGIN}


def _serial_blocks_s(world: SimWorld, plan: TypePlan, n_units: int, block: int = 8) -> float:
    """Old-gate time of the first ``n_units`` of a plan: blocks of ``block`` units one after
    another, base arm then candidate arm (a block's arm runs its units concurrently)."""
    total = 0.0
    for start in range(0, n_units, block):
        ranks = range(start, min(start + block, n_units))
        for arm in ("base", "cand"):
            total += max(world.outcome(plan.task(r, arm)).latency_s for r in ranks)
    return total


def _logged_units(workspace: Workspace, run_id: str) -> list[str]:
    return [u for (u,) in workspace.log.query(
        "SELECT unit_id FROM predictions WHERE run_id = ? ORDER BY ladder_rank", (run_id,))]


def serial_phase_times(workspace: Workspace, world: SimWorld,
                       steps: Iterable[tuple[int, int]], settled: Iterable[int] = (),
                       evaluated: Iterable[int] = (), block: int = 8) -> dict[str, Any]:
    """The OLD serial gate's simulated time per phase on the same inputs as a v3 run (the
    recorded manifests of ``steps``, the probes of ``settled`` epochs, the held-out units of
    ``evaluated`` epochs), and the old gate's decisions on those steps.

    Old: rollout types one after another (a type's batch concurrent); gate
    `block_serial_schedule` (types serial, blocks of 8, arms serial, block-end decisions);
    settlement and evaluation the same block-serial pattern over the whole probe / held-out
    split. No BaselineCache: every call runs. (Serial evolution is the sum of the evolver's
    call times: `TrainResult.serial_evolution_s`.)
    """
    phases = dict.fromkeys(("rollout", "gate", "settlement", "evaluation"), 0.0)
    decisions: list[tuple[int, int, str, str]] = []
    for e, s in sorted(steps):
        path = workspace.manifest_path(e, s)
        if not path.is_file():
            continue
        m = json.loads(path.read_text(encoding="utf-8"))
        base = {t: workspace.version_text(t, b["version"])
                for t, b in m["inputs"]["base_skills"].items()}
        for t in m["inputs"]["cases"]:
            batch = world.rollout(t, e, s, base[t], workspace.pool[t])
            phases["rollout"] += max((r.latency_s for _, r in batch), default=0.0)
        plans = [TypePlan(t, m["inputs"]["ladders"][t], base[t],
                          (workspace.root / c["file"]).read_text(encoding="utf-8"),
                          m["step_run_id"])
                 for t, c in sorted(m["candidates"].items()) if c.get("status") == "gated"]
        if plans:
            old = block_serial_schedule(world, plans, block=block)
            phases["gate"] += old["makespan_s"]
            decisions += [(e, s, t, str(o.action)) for t, o in old["outcomes"].items()]
    for kind, epochs, what in (("settlement", settled, "probation"),
                               ("evaluation", evaluated, "eval")):
        for e in sorted(epochs):
            srid = f"e{e}_{what}"
            for t in workspace.task_types:
                probe = TypePlan(t, ["-"], step_run_id=srid)
                units = _logged_units(workspace, probe.run_id("base"))
                hashes = dict(workspace.log.query(
                    "SELECT arm, skill_hash FROM predictions WHERE run_id IN (?, ?) "
                    "GROUP BY arm", (probe.run_id("base"), probe.run_id("cand"))))
                plan = _plan_from_hashes(workspace, t, units, srid, hashes) if units else None
                if plan is not None:
                    phases[kind] += _serial_blocks_s(world, plan, len(units), block)
    return {"phases": phases, "gate_decisions": decisions}


def _plan_from_hashes(workspace: Workspace, task_type: str, units: list[str], srid: str,
                      hashes: Mapping[str, str]) -> TypePlan | None:
    """A plan whose arm skills are the recorded versions with the logged content hashes."""
    latest = workspace.state.skills[task_type].latest
    by_hash = {}
    for v in range(1, latest + 1):
        p = workspace.history_path(task_type, v)
        if p.is_file():
            text = p.read_text(encoding="utf-8")
            by_hash[content_hash(text)] = text
    base, cand = by_hash.get(hashes.get("base", "")), by_hash.get(hashes.get("cand", ""))
    if base is None or cand is None:
        return None
    return TypePlan(task_type, units, base, cand, srid)


def training_summary(ws: Workspace, world: SimWorld, res: Any) -> dict[str, Any]:
    """A simulated training run's summary: loop-clock time per phase of v3 (what ``res``
    ran) and of the old serial gate on the same inputs, the old gate's decisions there, and
    the decision quality against the ground truth (`quality_report`)."""
    out: dict[str, Any] = {"epochs": res.epochs, "steps_per_epoch": res.steps_per_epoch,
                           "done_before": res.done_before,
                           "v3_phases_s": dict(res.phases), "v3_total_s": res.total_s}
    old = serial_phase_times(ws, world, res.steps, res.settlements,
                             [e for e, ev in res.evaluations.items() if not ev.already_done])
    phases = {"rollout": old["phases"]["rollout"], "evolution": res.serial_evolution_s,
              "gate": old["phases"]["gate"], "settlement": old["phases"]["settlement"],
              "evaluation": old["phases"]["evaluation"]}
    out["old_phases_s"] = phases
    out["old_total_s"] = sum(phases.values())
    out["old_gate_decisions"] = old["gate_decisions"]
    out["quality"] = quality_report(ws, world, res.epochs, res.steps_per_epoch)
    return out


def run_simulated_training(path: str | Path, sim_config: SimConfig, epochs: int,
                           steps_per_epoch: int, *, heldout_fraction: float = 0.2,
                           concurrency: int = 32, guard: Any = None,
                           on_event: Callable[[Any], Any] | None = None,
                           **config: Any) -> tuple[Workspace, Any, dict[str, Any]]:
    """Create a simulated workspace at ``path`` and train it on the virtual clock (seconds of
    wall time); returns (workspace, `TrainResult`, `training_summary`). ``config`` sets
    `WorkspaceConfig` fields such as ``probation_rule``."""
    from .harness import train
    from .sim import run_virtual

    ws = init_simulated(path, dataclasses.replace(sim_config, time_scale=1.0),
                        heldout_fraction=heldout_fraction, **config)
    be = simulated_backend(ws)
    res = run_virtual(train(ws, epochs, steps_per_epoch, infer=be.infer, evolver=be.evolver,
                            rollout=be.rollout(ws, concurrency), concurrency=concurrency,
                            guard=guard, on_event=on_event,
                            after=lambda w: record_ground_truth(w, be.world)))
    return ws, res, training_summary(ws, be.world, res)


def training_curve(ws: Workspace, world: SimWorld) -> Any:
    """Per type and epoch (0 = the initial skills): measured held-out accuracy, true
    accuracy, and the epoch's decisions (accepted, provisional, rolled back) - a polars frame."""
    import polars as pl

    ev = ws.log.query("SELECT epoch, task_type, version, acc_initial, acc_current, "
                      "skill_hash FROM evaluation ORDER BY epoch, task_type")
    marks: dict[tuple[int, str], dict[str, int]] = {}
    for e, t, action in ws.log.query(
            "SELECT epoch, task_type, action FROM step_report WHERE action IN "
            "('ACCEPT', 'PROVISIONAL', 'PROBATION_FAILED')"):
        key = {"ACCEPT": "accepted", "PROVISIONAL": "provisional",
               "PROBATION_FAILED": "rolled_back"}[action]
        m = marks.setdefault((e, t), {"accepted": 0, "provisional": 0, "rolled_back": 0})
        m[key] += 1
    rows = []
    seen0: set[str] = set()
    for e, t, v, acc0, acc, _ in ev:
        if t not in seen0:
            seen0.add(t)
            rows.append({"epoch": 0, "task_type": t, "version": 1, "measured": acc0,
                         "true": world.true_accuracy(t, ws.version_text(t, 1)),
                         "accepted": 0, "provisional": 0, "rolled_back": 0})
        rows.append({"epoch": e, "task_type": t, "version": v, "measured": acc,
                     "true": world.true_accuracy(t, ws.version_text(t, v)),
                     **marks.get((e, t), {"accepted": 0, "provisional": 0,
                                          "rolled_back": 0})})
    return pl.DataFrame(rows, infer_schema_length=None).sort("task_type", "epoch")
