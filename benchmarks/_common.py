"""Shared benchmark helpers: the machine, medians over repeats, a printed table."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}")


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median wall time of ``fn()`` over ``repeats`` runs, and the last return value."""
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def print_table(title: str, rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        return
    cols = list(rows[0])
    cells = [[_fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print(f"\n{title}")
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
    return "" if v is None else str(v)


def parser() -> argparse.ArgumentParser:
    """The running benchmark's argument parser (``--quick``; ``--help`` prints its usage and
    the first line of its docstring, and exits before anything starts)."""
    import sys

    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    doc = (main.__doc__ or "").strip().splitlines()
    ap = argparse.ArgumentParser(prog=f"python -m {spec.name}" if spec else None,
                                 description=doc[0] if doc else None)
    ap.add_argument("--quick", action="store_true", help="a short run (what CI runs)")
    return ap


def run_quick(main: Callable[..., Any]) -> None:
    """``python -m benchmarks.bench_x [--quick]``: parse and call ``main``."""
    main(quick=parser().parse_args().quick)


def run_with_seeds(main: Callable[..., Any]) -> None:
    """``python -m benchmarks.bench_x [--quick] [--seeds N]``: parse and call ``main``."""
    import sys

    ap = parser()
    ap.add_argument("--seeds", type=int, default=None, help="seeds to run (default: all)")
    a = ap.parse_args()
    main(quick=a.quick, seeds=a.seeds)
    sys.exit(0)
