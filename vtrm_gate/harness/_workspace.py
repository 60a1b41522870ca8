"""The workspace (SPEC §4): a directory a researcher can open by hand.

```
workspace.json      kind, agent/model config, ladder seed, cooldown / probation knobs
skills/<slug>.md    one current skill per type (+ default-strategy.md)
history/<slug>/vN.md  every skill version ever issued (write-once; rollback source)
pool.json           the frozen unit pool: {type: [unit ids]}
units.jsonl         (kind "llm") the multiple-choice units, one JSON object a line
seed_record.json    seed-baseline correctness {type: {unit: bool}} - ladder ORDERING only
state.json          training state: versions, probation, cooldown, rejected buffer
harness.sqlite      HarnessLog (predictions, traces, gate evidence, BaselineCache, ...)
candidates/eE_sS/<slug>/  materialised candidate skill dirs of a step
manifests/eE_sS.json      what a step ran with (config, skills, cases, ladders, candidates)
```

`Workspace.open` validates every file and writes nothing: a missing or malformed file raises
`WorkspaceError` naming it. ``state.json`` is the training-state checkpoint: only Phase D of
a step (and the epoch-end probation settlement) writes it, atomically (temp + ``os.replace``).
An ``llm`` workspace's agent settings are validated by `vtrm_gate.llm` (the harness knows no
endpoints): at ``init`` and whenever its backend is opened.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .._env import credential_keys, credential_name, user_path
from .._ids import check_ids, content_hash, json_hash, slugify, step_run_id, type_slugs
from ..errors import ConfigError, InputError, WorkspaceError, shown
from ..gate import check_unit_ids
from ..stats import PROBATION_RULES, as_correct
from ._atomic_dir import create_atomically, only_lock_file
from ._files import _rel, _whole, atomic_write, read_json, read_text, write_json
from ._log import HarnessLog
from ._state import FORMAT, SkillRef, TrainingState
from ._units import MediaOptions, MediaRefs, UnitRecord, read_units

log = logging.getLogger("vtrm_gate.harness")

DEFAULT_STRATEGY = "default-strategy.md"
LOG_FILE = "harness.sqlite"
"""The workspace's SQLite log (`HarnessLog`), under its root."""
FILES = ("workspace.json", "pool.json", "seed_record.json", "state.json", LOG_FILE)
UNITS_FILE = "units.jsonl"
KINDS = ("custom", "simulated", "llm")





T = TypeVar("T")


PROBATION_ORDERS = ("shuffle", "seed_wrong_first")
MAX_POLICY_COUNT = 1_000_000
"""The most steps of cooldown, rejected texts kept or probe units: far beyond any run, and
small enough that ``steps_applied + cooldown_steps`` stays an SQLite/JSON-safe integer
(2**63 - 1 made a state.json no command would read again)."""
LEGACY_PROBATION_RULE = "w_net"
"""The rule of a workspace.json without ``probation_rule`` (the default until issue 27)."""


