"""Deprecated: bring-your-own backends moved to `vtrm_gate.llm` (`AgentBackend`,
`BackendContext`, `load_factory`; the old ``open_backend(workspace, spec, ctx)`` is
``open_factory_backend``). To run a step with your agent, use
`vtrm_gate.backends.step_workspace`. Removed in vtrm_gate 0.3.0."""

from __future__ import annotations

from ._api import forwarder

__getattr__ = forwarder("vtrm_gate.plugin", {
    "open_backend": "vtrm_gate.llm:open_factory_backend",
    "BackendError": "vtrm_gate.errors"}, "vtrm_gate.llm")
