"""Layering (STYLE.md): each layer imports only from the layers before it.

stats -> ladder, dispatch -> scheduler -> harness, cache/llm -> sim, backends, faces -> cli.
A module-level or function-level import of a later layer is an upward dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "vtrm_gate"

LAYER = {
    "_env": 0, "stats": 0, "endpoints": 0, "ladder": 1, "dispatch": 1, "scheduler": 2,
    "_sync": 2, "config": 3, "media": 3, "harness": 4, "cluster": 5, "cache": 5,
    "redis_server": 5, "llm": 5, "cli_cache": 5,
    "sim": 6, "montecarlo": 6, "frames": 6, "figures": 7, "train_figures": 7, "simstep": 7,
    "explore": 8, "review": 8, "nbstrip": 0, "backends": 8, "plugin": 8, "live": 8,
    "live_train": 8, "cli": 9, "cli_train": 9, "testing": 9, "__init__": 10, "__main__": 10,
}
# harness and cache/llm are peers: neither may import the other
PEERS = {("harness", "cache"), ("harness", "llm"), ("harness", "redis_server")}


def _imports(path: Path) -> list[tuple[str, int]]:
    rel = path.relative_to(PKG).parts
    package = list(rel[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - (node.level - 1)]
            target = base + (node.module.split(".") if node.module else [])
            if target:
                out.append((target[0].removesuffix(".py"), node.lineno))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names = [node.module] if isinstance(node, ast.ImportFrom) else [
                a.name for a in node.names]
            for name in names:
                if name and name.startswith("vtrm_gate."):
                    out.append((name.split(".")[1], node.lineno))
    return out


def test_no_module_imports_a_later_layer():
    upward = []
    for path in PKG.rglob("*.py"):
        mod = path.relative_to(PKG).parts[0].removesuffix(".py")
        assert mod in LAYER, f"{mod}: add the new module to LAYER"
        for target, line in _imports(path):
            if target == mod or target not in LAYER:
                continue
            if LAYER[target] > LAYER[mod] or (mod, target) in PEERS:
                upward.append(f"{path.relative_to(PKG)}:{line} imports {target}")
    assert not upward, "\n".join(upward)


def test_stats_imports_nothing_that_draws_or_does_io():
    tree = ast.parse((PKG / "stats.py").read_text())
    mods = {n.names[0].name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)}
    mods |= {n.module.split(".")[0] for n in ast.walk(tree)
             if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    assert mods <= {"__future__", "enum", "math", "collections", "dataclasses", "typing",
                    "numpy"}, mods
