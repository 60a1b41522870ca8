"""Sweeps of independent seeded runs on a `concurrent.futures` executor: local processes
(every core by default) tied to this process's life, or a Dask distributed cluster.

A run is a pure function of its arguments (seeded), so where it runs never changes its
result: `sweep_map` returns results in the order of its items, whatever the engine.

Local workers end with the process that started them: SIGTERM or SIGKILL of the parent (a
timeout, a killed notebook kernel) reaches them through ``PR_SET_PDEATHSIG`` on Linux and,
everywhere, a watcher thread that sees the worker re-parented; an interrupt (SIGINT, Ctrl-C)
cancels what is queued and ends the workers before it propagates.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import BrokenExecutor, Executor, Future, ProcessPoolExecutor
from typing import Any, TypeVar

from .._env import MAX_WORKERS
from ..errors import ConfigError, WorkerLostError, described, is_whole, shown

T = TypeVar("T")
R = TypeVar("R")

_PR_SET_PDEATHSIG = 1
_WATCH_S = 0.25
DASK_EXTRA = "pip install 'vtrm_gate[dask]'"


def local_workers() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _end_with_parent(parent: int) -> None:
    """Worker initializer: die with the pool's parent (pid ``parent``), leave interrupts to
    it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:  # the parent died before the prctl
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True,
                     name="vtrm-sweep-parent-watch").start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_WATCH_S)
    os._exit(1)


def _local_pool(workers: int) -> ProcessPoolExecutor:
    """Spawned workers: a fork of a process with threads (a notebook kernel, an asyncio run
    that used its default executor) can inherit a held lock and hang, and a forkserver's
    workers are not our children. So a run's function must be importable (not a notebook's)."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_end_with_parent, initargs=(os.getpid(),))


def _end_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel what is queued and kill the running workers (the run is abandoned)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # shutdown drops it
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        with contextlib.suppress(OSError, ValueError):
            p.kill()
    for p in procs:
        with contextlib.suppress(OSError, ValueError, AssertionError):
            p.join(5)


@contextlib.contextmanager
def _dask_executor(scheduler: str, timeout_s: float) -> Iterator[Executor]:
    try:
        distributed = importlib.import_module("distributed")
    except ImportError:
        raise ConfigError(f"--scheduler {scheduler}: Dask is not installed "
                          f"({DASK_EXTRA})") from None
    try:  # before a client is made: a failed one's finaliser waits 20 s at exit, and says so
        scheme, where = distributed.comm.parse_address(scheduler)
        if scheme in ("tcp", "tls"):
            distributed.comm.addressing.parse_host_port(where)
    except ValueError as e:
        raise ConfigError(f"--scheduler {scheduler}: not a Dask scheduler address, "
                          f"tcp://HOST:PORT ({e})") from None
    try:
        client = distributed.Client(scheduler, timeout=f"{timeout_s}s", set_as_default=False)
    except (OSError, TimeoutError, ValueError) as e:
        raise ConfigError(f"--scheduler {scheduler}: no Dask scheduler answers there "
                          f"({described(e)})") from None
    try:
        yield client.get_executor()
    finally:
        client.close()


@contextlib.contextmanager
def sweep_executor(scheduler: str | None = None, workers: int | None = None, *,
                   connect_timeout_s: float = 10.0) -> Iterator[Executor]:
    """An executor for `sweep_map`: the Dask cluster at ``scheduler`` (``tcp://HOST:PORT``;
    its workers must import the run's module) or ``workers`` local processes (default:
    every core) that end with this process."""
    if scheduler is not None and not (isinstance(scheduler, str) and scheduler.strip()):
        raise ConfigError(f"scheduler must be a Dask scheduler address (tcp://HOST:PORT) or "
                          f"None, got {shown(scheduler)}")
    if workers is not None and not (is_whole(workers) and 1 <= workers <= MAX_WORKERS):
        raise ConfigError(f"workers must be an integer from 1 to {MAX_WORKERS} (this machine "
                          f"has {os.cpu_count()} cores), got {shown(workers)}")
    if scheduler:
        with _dask_executor(scheduler, connect_timeout_s) as ex:
            yield ex
        return
    n = local_workers() if workers is None else workers
    pool = _local_pool(n)
    try:
        yield pool
    except BaseException:
        _end_workers(pool)
        raise
    pool.shutdown(wait=True)


def sweep_map(fn: Callable[[T], R], items: Iterable[T], executor: Executor | None = None
              ) -> list[R]:
    """``[fn(x) for x in items]`` on ``executor`` (None: here, serially), in item order; on
    the first failure or an interrupt, what has not started is cancelled."""
    work = list(items)
    if executor is None:
        return [fn(x) for x in work]
    futures: list[Future[Any]] = [executor.submit(fn, x) for x in work]
    try:
        return [f.result() for f in futures]
    except BrokenExecutor as exc:  # the pool itself failed every future: nothing to cancel
        raise WorkerLostError(
            f"a worker process of the sweep ended abruptly (killed by a signal, or by the "
            f"out-of-memory killer: see dmesg) before its run returned; nothing was kept: "
            f"run it again, with fewer workers if memory ran short ({exc})") from None
    except BaseException:
        for f in futures:
            f.cancel()
        raise
