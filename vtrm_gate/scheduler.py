"""Deprecated: the scheduler moved to `vtrm_gate.gate` (run ids and hashes to
`vtrm_gate._ids`, `InfraGuardError` to `vtrm_gate.errors`). Kept for one release."""

from __future__ import annotations

from ._deprecated import forwarder

__getattr__ = forwarder("vtrm_gate.scheduler", {
    **dict.fromkeys(("Arm", "ARMS", "arm_run_id", "content_hash", "slugify"), "vtrm_gate._ids"),
    "InfraGuardError": "vtrm_gate.errors"}, "vtrm_gate.gate")
