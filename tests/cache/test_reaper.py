"""Issue 27 row 17: a ``redis-server`` a script, test or benchmark starts is stopped when that
process is sent SIGTERM (``timeout 60 python -m benchmarks.bench_cache`` left it running
under PID 1, with its temporary directory) or SIGINT, and leaves no directory behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._signals import AT_A_TERMINAL

ROOT = Path(__file__).resolve().parents[2]

IN_A_TEMPORARY_DIRECTORY = """
import sys, tempfile, time
from vtrm_gate.cache import RedisServer
with tempfile.TemporaryDirectory() as d, RedisServer(d, persist=False) as server:
    print(server.pid, d, flush=True)
    time.sleep(600)
"""

STARTED_BARE = """
import sys, time
from vtrm_gate.cache import RedisServer
server = RedisServer(sys.argv[1], persist=False).start()
print(server.pid, sys.argv[1], flush=True)
time.sleep(600)
"""


def _gone(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _run_and_signal(script: str, sig: int, *args: str) -> tuple[int, Path, int]:
    proc = subprocess.Popen([sys.executable, "-c", AT_A_TERMINAL + script, *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        pid_text, directory = proc.stdout.readline().split()
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return int(pid_text), Path(directory), code


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_script_stops_its_server_and_removes_its_directory(sig: int) -> None:
    pid, directory, code = _run_and_signal(IN_A_TEMPORARY_DIRECTORY, sig)
    assert code != 0  # it was interrupted, not finished
    assert _gone(pid), f"redis-server {pid} outlived its parent"
    assert not directory.exists(), sorted(directory.rglob("*"))


def test_a_server_started_without_with_is_stopped_at_sigterm(tmp_path: Path) -> None:
    pid, directory, _code = _run_and_signal(STARTED_BARE, signal.SIGTERM,
                                            str(tmp_path / "redis"))
    assert _gone(pid), f"redis-server {pid} outlived its parent"
    assert not (directory / "redis.sock").exists()


GIVEN_BACK = """
import signal, sys
from vtrm_gate.cache import RedisServer
assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
with RedisServer(sys.argv[1], persist=False):
    taken = signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
print(taken, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
"""


def test_the_sigterm_handler_is_given_back_when_no_server_runs(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", GIVEN_BACK, str(tmp_path / "r")], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True"]
