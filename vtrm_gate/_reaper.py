"""Child servers (a test's or a benchmark's ``redis-server``, Redis Cluster nodes, a llama
server) stopped however this process ends, so none is left running with its directory.

A normal exit and Ctrl-C (``KeyboardInterrupt`` unwinds the ``with`` blocks) end in `atexit`;
SIGTERM (``timeout``, a CI runner, ``kill``) would end the process at once, skipping both,
so while a child runs and nobody else handles SIGTERM it is turned into a
``KeyboardInterrupt``, like the CLI does: ``with`` blocks and ``finally`` clauses run (a
``TemporaryDirectory`` is removed), then `atexit` stops what is left. The registry is
process-wide on purpose: signals and exit are.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import signal
import threading
from collections.abc import Callable
from types import FrameType

_STOPS: dict[int, Callable[[], None]] = {}
_KEYS = itertools.count(1)
_LOCK = threading.Lock()
_HOOKED: list[bool] = []  # the atexit hook is registered (once)


def stop_at_exit(stop: Callable[[], None]) -> int:
    """Call ``stop()`` when the process exits or is sent SIGTERM, unless `forget` is called
    with the returned key first (the owner stopped its child itself)."""
    with _LOCK:
        key = next(_KEYS)
        _STOPS[key] = stop
        if not _HOOKED:
            _HOOKED.append(True)
            atexit.register(stop_all)
    _sigterm(take=True)
    return key


def forget(key: int | None) -> None:
    """The child of ``key`` was stopped by its owner: nothing left to do at exit (and, with
    no child left, SIGTERM is given back its default)."""
    with _LOCK:
        _STOPS.pop(key or 0, None)
        idle = not _STOPS
    if idle:
        _sigterm(take=False)


def stop_all() -> None:
    """Stop every registered child (the newest first); errors are its owner's to report."""
    with _LOCK:
        stops = [_STOPS.pop(k) for k in sorted(_STOPS, reverse=True)]
    for stop in stops:  # at exit, stop the others whatever one of them raises
        with contextlib.suppress(Exception):
            stop()
    _sigterm(take=False)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _sigterm(take: bool) -> None:
    """Take SIGTERM where it would still end the process at once (its default), or give it
    back; only the main thread may, and a handler someone else set is left alone."""
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGTERM)
    if take and current is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
    elif not take and current is _on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