@dataclass(frozen=True)
class WorkspaceConfig:
    """``workspace.json``: how this workspace's steps run (all plain JSON values).

    ``agent`` identifies the agent/model configuration; its hash keys the BaselineCache.
    ``targets`` optionally maps a type to a skill file other than ``skills/<slug>.md``.
    ``workspace_id`` (random, created at ``init``) salts the LLM response cache, so two
    workspaces on one Redis never share samples unless they opt in (``cache.share``).
    """

    kind: str = "custom"
    agent: Mapping[str, Any] = field(default_factory=lambda: {"backend": "custom"})
    seed: int = 0
    cooldown_steps: int = 2
    futile_cooldown: bool = True
    """Whether a FUTILE exit puts its type in cooldown, as a REJECT does (the SPEC's Phase D).
    False: a FUTILE candidate still goes to the rejected buffer, but its type is evolved
    again at the next step, as after INERTIA (the exit a futile ladder would have reached;
    docs/training.md measures what the cooldown costs)."""
    rejected_max: int = 5
    probation_min_w_net: int = 0
    probation_units: int = 40
    probation_rule: str = "e_continue"
    """How the epoch-end settlement decides: e_continue (the default, as ``init``'s: a neutral
    candidate is kept with probability <= 1/e_confirm) | e_harm | w_net (a bet, no bound)."""
    probation_order: str = "shuffle"
    """The probe's order: ``shuffle`` (a seeded shuffle of the fresh units) or
    ``seed_wrong_first`` (the ladder's order: units the seed baseline got wrong first)."""
    targets: Mapping[str, str] = field(default_factory=dict)
    sim: Mapping[str, Any] | None = None
    format: int = FORMAT
    workspace_id: str = ""

    def __post_init__(self) -> None:
        def bad(name: str, allowed: str, value: object) -> None:
            raise ConfigError(f"{name} must be {allowed}, got {shown(value)}")

        if self.format != FORMAT:
            bad("format", f"{FORMAT}", self.format)
        if self.kind not in KINDS:
            bad("kind", "'custom', 'simulated' or 'llm'", self.kind)
        if not isinstance(self.agent, Mapping):
            bad("agent", "an object (agent/model configuration)", self.agent)
        if not _whole(self.seed):
            bad("seed", "an integer", self.seed)
        for name in ("cooldown_steps", "rejected_max", "probation_units"):
            v = getattr(self, name)
            if not _whole(v) or not 0 <= v <= MAX_POLICY_COUNT:
                bad(name, f"an integer from 0 to {MAX_POLICY_COUNT}", v)
        if not isinstance(self.futile_cooldown, bool):
            bad("futile_cooldown", "true or false", self.futile_cooldown)
        if not _whole(self.probation_min_w_net):
            bad("probation_min_w_net", "an integer", self.probation_min_w_net)
        if self.probation_rule not in PROBATION_RULES:
            bad("probation_rule", " | ".join(PROBATION_RULES), self.probation_rule)
        if self.probation_order not in PROBATION_ORDERS:
            bad("probation_order", " | ".join(PROBATION_ORDERS), self.probation_order)
        if not isinstance(self.targets, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) and v.startswith("skills/")
                and ".." not in v for k, v in self.targets.items()):
            bad("targets", "an object mapping type -> 'skills/<file>.md'", self.targets)
        if self.kind == "simulated" and not isinstance(self.sim, Mapping):
            bad("sim", "an object of SimConfig fields for a simulated workspace", self.sim)
        _check_no_secret(self.agent)  # an llm agent's endpoint settings: vtrm_gate.llm
        if not isinstance(self.workspace_id, str) or any(c.isspace() or c == "/"
                                                         for c in self.workspace_id):
            bad("workspace_id", "a string without spaces or slashes", self.workspace_id)

    def as_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def agent_hash(self) -> str:
        """Hash of the agent/model configuration (BaselineCache key component)."""
        return json_hash(dict(self.agent))



def _check_no_secret(agent: Mapping[str, Any]) -> None:
    """No key of the agent config (or of its request ``params``) may name a credential: it
    would be written to workspace.json, every manifest and the BaselineCache key."""
    params = agent.get("params")
    secret = [k for k in agent if credential_name(k)] + [
        f"params.{k}" for k in credential_keys(params if isinstance(params, Mapping) else {})]
    if secret:
        raise ConfigError(f"agent must not hold credentials (found {sorted(secret)}); the API "
                         f"key comes from OPENAI_API_KEY / VTRM_API_KEY at run time")



# ---- the workspace ----------------------------------------------------------------------


