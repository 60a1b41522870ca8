"""The declared API is the one used: every public namespace has an ``__all__`` whose names
resolve, what the notebooks, the README and docs/ import is declared, and public classes
report (and pickle by) their public path."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import pickle
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAMESPACES = ("vtrm_gate", "vtrm_gate.views", "vtrm_gate.sim", "vtrm_gate.harness",
              "vtrm_gate.cache", "vtrm_gate.llm", "vtrm_gate.stats", "vtrm_gate.gate",
              "vtrm_gate.testing", "vtrm_gate.backends", "vtrm_gate.options",
              "vtrm_gate.errors")


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_every_namespace_declares_its_names_and_each_resolves(namespace: str) -> None:
    module = importlib.import_module(namespace)
    declared = module.__all__
    assert len(declared) == len(set(declared)), f"{namespace}.__all__ repeats a name"
    for name in declared:
        assert getattr(module, name) is not None, f"{namespace}.{name}"


@pytest.mark.parametrize("namespace", NAMESPACES[1:10])
def test_every_name_a_namespace_re_exports_is_declared(namespace: str) -> None:
    """A name added to a subpackage's ``__init__`` without ``__all__`` is an undeclared API."""
    import types

    module = importlib.import_module(namespace)
    public = {n for n, v in vars(module).items() if not n.startswith("_")
              and not isinstance(v, types.ModuleType) and n != "annotations"}
    assert public <= set(module.__all__), sorted(public - set(module.__all__))


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_public_classes_report_their_public_path(namespace: str) -> None:
    """``repr(type(x))`` and pickles name ``vtrm_gate.gate.TypePlan``, never a private module
    that may move; the path found there is the class itself."""
    module = importlib.import_module(namespace)
    for name in module.__all__:
        obj = getattr(module, name)
        if not isinstance(obj, type) or not obj.__module__.startswith("vtrm_gate"):
            continue
        path = obj.__module__.split(".")
        assert not any(p.startswith("_") for p in path), f"{namespace}.{name}: {obj.__module__}"
        assert getattr(importlib.import_module(obj.__module__), obj.__qualname__) is obj


def _python_sources() -> Iterator[tuple[str, str]]:
    """(where, code) for every notebook cell, README / docs python block, and example."""
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            if cell["cell_type"] == "code":
                code = "".join(cell["source"])
                yield f"{nb.name} cell {i}", "\n".join(
                    ln for ln in code.splitlines() if not ln.lstrip().startswith(("%", "!")))
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for j, block in enumerate(_fenced(md.read_text())):
            yield f"{md.relative_to(ROOT)} block {j}", block


def _fenced(text: str) -> Iterator[str]:
    """The python blocks of a markdown text (``python`` fences, and bare ones importing
    vtrm_gate)."""
    lang, lines = None, []
    for line in text.splitlines():
        if lang is None and line.startswith("```"):
            lang, lines = line[3:].strip(), []
        elif lang is not None and line.strip() == "```":
            code = "\n".join(lines)
            if lang == "python" or (lang == "" and re.search(r"^\s*(from|import) vtrm_gate",
                                                             code, re.M)):
                yield code
            lang = None
        elif lang is not None:
            lines.append(line)


def _imported(code: str) -> Iterator[tuple[str, str]]:
    """(module, name) for each ``from vtrm_gate... import name`` in ``code``."""
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vtrm_gate"):
            for alias in node.names:
                yield node.module or "", alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("vtrm_gate."):
                    module, _, name = alias.name.rpartition(".")
                    yield module, name


def _declared(module: str, name: str) -> bool:
    if module not in NAMESPACES:
        return False
    if name in importlib.import_module(module).__all__:
        return True
    sub = f"{module}.{name}"
    return not name.startswith("_") and importlib.util.find_spec(sub) is not None


def test_the_notebooks_readme_and_docs_import_only_declared_names() -> None:
    seen, undeclared = 0, []
    for where, code in _python_sources():
        try:
            pairs = list(_imported(code))
        except SyntaxError:  # a block with top-level await parses as a function body
            pairs = list(_imported("async def _():\n" + "\n".join(
                "    " + ln for ln in code.splitlines())))
        seen += len(pairs)
        undeclared += [f"{where}: from {m} import {n}" for m, n in pairs if not _declared(m, n)]
    assert seen > 40, seen  # the notebooks alone import ~50 names
    assert not undeclared, "\n".join(undeclared)


def test_public_values_pickle_by_their_public_path() -> None:
    """Values cross to worker processes by pickle: the public ``__module__`` must resolve in
    a fresh interpreter, and the value come back equal."""
    from vtrm_gate import Action, GateParams, TypePlan, UnitResult, UnitTask
    from vtrm_gate.gate import LadderEntry

    values = [GateParams(), Action.ACCEPT, UnitResult(correct=True, tokens=9),
              TypePlan("Counting Problem", ["u1", "u2"], base_skill="a", cand_skill="b"),
              UnitTask("Counting Problem", "u1", "base", 0, "run-1", skill="a"),
              LadderEntry("u1", 0, 1)]
    for v in values:
        assert pickle.loads(pickle.dumps(v)) == v
        assert f"vtrm_gate.{type(v).__module__.split('.')[1]}".encode() in pickle.dumps(v)
        assert b"._" not in pickle.dumps(v)  # no private module path in the pickle
    old = pickle.dumps(GateParams(), protocol=0).replace(b"cvtrm_gate.stats\n",
                                                         b"cvtrm_gate.stats._params\n")
    assert b"stats._params" in old and pickle.loads(old) == GateParams()  # an older pickle
    code = ("import pickle, sys; vs = pickle.loads(sys.stdin.buffer.read()); "
            "print(*sorted({type(v).__module__ for v in vs}))")
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(values),
                         capture_output=True, check=True).stdout.decode().split()
    assert out == ["vtrm_gate.gate", "vtrm_gate.stats"]
