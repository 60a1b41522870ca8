"""Phase D of a step: the gate's decisions applied to the training state, in alphabetical
order. The only writer of training state besides the epoch-end settlement."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from .._ids import content_hash
from ..stats import Action, TypeOutcome
from ._files import atomic_write
from ._state import Probation, Rejected, SkillRef, TrainingState
from ._workspace import Workspace


def apply_decisions(ws: Workspace, base: TrainingState, epoch: int, step: int,
                    outcomes: Mapping[str, TypeOutcome], cand: Mapping[str, str]
                    ) -> tuple[TrainingState, dict[str, str]]:
    """Phase D: write the new versions (write-once history first), then checkpoint the new
    state (one atomic write); returns it and what was applied per type."""
    new_state, applied, new_versions = plan_decisions(ws, base, epoch, step, outcomes, cand)
    ws.check_root()
    for t, v, text in new_versions:
        atomic_write(ws.history_path(t, v), text)
    ws.save_state(new_state)
    ws.log.set_applied(epoch, step, applied)
    return new_state, applied


def _new_version(ws: Workspace, task_type: str, ref: SkillRef, text: str) -> int:
    """The next version number; a forced re-run may propose other text, so a recorded
    version is never overwritten."""
    v = ref.latest + 1
    while (ws.history_path(task_type, v).is_file()
           and ws.history_path(task_type, v).read_text(encoding="utf-8") != text):
        v += 1
    return v


def plan_decisions(ws: Workspace, base: TrainingState, epoch: int, step: int,
                   outcomes: Mapping[str, TypeOutcome], cand: Mapping[str, str]
                   ) -> tuple[TrainingState, dict[str, str], list[tuple[str, int, str]]]:
    """Phase D minus the writes: (new state, what was applied per type, new versions)."""
    skills = dict(base.skills)
    probation = dict(base.probation)
    cooldown = dict(base.cooldown_until)
    rejected = {t: tuple(rs) for t, rs in base.rejected.items()}
    n = base.steps_applied + 1
    applied: dict[str, str] = {}
    new_versions: list[tuple[str, int, str]] = []
    for t in sorted(outcomes):  # alphabetical: deterministic bookkeeping order
        action, ref = outcomes[t].action, skills[t]
        settled = base.settled_version(t)  # the gate's base (run_step gates against it)
        against = "" if settled == ref.version else f" (gated against settled v{settled})"
        if action in (Action.ACCEPT, Action.PROVISIONAL):
            v = _new_version(ws, t, ref, cand[t])
            new_versions.append((t, v, cand[t]))
            skills[t] = SkillRef(v, content_hash(cand[t]), v)
            if action is Action.ACCEPT:
                # Settled: it beat a settled version; a pending bet it replaces is dropped.
                probation.pop(t, None)
                applied[t] = f"accepted: v{ref.version} -> v{v}{against}"
            else:
                # A bet on a bet replaces it: both were gated against the settled version,
                # which a failed settlement restores.
                probation[t] = Probation(v, settled, epoch, step)
                applied[t] = (f"probation: v{ref.version} -> v{v}{against} (rolled back to "
                              f"v{settled} if it fails at the end of epoch {epoch})")
        elif action in (Action.REJECT, Action.FUTILE):
            rejected[t] = push_rejected(ws, rejected.get(t, ()),
                                        Rejected(content_hash(cand[t]), cand[t], epoch, step,
                                                 action.value))
            if action is Action.REJECT or ws.config.futile_cooldown:
                cooldown[t] = n + ws.config.cooldown_steps
                applied[t] = (f"rejected ({action.value}): kept v{ref.version}; cooldown for "
                              f"{ws.config.cooldown_steps} steps")
            else:
                applied[t] = (f"rejected ({action.value}): kept v{ref.version}; no cooldown "
                              f"(futile_cooldown off)")
        else:
            applied[t] = f"kept v{ref.version} ({action.value})"
    state = TrainingState(skills, probation, cooldown, rejected, n, (epoch, step),
                          dataclasses.replace(base, before_last=None), base.settled_epochs)
    return state, applied, new_versions


def push_rejected(ws: Workspace, buffer: tuple[Rejected, ...], entry: Rejected
                  ) -> tuple[Rejected, ...]:
    """The rejected buffer with ``entry`` appended, keeping the newest ``rejected_max``."""
    rs = (*buffer, entry)
    keep = ws.config.rejected_max
    return rs[len(rs) - keep:] if keep else ()
