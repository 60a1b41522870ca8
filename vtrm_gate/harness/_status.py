"""What happened to a type in a step, as a type: the strings are the ones stored (SQLite
``step_report.status``, the manifest's ``candidates.*.status``) and they never change."""

from __future__ import annotations

import enum


class StepStatus(enum.StrEnum):
    """A type's status in a step: gated through the gate, or why it was not (or did not
    finish); ``probation`` rows (step 0) record the epoch-end settlement."""

    GATED = "gated"
    SKIPPED = "skipped"
    """The evolver's candidate is no real change (or was refused): nothing to gate."""
    COOLDOWN = "cooldown"
    NO_CASES = "no_cases"
    ROLLOUT_ERROR = "rollout_error"
    EVOLVE_ERROR = "evolve_error"
    ABORTED = "aborted"
    PROBATION = "probation"


NOT_EVOLVED = (StepStatus.COOLDOWN, StepStatus.ROLLOUT_ERROR, StepStatus.NO_CASES)
"""Statuses set before the evolver runs: the type gets no candidate this step."""
