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
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from .._env import mask_url
from ..endpoints import EndpointsError, check_endpoints_setting, read_endpoints_file
from ..ladder import check_unit_ids
from ..media import Media as Media
from ..media import MediaOptions, MediaResolver, missing_media, parse_media
from ..scheduler import content_hash, slugify
from .probation import PROBATION_RULES

if TYPE_CHECKING:
    from .log import HarnessLog

FORMAT = 1
DEFAULT_STRATEGY = "default-strategy.md"
FILES = ("workspace.json", "pool.json", "seed_record.json", "state.json", "harness.sqlite")
UNITS_FILE = "units.jsonl"
KINDS = ("custom", "simulated", "llm")
# Agent keys that would put a credential into workspace.json (and into the BaselineCache key).
_SECRET_KEYS = ("api_key", "apikey", "authorization", "password", "secret", "bearer")


class WorkspaceError(ValueError):
    """A workspace file is missing or malformed; the message names the file and the fault."""


# ---- small file helpers ---------------------------------------------------------------


def canonical_json(value: Any) -> str:
    """Deterministic JSON (sorted keys, no spaces) for hashing."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def json_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` all-or-nothing: temp file in the same dir, fsync, replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_TEMP_NAME = re.compile(r"^\..+\.tmp-(\d+)$")


def clean_temp_files(root: Path) -> list[Path]:
    """Remove ``.<name>.tmp-PID`` files `atomic_write` left behind (a writer killed mid-write).

    Called by a writer that holds the workspace lock, so no other writer is mid-write; files
    of this process are kept. Returns the files removed.
    """
    removed = []
    for p in root.rglob(".*.tmp-*"):
        m = _TEMP_NAME.match(p.name)
        if m and int(m.group(1)) != os.getpid() and p.is_file() and not p.is_symlink():
            try:
                p.unlink()
            except FileNotFoundError:
                continue
            removed.append(p)
    return removed


def write_json(path: Path, value: Any) -> None:
    atomic_write(path, json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def _rel(root: Path, path: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def read_json(path: Path, root: Path | None = None) -> Any:
    """Parse a JSON file, or raise WorkspaceError naming it."""
    name = _rel(root, path) if root else str(path)
    if not path.is_file():
        raise WorkspaceError(f"{name}: missing (expected a file at {path})")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise WorkspaceError(f"{name}: not UTF-8 text ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise WorkspaceError(f"{name}: malformed JSON at line {exc.lineno} column "
                             f"{exc.colno}: {exc.msg}") from None


def read_text(path: Path, root: Path | None = None) -> str:
    """A skill file's text, or WorkspaceError naming it (missing, not UTF-8, empty)."""
    name = _rel(root, path) if root else str(path)
    if not path.is_file():
        raise WorkspaceError(f"{name}: missing skill file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise WorkspaceError(f"{name}: not UTF-8 text ({exc.reason})") from None
    if not text.strip():
        raise WorkspaceError(f"{name}: empty skill file")
    return text


def _whole(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def step_run_id(epoch: int, step: int) -> str:
    """The step's run-id stem: arm run ids are ``{step_run_id}_gate_{slug}_{arm}``."""
    return f"e{epoch}_s{step}"


# ---- configuration and training state -------------------------------------------------


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
    rejected_max: int = 5
    probation_min_w_net: int = 0
    probation_units: int = 40
    probation_rule: str = "w_net"
    """How the epoch-end settlement decides: w_net | e_continue | e_harm (see harness.probation)."""
    targets: Mapping[str, str] = field(default_factory=dict)
    sim: Mapping[str, Any] | None = None
    format: int = FORMAT
    workspace_id: str = ""

    def __post_init__(self) -> None:
        def bad(name: str, allowed: str, value: object) -> None:
            raise ValueError(f"{name} must be {allowed}, got {value!r}")

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
            if not _whole(v) or v < 0:
                bad(name, "an integer >= 0", v)
        if not _whole(self.probation_min_w_net):
            bad("probation_min_w_net", "an integer", self.probation_min_w_net)
        if self.probation_rule not in PROBATION_RULES:
            bad("probation_rule", " | ".join(PROBATION_RULES), self.probation_rule)
        if not isinstance(self.targets, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) and v.startswith("skills/")
                and ".." not in v for k, v in self.targets.items()):
            bad("targets", "an object mapping type -> 'skills/<file>.md'", self.targets)
        if self.kind == "simulated" and not isinstance(self.sim, Mapping):
            bad("sim", "an object of SimConfig fields for a simulated workspace", self.sim)
        if self.kind == "llm":
            _check_llm_agent(self.agent)
        if not isinstance(self.workspace_id, str) or any(c.isspace() or c == "/"
                                                         for c in self.workspace_id):
            bad("workspace_id", "a string without spaces or slashes", self.workspace_id)

    def as_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def agent_hash(self) -> str:
        """Hash of the agent/model configuration (BaselineCache key component)."""
        return json_hash(dict(self.agent))


def _refuse_url_credentials(url: str) -> None:
    """No password, token or key inside the endpoint URL: it would be written to
    workspace.json and every manifest (the message does not repeat it)."""
    parts = urlsplit(url)
    names = [k for k, _ in parse_qsl(parts.query, keep_blank_values=True)]
    bad = [k for k in names if k.lower().replace("-", "_") in ("key", "token", "access_token")
           or any(s in k.lower().replace("-", "_") for s in _SECRET_KEYS)]
    if "@" in parts.netloc or bad:
        what = "user info (user:password@)" if "@" in parts.netloc else \
            f"the query parameter(s) {', '.join(bad)}"
        raise ValueError(f"agent.base_url must not hold a credential (found {what}); the API "
                         f"key comes from OPENAI_API_KEY / VTRM_API_KEY at run time")


def _check_llm_agent(agent: Mapping[str, Any]) -> None:
    """An ``llm`` workspace's agent: an OpenAI-compatible endpoint, a model, sampling
    params; never a credential (the key comes from the environment at run time)."""
    backend = agent.get("backend")
    factory = isinstance(backend, str) and backend.count(":") == 1 and "//" not in backend
    if backend != "openai" and not factory:
        raise ValueError(f"agent.backend must be 'openai' or a factory "
                         f"'package.module:function' for an llm workspace, got {backend!r}")
    _check_no_secret(agent)
    if agent.get("media") is not None:
        m = agent["media"]
        if not isinstance(m, Mapping) or not set(m) <= {"max_frames", "max_side", "detail"}:
            raise ValueError(f"agent.media must be an object of max_frames, max_side, detail; "
                             f"got {m!r}")
        MediaOptions(**m)
    if factory:  # your own agent (vtrm_gate.plugin): it needs no endpoint or model here
        return
    url = agent.get("base_url")
    if isinstance(url, list) or "endpoints_file" in agent:  # several endpoints
        check_endpoints_setting(agent)
    elif not isinstance(url, str) or not url.startswith(("http://", "https://")):
        shown = mask_url(url) if isinstance(url, str) else repr(url)
        raise ValueError(f"agent.base_url must be an http(s):// URL, got {shown}")
    for u in url if isinstance(url, list) else [url]:
        if isinstance(u, str):
            _refuse_url_credentials(u)
    model = agent.get("model")
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"agent.model must be a non-empty string, got {model!r}")


