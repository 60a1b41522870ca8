"""A new workspace appears whole or not at all: built in a temporary sibling, renamed in.

`init` (and `Workspace.create`) write every file into ``.<name>.init-PID`` next to the target
and ``rename`` it into place at the end, so a full disk, a bad value found late or a kill
mid-way leaves no half-built workspace (a killed build's sibling is removed by the next
build next to it). An existing empty target directory is held under the writer lock while
the build runs, so two writers never race on it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from .._env import pid_alive
from ..errors import WorkspaceError
from ._lock import LOCK_FILE, workspace_lock


def _remove_dead_builds(parent: Path, name: str) -> None:
    """Remove build siblings of ``name`` whose process is gone (a killed init)."""
    pattern = re.compile(rf"^\.{re.escape(name)}\.init-(\d+)$")
    for p in parent.glob(f".{name}.init-*"):
        m = pattern.match(p.name)
        if m and p.is_dir() and not p.is_symlink() and not pid_alive(int(m.group(1))):
            shutil.rmtree(p, ignore_errors=True)


def only_lock_file(root: Path) -> bool:
    """True if the directory ``root`` holds nothing but (possibly) the lock file."""
    return all(p.name == LOCK_FILE for p in root.iterdir())


def create_atomically(root: str | os.PathLike[str], build: Callable[[Path], None],
                      command: str = "init") -> Path:
    """Run ``build(tmp)`` on a fresh sibling directory, then rename it to ``root``.

    ``root`` must not exist or be an empty directory (held under the writer lock meanwhile).
    On any failure the sibling is removed and ``root`` is as before. Returns ``root``.
    """
    root = Path(root)
    parent = root.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _cannot_create(root, exc) from None
    _remove_dead_builds(parent, root.name)
    with contextlib.ExitStack() as stack:
        if root.is_dir():
            stack.enter_context(workspace_lock(root, command))
            if not only_lock_file(root):
                raise WorkspaceError(f"{root}: exists and is not empty; refusing to overwrite")
        elif root.exists() or root.is_symlink():
            raise WorkspaceError(f"{root}: exists and is not a directory")
        tmp = parent / f".{root.name}.init-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
        except OSError as exc:  # it named the internal sibling, not the user's path
            raise _cannot_create(root, exc) from None
        try:
            build(tmp)
            if root.is_dir():  # we hold the lock on its open fd: the file itself may go
                (root / LOCK_FILE).unlink(missing_ok=True)
            try:
                os.rename(tmp, root)  # atomic; replaces an empty directory only
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                    raise WorkspaceError(f"{root}: was created by another process meanwhile; "
                                         f"nothing written") from None
                raise
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, OSError) and str(tmp) in str(exc.filename or ""):
                raise _cannot_create(root, exc) from None  # a full disk mid-build, say
            raise
    return root


def _cannot_create(root: Path, exc: OSError) -> WorkspaceError:
    """A failure to make ``root`` or its build sibling, named by the path the user gave."""
    reason = exc.strerror or str(exc)
    if isinstance(exc, (FileExistsError, NotADirectoryError)) and exc.filename:
        reason = f"{exc.filename} is not a directory"
    return WorkspaceError(f"{root}: cannot create the workspace there: {reason}")
