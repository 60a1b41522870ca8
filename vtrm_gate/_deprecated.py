"""Deprecation shims for modules that moved in 0.2 (kept for one release)."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def forwarder(old: str, where: Mapping[str, str], default: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the moved module ``old``: each name resolves from its new
    home (``where[name]``: ``module`` or ``module:new_name``; else ``default``) with one
    `DeprecationWarning` naming it."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        new, _, new_name = where.get(name, default).partition(":")
        value = getattr(importlib.import_module(new), new_name or name)
        warnings.warn(f"{old}.{name} moved to {new}.{new_name or name}; {old} will be removed "
                      f"in the next release", DeprecationWarning, stacklevel=2)
        return value

    return __getattr__