def _validate_pool(data: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(data, dict) or not data:
        raise InputError("must be a non-empty object {task type: [unit ids]}")
    pool: dict[str, tuple[str, ...]] = {}
    for t in data:
        if not isinstance(t, str) or not t.strip():
            raise InputError(f"task type names must be non-empty strings, got {shown(t)}")
    type_slugs(data)
    for t, units in data.items():
        if not isinstance(units, list):
            raise InputError(f"type {t!r}: expected a list of unit ids, got "
                             f"{type(units).__name__}")
        pool[t] = check_unit_ids(units, f"type {t!r}: ")
    return pool


def _validate_seed(data: Any, pool: Mapping[str, Sequence[str]]) -> dict[str, dict[str, bool]]:
    if not isinstance(data, dict):
        raise InputError("must be an object {task type: {unit id: true|false}}")
    out: dict[str, dict[str, bool]] = {}
    for t, rec in data.items():
        if t not in pool:
            raise InputError(f"type {t!r} is not in pool.json")
        if not isinstance(rec, dict):
            raise InputError(f"type {t!r}: expected an object {{unit id: bool}}")
        units = set(pool[t])
        for u, v in rec.items():
            if u not in units:
                raise InputError(f"type {t!r}: unit {u!r} is not in the type's pool")
            if not isinstance(v, bool):
                raise InputError(f"type {t!r}, unit {u!r}: expected true or false, got {shown(v)}")
        out[t] = dict(rec)
    return out


def _check_create_args(pool: object, skills: object, seed_record: object,
                       default_strategy: object, config: object, files: object) -> None:
    """`Workspace.create`'s arguments of the right kinds, before anything is read from them:
    a lone string is no list of units (``list("unit-7")`` is six), a set has no order, and
    a skill of a type the pool lacks would be dropped."""
    def kind(v: object) -> str:
        return type(v).__name__

    def bad(what: str) -> WorkspaceError:
        return WorkspaceError(f"create: {what}")

    if not isinstance(pool, Mapping):
        raise bad(f"pool must be a mapping {{task type: [unit ids]}}, got {kind(pool)}")
    for t, us in pool.items():
        if isinstance(us, str | bytes | Set | Mapping) or not isinstance(us, Iterable):
            why = " (it has no order: pass sorted(...))" if isinstance(us, Set) else ""
            shown_us = f" ({shown(us, 40)})" if isinstance(us, str | bytes) else why
            raise bad(f"pool[{t!r}] must be a list of unit ids, got a {kind(us)}{shown_us}")
    if not isinstance(skills, Mapping):
        raise bad(f"skills must be a mapping {{task type: skill text}}, got {kind(skills)}")
    extra = sorted(str(t) for t in skills if t not in pool)
    if extra:
        raise bad(f"skills for types not in the pool: {extra}")
    for t, text in skills.items():
        if not isinstance(text, str):
            raise bad(f"skill text of {t!r} must be text, got {kind(text)}")
        if not text.strip():
            raise bad(f"skill text of {t!r} is empty")
    if seed_record is not None and not isinstance(seed_record, Mapping):
        raise bad(f"seed_record must be a mapping {{task type: {{unit id: True/False}}}}, got "
                  f"{kind(seed_record)}")
    for t, rec in (seed_record or {}).items():
        if not isinstance(rec, Mapping):
            raise bad(f"seed_record[{t!r}] must be a mapping {{unit id: True/False}}, got "
                      f"{kind(rec)}")
    if not isinstance(default_strategy, str):
        raise bad(f"default_strategy must be text, got {kind(default_strategy)}")
    if not default_strategy.strip():
        raise bad("default strategy text is empty")
    if not isinstance(config, WorkspaceConfig):
        raise bad(f"config must be a WorkspaceConfig, got {kind(config)}")
    if files is not None and not isinstance(files, Mapping):
        raise bad(f"files must be a mapping {{relative path: text}}, got {kind(files)}")
    for rel, text in (files or {}).items():
        if (not isinstance(rel, str) or not rel.strip() or Path(rel).is_absolute()
                or ".." in Path(rel).parts or rel in FILES or rel.endswith("/")):
            raise bad(f"extra file {rel!r} must be a new relative path inside the workspace")
        if not isinstance(text, str):
            raise bad(f"extra file {rel!r} must be text, got {kind(text)}")


class Workspace:
    """An opened, validated workspace: `open` or `create` (`vtrm_gate.backends` makes
    simulated and LLM workspaces).

    The HarnessLog is opened lazily (``ws.log``) so that opening writes nothing.
    """

    def __init__(self, root: Path, config: WorkspaceConfig, pool: dict[str, tuple[str, ...]],
                 seed_record: dict[str, dict[str, bool]], state: TrainingState,
                 stale_skills: tuple[str, ...] = (),
                 units: Mapping[str, UnitRecord] | None = None):
        self.root = root
        self.config = config
        self.pool = pool
        self.seed_record = seed_record
        self.state = state
        self.stale_skills = stale_skills
        """Types whose skills/ file shows a recorded but not the current version (a Phase D
        interrupted between the state checkpoint and the skill files); `sync_skills` fixes."""
        self.units: Mapping[str, UnitRecord] = dict(units or {})
        """An ``llm`` workspace's units (``units.jsonl``) by unit id; empty otherwise."""
        self._log: HarnessLog | None = None
        self.readonly = False
        """Set by ``open(readonly=True)``: the log is opened read-only (a reader's view)."""
        self._media: MediaRefs | None = None
        self._root_id = _identity(root)

    def check_root(self) -> None:
        """Refuse to write once the directory at ``root`` is not the one opened (moved or
        replaced): a step went on writing at the old path, into a new workspace made there."""
        if _identity(self.root) != self._root_id:
            raise WorkspaceError(f"{self.root}: the workspace directory was moved or replaced "
                                 f"while this process used it; nothing more is written at "
                                 f"that path (run the step again where the workspace is now)")

    @property
    def workspace_id(self) -> str:
        """This workspace's identity (the response-cache salt's namespace): workspace.json's
        ``workspace_id``; a workspace created before ids existed gets one derived from its
        absolute path (stable, nothing written; moving it starts a fresh cache namespace)."""
        if self.config.workspace_id:
            return self.config.workspace_id
        path = str(self.root.resolve())
        return "path-" + hashlib.sha256(path.encode()).hexdigest()[:24]

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r}, types={len(self.pool)})"

    # ---- layout ----

    @property
    def task_types(self) -> tuple[str, ...]:
        return tuple(sorted(self.pool))

    @property
    def log_path(self) -> Path:
        return self.root / LOG_FILE

    @property
    def state_path(self) -> Path:
        return self.root / "state.json"

    def target(self, task_type: str) -> str:
        """The type's skill file, relative to the root (``skills/<slug>.md`` by default)."""
        return self.config.targets.get(task_type) or f"skills/{slugify(task_type)}.md"

    def skill_path(self, task_type: str) -> Path:
        return self.root / self.target(task_type)

    def history_path(self, task_type: str, version: int) -> Path:
        return self.root / "history" / slugify(task_type) / f"v{version}.md"

    def candidates_dir(self, epoch: int, step: int) -> Path:
        return self.root / "candidates" / step_run_id(epoch, step)

    def manifest_path(self, epoch: int, step: int) -> Path:
        check_ids(epoch, step)
        return self.root / "manifests" / f"{step_run_id(epoch, step)}.json"

    @property
    def log(self) -> HarnessLog:
        """The workspace's HarnessLog (opened on first use)."""
        if self._log is None:
            self._log = HarnessLog(self.log_path, readonly=self.readonly)
        return self._log

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _refs(self) -> MediaRefs:
        if self._media is None:
            self._media = MediaRefs(MediaOptions.from_agent(self.config.agent, self.root))
        return self._media

    def unit_key(self, task_type: str, unit_id: str) -> str:
        """Hash of a unit's content (question, options, answer, every media reference: path
        + content hash, or URL) for the BaselineCache key; "" where units have no content.
        `MediaError` when a frame cannot be read (deleted since the ladder was built)."""
        rec = self.units.get(unit_id)
        if rec is None:
            return ""
        return json_hash({**dataclasses.asdict(rec), "media": self._refs().refs(rec.media)})

    def media_fault(self, unit_id: str) -> str | None:
        """Why a unit's frames cannot be sent (its first bad frame, named), or None: outside
        the units directory, missing, over a cap, not an image (`check_frame`)."""
        rec = self.units.get(unit_id)
        if rec is None or rec.media is None:
            return None
        return self._refs().fault(rec.media)

    def sendable(self, units: Iterable[str], n: int) -> tuple[list[str], dict[str, str]]:
        """The first ``n`` of ``units`` (in order) whose frames can be sent, and the fault of
        every unit passed over on the way (checked lazily: only as far as needed)."""
        kept: list[str] = []
        faults: dict[str, str] = {}
        for u in units:
            if len(kept) >= n:
                break
            why = self.media_fault(u)
            if why is None:
                kept.append(u)
            else:
                faults[u] = why
        return kept, faults

    # ---- skills ----

    def version_text(self, task_type: str, version: int) -> str:
        """The text of a recorded skill version (history/<slug>/vN.md)."""
        return read_text(self.history_path(task_type, version), self.root)

    def skill_text(self, task_type: str, state: TrainingState | None = None) -> str:
        """The current skill text of a type under ``state`` (default: the workspace's)."""
        state = state or self.state
        return self.version_text(task_type, state.skills[task_type].version)

    def default_strategy(self) -> str:
        return read_text(self.root / "skills" / DEFAULT_STRATEGY, self.root)

    def sync_skills(self, state: TrainingState | None = None) -> list[str]:
        """Rewrite each type's skills/ file from ``state`` where it differs; returns types.
        A file that holds no recorded version (edited by hand while a step ran: the check
        at open cannot see it) is kept beside it first, with a warning, never lost."""
        state = state or self.state
        changed = []
        for t in self.task_types:
            text = self.skill_text(t, state)
            p = self.skill_path(t)
            old = p.read_text(encoding="utf-8") if p.is_file() else None
            if old == text:
                continue
            if old is not None and not self._recorded(t, old, state):
                kept = p.with_name(f"{p.stem}.hand-edit-{time.strftime('%Y%m%dT%H%M%S')}.md")
                atomic_write(kept, old)
                log.warning("%s was edited by hand while a step ran; the edit is kept in %s "
                            "(skills/ follows state.json)", _rel(self.root, p),
                            _rel(self.root, kept))
            atomic_write(p, text)
            changed.append(t)
        self.stale_skills = ()
        return changed

    def _recorded(self, task_type: str, text: str, state: TrainingState) -> bool:
        """Whether ``text`` is one of the type's recorded versions (history/)."""
        return any(self.history_path(task_type, v).is_file()
                   and self.history_path(task_type, v).read_text(encoding="utf-8") == text
                   for v in range(1, state.skills[task_type].latest + 1))

    def save_state(self, state: TrainingState) -> None:
        """Checkpoint training state (atomic), then bring skills/ in line with it."""
        self.check_root()
        write_json(self.state_path, state.to_json())
        self.state = state
        self.sync_skills(state)

    def reload_state(self) -> None:
        """Re-read ``state.json`` (and which skill files are stale) from disk: a writer calls
        it once it holds the workspace lock, so it never starts from a replaced state."""
        fresh = type(self).open(self.root)
        fresh.close()
        self.state, self.stale_skills = fresh.state, fresh.stale_skills

    # ---- opening and creating ----

    @classmethod
    def open(cls, path: str | Path, *, readonly: bool = False) -> Workspace:
        """Open and validate a workspace; nothing is written (even on success).

        ``readonly``: its HarnessLog is opened read-only, so readers work on a read-only
        workspace (a mount, a copy without write permission)."""
        root = user_path(path)
        _check_layout(root)
        config = _read_config(root)
        pool = _parsed(root, "pool.json", _validate_pool)
        seed = _parsed(root, "seed_record.json", lambda d: _validate_seed(d, pool))
        state = _parsed(root, "state.json", TrainingState.from_json)
        _check_consistency(config, pool, state)
        units = _check_units(root, pool) if config.kind == "llm" else None
        ws = cls(root, config, pool, seed, state, units=units)
        read_text(root / "skills" / DEFAULT_STRATEGY, root)
        ws.stale_skills = tuple(t for t in ws.task_types if _skill_is_stale(ws, t))
        ws.readonly = readonly
        return ws

    @classmethod
    def create(cls, path: str | Path, *, pool: Mapping[str, Sequence[str]],
               skills: Mapping[str, str], seed_record: Mapping[str, Mapping[str, bool]]
               | None = None, default_strategy: str = "# Default strategy\n\nAnswer with one "
               "letter.\n", config: WorkspaceConfig | None = None,
               files: Mapping[str, str] | None = None) -> Workspace:
        """Create a new workspace at ``path`` (must not exist or be empty); returns it opened.

        ``files`` adds files (path relative to the root -> text), e.g. ``units.jsonl``.
        Everything is validated before the first file is written, and the files are built in
        a temporary sibling renamed into place: the workspace appears whole or not at all.
        """
        root = user_path(path)
        if root.exists() and (not root.is_dir() or not only_lock_file(root)):
            raise WorkspaceError(f"{root}: exists and is not an empty directory; refusing to "
                                 f"overwrite")
        config = config or WorkspaceConfig()
        _check_create_args(pool, skills, seed_record, default_strategy, config, files)
        if not config.workspace_id:  # a new workspace is a new identity
            config = dataclasses.replace(config, workspace_id=uuid.uuid4().hex)
        pool_j = {t: list(us) for t, us in pool.items()}
        try:
            valid_pool = _validate_pool(pool_j)
            seed_j = {t: {u: as_correct(v, f"seed_record[{t!r}][{u!r}]") for u, v in rec.items()}
                      for t, rec in (seed_record or {}).items()}
            _validate_seed(seed_j, valid_pool)
        except ValueError as exc:
            raise WorkspaceError(f"create: {exc}") from None
        missing = sorted(set(valid_pool) - set(skills))
        if missing:
            raise WorkspaceError(f"create: no skill text for types {missing}")

        def build(tmp: Path) -> None:
            for rel, text in (files or {}).items():
                atomic_write(tmp / rel, text)
            for d in ("skills", "history", "candidates", "manifests"):
                (tmp / d).mkdir(exist_ok=True)
            write_json(tmp / "workspace.json", config.as_json())
            write_json(tmp / "pool.json", pool_j)
            write_json(tmp / "seed_record.json", seed_j)
            atomic_write(tmp / "skills" / DEFAULT_STRATEGY, default_strategy)
            refs = {}
            for t in valid_pool:
                text = skills[t]
                ws_tmp = cls(tmp, config, valid_pool, seed_j, TrainingState({}))
                atomic_write(ws_tmp.history_path(t, 1), text)
                atomic_write(ws_tmp.skill_path(t), text)
                refs[t] = SkillRef(1, content_hash(text), 1)
            HarnessLog(tmp / LOG_FILE).close()
            write_json(tmp / "state.json", TrainingState(refs).to_json())

        create_atomically(root, build)  # whole or not at all
        return cls.open(root)



