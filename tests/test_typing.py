"""The type checker's config covers the whole package, and every `# type: ignore` in it names
its error code and says why, on its line or in a comment right above it (mypy itself, run by
``make lint``, refuses a code-less or unneeded one)."""

from __future__ import annotations

import io
import re
import tokenize
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IGNORE = re.compile(r"#\s*type:\s*ignore")
WITH_REASON = re.compile(r"#\s*type:\s*ignore\[[a-z-]+(,\s*[a-z-]+)*\]\s+#\s*\S")


def _unexplained(path: Path) -> list[tuple[int, str]]:
    """(line, comment) of each ``type: ignore`` comment with no reason after its code and no
    comment line right above it (strings do not count)."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return [(t.start[0], t.string) for t in tokens
            if t.type == tokenize.COMMENT and IGNORE.search(t.string)
            and not WITH_REASON.search(t.string)
            and not (t.start[0] > 1 and lines[t.start[0] - 2].lstrip().startswith("#"))]


def test_every_type_ignore_names_its_code_and_why() -> None:
    bare = [f"{p.relative_to(ROOT)}:{line}: {text}"
            for p in sorted((ROOT / "vtrm_gate").rglob("*.py")) for line, text in _unexplained(p)]
    assert not bare, "write `# type: ignore[code]  # why`:\n" + "\n".join(bare)


def test_the_reason_check_tells_a_reason_from_none(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text('x = 1  # type: ignore[assignment]  # a number\n'
                 'y = 2  # type: ignore[union-attr,index]\n'
                 'z = "# type: ignore"\n'
                 '# w is set by then\n'
                 'w = 3  # type: ignore[operator]\n')
    assert _unexplained(f) == [(2, "# type: ignore[union-attr,index]")]


def test_mypy_checks_the_whole_package_strictly_where_declared() -> None:
    """`strict = true` in an override would switch strict on for every module (mypy issues
    11401, 16387): the strict modules list its remaining flags instead."""
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["files"] == ["vtrm_gate"]
    assert mypy["disallow_untyped_defs"] and mypy["check_untyped_defs"]
    assert mypy["warn_unused_ignores"] and "ignore-without-code" in mypy["enable_error_code"]
    (strict,) = mypy["overrides"]
    assert "strict" not in strict and "strict" not in mypy
    assert {"vtrm_gate.stats.*", "vtrm_gate.gate.*", "vtrm_gate.options"} <= set(strict["module"])
    assert strict["disallow_untyped_calls"] and strict["warn_return_any"]
