"""``vtrm-gate export``: every table of a workspace's log to one Parquet or CSV file each
(``predictions.parquet``, ``gate_evidence.parquet``, ...; columns in docs/api.md), read-only
(no lock: it works while ``train`` writes the workspace)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .._env import EXPORT_FORMATS
from ._args import a_path, emit
from ._table import Column, render, terminal_width, wrap


def register(sub: Any) -> None:
    """Add ``export`` to the ``vtrm-gate`` subcommands."""
    x = sub.add_parser("export", help="write every table of a workspace to Parquet or CSV")
    x.add_argument("--workspace", type=a_path, required=True)
    x.add_argument("--out", type=a_path, required=True,
                   help="directory for the files (created if needed)")
    x.add_argument("--format", choices=EXPORT_FORMATS, default="parquet",
                   help="file format (default parquet); csv-excel: CSV files that Excel on "
                        "Windows opens as UTF-8 (a byte order mark first)")
    x.add_argument("--json", action="store_true", help="machine-readable output")
    x.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from ..harness import Workspace
    from ..views import export_tables

    with Workspace.open(Path(args.workspace), readonly=True) as ws:
        files = export_tables(ws, args.out, args.format)
    width = terminal_width()
    text = render([Column("table", tuple(files)),
                   Column("rows", tuple(str(n) for _, n in files.values()), True),
                   Column("file", tuple(f.name for f, _ in files.values()))], width)
    text += "\n" + wrap(f"wrote {len(files)} {args.format} files to {args.out} (their "
                        f"columns: docs/api.md, 'vtrm-gate export')", width)
    emit(args, {"workspace": args.workspace, "out": args.out, "format": args.format,
                "tables": {t: {"file": str(f), "rows": n} for t, (f, n) in files.items()}},
         text)
    return 0
