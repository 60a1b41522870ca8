"""One writer per workspace: the lock wired into every writer, readers without it, leftovers
of a killed writer cleaned on the next writer's open. Real processes throughout."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from vtrm_gate.harness import (
    HarnessLog,
    Workspace,
    WorkspaceLockedError,
    read_holder,
    run_step,
    settle_probation,
    workspace_lock,
)
from vtrm_gate.sim import SimConfig, init_simulated, run_virtual, simulated_backend

ROOT = Path(__file__).resolve().parents[2]

HOLD = textwrap.dedent("""
    import sys, time
    from vtrm_gate.harness import workspace_lock
    with workspace_lock(sys.argv[1], "holder-test"):
        print("locked", flush=True)
        time.sleep(120)
""")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vtrm_gate", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=240, env={**os.environ, **(env or {})})


def cli_popen(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "vtrm_gate", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def hold(root: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(root)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "locked"
    return p


def stop(p: subprocess.Popen[str]) -> None:
    p.kill()
    p.communicate()


def wait_for_holder(root: Path, pid: int, proc: subprocess.Popen[str]) -> None:
    """Poll until ``pid`` holds the lock (fails if the process exits first)."""
    for _ in range(6000):
        holder = read_holder(root)
        if holder is not None and holder.pid == pid:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    raise AssertionError("the step never took the lock")


def small_ws(root: Path, seed: int = 3) -> Path:
    init_simulated(root, SimConfig(seed=seed,
                                   pool_sizes={"Action Reasoning": 40, "OCR Problems": 30},
                                   effects={"Action Reasoning": "helpful",
                                            "OCR Problems": "neutral"})).close()
    return root


def report_steps(root: Path) -> list[tuple[int, int]]:
    with HarnessLog(root / "harness.sqlite") as log:
        return [tuple(r) for r in log.query(
            "SELECT DISTINCT epoch, step FROM step_report ORDER BY epoch, step")]


def test_two_step_processes_the_second_exits_2_naming_the_first(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    assert cli("init", str(ws), "--seed", "3").returncode == 0
    first = cli_popen("step", "--workspace", str(ws), "--epoch", "1", "--step", "1",
                      "--time-scale", "0.002", "--json")
    try:
        wait_for_holder(ws, first.pid, first)
        second = cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "2")
        assert second.returncode == 2, second.stderr
        assert len(second.stderr.strip().splitlines()) == 1 and "Traceback" not in second.stderr
        assert f"locked by pid {first.pid} (vtrm-gate step e1 s1) since " in second.stderr
        out, err = first.communicate(timeout=240)
    finally:
        if first.poll() is None:
            stop(first)
    assert first.returncode == 0, err
    state = json.loads((ws / "state.json").read_text())
    assert state["steps_applied"] == 1 and state["last_step"] == [1, 1]
    assert report_steps(ws) == [(1, 1)]
    applied = {t["task_type"]: t["applied"] for t in json.loads(out)["types"]}
    with HarnessLog(ws / "harness.sqlite") as log:
        assert dict(log.query("SELECT task_type, applied FROM step_report")) == applied
    # the lock went with the first process: step 2 now runs and moves the state on
    assert cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "2").returncode == 0
    assert json.loads((ws / "state.json").read_text())["steps_applied"] == 2
    assert report_steps(ws) == [(1, 1), (1, 2)]


def test_library_writers_are_refused_while_another_process_holds_the_lock(
        tmp_path: Path) -> None:
    root = small_ws(tmp_path / "ws")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != ".lock"}
    holder = hold(root)
    try:
        backend = simulated_backend(root)
        with pytest.raises(WorkspaceLockedError, match=f"pid {holder.pid} \\(holder-test\\)"):
            run_virtual(run_step(root, 1, 1, infer=backend.infer, evolver=backend.evolver,
                                 cases=backend.cases))
        ws = Workspace.open(root)  # readers need no lock
        try:
            with pytest.raises(WorkspaceLockedError):
                run_virtual(run_step(ws, 1, 1, infer=backend.infer, evolver=backend.evolver,
                                     cases=backend.cases))
            with pytest.raises(WorkspaceLockedError):
                run_virtual(settle_probation(ws, 1, infer=backend.infer))
        finally:
            ws.close()
    finally:
        stop(holder)
    after = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before


def test_a_workspace_object_opened_before_another_writer_steps_reads_the_new_state(
        tmp_path: Path) -> None:
    root = small_ws(tmp_path / "ws")
    stale = Workspace.open(root)  # opened before the other process's step
    try:
        assert cli("step", "--workspace", str(root), "--epoch", "1", "--step", "1"
                   ).returncode == 0
        backend = simulated_backend(root)
        run_virtual(run_step(stale, 1, 2, infer=backend.infer, evolver=backend.evolver,
                             cases=backend.cases))
    finally:
        stale.close()
    state = json.loads((root / "state.json").read_text())
    assert state["steps_applied"] == 2 and state["before_last"]["steps_applied"] == 1


def test_readers_need_no_lock(tmp_path: Path) -> None:
    root = small_ws(tmp_path / "ws")
    assert cli("step", "--workspace", str(root), "--epoch", "1", "--step", "1").returncode == 0
    holder = hold(root)
    try:
        r = cli("replay", "--workspace", str(root), "--epoch", "1", "--step", "1", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["types"]
    finally:
        stop(holder)


def test_init_into_a_locked_empty_directory_exits_2(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    holder = hold(root)
    try:
        r = cli("init", str(root))
        assert r.returncode == 2 and f"locked by pid {holder.pid}" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    finally:
        stop(holder)
    assert sorted(p.name for p in root.iterdir()) == [".lock"]


def test_temp_files_of_a_killed_writer_are_removed_by_the_next_writer(tmp_path: Path) -> None:
    root = small_ws(tmp_path / "ws")
    leftovers = [root / ".state.json.tmp-999999", root / "history" / ".v2.md.tmp-12345",
                 root / "skills" / ".ocr-problems.md.tmp-4242",
                 # the names temp_sibling makes (PID and a random suffix), never matched
                 root / ".state.json.tmp-999999-1a2b3c4d",
                 root / "manifests" / ".e1_s1.json.tmp-4242-deadbeef"]
    for p in leftovers:
        p.write_text("half a checkpoint")
    keep = root / "notes.tmp-1"  # not an atomic_write temp name
    keep.write_text("mine")
    r = cli("replay", "--workspace", str(root), "--epoch", "1", "--step", "1")
    assert r.returncode == 2 and all(p.exists() for p in leftovers)  # a reader leaves them
    assert cli("step", "--workspace", str(root), "--epoch", "1", "--step", "1").returncode == 0
    assert not any(p.exists() for p in leftovers)
    assert keep.read_text() == "mine"
    assert not list(root.rglob(".*.tmp-*"))


def test_a_write_that_fails_leaves_no_temp_file(tmp_path: Path) -> None:
    """A full disk mid-write left ``.state.json.tmp-PID-XXXXXXXX`` behind for good."""
    from vtrm_gate.harness._files import atomic_write

    target = tmp_path / "state.json"
    with pytest.raises(UnicodeEncodeError):  # as ENOSPC would: the write itself raises
        atomic_write(target, "x" * 10 + "\udcff")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_second_task_of_one_process_is_refused_while_the_first_writes(tmp_path: Path) -> None:
    """The lock was re-entrant per process: a notebook's background ``train`` task and a cell's
    ``step_workspace`` of the same step both ran it, every call twice (one writer at a time,
    SPEC). Calls nested in the writer's own task (train → step) stay re-entrant, and so does
    a blocking call made while holding the lock (its loop runs in a worker thread)."""
    root = small_ws(tmp_path / "ws")
    backend = simulated_backend(root)

    def step(s: int):
        return run_step(root, 1, s, infer=backend.infer, evolver=backend.evolver,
                        cases=backend.cases)

    async def two_writers() -> str:
        first = asyncio.create_task(step(1))
        await asyncio.sleep(60)  # virtual seconds: the first is mid-step
        assert not first.done()
        try:
            await step(1)
        except WorkspaceLockedError as exc:
            refusal = str(exc)
        else:
            refusal = "not refused"
        await first
        return refusal

    refusal = run_virtual(two_writers())
    assert re.fullmatch(rf"{re.escape(str(root))}: workspace is locked by another task of "
                        rf"this process \(.+ since 20\d\d-.+\); await it or cancel it "
                        rf"first \(readers such as replay and cache stats need no lock\)",
                        refusal), refusal
    assert report_steps(root) == [(1, 1)]
    with workspace_lock(root, "cell"):  # held by this thread; the step runs in another
        run_virtual(step(2))
    assert json.loads((root / "state.json").read_text())["steps_applied"] == 2
    assert read_holder(root) is None


def test_a_write_the_disk_refuses_names_its_file(tmp_path: Path) -> None:
    """A full disk while state.json was written said only "No space left on device" (a
    file's write names no file)."""
    root = small_ws(tmp_path / "ws")
    code = textwrap.dedent(f"""
        import resource, sys
        from pathlib import Path
        from vtrm_gate.harness._files import atomic_write
        resource.setrlimit(resource.RLIMIT_FSIZE, (8, 8))  # EFBIG past 8 bytes, as ENOSPC
        try:
            atomic_write(Path({str(root / 'state.json')!r}), "x" * 100)
        except OSError as exc:
            print(exc.filename)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.stdout.split() == [str(root / "state.json")], r
