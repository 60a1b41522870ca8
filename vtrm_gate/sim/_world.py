"""Seeded simulated world (SPEC §6): Video-MME task types, a simulated agent and evolver.

Everything is a pure function of (seed, names): a skill's quality is carried in its text
(``<!-- sim: ability=+0.350 ... -->``), and every call's randomness is keyed by
(seed, unit_id, run_id, skill hash), so workspaces on disk and re-runs are deterministic.

Correctness: ``P(correct) = sigmoid(ability - difficulty)`` with a Gaussian copula: a latent
shared by every run of a unit plus a small per-run noise, so both arms see the same
difficulty and most pairs are concordant, yet an independent run (the seed-baseline record)
never equals the base arm's measurement by construction. Wrong answers take more agent steps
and so more time: the bias that makes arrival-order consumption invalid.

Clocks: latencies are a real agent's (``SimWorld()`` with the default ``time_scale=1.0`` on
a real loop sleeps ~1.3 h for a 12-type step). Either run under `run_virtual` (instant,
exact makespans) or scale real time: ``SimConfig(time_scale=30 / 4600)`` for ~30 s, or
`vtrm_gate.sim.sim_step(seed, wall_seconds=30)`, which computes the scale exactly.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from types import MappingProxyType
from typing import Any, Literal

from .._env import MAX_TIME_SCALE
from .._ids import content_hash, slugify, type_slugs
from ..errors import (
    CasesUnavailable,
    ConfigError,
    InputError,
    is_real,
    is_whole,
    plain_fields,
    shown,
)
from ..gate import UnitResult, UnitTask
from ._effects import PRESETS, World

Effect = Literal["harmful", "neutral", "helpful"]

TASK_TYPES: tuple[str, ...] = (
    "Action Reasoning",
    "Action Recognition",
    "Attribute Perception",
    "Counting Problem",
    "Information Synopsis",
    "OCR Problems",
    "Object Reasoning",
    "Object Recognition",
    "Spatial Perception",
    "Spatial Reasoning",
    "Temporal Perception",
    "Temporal Reasoning",
)
EFFECTS: tuple[Effect, ...] = ("harmful", "neutral", "helpful")

# A spread from tiny (9: can only reach the exhaustion exit) to a few hundred.
DEFAULT_POOL_SIZES: Mapping[str, int] = MappingProxyType({
    "Action Reasoning": 200,
    "Action Recognition": 280,
    "Attribute Perception": 180,
    "Counting Problem": 260,
    "Information Synopsis": 240,
    "OCR Problems": 120,
    "Object Reasoning": 320,
    "Object Recognition": 300,
    "Spatial Perception": 9,
    "Spatial Reasoning": 23,
    "Temporal Perception": 45,
    "Temporal Reasoning": 150,
})

SEED_RUN_ID = "seed-baseline"
"""Run id of the seed-baseline record: an earlier, independent run of the v0 skills."""

REF_STEPS = 8
"""Agent steps at which an inference takes ``mean_latency_s`` on average."""
MAX_STEPS = 40
ROLLOUT_BATCH = 6


def rollout_cases(batch: Sequence[tuple[UnitTask, UnitResult]]) -> list[str]:
    """A rollout batch's wrong answers; `CasesUnavailable` when more than half of it failed
    for INFRA (read as "no cases", a batch that measured nothing applied a step). Half, not
    the LLM rollout's guard ratio: one failure in the 6-unit batch is 17%, and at the default
    post-retry rate that would turn ~0.2% of the simulator's type-steps into errors, changing
    every seeded run that measured them; the failed units are unknown, the rest real."""
    n_infra = sum(bool(res.infra) for _, res in batch)
    if batch and n_infra > len(batch) / 2:
        raise CasesUnavailable(f"rollout INFRA ({batch[0][0].run_id}): {n_infra} of "
                               f"{len(batch)} units failed")
    return [t.unit_id for t, res in batch if not res.infra and not res.correct]
"""Units per type in a step's rollout; the wrong ones are that step's evolution cases."""
EFFECT_SIZE = (0.3, 0.9)
"""Range of |ability shift| of a helpful or harmful candidate (a neutral one shifts 0) in the
``default`` world (`World.size_min`, `World.size_max`)."""

DEFAULT_INFRA_RATE = 0.0004
"""The simulator's default INFRA rate per call *after* the agent's retries (the LLM agent
makes up to 6 attempts over up to 180 s). Independent transient 5xx at 5% per attempt would
survive that 0.05^6 = 1.6e-8 of the time; what survives retries is an outage longer than
the backoff, here one call in 2,500. With it, P(INFRA-guard abort) of a default 3x5 training
run is at most 0.69% for any run (252 gates, every one at its worst), 0.33% for a typical one
(`python -m benchmarks.bench_guard`); 0.003, the earlier default, gave 17% (a pre-retry
rate)."""

_STEPS_MEDIAN = {True: 6.0, False: 13.0}  # wrong answers: the agent keeps exploring
_STEPS_SIGMA = 0.35
_JITTER_SIGMA = 0.25
_TOKENS_PROMPT = 1500
_TOKENS_PER_STEP = 900
_LETTERS = ("A", "B", "C", "D")
_NORMAL = NormalDist()
_MARKER = re.compile(r"<!--\s*sim:[^>]*?-->")
_ABILITY = re.compile(r"<!--\s*sim:[^>]*?\bability=([+-]?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)")


def _uniform(*parts: object) -> float:
    """A uniform in (0, 1) that is a pure, platform-independent function of ``parts``."""
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return ((int.from_bytes(h, "big") >> 11) + 0.5) / 2.0**53


def _normal(*parts: object) -> float:
    return _NORMAL.inv_cdf(_uniform(*parts))


_LOGIT_EDGE = 27.6
"""|ability - difficulty| is clipped here: P(correct) stays within ~1e-12 of 0 and 1, where
``inv_cdf`` is defined (sigmoid(40) is 1.0 in floats: a world with huge sizes, or a skill
marker's ability far past the scale, gets there)."""


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-_LOGIT_EDGE, min(_LOGIT_EDGE, x))))