def media_note(faults: Mapping[str, str]) -> str:
    """The report note of units left out because their frames cannot be sent."""
    return (f"left out {len(faults)} unit(s) whose frames cannot be sent: "
            + "; ".join(f"{u!r}: {why}" for u, why in faults.items()))


def _check_units(root: Path, pool: Mapping[str, Sequence[str]]) -> dict[str, UnitRecord]:
    """An llm workspace's units.jsonl, validated, and every pool unit found in it."""
    units = read_units(root / UNITS_FILE, root)
    for t, us in pool.items():
        for u in us:
            rec = units.get(u)
            if rec is None or rec.task_type != t:
                where = "is not in" if rec is None else f"has task_type {rec.task_type!r} in"
                raise WorkspaceError(f"pool.json: unit {u!r} of type {t!r} {where} "
                                     f"{UNITS_FILE}")
    return units


def _check_layout(root: Path) -> None:
    """The directory holds every workspace file, and an SQLite log."""
    if not root.exists():
        raise WorkspaceError(f"{root}: no such workspace directory")
    if not root.is_dir():
        raise WorkspaceError(f"{root}: not a directory")
    for name in FILES:
        if not (root / name).is_file():
            raise WorkspaceError(f"{name}: missing in workspace {root} (is this a "
                                 f"vtrm_gate workspace? create one with init)")
    with open(root / LOG_FILE, "rb") as f:
        if f.read(16) != b"SQLite format 3\x00":
            raise WorkspaceError(f"{LOG_FILE}: not an SQLite database")


