"""Deprecated: the scheduler moved to `vtrm_gate.gate` (run ids and hashes to
`vtrm_gate._ids`, `InfraGuardError` to `vtrm_gate.errors`). Removed in vtrm_gate 0.3.0."""

from __future__ import annotations

from ._api import forwarder

__getattr__ = forwarder("vtrm_gate.scheduler", {
    **dict.fromkeys(("Arm", "arm_run_id", "content_hash", "slugify"), "vtrm_gate._ids"),
    "InfraGuardError": "vtrm_gate.errors"}, "vtrm_gate.gate",
    values={"ARMS": (("base", "cand"), "the tuple ('base', 'cand') (the values of "
                                       "vtrm_gate.gate.UnitTask.arm)")})
