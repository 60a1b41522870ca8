"""SIGTERM of a running `vtrm-gate step` behaves like Ctrl-C: the gate is cancelled, its rows
marked ``aborted``, nothing applied or half-written, exit 130; a re-run then completes. Also
when the step was started with SIGINT ignored (``vtrm-gate step ... &`` in a script, where
the shell ignores SIGINT for background jobs, or a supervisor that does the same): it must
not run on to the end."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_cli import ROOT, cli


def _ignore_sigint() -> None:  # what bash does to an asynchronous command without job control
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _predictions(ws: Path) -> int:
    try:
        with sqlite3.connect(f"file:{ws / 'harness.sqlite'}?mode=ro", uri=True) as con:
            return con.execute("SELECT count(*) FROM predictions").fetchone()[0]
    except sqlite3.Error:
        return 0


@pytest.mark.parametrize(("sig", "sigint"), [(signal.SIGTERM, "default"),
                                             (signal.SIGTERM, "ignored"),
                                             (signal.SIGHUP, "default")])
def test_sigterm_of_a_step_is_like_sigint(tmp_path: Path, sig: int, sigint: str) -> None:
    """SIGHUP (the ssh session dropped, the terminal closed) ended the process with no word,
    its lock record stale and an embedded redis-server left running: it is a SIGTERM."""
    ws = tmp_path / "ws"
    assert cli("init", str(ws), "--seed", "3").returncode == 0
    state = (ws / "state.json").read_bytes()
    step = subprocess.Popen(
        [sys.executable, "-m", "vtrm_gate", "step", "--workspace", str(ws), "--epoch", "1",
         "--step", "1", "--time-scale", "0.005"], cwd=ROOT, text=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        preexec_fn=_ignore_sigint if sigint == "ignored" else None)
    for _ in range(20000):  # until the gate has results (Phase C runs)
        if _predictions(ws) > 0 or step.poll() is not None:
            break
        threading.Event().wait(0.01)
    assert step.poll() is None
    step.send_signal(sig)
    try:
        _, err = step.communicate(timeout=120)  # the gate alone takes ~18 s at this scale
    except subprocess.TimeoutExpired:
        step.kill()
        step.communicate()
        raise AssertionError("SIGTERM was ignored: the step ran on") from None
    assert step.returncode == 130, err[-2000:]
    assert "interrupted; run the same command again to resume" in err
    assert "Traceback" not in err
    with sqlite3.connect(ws / "harness.sqlite") as con:
        statuses = set(dict(con.execute("SELECT task_type, status FROM step_report")).values())
        applied = con.execute("SELECT count(*) FROM step_report WHERE applied IS NOT NULL"
                              ).fetchone()[0]
    assert "aborted" in statuses
    assert statuses <= {"aborted", "no_cases", "skipped", "evolve_error"}  # none gated
    assert applied == 0
    assert (ws / "state.json").read_bytes() == state
    assert not list(ws.rglob(".*.tmp-*"))
    assert cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "1").returncode == 0


@pytest.mark.parametrize("command", [["options", "--workspace", "no-such-ws"],
                                     ["init", "--seed", "1"]])
def test_main_called_from_python_restores_the_signal_handlers(tmp_path: Path,
                                                              command: list[str]) -> None:
    # Issue 27 row 8: main() replaced the process's SIGTERM handler for good (and SIGINT's,
    # when it was ignored). Whatever the command's outcome (exit 2 or 0), both come back.
    from vtrm_gate.cli import main

    def mine(signum: int, frame: object) -> None:
        raise AssertionError("not called")

    saved = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGTERM, mine)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        argv = command if command[0] != "init" else ["init", str(tmp_path / "ws"), *command[1:]]
        assert main(argv) == (2 if command[0] == "options" else 0)
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, saved[0])
        signal.signal(signal.SIGINT, saved[1])


def test_an_interrupt_wrapped_in_another_error_is_an_interrupt(capsys) -> None:
    """A SIGTERM landing while a module was imported surfaced as "RuntimeError: Error calling
    __set_name__ on 'Field' instance 'types' in 'World'" (its cause the KeyboardInterrupt):
    a traceback, "this is a bug", exit 1. It is an interruption: exit 130, one line."""
    import argparse

    from vtrm_gate.cli._main import _run

    def imports_while_interrupted(args: argparse.Namespace) -> int:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise RuntimeError("Error calling __set_name__ on 'Field' instance") from exc

    args = argparse.Namespace(func=imports_while_interrupted, command="train")
    assert _run(args, False) == 130
    err = capsys.readouterr().err
    assert "interrupted; run the same command again to resume" in err and "Traceback" not in err
