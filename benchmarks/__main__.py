"""`make bench`: every benchmark, one after another, tables on stdout.

``python -m benchmarks [--quick] [NAME ...]``: NAME one of `ALL` (default: all of them)
"""

from __future__ import annotations

import importlib
import sys

ALL = ("core", "makespan", "cache", "oc", "training", "throughput", "integrity", "forecast",
       "adaptive", "guard", "power", "small_types", "sweep")


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m benchmarks",
                                 description="every benchmark, one after another")
    ap.add_argument("--quick", action="store_true", help="short runs (what CI runs)")
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"one of {', '.join(ALL)}")
    args = ap.parse_args(argv)
    quick, names = args.quick, args.names or list(ALL)
    for name in names:
        if name not in ALL:
            print(f"unknown benchmark {name!r}; choose from {', '.join(ALL)}", file=sys.stderr)
            return 2
        print(f"\n=== benchmarks.bench_{name} ===", flush=True)
        importlib.import_module(f"benchmarks.bench_{name}").main(quick=quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
