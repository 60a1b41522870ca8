"""Deprecation shims for modules that moved in 0.2 (`vtrm_gate.scheduler`,
`vtrm_gate.plugin`); they go in `REMOVED_IN`."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

REMOVED_IN = "0.3.0"
"""The release that removes the shims (and every other name deprecated in 0.2.x)."""


def deprecated(what: str, instead: str, stacklevel: int = 3) -> None:
    """One `DeprecationWarning`: ``what`` stops working in `REMOVED_IN`; use ``instead``."""
    warnings.warn(f"{what} is deprecated and stops working in vtrm_gate {REMOVED_IN}; use "
                  f"{instead}", DeprecationWarning, stacklevel=stacklevel)


def forwarder(old: str, where: Mapping[str, str], default: str,
              values: Mapping[str, tuple[Any, str]] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the moved module ``old``: each name resolves from its new
    home (``where[name]``: ``module`` or ``module:new_name``; else ``default``), or is one of
    ``values`` (name: (value, what to use instead)), with one `DeprecationWarning` naming the
    replacement and `REMOVED_IN`."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if values and name in values:
            value, instead = values[name]
        else:
            new, _, new_name = where.get(name, default).partition(":")
            value = getattr(importlib.import_module(new), new_name or name)
            instead = f"{new}.{new_name or name}"
        warnings.warn(f"{old}.{name} moved to {instead}; {old} will be removed in "
                      f"vtrm_gate {REMOVED_IN}", DeprecationWarning, stacklevel=2)
        return value

    return __getattr__