def _check_no_secret(agent: Mapping[str, Any]) -> None:
    secret = [k for k in agent if any(s in str(k).lower().replace("-", "_")
                                      for s in _SECRET_KEYS)]
    if secret:
        raise ValueError(f"agent must not hold credentials (found {sorted(secret)}); the API "
                         f"key comes from OPENAI_API_KEY / VTRM_API_KEY at run time")


@dataclass(frozen=True)
class UnitRecord:
    """One multiple-choice unit of an ``llm`` workspace (a line of ``units.jsonl``)."""

    unit_id: str
    task_type: str
    question: str
    options: tuple[str, ...]
    answer: str
    media: Media | None = None
    """Frames and/or a video shown with the question (`vtrm_gate.media`)."""


_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _unit_record(obj: Any) -> UnitRecord:
    """Validate one parsed line; ValueError says what is wrong (extra keys are ignored)."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in ("unit_id", "task_type", "question", "options", "answer")
               if k not in obj]
    if missing:
        raise ValueError(f"missing keys {missing}")
    for k in ("unit_id", "task_type", "question"):
        if not isinstance(obj[k], str) or not obj[k].strip():
            raise ValueError(f"{k} must be a non-empty string, got {obj[k]!r}")
    slugify(obj["task_type"])
    opts = obj["options"]
    if not isinstance(opts, list) or not 2 <= len(opts) <= len(_LETTERS) \
            or not all(isinstance(o, str) and o.strip() for o in opts):
        raise ValueError(f"options must be a list of 2 to 26 non-empty strings, got {opts!r}")
    ans = obj["answer"]
    valid = _LETTERS[:len(opts)]
    if not isinstance(ans, str) or ans.strip().upper() not in valid or len(ans.strip()) != 1:
        raise ValueError(f"answer must be one letter of {valid!r}, got {ans!r}")
    return UnitRecord(obj["unit_id"], obj["task_type"], obj["question"], tuple(opts),
                      ans.strip().upper(), parse_media(obj.get("media")))


def _check_text(obj: Any) -> None:
    """ValueError if a parsed JSON value holds text that is not valid Unicode (a lone
    surrogate such as ``"\\ud800"``): it cannot be encoded into a prompt or a cache key."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start:exc.end].encode("unicode_escape").decode()
        raise ValueError(f"invalid text: a lone surrogate {bad} (not a Unicode character)"
                         ) from None


