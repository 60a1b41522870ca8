"""The public surface's machinery: each namespace's classes report its public path
(`declare`), and names that moved keep working for one release with a `DeprecationWarning`
naming the replacement and `REMOVED_IN` (`deprecated`, `forwarder` for the 0.2 shims
`vtrm_gate.scheduler` and `vtrm_gate.plugin`)."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping, MutableMapping
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


def declare(namespace: str, scope: MutableMapping[str, Any]) -> None:
    """Set ``__module__`` to ``namespace`` on every class of ``scope["__all__"]`` defined in a
    private module (``namespace._x`` or another ``vtrm_gate._x``); pickling by module path
    still finds it, the namespace exporting it."""
    for name in scope["__all__"]:
        obj = scope.get(name)
        if isinstance(obj, type) and obj.__module__.startswith("vtrm_gate.") \
                and _private(obj.__module__) and obj.__qualname__ == name:
            obj.__module__ = namespace


def _private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))