def _fail(name: str, allowed: str, value: object) -> None:
    raise ConfigError(f"SimConfig.{name} must be {allowed}, got {shown(value)}")


@dataclass(frozen=True)
class SimConfig:
    """A simulated world's knobs; validated on construction (errors name the field)."""

    seed: int = 0
    pool_sizes: Mapping[str, int] | None = None
    """Units per type; also chooses the world's types (in mapping order). Default: 9..320."""
    infra_rate: float = DEFAULT_INFRA_RATE
    """Per-call probability of a 503-like failure that survived the backend's retries.

    A post-retry rate (see `DEFAULT_INFRA_RATE`): the SPEC's guard (> 10% once >= 10 calls)
    trips on two INFRA units in a type's first 10-19 calls, so at 0.3% a default 3x5 run
    aborted ~1 time in 6; at 0.04% it aborts < 0.7% of the time, exactly bounded.
    """
    time_scale: float = 1.0
    """Loop seconds slept per simulated second (1.0 under `run_virtual`; 1e-4 on real time)."""
    mean_latency_s: float = 120.0
    """Mean simulated seconds of an inference whose agent took REF_STEPS (8) steps."""
    effects: Mapping[str, str] | None = None
    """Per type the evolver's true effect, fixed for the run: harmful / neutral / helpful.
    The other types draw theirs from ``world``."""
    no_change_rate: float = 0.1
    """Probability that the evolver returns the current text unchanged."""
    unit_correlation: float = 0.7
    """Correlation of two runs' latents on one unit: higher means more concordant pairs."""
    world: World | None = None
    """The distribution candidate effects are drawn from (a `World`, its JSON object or a
    preset name). None: the preset ``default``, the original per-type world."""

    def __post_init__(self) -> None:
        plain_fields(self)
        if not is_whole(self.seed):
            _fail("seed", "an integer", self.seed)
        pools = DEFAULT_POOL_SIZES if self.pool_sizes is None else self.pool_sizes
        if not isinstance(pools, Mapping) or not pools:
            _fail("pool_sizes", "a non-empty mapping of task type -> units (integer >= 1)",
                  pools)
        for name in pools:
            if not isinstance(name, str):
                _fail("pool_sizes", "keyed by task type names", name)
        try:
            type_slugs(pools)
        except InputError as exc:
            raise ConfigError(f"SimConfig.pool_sizes: {exc}") from None
        for name, size in pools.items():
            if not is_whole(size) or size < 1:  # a type of no units is never measured: NaN means
                _fail("pool_sizes", f"integers >= 1 (type {name!r})", size)
        if self.pool_sizes is not None:  # a private copy: the caller's dict may change
            object.__setattr__(self, "pool_sizes", dict(pools))
        if not (is_real(self.infra_rate) and 0 <= self.infra_rate < 1):
            _fail("infra_rate", "a probability in [0, 1)", self.infra_rate)
        if not (is_real(self.time_scale) and 0 <= self.time_scale <= MAX_TIME_SCALE):
            _fail("time_scale", f"a number from 0 to {MAX_TIME_SCALE:g} (real seconds per "
                                f"simulated second)", self.time_scale)
        if not (is_real(self.mean_latency_s) and self.mean_latency_s > 0):
            _fail("mean_latency_s", "a finite number > 0", self.mean_latency_s)
        if not (is_real(self.no_change_rate) and 0 <= self.no_change_rate <= 1):
            _fail("no_change_rate", "a probability in [0, 1]", self.no_change_rate)
        if not (is_real(self.unit_correlation) and 0 <= self.unit_correlation < 1):
            _fail("unit_correlation", "in [0, 1)", self.unit_correlation)
        given = {} if self.effects is None else self.effects
        if not isinstance(given, Mapping):
            _fail("effects", "a mapping of task type -> harmful | neutral | helpful", given)
        for name, eff in given.items():
            if name not in pools:
                _fail("effects", f"keyed by the world's task types {list(pools)}", name)
            if eff not in EFFECTS:
                _fail("effects", f"one of {list(EFFECTS)} (type {name!r})", eff)
        if self.effects is not None:
            object.__setattr__(self, "effects", dict(given))
        if self.world is not None:
            world = self.world if isinstance(self.world, World) else World.from_dict(
                self.world, "SimConfig.world")
            unknown = [t for t in world.types if t not in pools]
            if unknown:
                _fail("world", f"keyed (types) by the world's task types {list(pools)}",
                      unknown[0])
            object.__setattr__(self, "world", world)

    def resolved_world(self) -> World:
        """The effects distribution: ``world``, or the preset ``default``."""
        return PRESETS["default"] if self.world is None else self.world

    def resolved_pool_sizes(self) -> dict[str, int]:
        """Units per type with the default filled in; its order is the world's type order."""
        return dict(DEFAULT_POOL_SIZES if self.pool_sizes is None else self.pool_sizes)

    def resolved_effects(self) -> dict[str, str]:
        """The types whose evolver effect is fixed for the run: the given ones, and, in a
        world of scope ``type``, every other type's seeded draw from the world's shares
        (a world of scope ``candidate`` draws the rest per candidate)."""
        given = self.effects or {}
        world = self.resolved_world()
        out = {}
        for name in self.resolved_pool_sizes():
            if name in given:
                out[name] = given[name]
            elif world.scope == "type":
                out[name] = world.classify(_uniform(self.seed, "effect", name), name)
        return out


