"""LLM workspaces: create one from a units file (`init_llm`), and validate its agent settings
(an OpenAI-compatible endpoint or several, a model, sampling; never a credential)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from .._env import credential_name, user_path
from .._ids import slugify
from ..errors import USER_TEXT, ConfigError, EndpointsError, MediaError, WorkspaceError, shown
from ..harness import (
    DEFAULT_STRATEGY,
    HELDOUT_FILE,
    UNITS_FILE,
    MediaOptions,
    UnitRecord,
    Workspace,
    WorkspaceConfig,
    check_frame,
    read_json,
    read_text,
    read_units,
    split_heldout,
    units_pool,
    units_task_description,
)
from ..harness._units import task_description_problem
from ..harness._workspace import _check_no_secret
from ._agent import TEXT_TASK, VIDEO_TASK
from ._endpoints import check_endpoints_setting, read_endpoints_file, url_problem


def _refuse_url_credentials(url: str) -> None:
    """No password, token or key inside the endpoint URL: it would be written to
    workspace.json and every manifest (the message does not repeat it)."""
    parts = urlsplit(url)
    names = [k for k, _ in parse_qsl(parts.query, keep_blank_values=True)]
    bad = [k for k in names if credential_name(k)]
    if "@" in parts.netloc or bad:
        what = "user info (user:password@)" if "@" in parts.netloc else \
            f"the query parameter(s) {', '.join(bad)}"
        raise ConfigError(f"agent.base_url must not hold a credential (found {what}); the API "
                         f"key comes from OPENAI_API_KEY / VTRM_API_KEY at run time")


def check_llm_agent(agent: Mapping[str, Any]) -> None:
    """An ``llm`` workspace's agent: an OpenAI-compatible endpoint, a model, sampling
    params; never a credential (the key comes from the environment at run time)."""
    backend = agent.get("backend")
    factory = isinstance(backend, str) and backend.count(":") == 1 and "//" not in backend
    if backend != "openai" and not factory:
        raise ConfigError(f"agent.backend must be 'openai' or a factory 'package.module:"
                          f"function' for an llm workspace, got {shown(backend)}")
    _check_no_secret(agent)
    task = agent.get("task_description")
    if task is not None and (why := task_description_problem(task)):
        raise ValueError(f"agent.task_description {why} (what the agent answers, e.g. "
                         f"{VIDEO_TASK!r}), got {task!r:.80}")
    if agent.get("media") is not None:
        m = agent["media"]
        keys = {"max_frames", "max_side", "detail", "max_frame_bytes", "max_pixels"}
        if not isinstance(m, Mapping) or not set(m) <= keys:
            raise ConfigError(f"agent.media must be an object of {', '.join(sorted(keys))}; "
                             f"got {shown(m)}")
        MediaOptions(**m)
    if factory:  # your own agent (`vtrm_gate.llm.AgentBackend`): it needs no endpoint or model here
        return
    url = agent.get("base_url")
    if isinstance(url, list) or "endpoints_file" in agent:  # several endpoints
        check_endpoints_setting(agent)
    elif (problem := url_problem("agent.base_url", url)) is not None:
        raise ConfigError(problem)
    for u in url if isinstance(url, list) else [url]:
        if isinstance(u, str):
            _refuse_url_credentials(u)
    model = agent.get("model")
    if not isinstance(model, str) or not model.strip():
        raise ConfigError(f"agent.model must be a non-empty string, got {shown(model)}")



def _check_model_name(model: object) -> None:
    """At init only (a server that ignores the name, llama.cpp's, ran such workspaces): a
    model name with a space at an end or a control character, which a server that checks
    names refuses on every call."""
    if isinstance(model, str) and (model != model.strip() or not model.isprintable()):
        raise ConfigError(f"agent.model {model!r} has a space at an end or a control "
                          f"character: no model is named so, and a server that checks the "
                          f"name refuses every call (pasted with one?)")


def default_llm_skill(task_type: str, task: str = TEXT_TASK) -> str:
    """A short starting skill for a type with no skill file of its own, naming the ``task``
    (the workspace's task description, `VIDEO_TASK` for units with media, else `TEXT_TASK`)."""
    return (f"# {task_type}\n\n"
            f"You answer {task}; this skill is for the question type \"{task_type}\".\n\n"
            f"## Strategy\n"
            f"- Read the question and every option before deciding.\n"
            f"- Eliminate options that contradict what the question describes.\n"
            f"- Choose the single best-supported option.\n")



def init_llm(path: str | Path, units_file: str | Path, *,
             base_url: str | Sequence[Any] | None = None,
             endpoints_file: str | Path | None = None,
             model: str | None = None, seed: int = 0, backend: str | None = None,
             skills_dir: str | Path | None = None,
             seed_record: str | Path | Mapping[str, Any] | None = None,
             temperature: float = 0.0, max_tokens: int | None = None, think: bool = True,
             media: Mapping[str, Any] | None = None, heldout_fraction: float = 0.0,
             task_description: str | None = None, **config: Any) -> Workspace:
    """A workspace whose units are answered by an OpenAI-compatible chat model.

    ``units_file`` (JSON lines: unit_id, task_type, question, options, answer) is copied
    to ``units.jsonl``; the pool is its units per type, in file order. Initial skills come
    from ``skills_dir/<slug>.md`` (and its ``default-strategy.md``, if any), else a short
    default per type. ``seed_record`` (a JSON file or mapping ``{unit id: bool}``) orders
    the ladder; without it the ladder is the deterministic shuffle. The agent mapping
    (endpoint, model, sampling) keys the BaselineCache; it never holds the API key.
    ``base_url`` may be a list of endpoints (or comma-separated URLs), or
    ``endpoints_file`` a file of them (read at step time: `EndpointPool`).
    Units may carry ``media`` (frames, a video URL: `vtrm_gate.harness.Media`); local frames
    must exist under the units file's directory. ``heldout_fraction`` holds a seeded share of
    each type's units out of the pool (``heldout.json``: never gated, the epoch-end
    evaluation's split, as for a simulated workspace). ``task_description`` (one line, e.g.
    "multiple-choice questions about a chest X-ray", else the units file's) is the task the
    prompts and the default skills name; without either they say "multiple-choice questions",
    and "about a video" only for units that show media. ``media`` sets ``max_frames`` /
    ``max_side`` / ``detail``. ``backend="package.module:function"`` names your own
    agent's factory instead of the endpoint (`vtrm_gate.llm.AgentBackend`). ``config`` sets other
    `WorkspaceConfig` fields (cooldown_steps, ...). Everything is validated before the
    first file is written.
    """
    src = user_path(units_file)
    units = read_units(src)
    pool = units_pool(units)
    agent = _agent_config(base_url, endpoints_file, model, backend, temperature, max_tokens,
                          think)
    agent.update(_media_settings(src, units, media))
    task = units_task_description(units) if task_description is None else task_description
    if task is not None:  # the argument wins over the units file
        agent["task_description"] = task
    try:
        check_llm_agent(agent)
        _check_model_name(agent.get("model"))
        cfg = WorkspaceConfig(kind="llm", agent=agent, seed=seed, **config)
        heldout = {t: split_heldout(us, seed, heldout_fraction) for t, us in pool.items()}
    except ValueError as exc:
        raise WorkspaceError(f"init_llm: {exc}") from None
    skills, strategy = _initial_skills(
        pool, skills_dir, task or (VIDEO_TASK if "media_root" in agent else TEXT_TASK))
    files = {UNITS_FILE: src.read_text(encoding=USER_TEXT)}  # without a BOM
    if heldout_fraction:
        files[HELDOUT_FILE] = json.dumps(heldout, indent=2) + "\n"
    seeds = _seed_record(seed_record, units, src)
    return Workspace.create(
        path, pool={t: [u for u in us if u not in set(heldout[t])] for t, us in pool.items()},
        skills=skills, config=cfg, files=files, **strategy,
        seed_record={t: {u: v for u, v in r.items() if u not in set(heldout[t])}
                     for t, r in seeds.items()})


def _agent_config(base_url: str | Sequence[Any] | None, endpoints_file: str | Path | None,
                  model: str | None, backend: str | None, temperature: float,
                  max_tokens: int | None, think: bool) -> dict[str, Any]:
    """The agent mapping of a new llm workspace (endpoint or endpoints, model, sampling)."""
    if backend is not None:  # your own agent: its factory, and a model name if given
        return {"backend": backend, **({"model": model} if model else {})}
    if isinstance(base_url, str) and "," in base_url:  # several endpoints
        base_url = [u.strip() for u in base_url.split(",") if u.strip()]
    elif not isinstance(base_url, str | None):  # a tuple or any sequence: the same list
        base_url = list(base_url)
    agent: dict[str, Any] = {
        "backend": "openai", "model": model, "think": bool(think),
        "temperature": temperature,
        "base_url": base_url if isinstance(base_url, list) else (base_url or "").rstrip("/")}
    if endpoints_file is not None:
        try:
            read_endpoints_file(endpoints_file)  # refuse a bad file before writing
        except EndpointsError as exc:
            raise WorkspaceError(str(exc)) from None
        agent["endpoints_file"] = str(user_path(endpoints_file).resolve())
        del agent["base_url"]
    if max_tokens is not None:
        agent["max_tokens"] = max_tokens
    return agent


def _media_settings(src: Path, units: Mapping[str, UnitRecord],
                    media: Mapping[str, Any] | None) -> dict[str, Any]:
    """``media_root`` (the units file's directory) and the ``media`` options, for units that
    show frames or a video. Every local frame is checked there (`check_frame`: inside the
    directory, within the size and pixel caps, an image), before anything is written."""
    out: dict[str, Any] = {}
    if media:
        out["media"] = dict(media)
    if any(u.media is not None for u in units.values()):
        root = src.resolve().parent  # local frame paths are relative to the units file
        try:
            options = MediaOptions(str(root), **(media or {}))
        except (TypeError, ValueError) as exc:
            raise WorkspaceError(f"init_llm: {exc}") from None
        for u in units.values():
            for image in u.media.local_paths() if u.media else ():
                try:
                    check_frame(image, options)
                except MediaError as exc:
                    raise WorkspaceError(f"{src}: unit {u.unit_id!r}: {exc} (units directory "
                                         f"{root})") from None
        out["media_root"] = str(root)
    return out


def _initial_skills(pool: Mapping[str, Any], skills_dir: str | Path | None, task: str
                    ) -> tuple[dict[str, str], dict[str, str]]:
    """Each type's v1 skill (``skills_dir/<slug>.md``, else a short default naming ``task``)
    and the default strategy, if the directory has one."""
    if skills_dir is None:
        return {t: default_llm_skill(t, task) for t in pool}, {}
    sdir = user_path(skills_dir)
    if not sdir.is_dir():
        raise WorkspaceError(f"{sdir}: skills directory not found")
    skills = {t: _skill_file(sdir, t) for t in pool}
    strategy = ({"default_strategy": read_text(sdir / DEFAULT_STRATEGY)}
                if (sdir / DEFAULT_STRATEGY).is_file() else {})
    return skills, strategy


def _skill_file(sdir: Path, task_type: str) -> str:
    """``task_type``'s skill in ``sdir/<slug>.md``; when that is missing but a file beside it
    is named by the type itself ("OCR Problems.md"), the error says so."""
    path = sdir / f"{slugify(task_type)}.md"
    if not path.is_file():
        named = [p.name for p in sdir.iterdir()
                 if p.is_file() and p.suffix.lower() == ".md" and p.stem == task_type]
        if named:
            raise WorkspaceError(f"{path}: missing skill file ({sdir} holds {named[0]!r}: a "
                                 f"type's skill file is named by its slug, {path.name})")
    return read_text(path)


def _seed_record(seed_record: str | Path | Mapping[str, Any] | None,
                 units: Mapping[str, UnitRecord], src: Path) -> dict[str, dict[str, bool]]:
    """``{type: {unit: bool}}`` from a JSON file or mapping ``{unit id: bool}``."""
    if seed_record is None:
        return {}
    where = "seed_record" if isinstance(seed_record, Mapping) else str(seed_record)
    raw = seed_record if isinstance(seed_record, Mapping) else read_json(user_path(seed_record))
    if not isinstance(raw, Mapping):
        raise WorkspaceError(f"{where}: must be an object {{unit id: true|false}}")
    out: dict[str, dict[str, bool]] = {}
    for u, v in raw.items():
        if u not in units:
            raise WorkspaceError(f"{where}: unit {u!r} is not in {src}")
        if not isinstance(v, bool):
            raise WorkspaceError(f"{where}: unit {u!r}: expected true or false, got {shown(v)}")
        out.setdefault(units[u].task_type, {})[u] = v
    return out