def _read_config(root: Path) -> WorkspaceConfig:
    raw = read_json(root / "workspace.json", root)
    if not isinstance(raw, dict):
        raise WorkspaceError("workspace.json: must be an object")
    known = {f.name for f in dataclasses.fields(WorkspaceConfig)}
    unknown = set(raw) - known
    if unknown:
        raise WorkspaceError(f"workspace.json: unknown keys {sorted(unknown)}; valid keys: "
                             f"{sorted(known)}")
    # A file written before the default became e_continue keeps the rule it ran with.
    raw.setdefault("probation_rule", LEGACY_PROBATION_RULE)
    try:
        return WorkspaceConfig(**raw)
    except ValueError as exc:
        raise WorkspaceError(f"workspace.json: {exc}") from None


def _parsed(root: Path, name: str, parse: Callable[[Any], T]) -> T:
    """``parse`` of a JSON file; its ValueError becomes a `WorkspaceError` naming the file."""
    try:
        return parse(read_json(root / name, root))
    except WorkspaceError:
        raise
    except ValueError as exc:
        raise WorkspaceError(f"{name}: {exc}") from None


def _check_consistency(config: WorkspaceConfig, pool: Mapping[str, Sequence[str]],
                       state: TrainingState) -> None:
    try:
        state.check_types(pool)
    except ValueError as exc:
        raise WorkspaceError(f"state.json: {exc}") from None
    for t in config.targets:
        if t not in pool:
            raise WorkspaceError(f"workspace.json: targets names type {t!r}, which is not "
                                 f"in pool.json")


def _identity(root: Path) -> tuple[int, int] | None:
    """The directory's (device, inode), None when nothing is there."""
    try:
        st = os.stat(root)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _skill_is_stale(ws: Workspace, task_type: str) -> bool:
    """True when the type's skills/ file shows a recorded version other than the current
    one (an interrupted checkpoint); `WorkspaceError` when it shows none or the current
    version's history file does not match its hash."""
    root, ref = ws.root, ws.state.skills[task_type]
    text = read_text(ws.skill_path(task_type), root)
    recorded = ws.version_text(task_type, ref.version)
    if content_hash(recorded) != ref.hash:
        raise WorkspaceError(f"{_rel(root, ws.history_path(task_type, ref.version))}: content "
                             f"does not match state.json's hash for {task_type!r} "
                             f"v{ref.version}")
    if content_hash(text) == ref.hash:
        return False
    if not ws._recorded(task_type, text, ws.state):
        raise WorkspaceError(
            f"{ws.target(task_type)}: content matches neither state.json's version "
            f"v{ref.version} of {task_type!r} nor any recorded version (edited by hand?); "
            f"restore it from history/{slugify(task_type)}/v{ref.version}.md")
    return True
