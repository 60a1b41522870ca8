"""The folder tree is the architecture (docs/contributing.md): each layer imports only from
the layers before it, no import cycle exists (function-local imports included), and no
library function is over 60 lines.

stats -> gate -> options -> harness -> cache -> llm -> sim -> backends -> views -> cli.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "vtrm_gate"
MAX_FUNCTION_LINES = 60

LAYER = {
    # the error tree (it imports nothing of ours): every module may raise its errors
    "errors": -1,
    # identities, environment, the sync bridge: every layer may use them
    "_ids": 0, "_env": 0, "_reaper": 0, "_sync": 0, "_api": 0, "nbstrip": 0,
    "stats": 1, "gate": 2, "options": 3, "harness": 4, "cache": 5, "llm": 6, "sim": 7,
    "backends": 8, "views": 9, "cli": 10,
    # faces and shims on top
    "testing": 11, "scheduler": 11, "plugin": 11, "__init__": 12, "__main__": 12,
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (they never run)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
                and node.test.id == "TYPE_CHECKING":
            out |= {id(n) for b in node.body for n in ast.walk(b)}
    return out


def _imports(path: Path, runtime: bool = False) -> Iterator[tuple[str, int]]:
    """Every vtrm_gate module ``path`` imports (at any depth; ``runtime``: leaving out
    imports for type checkers only), with the line."""
    mod = _module(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_only(tree) if runtime else set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("vtrm_gate"):
                continue
            for alias in node.names:  # `from . import _cluster`: a submodule
                sub = f"{target}.{alias.name}"
                yield (sub if _exists(sub) else target), node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("vtrm_gate"):
                    yield alias.name, node.lineno


def _exists(module: str) -> bool:
    p = PKG.parent / module.replace(".", "/")
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _files() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def test_every_module_belongs_to_a_layer():
    unknown = {_layer(_module(p)) for p in _files()} - set(LAYER)
    assert not unknown, f"add to LAYER: {unknown}"


def test_no_module_imports_a_later_layer():
    upward = []
    for path in _files():
        mine = _layer(_module(path))
        for target, line in _imports(path):
            theirs = _layer(target)
            if theirs != mine and LAYER[theirs] >= LAYER[mine]:
                upward.append(f"{path.relative_to(PKG)}:{line} imports {target}")
    assert not upward, "\n".join(upward)


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in _files():
        mod = _module(path)
        deps = graph.setdefault(mod, set())
        for target, _ in _imports(path, runtime=True):
            if target != mod:
                deps.add(target)
    return graph


def test_no_import_cycles_function_local_imports_included():
    graph = _graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycles.append([*stack[stack.index(d):], d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_no_library_function_is_over_60_lines():
    long = []
    for path in _files():
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                size = n.end_lineno - n.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PKG)}:{n.lineno} {n.name}: {size} lines")
    assert not long, "\n".join(long)


def test_at_most_a_dozen_modules_loose_at_the_top():
    loose = sorted(p.name for p in PKG.glob("*.py"))
    assert len(loose) <= 12, loose


def test_stats_imports_nothing_that_draws_or_does_io():
    mods: set[str] = set()
    for path in (PKG / "stats").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        mods |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                 for a in n.names}
        mods |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    assert mods <= {"__future__", "enum", "math", "statistics", "collections", "dataclasses",
                    "typing", "numpy"}, mods  # statistics: NormalDist, pure math


def test_the_gate_knows_no_storage_redis_or_http():
    for path in (PKG / "gate").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        for banned in ("sqlite3", "redis", "httpx"):
            assert f"import {banned}" not in text, (path.name, banned)
