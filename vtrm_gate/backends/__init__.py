"""Drive a workspace with its own agent: one opener (`open_backend`) and one code path for
step, train and settle, shared by the ``vtrm-gate`` commands and the Python API.

- `_open`: `open_backend(workspace, options)` for every kind of workspace (simulated, llm
  with one or several endpoints or an endpoints file, media units, your own factory)
- `_commands`: `step_workspace`, `train_workspace`, `settle_workspace` (async, and ``_sync``
  wrappers that pick the simulator's virtual clock or real time), `run_simulated_training`
"""

from __future__ import annotations

from ._commands import WorkspaceRun as WorkspaceRun
from ._commands import plain_summary as plain_summary
from ._commands import run_on_clock as run_on_clock
from ._commands import run_simulated_training as run_simulated_training
from ._commands import settle_workspace as settle_workspace
from ._commands import settle_workspace_sync as settle_workspace_sync
from ._commands import step_workspace as step_workspace
from ._commands import step_workspace_sync as step_workspace_sync
from ._commands import train_workspace as train_workspace
from ._commands import train_workspace_sync as train_workspace_sync
from ._open import Backend as Backend
from ._open import open_backend as open_backend
from ._open import uses_virtual_clock as uses_virtual_clock
from ._open import workspace_options as workspace_options

__all__ = [
    "Backend", "WorkspaceRun", "open_backend", "plain_summary", "run_on_clock",
    "run_simulated_training", "settle_workspace", "settle_workspace_sync", "step_workspace",
    "step_workspace_sync", "train_workspace", "train_workspace_sync", "uses_virtual_clock",
    "workspace_options",
]

# below __all__: the classes it names report this namespace as their module
from .._api import declare

declare(__name__, globals())
del declare
