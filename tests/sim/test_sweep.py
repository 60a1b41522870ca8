"""Sweeps on an executor (issue 25, item 6): a seeded run gives the same result serially, on
local processes and on a real Dask cluster; local workers end with their parent however it
ends (SIGTERM, SIGKILL: a killed kernel; SIGINT: an interrupt)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from benchmarks.bench_power import Config, engine, run_all
from tests._signals import AT_A_TERMINAL
from vtrm_gate.errors import ConfigError, WorkerLostError
from vtrm_gate.sim import sweep_executor, sweep_map

ROOT = Path(__file__).resolve().parents[2]
TINY = [Config("tiny v3", epochs=1, steps=2),
        Config("tiny old", epochs=1, steps=2, decision_rule="old_blocks", old=True)]
"""Two configurations of one epoch of two steps: a real training run in about a second."""


def _same(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "cpu_s"} for r in rows]  # cpu_s: wall time


@pytest.fixture(scope="module")
def serial_rows() -> list[dict]:
    with engine(jobs=1) as ex:
        assert ex is None
        return run_all(TINY, [0], ex)


@pytest.mark.slow
def test_local_processes_give_the_serial_results_in_order(serial_rows):
    with engine(jobs=2) as ex:
        rows = run_all(TINY, [0], ex)
    assert [(r["config"], r["seed"]) for r in rows] == [("tiny v3", 0), ("tiny old", 0)]
    assert _same(rows) == _same(serial_rows)
    assert rows[0]["wall_h"] != rows[1]["wall_h"]  # the runs differ: a real comparison


@pytest.mark.slow
def test_a_dask_cluster_gives_the_serial_results(serial_rows):
    from dask.distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, \
            engine(scheduler=cluster.scheduler_address) as ex:
        assert type(ex).__module__.startswith("distributed")
        rows = run_all(TINY, [0], ex)
        workers = {w.pid for w in cluster.scheduler.workers.values()}
    assert _same(rows) == _same(serial_rows)
    assert len(workers) == 2 and os.getpid() not in workers


def test_no_scheduler_there_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"--scheduler tcp://127\.0\.0\.1:9: no Dask"), \
            sweep_executor("tcp://127.0.0.1:9", connect_timeout_s=1):
        pass


@pytest.mark.parametrize(("address", "why"), [
    ("nonsense", "missing port number"), ("tcp://h:port", "port"), ("tcp://127.0.0.1", "port")])
def test_a_malformed_scheduler_address_is_refused_at_once_and_cleanly(address, why):
    """``--scheduler nonsense`` named the problem, then the half-made Dask client's
    finaliser waited 20 s at exit and printed a TimeoutError traceback ("Exception ignored
    in Client.__del__"). The address is now checked before a client is made."""
    code = ("from vtrm_gate.sim import sweep_executor\n"
            "from vtrm_gate.errors import ConfigError\n"
            f"try:\n    with sweep_executor({address!r}): pass\n"
            "except ConfigError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert f"--scheduler {address}: not a Dask scheduler address" in out.stdout, out
    # nothing at exit: the finaliser's 20 s wait ended in "Exception ignored ... TimeoutError"
    assert why in out.stdout and out.stderr == "", out.stderr[-2000:]


def test_a_failing_run_cancels_the_rest_and_raises_here():
    with sweep_executor(workers=1) as ex:
        with pytest.raises(ZeroDivisionError):
            sweep_map(_inverse, [1, 0, 2, 4], ex)
        assert sweep_map(_inverse, [1, 2, 4], ex) == [1.0, 0.5, 0.25]  # still usable
    assert sweep_map(_inverse, [2], None) == [0.5]


def _inverse(x: int) -> float:
    return 1 / x


def _slow_inverse(x: int) -> float:
    time.sleep(0.5)
    return 1 / x


@pytest.mark.slow
def test_a_dask_worker_killed_mid_sweep_is_replaced_and_the_results_are_whole():
    """Dask re-runs a killed worker's runs elsewhere: a seeded sweep loses nothing."""
    from dask.distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, \
            sweep_executor(cluster.scheduler_address) as ex:
        victim = next(iter(cluster.scheduler.workers.values())).pid
        threading.Timer(1.2, os.kill, (victim, signal.SIGKILL)).start()
        out = sweep_map(_slow_inverse, list(range(1, 11)), ex)
        assert not _alive(victim)
    assert out == [1 / x for x in range(1, 11)]


def test_a_local_worker_killed_mid_sweep_is_named_not_reported_as_a_bug(
        capfd: pytest.CaptureFixture[str]) -> None:
    """A worker that the out-of-memory killer (or a kill -9) ends mid-sweep broke the pool:
    ``vtrm-gate fit --jobs 2`` printed a traceback, "this is a bug in vtrm_gate", and a
    second traceback from the pool's own thread (a future cancelled as it was failed)."""
    def kill_a_worker() -> None:
        while not (workers := multiprocessing.active_children()):
            time.sleep(0.05)
        time.sleep(0.5)  # a run under way
        os.kill(workers[0].pid, signal.SIGKILL)

    with sweep_executor(workers=2) as ex:
        threading.Thread(target=kill_a_worker, daemon=True).start()
        with pytest.raises(WorkerLostError, match=r"a worker process .* ended abruptly") as lost:
            sweep_map(time.sleep, [30.0] * 4, ex)
    assert lost.value.exit_code == 3 and "fewer" in str(lost.value)
    assert "InvalidStateError" not in capfd.readouterr().err


_CHILD = textwrap.dedent("""
    import os, sys, time
    from vtrm_gate.sim import sweep_executor, sweep_map

    def hold(path):
        open(path, "w").write(str(os.getpid()))
        time.sleep(120)

    if __name__ == "__main__":
        d = sys.argv[1]
        with sweep_executor(workers=2) as ex:
            sweep_map(hold, [f"{d}/w{i}" for i in range(4)], ex)
""")


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper is dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT])
def test_local_workers_end_with_their_parent(tmp_path, sig):
    """Two workers hold a task each; the parent gets ``sig``; then neither worker runs (a
    plain ProcessPoolExecutor's workers lived on after SIGTERM/SIGKILL, until the timeout)."""
    script = tmp_path / "child.py"
    script.write_text(AT_A_TERMINAL + _CHILD)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env)
    pids: set[int] = set()
    try:
        # no wall-clock bound (a loaded machine starts workers late): the parent must stay up
        # until both run; a hang is pytest's timeout
        while len(list(tmp_path.glob("w*"))) < 2 or any(
                not p.read_text() for p in tmp_path.glob("w*")):
            assert child.poll() is None, "the parent ended before its workers ran"
            time.sleep(0.1)
        pids = {int(p.read_text()) for p in tmp_path.glob("w*")}
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        child.send_signal(sig)
        child.wait(30)
        # the property, not a time: every worker ends once its parent has (a worker that
        # outlives it keeps this loop going until pytest's timeout names the test)
        while [p for p in pids if _alive(p)]:
            time.sleep(0.1)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for p in pids:  # never leave a worker behind, even when the test fails
            if _alive(p):
                os.kill(p, signal.SIGKILL)


_WORKERS = f"workers must be an integer from 1 to 256 (this machine has {os.cpu_count()} cores)"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"workers": "2"}, f"{_WORKERS}, got '2'"),
    ({"workers": 2.5}, f"{_WORKERS}, got 2.5"),
    ({"workers": 0}, f"{_WORKERS}, got 0"),
    ({"workers": 10**9}, f"{_WORKERS}, got 1000000000"),  # started until the pool's limit
    ({"scheduler": ""}, "scheduler must be a Dask scheduler address (tcp://HOST:PORT) or None, "
                        "got ''"),
    ({"scheduler": 8786}, "scheduler must be a Dask scheduler address"),
])
def test_sweep_executor_settings_are_refused_naming_them(kwargs, message):
    """``workers="2"`` was a TypeError from a comparison; ``scheduler=""`` quietly gave local
    processes instead of the cluster the caller meant."""
    match = message.replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(ConfigError, match=match), sweep_executor(**kwargs):
        pass
