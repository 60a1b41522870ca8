"""Opening a workspace for a reader (no lock) or a writer (the lock, then a fresh state)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ._lock import workspace_lock
from ._workspace import Workspace


def for_reading(workspace: Workspace | str | Path) -> Workspace:
    """The workspace as given, or opened read-only from a path (readers take no lock)."""
    return workspace if isinstance(workspace, Workspace) else Workspace.open(workspace,
                                                                           readonly=True)


@contextmanager
def writer(workspace: Workspace | str | Path, command: str,
           check_log: bool = False) -> Iterator[Workspace]:
    """The workspace opened for writing: validated first (a broken workspace is refused
    before anything is written), then its writer lock held for the block (a second writer
    gets `WorkspaceLockedError` at once) and its state re-read under the lock. The log is
    checked (`HarnessLog.quick_check`) when ``check_log`` or when the last writer died
    holding the lock."""
    ws = workspace if isinstance(workspace, Workspace) else Workspace.open(workspace)
    try:
        with workspace_lock(ws.root, command) as lock:
            ws.reload_state()  # another writer may have moved it on since it was opened
            if check_log or lock.unclean:
                ws.log.quick_check()
                lock.mark_checked()
            yield ws
    finally:
        if ws is not workspace:  # opened here from a path: release the SQLite connection
            ws.close()