def read_units(path: Path, root: Path | None = None) -> dict[str, UnitRecord]:
    """Parse and validate a units file (JSON lines; blank lines skipped), in file order.

    Raises WorkspaceError naming the file and the line of the first fault (malformed JSON,
    invalid text such as a lone surrogate, missing key, bad options or answer, duplicate unit id).
    """
    name = _rel(root, path) if root else str(path)
    if not path.is_file():
        raise WorkspaceError(f"{name}: missing (expected a units file at {path})")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise WorkspaceError(f"{name}: not UTF-8 text ({exc.reason})") from None
    units: dict[str, UnitRecord] = {}
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            _check_text(obj)
            rec = _unit_record(obj)
        except json.JSONDecodeError as exc:
            raise WorkspaceError(f"{name}: line {i}: malformed JSON at column {exc.colno}: "
                                 f"{exc.msg}") from None
        except ValueError as exc:
            raise WorkspaceError(f"{name}: line {i}: {exc}") from None
        if rec.unit_id in units:
            raise WorkspaceError(f"{name}: line {i}: duplicate unit_id {rec.unit_id!r}")
        units[rec.unit_id] = rec
    if not units:
        raise WorkspaceError(f"{name}: no units (expected one JSON object a line)")
    return units


def units_pool(units: Mapping[str, UnitRecord]) -> dict[str, list[str]]:
    """The unit pool of a units file: ``{task type: [unit ids in file order]}``."""
    pool: dict[str, list[str]] = {}
    for u in units.values():
        pool.setdefault(u.task_type, []).append(u.unit_id)
    return pool


def default_llm_skill(task_type: str) -> str:
    """A short starting skill for a type with no skill file of its own."""
    return (f"# {task_type}\n\n"
            f"You answer multiple-choice questions of type \"{task_type}\" about a video.\n\n"
            f"## Strategy\n"
            f"- Read the question and every option before deciding.\n"
            f"- Eliminate options that contradict what the question describes.\n"
            f"- Choose the single best-supported option.\n")


@dataclass(frozen=True)
class SkillRef:
    """A type's current skill version, its content hash, and the highest version issued."""

    version: int
    hash: str
    latest: int


@dataclass(frozen=True)
class Probation:
    """A PROVISIONAL version on probation; ``prev_version`` is what a rollback restores."""

    version: int
    prev_version: int
    epoch: int
    step: int


@dataclass(frozen=True)
class Rejected:
    """A rejected candidate in the evolver's rejected buffer."""

    hash: str
    text: str
    epoch: int
    step: int
    action: str