TRUE_MARGIN = 0.01
"""A candidate is truly *neutral* when its true accuracy gain is within +-1 point."""


@dataclass(frozen=True)
class TrueEffect:
    """The simulator's ground truth about one candidate (never shown to the gate)."""

    base_acc: float
    cand_acc: float
    effect: float
    """True accuracy gain ``E[d] = acc(cand) - acc(base)`` over the type's units."""
    p_win: float
    """P(cand right | exactly one arm right): 0.5 for a neutral candidate."""
    true_class: str
    """better | neutral | worse (margin `TRUE_MARGIN`)."""


@dataclass(frozen=True)
class _Unit:
    """Hidden truth of one unit: difficulty, the latent shared by every run, the answer."""

    unit_id: str
    difficulty: float
    z_unit: float
    answer: str


class SimWorld:
    """A seeded world: pools, seed record, error cases, skills and a simulated agent.

    ``infer`` sleeps ``latency × config.time_scale`` on the loop clock: under `run_virtual`
    keep ``time_scale=1.0``; on a real loop (a notebook) pass a small ``time_scale`` or use
    ``sim_step(seed, wall_seconds=30)`` — at 1.0 a 12-type step takes ~1.3 h of real time.
    """

    def __init__(self, config: SimConfig = SimConfig()) -> None:
        if not isinstance(config, SimConfig):
            raise TypeError(f"config must be a SimConfig, got {type(config).__name__}")
        self.config = config
        sizes = config.resolved_pool_sizes()
        self.task_types: tuple[str, ...] = tuple(sizes)
        self.world: World = config.resolved_world()
        self.effects: Mapping[str, str] = MappingProxyType(config.resolved_effects())
        """Types whose effect is fixed for the run (all of them in a per-type world)."""
        seed = config.seed
        self._units: dict[str, dict[str, _Unit]] = {}
        for t in self.task_types:
            mean = -1.2 + 1.8 * _uniform(seed, "type-difficulty", t)  # v0 accuracy ~45..75%
            slug = slugify(t)
            units = {}
            for i in range(sizes[t]):
                uid = f"{slug}-{i:03d}"
                units[uid] = _Unit(uid, mean + 1.3 * _normal(seed, "difficulty", uid),
                                   _normal(seed, "latent", uid),
                                   _LETTERS[int(4 * _uniform(seed, "answer", uid))])
            self._units[t] = units
        self._abilities: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"SimWorld({self.config!r})"

    def _unit(self, task_type: str, unit_id: str) -> _Unit:
        try:
            return self._units[task_type][unit_id]
        except KeyError:
            raise ConfigError(f"unknown unit {unit_id!r} of type {task_type!r} in this "
                             f"simulated world") from None

    def _type(self, task_type: str) -> dict[str, _Unit]:
        try:
            return self._units[task_type]
        except KeyError:
            raise ConfigError(f"unknown task type {task_type!r}; this world has "
                             f"{list(self.task_types)}") from None

    # ---- data a step starts from ------------------------------------------------------

    def pool(self, task_type: str) -> list[str]:
        """The frozen unit pool of a type (ids stable for a seed)."""
        return list(self._type(task_type))

    def seed_record(self, task_type: str) -> dict[str, bool]:
        """Seed-baseline correctness per unit: selection data ONLY, from an earlier run.

        Its own run id makes it independent of any gate base-arm run; units whose seed call
        failed for infrastructure reasons have no record.
        """
        skill = self.initial_skill(task_type)
        out: dict[str, bool] = {}
        for rank, uid in enumerate(self._type(task_type)):
            res = self.outcome(UnitTask(task_type, uid, "base", rank, SEED_RUN_ID, skill,
                                        content_hash(skill)))
            if not res.infra:
                out[uid] = res.correct
        return out

    def error_cases(self, task_type: str, epoch: int, step: int,
                    skill: str | None = None, pool: Sequence[str] | None = None) -> list[str]:
        """This step's evolution cases: units of a seeded rollout batch that ``skill``
        (default: the v0 skill) got wrong. May be empty. ``pool`` restricts the batch to
        those units (a workspace's pool, without its held-out split)."""
        return rollout_cases(self.rollout(task_type, epoch, step, skill, pool))

    def rollout(self, task_type: str, epoch: int, step: int, skill: str | None = None,
                pool: Sequence[str] | None = None) -> list[tuple[UnitTask, UnitResult]]:
        """The step's rollout batch (``ROLLOUT_BATCH`` seeded units) and the skill's results."""
        skill = self.initial_skill(task_type) if skill is None else skill
        seed = self.config.seed
        units = self._type(task_type) if pool is None else pool
        batch = sorted(units, key=lambda u: _uniform(seed, "rollout", task_type, epoch, step, u))
        run_id = f"rollout_e{epoch}_s{step}_{slugify(task_type)}"
        out = []
        for rank, uid in enumerate(batch[:ROLLOUT_BATCH]):
            task = UnitTask(task_type, uid, "base", rank, run_id, skill, content_hash(skill))
            out.append((task, self.outcome(task)))
        return out

    # ---- ground truth (never visible to the gate) ---------------------------------------

    def unit_p_correct(self, task_type: str, unit_id: str, skill: str) -> float:
        """P(correct) of one run of ``skill`` on this unit, given the unit's shared latent
        (two runs of a unit are independent given it; averaged over units it is the
        marginal ``sigmoid(ability - difficulty)``)."""
        u = self._unit(task_type, unit_id)
        p = _sigmoid(self.skill_ability(skill) - u.difficulty)
        rho = self.config.unit_correlation
        return _NORMAL.cdf((_NORMAL.inv_cdf(p) - math.sqrt(rho) * u.z_unit) / math.sqrt(1 - rho))

    def true_accuracy(self, task_type: str, skill: str,
                      units: Sequence[str] | None = None) -> float:
        """The skill's true accuracy on the type's units (default: all of them): the mean
        over those units of a fresh run's P(correct)."""
        us = list(self._type(task_type)) if units is None else list(units)
        return (sum(self.unit_p_correct(task_type, u, skill) for u in us) / len(us) if us
                else float("nan"))

    def true_effect(self, task_type: str, base: str, cand: str) -> TrueEffect:
        """A candidate's true effect against its base over the type's units: accuracy gain
        (``E[d]``), win probability among discordant pairs, and its class."""
        wins = losses = gain = 0.0
        units = list(self._type(task_type))
        for uid in units:
            pb = self.unit_p_correct(task_type, uid, base)
            pc = self.unit_p_correct(task_type, uid, cand)
            wins += pc * (1 - pb)
            losses += pb * (1 - pc)
            gain += pc - pb
        effect = gain / len(units) if units else 0.0
        p_win = wins / (wins + losses) if wins + losses > 0 else 0.5
        cls = ("better" if effect >= TRUE_MARGIN else "worse" if effect <= -TRUE_MARGIN
               else "neutral")
        return TrueEffect(self.true_accuracy(task_type, base),
                          self.true_accuracy(task_type, cand), effect, p_win, cls)

    def initial_skill(self, task_type: str) -> str:
        """Text of ``skills/<slug>.md`` v0 (ability 0 by definition)."""
        self._type(task_type)
        return (f"# {task_type}\n\n"
                f"<!-- sim: ability=+0.000 effect=seed rev=v0 -->\n\n"
                f"You answer multiple-choice questions of type \"{task_type}\" about a video.\n"
                f"\n## Strategy\n"
                f"- Skim the whole video first, then revisit the segments the question names.\n"
                f"- Eliminate options that contradict what is on screen before choosing.\n"
                f"- Answer with one letter.\n")

    def question(self, task_type: str, unit_id: str) -> dict[str, Any]:
        """A placeholder multiple-choice item for realism and for LLM-backed runs."""
        u = self._unit(task_type, unit_id)
        return {
            "question": f"[{task_type}] Simulated question {unit_id}: which option matches "
                        f"the video?",
            "options": [f"{c}. option {c.lower()} of {unit_id}" for c in _LETTERS],
            "answer": u.answer,
        }

    def prompt(self, task: UnitTask) -> list[dict[str, str]]:
        """The messages an LLM agent would be sent for ``task`` (the response-cache key)."""
        q = self.question(task.task_type, task.unit_id)
        return [{"role": "system", "content": f"skill sha256:{task.skill_hash}"},
                {"role": "user", "content": "\n".join([q["question"], *q["options"]])}]

    def grade(self, task: UnitTask, answer: str) -> bool:
        """Whether ``answer`` (a letter) is right for ``task``'s unit."""
        return answer == self.question(task.task_type, task.unit_id)["answer"]

    def skill_ability(self, skill_text: str) -> float:
        """The ability carried in a skill's ``<!-- sim: ability=... -->`` line (0 if none)."""
        a = self._abilities.get(skill_text)
        if a is None:
            m = _ABILITY.search(skill_text)
            a = float(m.group(1)) if m else 0.0
            if len(self._abilities) < 4096:
                self._abilities[skill_text] = a
        return a

    # ---- the simulated agent ------------------------------------------------------------

    def _call_key(self, task: UnitTask) -> tuple[object, ...]:
        return (self.config.seed, task.unit_id, task.run_id,
                task.skill_hash or content_hash(task.skill))

    def _infra(self, key: tuple[object, ...], attempt: int) -> bool:
        """Whether the call fails for infrastructure reasons at this attempt of its step.

        A fresh draw per attempt, and a call that succeeded once succeeds at every later
        attempt (as a cached call would): after the INFRA guard aborted a step, re-running it
        asks again only what failed, and each re-run fails less (rate ** (attempt + 1))."""
        rate = self.config.infra_rate
        return all(_uniform(*key, "infra", *((a,) if a else ())) < rate
                   for a in range(max(attempt, 0) + 1))

    def _steps(self, key: tuple[object, ...], correct: bool) -> int:
        s = _STEPS_MEDIAN[correct] * math.exp(_STEPS_SIGMA * _normal(*key, "steps"))
        return max(1, min(MAX_STEPS, round(s)))

    def outcome(self, task: UnitTask) -> UnitResult:
        """The result `infer` returns for ``task``, computed at once (deterministic)."""
        u = self._unit(task.task_type, task.unit_id)
        key = self._call_key(task)
        if self._infra(key, task.attempt):
            res = UnitResult(infra=True, error="503 Service Unavailable (simulated)",
                             trace={"sim": True, "infra": True})
            return _with_latency(res, self.latency(task, res))
        ability = self.skill_ability(task.skill)
        p = _sigmoid(ability - u.difficulty)
        rho = self.config.unit_correlation
        latent = math.sqrt(rho) * u.z_unit + math.sqrt(1 - rho) * _normal(*key, "run")
        correct = latent < _NORMAL.inv_cdf(p)
        steps = self._steps(key, correct)
        if correct:
            pred = u.answer
        else:
            others = [c for c in _LETTERS if c != u.answer]
            pred = others[int(3 * _uniform(*key, "wrong"))]
        tokens = _TOKENS_PROMPT + _TOKENS_PER_STEP * steps + int(200 * _uniform(*key, "tok"))
        res = UnitResult(correct=correct, prediction=pred, tokens=tokens,
                         trace={"sim": True, "agent_steps": steps, "p_correct": round(p, 4),
                                "ability": ability, "difficulty": round(u.difficulty, 4)})
        return _with_latency(res, self.latency(task, res))

    def latency(self, task: UnitTask, result: UnitResult) -> float:
        """Simulated seconds of that call, growing with agent steps (wrong answers are slower).

        An INFRA result is what is left after the backend's retries are used up, so it costs
        a partial call plus the backoff budget, not an instant 503.
        """
        key = self._call_key(task)
        if result.infra:
            return self.config.mean_latency_s * (0.5 + _uniform(*key, "infra-latency")) + 30.0
        steps = self._steps(key, result.correct)
        jitter = math.exp(_JITTER_SIGMA * _normal(*key, "jitter") - _JITTER_SIGMA**2 / 2)
        return self.config.mean_latency_s * steps / REF_STEPS * jitter

    async def infer(self, task: UnitTask) -> UnitResult:
        """`run_gate`'s ``infer``: sleeps ``latency * time_scale`` on the loop clock."""
        res = self.outcome(task)
        await asyncio.sleep(res.latency_s * self.config.time_scale)
        return res


