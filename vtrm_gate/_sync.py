"""The one bridge from sync to async: run a coroutine from a script or a Jupyter cell.

An interrupt (Ctrl-C, Jupyter's Stop button) stops the work in both: as in `asyncio.run`, the
coroutine's task is cancelled, runs its cleanup, and the call raises `KeyboardInterrupt`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

T = TypeVar("T")

POLL_S = 0.05
"""How often a thread waiting on another wakes to run signal handlers (an interrupt)."""


def run_sync(coro: Coroutine[Any, Any, T],
             loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None) -> T:
    """Run ``coro`` to completion, whether or not an event loop is already running.

    In a script: an `asyncio.Runner` (on ``loop_factory``'s loop if given). Inside a running
    loop (a Jupyter kernel): with no ``loop_factory``, nest-asyncio lets the running loop be
    re-entered, so the call blocks the cell and returns the result; with one, its loop runs in
    a worker thread while the cell waits.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(coro)
    if loop_factory is not None:
        return _run_in_thread(coro, loop_factory)
    return _run_nested(coro, loop)


def _run_nested(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> T:
    """Re-enter the running loop until ``coro`` ends; an interrupt cancels it first."""
    import nest_asyncio

    batch = _unpatched_batch(loop)
    nest_asyncio.apply(loop)
    task = loop.create_task(coro)
    with _interrupt_cancels(lambda: loop.call_soon_threadsafe(task.cancel)) as interrupted:
        try:
            return loop.run_until_complete(task)
        except asyncio.CancelledError:
            if interrupted():
                raise KeyboardInterrupt from None
            raise
        except BaseException:  # an interrupt our handler did not see: stop the work all the same
            if not task.done():
                task.cancel()
                with suppress(BaseException):
                    loop.run_until_complete(task)
            raise
        finally:
            _pad_batch(loop, batch)


def _unpatched_batch(loop: asyncio.AbstractEventLoop) -> int:
    """How many ready callbacks the loop's current pass may still pop, if that pass runs
    asyncio's own ``_run_once`` (nest-asyncio not applied yet): it counted them before this
    callback ran and pops them without looking, so a nested run that runs them first would
    leave it popping an empty queue (IndexError in asyncio, the outer run dead)."""
    if getattr(loop, "_nest_patched", False):
        return 0
    return len(getattr(loop, "_ready", ()))


def _pad_batch(loop: asyncio.AbstractEventLoop, batch: int) -> None:
    """Make the unpatched pass find as many callbacks as it may still pop (no-ops)."""
    for _ in range(batch - len(getattr(loop, "_ready", ()))):
        loop.call_soon(_nothing)


def _nothing() -> None:
    """A ready callback that does nothing (`_pad_batch`)."""


def _run_in_thread(coro: Coroutine[Any, Any, T],
                   loop_factory: Callable[[], asyncio.AbstractEventLoop]) -> T:
    """Run ``coro`` on a new loop in a worker thread; an interrupt of the waiting thread
    cancels it there, waits for its cleanup, then raises."""
    started = concurrent.futures.Future[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]]()

    async def tracked() -> T:
        started.set_result((asyncio.get_running_loop(), asyncio.current_task()))  # type: ignore[arg-type]  # inside a task, current_task() is never None
        return await coro

    def run() -> T:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(tracked())

    pool = concurrent.futures.ThreadPoolExecutor(1)
    done = pool.submit(contextvars.copy_context().run, run)  # on the caller's behalf
    try:
        _wait_interruptibly(done)
        return done.result()
    except KeyboardInterrupt:
        _wait_interruptibly(started, done)
        if started.done() and not done.done():
            other, task = started.result()
            other.call_soon_threadsafe(task.cancel)
            _wait_interruptibly(done)
        raise
    finally:
        pool.shutdown(wait=False)


def _wait_interruptibly(*futures: concurrent.futures.Future[Any]) -> None:
    """Wait until one of ``futures`` is done, waking every `POLL_S`: a signal sent to the
    process (an interrupt, from Jupyter too) may land on any thread, and the main thread runs
    its handler only between waits, never inside one."""
    while not concurrent.futures.wait(futures, timeout=POLL_S,
                                      return_when=concurrent.futures.FIRST_COMPLETED).done:
        pass


@contextmanager
def _interrupt_cancels(cancel: Callable[[], object]) -> Iterator[Callable[[], bool]]:
    """While a nested run blocks the main thread, the first SIGINT calls ``cancel`` instead of
    raising wherever it lands (inside one of the run's tasks it would orphan the rest); a
    second raises `KeyboardInterrupt` at once. Yields whether an interrupt came."""
    hits: list[int] = []
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield lambda: False
        return

    def on_sigint(signum: int, frame: object) -> None:
        hits.append(signum)
        if len(hits) > 1:
            raise KeyboardInterrupt
        cancel()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield lambda: bool(hits)
    finally:
        signal.signal(signal.SIGINT, previous)
