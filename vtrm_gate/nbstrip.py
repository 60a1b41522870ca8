"""Strip notebook outputs except in ``# NBVAL_CHECK_OUTPUT`` cells (nbval compares those).

``python -m vtrm_gate.nbstrip notebooks/*.ipynb`` rewrites the files in place;
``--check`` only lists the cells that would change (exit 1 if any).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CHECK_MARK = "NBVAL_CHECK_OUTPUT"


def is_checked(cell: dict[str, Any]) -> bool:
    src = cell.get("source", "")
    return CHECK_MARK in ("".join(src) if isinstance(src, list) else src)


def dirty_cells(nb: dict[str, Any]) -> list[int]:
    """Indices of code cells that carry outputs (or an execution count) but are not checked."""
    return [i for i, c in enumerate(nb.get("cells", []))
            if c.get("cell_type") == "code" and not is_checked(c)
            and (c.get("outputs") or c.get("execution_count") is not None)]


def strip(nb: dict[str, Any]) -> dict[str, Any]:
    for c in nb.get("cells", []):
        if c.get("cell_type") == "code" and not is_checked(c):
            c["outputs"], c["execution_count"] = [], None
    nb.get("metadata", {}).pop("widgets", None)
    return nb


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    bad = 0
    for name in (a for a in args if a != "--check"):
        path = Path(name)
        nb = json.loads(path.read_text())
        cells = dirty_cells(nb)
        if check:
            if cells:
                print(f"{path}: outputs in unchecked cells {cells}")
                bad += 1
            continue
        path.write_text(json.dumps(strip(nb), indent=1, ensure_ascii=False) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