def _with_latency(res: UnitResult, latency: float) -> UnitResult:
    return UnitResult(res.correct, res.infra, res.cached, res.prediction, latency, res.tokens,
                      res.trace, res.error)


_PHRASES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "helpful": ("Ground every claim in a timestamped frame before answering.",
                "Count objects per segment, then sum; do not estimate from one frame.",
                "Read on-screen text at the highest-resolution frame available.",
                "Compare the options pairwise against the relevant segment."),
    "neutral": ("Restate the question in your own words first.",
                "Keep notes short; one line per observation.",
                "Prefer the option phrased most like the question.",
                "Mention the segment you relied on."),
    "harmful": ("Answer from the first frames only to save time.",
                "If unsure, pick the longest option.",
                "Skip re-watching; trust the first impression.",
                "Ignore on-screen text; it is usually decorative."),
})


class SimEvolver:
    """Simulated evolver: a candidate skill text whose true effect (helpful / neutral /
    harmful) is the type's fixed one or, in a per-candidate world, the candidate's own draw,
    with a seeded magnitude from the world; both are written into the text."""

    def __init__(self, world: SimWorld) -> None:
        self.world = world

    def propose(self, task_type: str, current_skill: str, rejected: Sequence[str],
                epoch: int, step: int) -> str:
        """The candidate `evolve` returns, computed at once (deterministic)."""
        w = self.world
        w._type(task_type)
        key = (w.config.seed, "evolve", task_type, epoch, step, len(rejected))
        if _uniform(*key, "no-change") < w.config.no_change_rate:
            return current_skill
        effect = w.effects.get(task_type) or w.world.classify(_uniform(*key, "effect"),
                                                              task_type)
        size = w.world.size(_uniform(*key, "size"))
        shift = {"helpful": size, "neutral": 0.0, "harmful": -size}[effect]
        ability = w.skill_ability(current_skill) + shift
        rev = f"e{epoch}s{step}r{len(rejected)}"
        marker = f"<!-- sim: ability={ability:+.3f} effect={effect} rev={rev} -->"
        if _MARKER.search(current_skill):
            text = _MARKER.sub(lambda _: marker, current_skill, count=1)
        else:
            head, sep, rest = current_skill.partition("\n")
            text = f"{head}\n\n{marker}\n{sep}{rest}" if sep else f"{marker}\n\n{head}"
        phrases = _PHRASES[effect]
        line = phrases[int(len(phrases) * _uniform(*key, "phrase"))]
        return f"{text.rstrip()}\n- ({rev}) {line}\n"

    async def evolve(self, task_type: str, current_skill: str, rejected: Sequence[str],
                     epoch: int, step: int) -> str:
        """Propose a candidate after a simulated LLM call (30-90 simulated seconds)."""
        text = self.propose(task_type, current_skill, rejected, epoch, step)
        delay = 30.0 + 60.0 * _uniform(self.world.config.seed, "evolve-latency", task_type,
                                       epoch, step, len(rejected))
        await asyncio.sleep(delay * self.world.config.time_scale)
        return text



