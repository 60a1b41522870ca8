"""``vtrm-gate options``: every option a run of this workspace would take, and where each
value came from (flag, environment, ``.env``, config file, workspace, default)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._args import a_path, add_run_flags, emit, run_options
from ._table import Column, render, terminal_width


def register(sub: Any) -> None:
    """Add ``options`` to the ``vtrm-gate`` subcommands."""
    o = sub.add_parser("options", help="print every resolved run option and its source")
    o.add_argument("--workspace", type=a_path, required=True)
    add_run_flags(o)
    o.set_defaults(func=cmd_options)


def cmd_options(args: argparse.Namespace) -> int:
    from ..backends import workspace_options
    from ..harness import Workspace

    with Workspace.open(Path(args.workspace), readonly=True) as ws:
        options = workspace_options(ws, run_options(args))
        agent = dict(ws.config.agent)
    rows = options.explain(agent)  # the budgets a run of this workspace uses, never None
    cols = [Column(head, tuple(str(r[i]) for r in rows), whole=head == "option",
                   wraps=head == "value")
            for i, head in enumerate(("option", "value", "source"))]
    text = render(cols, terminal_width())  # names whole, the source wraps within COLUMNS
    emit(args, {"workspace": args.workspace,
                "options": {k: {"value": v, "source": src} for k, v, src in rows}}, text)
    return 0
