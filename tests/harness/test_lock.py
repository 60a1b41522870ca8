"""The workspace writer lock: exclusive across processes, released by the kernel on death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vtrm_gate.errors import WorkspaceLockedError
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
