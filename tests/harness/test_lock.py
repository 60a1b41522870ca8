"""The workspace writer lock: exclusive across processes, released by the kernel on death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vtrm_gate.errors import WorkspaceError, WorkspaceLockedError
from vtrm_gate.harness import read_holder, workspace_lock

HOLD = textwrap.dedent("""
    import sys, time
    from vtrm_gate.harness import workspace_lock
    with workspace_lock(sys.argv[1], "holder-test"):
        print("locked", flush=True)
        time.sleep(60)
""")


def _hold(root: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(root)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "locked"
    return p


def test_second_writer_is_refused_naming_the_holder(tmp_path: Path) -> None:
    p = _hold(tmp_path)
    try:
        with pytest.raises(WorkspaceLockedError) as info, workspace_lock(tmp_path, "me"):
            pass
        assert info.value.holder is not None
        assert info.value.holder.pid == p.pid
        assert f"pid {p.pid} (holder-test)" in str(info.value)
    finally:
        p.kill()
        p.wait()


def test_a_deleted_lock_file_lets_no_second_writer_in(tmp_path: Path) -> None:
    """Hostile pass (h24): ``rm ws/.lock`` while a step ran let a second ``step --force`` in
    beside it (its flock was on a new file): both wrote, 8 duplicate prediction rows."""
    p = _hold(tmp_path)
    try:
        (tmp_path / ".lock").unlink()
        with pytest.raises(WorkspaceLockedError), workspace_lock(tmp_path, "me"):
            pass
    finally:
        p.kill()
        p.wait()
    with workspace_lock(tmp_path, "after") as lock:  # released with its holder, as before
        assert lock.held


def test_kill_9_releases_the_lock(tmp_path: Path) -> None:
    p = _hold(tmp_path)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert read_holder(tmp_path) is None
    with workspace_lock(tmp_path, "after") as lock:
        assert lock.held
        assert read_holder(tmp_path) is not None


def test_reentrant_in_one_process_and_released_by_the_outermost(tmp_path: Path) -> None:
    with workspace_lock(tmp_path, "outer"):
        with workspace_lock(tmp_path, "inner"):
            pass
        holder = read_holder(tmp_path)
        assert holder is not None and holder.command == "outer"
    assert read_holder(tmp_path) is None


FULL = textwrap.dedent("""
    import resource, signal, sys
    from vtrm_gate.harness import read_holder, workspace_lock
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, as on a full disk
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    for limit in (0, 20):
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
        try:
            with workspace_lock(sys.argv[1], "full-disk"):
                print(limit, "taken", flush=True)
        except OSError as exc:
            print(limit, "refused", exc.errno, exc.filename, flush=True)
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        with workspace_lock(sys.argv[1], "after") as lock:  # not held by a leaked descriptor
            print(limit, "after", read_holder(sys.argv[1]).command, flush=True)
""")


def test_a_lock_record_that_cannot_be_written_whole_is_an_error_and_leaks_no_lock(
        tmp_path: Path) -> None:
    """A full disk (here a file-size limit) when the holder record is written: at 0 bytes the
    write's OSError left the lock's descriptors open, so the process (a notebook's kernel) held
    its own workspace locked until it ended; at 20 bytes the record was cut short without a
    word. Both are an OSError naming the lock file, and the lock is released."""
    r = subprocess.run([sys.executable, "-c", FULL, str(tmp_path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lock = str(tmp_path / ".lock")
    assert r.stdout.splitlines() == [f"0 refused 27 {lock}", "0 after after",
                                     f"20 refused 28 {lock}", "20 after after"]



DEAD = textwrap.dedent("""
    import resource, signal, sys
    from vtrm_gate.harness import workspace_lock
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
    try:
        workspace_lock(sys.argv[1], "full-disk").acquire()
    except OSError:
        pass
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    with workspace_lock(sys.argv[1], "after") as lock:
        print("unclean", lock.unclean, flush=True)
""")


def test_a_dead_writers_record_survives_a_record_that_cannot_be_written(tmp_path: Path) -> None:
    """The record was truncated before the new one was written: a write that then failed
    (a full disk) left an empty file, and the next writer took a killed writer's half-done
    work for a clean release."""
    (tmp_path / ".lock").write_text('{"pid": 1, "command": "killed step", "since": "x"}')
    r = subprocess.run([sys.executable, "-c", DEAD, str(tmp_path)], capture_output=True,
                       text=True, timeout=60)
    assert r.stdout.splitlines() == ["unclean True"], (r.stdout, r.stderr)


@pytest.mark.parametrize("kind", ["fifo", "device", "symlink out", "directory", "socket"])
def test_a_lock_file_that_is_no_regular_file_is_refused_and_nothing_outside_changes(
        tmp_path: Path, kind: str) -> None:
    """Hostile pass (h11): ``.lock`` as a FIFO hung ``status`` (its holder was read with a
    blocking open) and crashed ``settle`` ("Illegal seek"); a symlink to /dev/zero crashed
    it; a symlink to a file outside the workspace had that file overwritten with the record,
    then emptied at release. Each is refused naming ``.lock``; readers see no holder."""
    ws, victim = tmp_path / "ws", tmp_path / "victim.txt"
    ws.mkdir()
    victim.write_text("precious\n")
    lock = ws / ".lock"
    {"fifo": lambda: os.mkfifo(lock), "device": lambda: lock.symlink_to("/dev/zero"),
     "symlink out": lambda: lock.symlink_to(victim), "directory": lock.mkdir,
     "socket": lambda: _socket_file(lock)}[kind]()
    r = subprocess.run([sys.executable, "-c", "import sys; from vtrm_gate.harness import "
                        "read_holder; print(read_holder(sys.argv[1]))", str(ws)],
                       capture_output=True, text=True, timeout=10)
    assert r.stdout.strip() == "None", r.stderr
    with pytest.raises(WorkspaceError, match=r"\.lock: is not a regular file"), \
            workspace_lock(ws, "me"):
        pass
    assert victim.read_text() == "precious\n"
    with workspace_lock(ws.parent, "after") as held:  # no descriptor leaked, nothing held
        assert held.held


def _socket_file(path: Path) -> None:
    import socket

    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()


def test_a_writer_that_never_checked_keeps_the_dead_writers_mark(tmp_path: Path) -> None:
    """Hostile pass (h11): a writer refused before it checked the log (``step`` of a settled
    epoch) emptied the record at release, and the next writer skipped the check a dead
    writer had made necessary. The record stays until a writer has checked."""
    (tmp_path / ".lock").write_text('{"pid": 1, "command": "killed step", "since": "x"}')
    with workspace_lock(tmp_path, "refused early") as first:
        assert first.unclean
    with workspace_lock(tmp_path, "next") as second:
        assert second.unclean
        second.mark_checked()
    with workspace_lock(tmp_path, "after the check") as third:
        assert not third.unclean
