"""The workspace lock: one writer at a time (SPEC amendment), readers need none.

An OS file lock (``flock`` on ``<workspace>/.lock``, and on the directory itself, so a
deleted ``.lock`` lets no second writer in), so the kernel releases it when the holder
dies: a kill -9 never leaves a stale lock. The file also records who holds it (pid,
command, since) so a refused writer can name the holder in one line; a clean release
empties it, so a record found by the next writer means its holder died (`unclean`).

Taking the lock (outermost) also removes the ``.<name>.tmp-PID`` files a killed writer's
`atomic_write` left behind.

Re-entrant within one writer: ``train`` holds the lock and calls ``run_step``, which takes it
again; only the outermost release unlocks. The writer is the holder's context (its task and
the tasks and worker threads it starts), not the process: another task of the same process
(a notebook's background run and a cell) is refused like another process. (flock conflicts
between two open file descriptions even in one process, hence the small per-process table of
held locks.)
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as _dt
import errno
import fcntl
import json
import os
import stat
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from ..errors import WorkspaceError, WorkspaceLockedError
from ._files import clean_temp_files

LOCK_FILE = ".lock"


@dataclass(frozen=True)
class LockHolder:
    """Who holds a workspace lock, as recorded in the lock file."""

    pid: int
    command: str
    since: str

    def describe(self) -> str:
        return f"pid {self.pid} ({self.command}) since {self.since}"


# Per-process table of held locks: resolved root -> [fd, depth, unclean, directory fd].
# Guarded by _TABLE_LOCK. ``unclean`` (0/1) stays set until a writer has checked the log.
_HELD: dict[Path, list[int]] = {}
_TABLE_LOCK = threading.Lock()
# The workspaces whose lock this context holds: a nested acquire in the holder's context is
# re-entrant; one in another task's context is a second writer.
_MINE: contextvars.ContextVar[frozenset[Path]] = contextvars.ContextVar(
    "vtrm_gate_workspace_locks", default=frozenset())


def _open_lock_file(path: Path, flags: int) -> int:
    """``path`` opened without following a symlink or waiting on a FIFO, and only if it is a
    regular file: a ``.lock`` linked to a file outside the workspace had that file
    overwritten and emptied, and a FIFO hung every reader."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return fd