@dataclass(frozen=True)
class TrainingState:
    """``state.json``: everything a step's Phase D changes, checkpointed once per step.

    ``steps_applied`` counts applied steps (the cooldown clock: a type is cooling down while
    ``cooldown_until[t] > steps_applied``). ``before_last`` is the state before the last
    applied step, so that step can be re-run (idempotently) until the epoch is settled.
    """

    skills: Mapping[str, SkillRef]
    probation: Mapping[str, Probation] = field(default_factory=dict)
    cooldown_until: Mapping[str, int] = field(default_factory=dict)
    rejected: Mapping[str, tuple[Rejected, ...]] = field(default_factory=dict)
    steps_applied: int = 0
    last_step: tuple[int, int] | None = None
    before_last: TrainingState | None = None
    settled_epochs: tuple[int, ...] = ()

    def in_cooldown(self, task_type: str) -> bool:
        return self.cooldown_until.get(task_type, 0) > self.steps_applied

    def rejected_texts(self, task_type: str) -> list[str]:
        return [r.text for r in self.rejected.get(task_type, ())]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "skills": {t: dataclasses.asdict(s) for t, s in sorted(self.skills.items())},
            "probation": {t: dataclasses.asdict(p) for t, p in sorted(self.probation.items())},
            "cooldown_until": dict(sorted(self.cooldown_until.items())),
            "rejected": {t: [dataclasses.asdict(r) for r in rs]
                         for t, rs in sorted(self.rejected.items())},
            "steps_applied": self.steps_applied,
            "last_step": None if self.last_step is None else list(self.last_step),
            "before_last": None if self.before_last is None else self.before_last.to_json(),
            "settled_epochs": list(self.settled_epochs),
        }

    @classmethod
    def from_json(cls, data: Any, where: str = "state") -> TrainingState:
        """Parse and validate; ValueError names the offending key path."""
        def need(cond: bool, key: str, what: str, value: object) -> None:
            if not cond:
                raise ValueError(f"{where}.{key} must be {what}, got {value!r}")

        need(isinstance(data, dict), "", "an object", type(data).__name__)
        need(data.get("format") == FORMAT, "format", str(FORMAT), data.get("format"))
        skills: dict[str, SkillRef] = {}
        raw = data.get("skills")
        need(isinstance(raw, dict), "skills", "an object {type: {version, hash, latest}}", raw)
        for t, s in raw.items():
            need(isinstance(s, dict) and _whole(s.get("version")) and s["version"] >= 1
                 and _whole(s.get("latest")) and s["latest"] >= s["version"]
                 and isinstance(s.get("hash"), str) and len(s["hash"]) == 64,
                 f"skills[{t!r}]", "{version >= 1, latest >= version, hash: sha256}", s)
            skills[t] = SkillRef(s["version"], s["hash"], s["latest"])
        probation: dict[str, Probation] = {}
        for t, p in (data.get("probation") or {}).items():
            try:
                probation[t] = Probation(**p)
            except TypeError:
                need(False, f"probation[{t!r}]", "{version, prev_version, epoch, step}", p)
            need(all(_whole(getattr(probation[t], k)) for k in
                     ("version", "prev_version", "epoch", "step")),
                 f"probation[{t!r}]", "integers", p)
        cooldown = data.get("cooldown_until") or {}
        need(isinstance(cooldown, dict) and all(_whole(v) for v in cooldown.values()),
             "cooldown_until", "an object {type: integer}", cooldown)
        rejected: dict[str, tuple[Rejected, ...]] = {}
        for t, rs in (data.get("rejected") or {}).items():
            need(isinstance(rs, list), f"rejected[{t!r}]", "a list", rs)
            try:
                rejected[t] = tuple(Rejected(**r) for r in rs)
            except TypeError:
                need(False, f"rejected[{t!r}]", "a list of {hash, text, epoch, step, action}",
                     rs)
        steps_applied = data.get("steps_applied", 0)
        need(_whole(steps_applied) and steps_applied >= 0, "steps_applied", "an integer >= 0",
             steps_applied)
        last = data.get("last_step")
        need(last is None or (isinstance(last, list) and len(last) == 2
                              and all(_whole(x) for x in last)),
             "last_step", "null or [epoch, step]", last)
        before = data.get("before_last")
        settled = data.get("settled_epochs") or []
        need(isinstance(settled, list) and all(_whole(x) for x in settled), "settled_epochs",
             "a list of integers", settled)
        return cls(skills, probation, dict(cooldown), rejected, steps_applied,
                   None if last is None else (last[0], last[1]),
                   None if before is None else cls.from_json(before, f"{where}.before_last"),
                   tuple(settled))


# ---- the workspace ----------------------------------------------------------------------


