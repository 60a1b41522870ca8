"""The step manifest: what a step ran with, how a re-run compares with it, what it recorded."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from .._ids import (
    canonical_json,
    content_hash,
)
from ..errors import (
    StepRefusedError,
    WorkspaceError,
)
from ._files import read_json
from ._workspace import Workspace


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
    p = ws.manifest_path(epoch, step)
    if not p.exists():
        return None
    data = read_json(p, ws.root)
    if not isinstance(data, dict) or not isinstance(data.get("inputs"), dict) \
            or not isinstance(data.get("candidates"), dict):
        raise WorkspaceError(f"{p.relative_to(ws.root)}: malformed manifest (needs 'inputs' "
                             f"and 'candidates'); delete it or re-run with force=True")
    return data


def refusal(ws: Workspace, epoch: int, step: int, changes: list[str]) -> StepRefusedError:
    """The refusal of a re-run whose inputs differ from the step's manifest."""
    return StepRefusedError(
        f"step e{epoch} s{step} was run before with a different manifest "
        f"({ws.manifest_path(epoch, step).relative_to(ws.root)}); refusing to re-run it "
        f"because:\n  - " + "\n  - ".join(changes)
        + "\npass force=True to re-run it anyway (its log rows are replaced)", changes)


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
                         ) -> dict[str, tuple[str, str | None, str | None]]:
    """(status, candidate text, note) per type from a manifest, verified against its hashes."""
    out: dict[str, tuple[str, str | None, str | None]] = {}
    for t, c in manifest["candidates"].items():
        text = None
        if c.get("status") == "gated":
            p = ws.root / c["file"]
            if not p.is_file() or content_hash(p.read_text(encoding="utf-8")) != c["hash"]:
                raise StepRefusedError(
                    f"candidate file {c['file']} of {t!r} is missing or differs from the "
                    f"manifest's hash; re-run with force=True to evolve new candidates",
                    [f"candidates.{t}"])
            text = p.read_text(encoding="utf-8")
        out[t] = (c["status"], text, c.get("note"))
    return out



def plain(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}