def read_holder(root: str | Path) -> LockHolder | None:
    """The holder recorded in the lock file (None if unlocked, unreadable or never locked)."""
    path = Path(root) / LOCK_FILE
    try:
        fd = _open_lock_file(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # locked: the recorded holder is current
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None  # nobody holds it; the file names a past holder
        raw = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        data = json.loads(raw.decode("utf-8"))
        return LockHolder(int(data["pid"]), str(data["command"]), str(data["since"]))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


def _lock_directory(key: Path, root: Path) -> int:
    """The directory itself locked too (its descriptor, held): ``.lock`` can be deleted
    under a writer, and a second writer would then lock a new file beside it. Where a file
    system cannot lock a directory (NFS emulates flock with write locks, refused on a
    read-only descriptor) ``.lock`` alone serves, as before."""
    dfd = os.open(key, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(dfd)
        raise WorkspaceLockedError(root, read_holder(key)) from None
    except OSError:
        return dfd  # held open, unlocked: closing it at release is harmless
    except BaseException:
        os.close(dfd)
        raise
    return dfd


def _write_record(fd: int, command: str, path: Path) -> None:
    """The holder record, whole, in the locked file, or an OSError naming it: a full disk
    can cut a write short without an error. Written over the old record, then cut to its
    length, so a write that fails leaves a dead writer's record (`unclean`) non-empty."""
    since = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    data = json.dumps({"pid": os.getpid(), "command": command, "since": since}).encode()
    try:
        written = os.pwrite(fd, data, 0)
        if written == len(data):
            os.ftruncate(fd, written)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    if written != len(data):
        raise OSError(errno.ENOSPC, f"{written} of {len(data)} bytes of the holder record "
                                    f"written", str(path))


def _command() -> str:
    argv = [os.path.basename(sys.argv[0]), *sys.argv[1:3]] if sys.argv and sys.argv[0] else []
    return " ".join(argv) or "python"


class WorkspaceLock:
    """Exclusive, non-blocking writer lock on a workspace directory (a context manager)."""

    def __init__(self, root: str | Path, command: str | None = None):
        self.root = Path(root)
        self.command = command or _command()
        self._key: Path | None = None
        self._token: contextvars.Token[frozenset[Path]] | None = None

    @property
    def held(self) -> bool:
        return self._key is not None

    @property
    def unclean(self) -> bool:
        """The previous holder died holding the lock (its record stayed in the file), and no
        writer of this process has checked what it may have left half-done yet."""
        with _TABLE_LOCK:
            held = _HELD.get(self._key) if self._key is not None else None
            return bool(held and held[2])

    def mark_checked(self) -> None:
        """The log was checked (`HarnessLog.quick_check`): nested writers need not again."""
        with _TABLE_LOCK:
            held = _HELD.get(self._key) if self._key is not None else None
            if held:
                held[2] = 0

    def acquire(self) -> WorkspaceLock:
        """Take the lock or raise `WorkspaceLockedError` at once (never waits)."""
        if self._key is not None:
            raise RuntimeError("WorkspaceLock.acquire called twice on one object")
        if not self.root.is_dir():
            raise WorkspaceError(f"{self.root}: no such workspace directory")
        key = self.root.resolve()
        with _TABLE_LOCK:
            held = _HELD.get(key)
            if held is not None:
                if key not in _MINE.get():
                    raise WorkspaceLockedError(self.root, read_holder(key))
                held[1] += 1
                self._key = key
                return self
            dfd = _lock_directory(key, self.root)
            try:
                fd = _open_lock_file(key / LOCK_FILE, os.O_RDWR | os.O_CREAT)
            except OSError as exc:
                os.close(dfd)
                if exc.errno not in (errno.ELOOP, errno.EINVAL, errno.EISDIR, errno.ENXIO):
                    raise
                raise WorkspaceError(
                    f"{key / LOCK_FILE}: is not a regular file (a symbolic link, a FIFO, a "
                    f"socket, a device or a directory); remove it: it only records who holds "
                    f"the workspace's lock") from None
            except BaseException:
                os.close(dfd)
                raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                os.close(dfd)
                raise WorkspaceLockedError(self.root, read_holder(key)) from None
            except BaseException:
                os.close(fd)
                os.close(dfd)
                raise
            # A holder record left in the file: its writer died without releasing (kill -9,
            # a power cut), so what it wrote may be half-done (`unclean`).
            try:
                unclean = int(bool(os.pread(fd, 4096, 0).strip()))
                _write_record(fd, self.command, key / LOCK_FILE)
            except BaseException:  # a full disk: no descriptor may keep the lock held
                os.close(fd)
                os.close(dfd)
                raise
            _HELD[key] = [fd, 1, unclean, dfd]
            self._key = key
            self._token = _MINE.set(_MINE.get() | {key})
        try:  # the first writer after a kill finds its half-written temp files
            clean_temp_files(key)
        except BaseException:
            self.release()
            raise
        return self

    def release(self) -> None:
        """Release (the outermost release of this process unlocks the file)."""
        key, self._key = self._key, None
        if key is None:
            return
        token, self._token = self._token, None
        if token is not None:
            with contextlib.suppress(ValueError):  # released from another context
                token.var.reset(token)
        with _TABLE_LOCK:
            held = _HELD[key]
            held[1] -= 1
            if held[1] == 0:
                del _HELD[key]
                # A clean release leaves no holder on record (if this fails, on a full or
                # read-only disk, the next writer merely checks the log once more); a writer
                # that never checked what a dead one left keeps a record, so the next does.
                if not held[2]:
                    with contextlib.suppress(OSError):
                        os.ftruncate(held[0], 0)
                fcntl.flock(held[0], fcntl.LOCK_UN)
                os.close(held[0])
                os.close(held[3])  # the directory's lock goes with its descriptor

    def __enter__(self) -> WorkspaceLock:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def workspace_lock(root: str | Path, command: str | None = None) -> WorkspaceLock:
    """``with workspace_lock(ws.root, "step"):`` - hold the writer lock for the block."""
    return WorkspaceLock(root, command)