def _validate_pool(data: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(data, dict) or not data:
        raise ValueError("must be a non-empty object {task type: [unit ids]}")
    pool: dict[str, tuple[str, ...]] = {}
    slugs: dict[str, str] = {}
    for t, units in data.items():
        if not isinstance(t, str) or not t.strip():
            raise ValueError(f"task type names must be non-empty strings, got {t!r}")
        try:
            slug = slugify(t)
        except ValueError as exc:
            raise ValueError(str(exc)) from None
        if slug in slugs:  # they would share run ids, cache salts and a skill file
            raise ValueError(f"types {slugs[slug]!r} and {t!r} differ only in case or "
                             f"punctuation (both {slug!r}); rename one")
        slugs[slug] = t
        if not isinstance(units, list):
            raise ValueError(f"type {t!r}: expected a list of unit ids, got "
                             f"{type(units).__name__}")
        pool[t] = check_unit_ids(units, f"type {t!r}: ")
    return pool


def _validate_seed(data: Any, pool: Mapping[str, Sequence[str]]) -> dict[str, dict[str, bool]]:
    if not isinstance(data, dict):
        raise ValueError("must be an object {task type: {unit id: true|false}}")
    out: dict[str, dict[str, bool]] = {}
    for t, rec in data.items():
        if t not in pool:
            raise ValueError(f"type {t!r} is not in pool.json")
        if not isinstance(rec, dict):
            raise ValueError(f"type {t!r}: expected an object {{unit id: bool}}")
        units = set(pool[t])
        for u, v in rec.items():
            if u not in units:
                raise ValueError(f"type {t!r}: unit {u!r} is not in the type's pool")
            if not isinstance(v, bool):
                raise ValueError(f"type {t!r}, unit {u!r}: expected true or false, got {v!r}")
        out[t] = dict(rec)
    return out


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
        self._media: MediaResolver | None = None

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
        return self.root / "harness.sqlite"

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
        return self.root / "manifests" / f"{step_run_id(epoch, step)}.json"

    @property
    def log(self) -> HarnessLog:
        """The workspace's HarnessLog (opened on first use)."""
        if self._log is None:
            from .log import HarnessLog

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

    def unit_key(self, task_type: str, unit_id: str) -> str:
        """Hash of a unit's content (question, options, answer, every media reference: path
        + content hash, or URL) for the BaselineCache key; "" where units have no content."""
        rec = self.units.get(unit_id)
        if rec is None:
            return ""
        if self._media is None:
            self._media = MediaResolver(MediaOptions.from_agent(self.config.agent, self.root))
        return json_hash({**dataclasses.asdict(rec), "media": self._media.refs(rec.media)})

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
        """Rewrite each type's skills/ file from ``state`` where it differs; returns types."""
        state = state or self.state
        changed = []
        for t in self.task_types:
            text = self.skill_text(t, state)
            p = self.skill_path(t)
            if not p.is_file() or p.read_text(encoding="utf-8") != text:
                atomic_write(p, text)
                changed.append(t)
        self.stale_skills = ()
        return changed

    def save_state(self, state: TrainingState) -> None:
        """Checkpoint training state (atomic), then bring skills/ in line with it."""
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
        root = Path(path)
        if not root.exists():
            raise WorkspaceError(f"{root}: no such workspace directory")
        if not root.is_dir():
            raise WorkspaceError(f"{root}: not a directory")
        for name in FILES:
            if not (root / name).is_file():
                raise WorkspaceError(f"{name}: missing in workspace {root} (is this a "
                                     f"vtrm_gate workspace? create one with init)")
        with open(root / "harness.sqlite", "rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                raise WorkspaceError("harness.sqlite: not an SQLite database")
        raw = read_json(root / "workspace.json", root)
        if not isinstance(raw, dict):
            raise WorkspaceError("workspace.json: must be an object")
        known = {f.name for f in dataclasses.fields(WorkspaceConfig)}
        unknown = set(raw) - known
        if unknown:
            raise WorkspaceError(f"workspace.json: unknown keys {sorted(unknown)}; valid keys: "
                                 f"{sorted(known)}")
        try:
            config = WorkspaceConfig(**raw)
        except ValueError as exc:
            raise WorkspaceError(f"workspace.json: {exc}") from None
        try:
            pool = _validate_pool(read_json(root / "pool.json", root))
        except ValueError as exc:
            if isinstance(exc, WorkspaceError):
                raise
            raise WorkspaceError(f"pool.json: {exc}") from None
        try:
            seed = _validate_seed(read_json(root / "seed_record.json", root), pool)
        except ValueError as exc:
            if isinstance(exc, WorkspaceError):
                raise
            raise WorkspaceError(f"seed_record.json: {exc}") from None
        try:
            state = TrainingState.from_json(read_json(root / "state.json", root))
        except ValueError as exc:
            if isinstance(exc, WorkspaceError):
                raise
            raise WorkspaceError(f"state.json: {exc}") from None
        missing = sorted(set(pool) - set(state.skills))
        extra = sorted(set(state.skills) - set(pool))
        if missing or extra:
            raise WorkspaceError(f"state.json: skills must list exactly the types of pool.json"
                                 f" (missing {missing}, unknown {extra})")
        for t in config.targets:
            if t not in pool:
                raise WorkspaceError(f"workspace.json: targets names type {t!r}, which is not "
                                     f"in pool.json")
        units = _check_units(root, pool) if config.kind == "llm" else None
        ws = cls(root, config, pool, seed, state, units=units)
        read_text(root / "skills" / DEFAULT_STRATEGY, root)
        stale = []
        for t in ws.task_types:
            ref = state.skills[t]
            text = read_text(ws.skill_path(t), root)
            recorded = ws.version_text(t, ref.version)
            if content_hash(recorded) != ref.hash:
                raise WorkspaceError(f"{_rel(root, ws.history_path(t, ref.version))}: content "
                                     f"does not match state.json's hash for {t!r} "
                                     f"v{ref.version}")
            if content_hash(text) == ref.hash:
                continue
            versions = [v for v in range(1, ref.latest + 1)
                        if ws.history_path(t, v).is_file()
                        and ws.history_path(t, v).read_text(encoding="utf-8") == text]
            if not versions:
                raise WorkspaceError(
                    f"{ws.target(t)}: content matches neither state.json's version "
                    f"v{ref.version} of {t!r} nor any recorded version (edited by hand?); "
                    f"restore it from history/{slugify(t)}/v{ref.version}.md")
            stale.append(t)
        ws.stale_skills = tuple(stale)
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
        from .atomic_dir import create_atomically, only_lock_file

        root = Path(path)
        if root.exists() and (not root.is_dir() or not only_lock_file(root)):
            raise WorkspaceError(f"{root}: exists and is not an empty directory; refusing to "
                                 f"overwrite")
        config = config or WorkspaceConfig()
        if not config.workspace_id:  # a new workspace is a new identity
            config = dataclasses.replace(config, workspace_id=uuid.uuid4().hex)
        pool_j = {t: list(us) for t, us in pool.items()}
        try:
            valid_pool = _validate_pool(pool_j)
            seed_j = {t: {u: bool(v) for u, v in rec.items()}
                      for t, rec in (seed_record or {}).items()}
            _validate_seed(seed_j, valid_pool)
        except ValueError as exc:
            raise WorkspaceError(f"create: {exc}") from None
        missing = sorted(set(valid_pool) - set(skills))
        if missing:
            raise WorkspaceError(f"create: no skill text for types {missing}")
        for t, text in skills.items():
            if not isinstance(text, str) or not text.strip():
                raise WorkspaceError(f"create: skill text of {t!r} is empty")
        if not default_strategy.strip():
            raise WorkspaceError("create: default strategy text is empty")
        for rel in files or {}:
            if Path(rel).is_absolute() or ".." in Path(rel).parts or rel in FILES:
                raise WorkspaceError(f"create: extra file {rel!r} must be a new relative path "
                                     f"inside the workspace")
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
            from .log import HarnessLog

            HarnessLog(tmp / "harness.sqlite").close()
            write_json(tmp / "state.json", TrainingState(refs).to_json())

        create_atomically(root, build)  # whole or not at all
        return cls.open(root)

    @classmethod
    def init_llm(cls, path: str | Path, units_file: str | Path, *,
                 base_url: str | Sequence[Any] | None = None,
                 endpoints_file: str | Path | None = None,
                 model: str | None = None, seed: int = 0, backend: str | None = None,
                 skills_dir: str | Path | None = None,
                 seed_record: str | Path | Mapping[str, Any] | None = None,
                 temperature: float = 0.0, max_tokens: int | None = None, think: bool = True,
                 media: Mapping[str, Any] | None = None, **config: Any) -> Workspace:
        """A workspace whose units are answered by an OpenAI-compatible chat model.

        ``units_file`` (JSON lines: unit_id, task_type, question, options, answer) is copied
        to ``units.jsonl``; the pool is its units per type, in file order. Initial skills come
        from ``skills_dir/<slug>.md`` (and its ``default-strategy.md``, if any), else a short
        default per type. ``seed_record`` (a JSON file or mapping ``{unit id: bool}``) orders
        the ladder; without it the ladder is the deterministic shuffle. The agent mapping
        (endpoint, model, sampling) keys the BaselineCache; it never holds the API key.
        ``base_url`` may be a list of endpoints (or comma-separated URLs), or
        ``endpoints_file`` a file of them (read at step time: `vtrm_gate.endpoints`).
        Units may carry ``media`` (frames, a video URL: `vtrm_gate.media`); local frames
        must exist under the units file's directory. ``media`` sets ``max_frames`` /
        ``max_side`` / ``detail``. ``backend="package.module:function"`` names your own
        agent's factory instead of the endpoint (`vtrm_gate.plugin`). ``config`` sets other
        `WorkspaceConfig` fields (cooldown_steps, ...). Everything is validated before the
        first file is written.
        """
        src = Path(units_file)
        units = read_units(src)
        pool = units_pool(units)
        if isinstance(base_url, str) and "," in base_url:  # several endpoints
            base_url = [u.strip() for u in base_url.split(",") if u.strip()]
        agent: dict[str, Any] = {
            "backend": "openai", "model": model, "think": bool(think),
            "temperature": temperature,
            "base_url": base_url if isinstance(base_url, list) else (base_url or "").rstrip("/")}
        if endpoints_file is not None:
            try:
                read_endpoints_file(endpoints_file)  # refuse a bad file before writing
            except EndpointsError as exc:
                raise WorkspaceError(str(exc)) from None
            agent["endpoints_file"] = str(Path(endpoints_file).resolve())
            del agent["base_url"]
        if max_tokens is not None:
            agent["max_tokens"] = max_tokens
        if backend is not None:  # your own agent: its factory, and a model name if given
            agent = {"backend": backend, **({"model": model} if model else {})}
        if any(u.media is not None for u in units.values()):
            root = src.resolve().parent  # local frame paths are relative to the units file
            for u in units.values():
                gone = missing_media(u.media, root)
                if gone:
                    raise WorkspaceError(f"{src}: unit {u.unit_id!r}: media file "
                                         f"{gone[0]!r} not found under {root}")
            agent["media_root"] = str(root)
        if media:
            agent["media"] = dict(media)
        try:
            cfg = WorkspaceConfig(kind="llm", agent=agent, seed=seed, **config)
        except ValueError as exc:
            raise WorkspaceError(f"init_llm: {exc}") from None
        skills = {t: default_llm_skill(t) for t in pool}
        strategy: dict[str, str] = {}
        if skills_dir is not None:
            sdir = Path(skills_dir)
            if not sdir.is_dir():
                raise WorkspaceError(f"{sdir}: skills directory not found")
            skills = {t: read_text(sdir / f"{slugify(t)}.md") for t in pool}
            if (sdir / DEFAULT_STRATEGY).is_file():
                strategy["default_strategy"] = read_text(sdir / DEFAULT_STRATEGY)
        seed_rec: dict[str, dict[str, bool]] = {}
        if seed_record is not None:
            where = "seed_record" if isinstance(seed_record, Mapping) else str(seed_record)
            raw = seed_record if isinstance(seed_record, Mapping) else \
                read_json(Path(seed_record))
            if not isinstance(raw, Mapping):
                raise WorkspaceError(f"{where}: must be an object {{unit id: true|false}}")
            for u, v in raw.items():
                if u not in units:
                    raise WorkspaceError(f"{where}: unit {u!r} is not in {src}")
                if not isinstance(v, bool):
                    raise WorkspaceError(f"{where}: unit {u!r}: expected true or false, got "
                                         f"{v!r}")
                seed_rec.setdefault(units[u].task_type, {})[u] = v
        return cls.create(path, pool=pool, skills=skills, seed_record=seed_rec, config=cfg,
                          files={UNITS_FILE: src.read_text(encoding="utf-8")}, **strategy)


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
