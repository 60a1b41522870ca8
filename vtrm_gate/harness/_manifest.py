"""The step manifest: what a step ran with, how a re-run compares with it, what it recorded."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._ids import (
    canonical_json,
    content_hash,
)
from ..errors import (
    InputError,
    StepRefusedError,
    WorkspaceError,
    shown,
)
from ._files import _rel, _whole, read_json, read_text
from ._state import Probation, TrainingState
from ._status import StepStatus
from ._workspace import Workspace

STATUS_VALUES: tuple[str, ...] = tuple(s.value for s in StepStatus)


def diff_inputs(old: Any, new: Any, path: str = "") -> list[str]:
    """Human-readable differences between two manifests' inputs."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new), key=str):
            p = f"{path}.{k}" if path else str(k)
            if k not in old:
                out.append(f"{p}: added ({short_json(new[k])})")
            elif k not in new:
                out.append(f"{p}: removed (was {short_json(old[k])})")
            else:
                out.extend(diff_inputs(old[k], new[k], p))
        return out
    if old == new:
        return []
    if isinstance(old, list) and isinstance(new, list):
        first = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b),
                     min(len(old), len(new)))
        return [f"{path}: changed ({len(old)} -> {len(new)} items, first difference at "
                f"index {first})"]
    return [f"{path}: {short_json(old)} -> {short_json(new)}"]


def short_json(v: Any) -> str:
    s = json.dumps(v, sort_keys=True)
    return s if len(s) <= 80 else s[:77] + "..."


def read_manifest(ws: Workspace, epoch: int, step: int) -> dict[str, Any] | None:
    """The step's manifest, validated (`check_manifest`), or None if it was never written."""
    p = ws.manifest_path(epoch, step)
    if not p.exists():
        return None
    data = read_json(p, ws.root)
    try:
        return check_manifest(ws, data, epoch, step)
    except ValueError as exc:
        raise WorkspaceError(f"{p.relative_to(ws.root)}: {exc}; delete it or re-run the step "
                             f"with force=True") from None


Manifests = dict[tuple[int, int], dict[str, Any] | None]
"""Manifests read so far, by (epoch, step): one read each, however many types ask."""


def probation_manifest(ws: Workspace, task_type: str, p: Probation,
                       seen: Manifests | None = None) -> dict[str, Any]:
    """The manifest of the step that put ``task_type`` on probation: it records the version a
    rollback restores (its gate's base) and the cases its probe must leave out."""
    seen = {} if seen is None else seen
    if (p.epoch, p.step) not in seen:
        seen[p.epoch, p.step] = read_manifest(ws, p.epoch, p.step)
    manifest = seen[p.epoch, p.step]
    if manifest is None:
        raise WorkspaceError(
            f"{_rel(ws.root, ws.manifest_path(p.epoch, p.step))}, the record of the step that "
            f"put {task_type!r} on probation, is missing: the version a rollback restores "
            f"cannot be checked nor the step's cases left out of the probe; restore it "
            f"from a backup")
    return manifest


def settled_text(ws: Workspace, state: TrainingState, task_type: str,
                 seen: Manifests | None = None) -> str:
    """The type's last settled version (what its gates run against and a rollback restores),
    checked against its recorded hash: state.json's for the current version; for a type on
    probation, the base hash the step that began it recorded. A hand edit of that history
    file was adopted; it is refused, as one of the current version is at open."""
    p = state.probation.get(task_type)
    ref = state.skills[task_type]
    version, by = ref.version, "state.json's hash"
    want: str | None = ref.hash
    if p is not None:
        base = probation_manifest(ws, task_type, p, seen)["inputs"]["base_skills"][task_type]
        version, want = p.prev_version, base["hash"]
        by = f"the hash step e{p.epoch} s{p.step} gated it at"
        if base["version"] != version:  # the manifest recorded another base: no hash for it
            want = None
    text = ws.version_text(task_type, version)
    if want is not None and content_hash(text) != want:
        raise WorkspaceError(f"{_rel(ws.root, ws.history_path(task_type, version))}: content "
                             f"does not match {by} for {task_type!r} v{version} (edited by "
                             f"hand?); restore the text that was gated")
    return text


def _need(cond: bool, key: str, what: str, value: object) -> None:
    if not cond:
        raise InputError(f"{key} must be {what}, got {shown(value)}")


def _of_types(ws: Workspace, value: Any, key: str, what: str) -> dict[str, Any]:
    _need(isinstance(value, dict) and set(value) <= set(ws.pool), key,
          f"an object {{type of pool.json: {what}}}", value)
    return value


def _unit_lists(ws: Workspace, value: Any, key: str) -> None:
    for t, us in _of_types(ws, value, key, "[unit ids]").items():
        _need(isinstance(us, list) and all(isinstance(u, str) and u in ws.pool[t] for u in us),
              f"{key}[{t!r}]", f"a list of unit ids of {t!r}'s pool", us)


