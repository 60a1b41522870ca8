"""The public path of a namespace's classes: each class a subpackage re-exports from one of
its private modules reports the subpackage as its ``__module__`` (reprs, errors, pickles)."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any


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
