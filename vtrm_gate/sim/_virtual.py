"""The virtual clock: `run_virtual` runs a coroutine on a looptime loop whose clock jumps over
sleeps, so a multi-hour gate step replays in seconds and its makespan (``loop.time()``) is
exact.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

from .._sync import run_sync

T = TypeVar("T")


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a looptime loop: sleeps cost no wall time, loop.time() is simulated.

    Inside an already running loop (a Jupyter cell) the virtual loop runs in a worker thread;
    an interrupt stops it there.
    """
    import looptime

    return run_sync(coro, loop_factory=looptime.new_event_loop)



