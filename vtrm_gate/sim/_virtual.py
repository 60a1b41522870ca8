"""The virtual clock: `run_virtual` runs a coroutine on a looptime loop whose clock jumps over
sleeps, so a multi-hour gate step replays in seconds and its makespan (``loop.time()``) is
exact.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a looptime loop: sleeps cost no wall time, loop.time() is simulated.

    Inside an already running loop (a Jupyter cell) the virtual loop runs in a worker thread.
    """
    import looptime

    def run() -> T:
        with asyncio.Runner(loop_factory=looptime.new_event_loop) as runner:
            return runner.run(coro)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()