def check_manifest(ws: Workspace, data: Any, epoch: int, step: int) -> dict[str, Any]:
    """A manifest's fields as every reader uses them (ValueError naming the field): the
    step's ids, inputs (config, base skills, cooldown, cases, ladders of known types and
    their pools' units) and candidates (status, note, and a gated one's hash and file
    inside ``candidates/``)."""
    _need(isinstance(data, dict), "the manifest", "an object", type(data).__name__)
    _need(data.get("epoch") == epoch and data.get("step") == step, "epoch/step",
          f"{epoch}/{step} (the file's name)", (data.get("epoch"), data.get("step")))
    _need(isinstance(data.get("step_run_id"), str), "step_run_id", "a string",
          data.get("step_run_id"))
    inputs = data.get("inputs")
    _need(isinstance(inputs, dict), "inputs", "an object", inputs)
    for k in ("config", "agent"):
        _need(isinstance(inputs.get(k), dict), f"inputs.{k}", "an object", inputs.get(k))
    for t, b in _of_types(ws, inputs.get("base_skills"), "inputs.base_skills",
                          "{version, hash}").items():
        _need(isinstance(b, dict) and _whole(b.get("version")) and b["version"] >= 1,
              f"inputs.base_skills[{t!r}]", "{version: integer >= 1, hash}", b)
    _need(isinstance(inputs.get("cooldown"), list) and set(inputs["cooldown"]) <= set(ws.pool),
          "inputs.cooldown", "a list of types of pool.json", inputs.get("cooldown"))
    _unit_lists(ws, inputs.get("cases"), "inputs.cases")
    _unit_lists(ws, inputs.get("ladders"), "inputs.ladders")
    for t, c in _of_types(ws, data.get("candidates"), "candidates", "{status, ...}").items():
        key = f"candidates[{t!r}]"
        _need(isinstance(c, dict) and isinstance(c.get("status"), str)
              and isinstance(c.get("note"), str | None), key, "{status, note, ...}", c)
        _need(c["status"] in STATUS_VALUES, f"{key}.status", " | ".join(STATUS_VALUES),
              c["status"])
        if c["status"] == StepStatus.GATED:
            f = c.get("file")
            _need(isinstance(c.get("hash"), str) and isinstance(f, str)
                  and Path(f).parts[:1] == ("candidates",) and ".." not in Path(f).parts
                  and not Path(f).is_absolute(), key,
                  "{hash, file: 'candidates/...'} for a gated type", c)
            _need(t in inputs["ladders"] and t in inputs["base_skills"], key,
                  "a type with a ladder and a base skill in inputs", t)
    return data


def recorded_manifests(ws: Workspace) -> list[dict[str, Any]]:
    """Every step manifest of the workspace (``manifests/eE_sS.json``), validated, in order."""
    found = []
    for path in (ws.root / "manifests").glob("e*_s*.json"):
        m = re.fullmatch(r"e(\d+)_s(\d+)\.json", path.name)
        if m:
            found.append((int(m[1]), int(m[2])))
    return [read_manifest(ws, e, s) for e, s in sorted(found)]  # type: ignore[misc]  # each exists


def refusal(ws: Workspace, epoch: int, step: int, changes: list[str]) -> StepRefusedError:
    """The refusal of a re-run whose inputs differ from the step's manifest."""
    return StepRefusedError(
        f"step e{epoch} s{step} was run before with a different manifest "
        f"({ws.manifest_path(epoch, step).relative_to(ws.root)}); refusing to re-run it "
        f"because:\n  - " + "\n  - ".join(changes)
        + f"\n{FORCE_ADVICE}", changes)


FORCE_ADVICE = "pass force=True to re-run it anyway (its log rows are replaced)"
"""How a refused re-run is overridden (the CLI spells it --force; `train` has no override)."""


def check_agent_unchanged(ws: Workspace, epoch: int, step: int, force: bool = False) -> None:
    """Refuse, before any call, a re-run of a recorded step whose agent config changed (a
    new model, budget or agent version: the step's calls would all be new); the full
    comparison of inputs still happens in `run_step`."""
    prior = None if force else read_manifest(ws, epoch, step)
    if prior is None:
        return
    changes = diff_inputs(prior["inputs"].get("agent"),
                          json.loads(canonical_json(dict(ws.config.agent))), "agent")
    if changes:
        raise refusal(ws, epoch, step, changes)


def recorded_candidates(ws: Workspace, manifest: Mapping[str, Any]
                         ) -> dict[str, tuple[StepStatus, str | None, str | None]]:
    """(status, candidate text, note) per type from a manifest, verified against its hashes."""
    out: dict[str, tuple[StepStatus, str | None, str | None]] = {}
    for t, c in manifest["candidates"].items():
        text = None
        if c.get("status") == StepStatus.GATED:
            p = ws.root / c["file"]
            inside = p.resolve().is_relative_to((ws.root / "candidates").resolve())
            text = read_text(p, ws.root) if inside and p.is_file() else None
            if text is None or content_hash(text) != c["hash"]:
                raise StepRefusedError(
                    f"candidate file {c['file']} of {t!r} is missing or differs from the "
                    f"manifest's hash; re-run with force=True to evolve new candidates",
                    [f"candidates.{t}"])
        out[t] = (StepStatus(c["status"]), text, c.get("note"))
    return out



def plain(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}



