"""The one bridge from sync to async: run a coroutine from a script or a Jupyter cell."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion, whether or not an event loop is already running.

    In a script: `asyncio.run`. Inside a running loop (a Jupyter kernel): nest-asyncio lets
    the running loop be re-entered, so the call blocks the cell and returns the result.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import nest_asyncio

    nest_asyncio.apply(loop)
    return loop.run_until_complete(coro)
