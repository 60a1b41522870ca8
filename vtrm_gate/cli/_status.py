"""``vtrm-gate status``: where a workspace's run stands - its position, the types on
probation and in cooldown, the last step's decisions, counts, INFRA, who is writing, and
the next command to run. Read-only (no lock: it works while ``train`` writes)."""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._args import a_path, emit
from ._table import Column, render, terminal_width, wrap


def register(sub: Any) -> None:
    """Add ``status`` to the ``vtrm-gate`` subcommands."""
    s = sub.add_parser("status", help="where a workspace's run stands, and the next command")
    s.add_argument("--workspace", type=a_path, required=True)
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    from ..harness import Workspace
    from ..views import run_status

    with Workspace.open(Path(args.workspace), readonly=True) as ws:
        status = run_status(ws)
    emit(args, status, status_text(status, terminal_width()))
    return 0


def _listed(items: Mapping[str, Any] | list[Any], empty: str = "none") -> str:
    return ", ".join(map(str, items)) if items else empty


def _runs(epochs: list[int]) -> str:
    """Epoch numbers with each run of consecutive ones as a range: "1-135, 137" (a long run
    listed 135 numbers)."""
    parts = []
    for _, run in itertools.groupby(enumerate(sorted(epochs)), lambda ie: ie[1] - ie[0]):
        first, *rest = [e for _, e in run]  # consecutive epochs share e - position
        parts.append(f"{first}-{rest[-1]}" if rest else str(first))
    return ", ".join(parts) if parts else "none"


def _position(s: Mapping[str, Any]) -> str:
    p = s["position"]
    last = p["last_step"]
    plan = p["plan"]
    where = f"e{last[0]} s{last[1]}" if last else "none"
    return (f"last step {where} ({p['steps_applied']} "
            f"applied); settled epochs {_runs(p['settled_epochs'])}; evaluated epochs "
            f"{_runs(p['evaluated_epochs'])}; training plan "
            + (f"{plan['epochs']} epochs x {plan['steps_per_epoch']} steps" if plan
               else "none (no train run yet)"))


def _policy(p: Mapping[str, Any]) -> str:
    """The training policy in words: what a rejection costs, how probation settles."""
    exits = "REJECT and FUTILE" if p["futile_cooldown"] else "REJECT (not FUTILE)"
    return (f"cooldown {p['cooldown_steps']} steps after {exits}; probation "
            f"{p['probation_rule']}, {p['probation_order']} probe of up to "
            f"{p['probation_units']} units")


def status_text(s: Mapping[str, Any], width: int) -> str:
    """The status as lines within ``width`` columns."""
    counts = ", ".join(f"{k} {v}" for k, v in s["counts"].items())
    decided = ", ".join(f"{k} {v}" for k, v in s["decisions"].items()) or "none yet"
    probation = [f"{t} v{p['version']} (from e{p['epoch']} s{p['step']}, rollback to "
                 f"v{p['prev_version']})" for t, p in s["probation"].items()]
    cooling = [f"{t} (until {c['until_steps_applied']} steps applied)"
               for t, c in s["cooldown"].items()]
    parts = [f"workspace {s['workspace']} ({s['kind']}, {s['types']} types)",
             f"position: {_position(s)}",
             f"writer: {s['writer'] or 'none (nothing is writing it now)'}",
             f"policy: {_policy(s['policy'])}",
             f"on probation: {_listed(probation)}", f"in cooldown: {_listed(cooling)}",
             f"decisions so far (gate steps): {decided}",
             f"INFRA: {s['infra']['calls']} calls, {s['infra']['aborts']} guard aborts",
             f"rows: {counts}"]
    text = "\n".join(wrap(p, width, "    ") for p in parts)
    last = s["last_decisions"]
    if last:
        e, st = s["position"]["last_step"]
        get = lambda k: tuple("" if r[k] is None else str(r[k]) for r in last)  # noqa: E731
        cols = [Column("type", get("task_type")), Column("status", get("status")),
                Column("action", get("action")), Column("W", get("W"), True),
                Column("L", get("L"), True)]
        text += f"\nlast step e{e} s{st}:\n" + render(cols, width, {
            i: (r["applied"] or "") + (f"; at the end of epoch {e}: {r['settled']}"
                                       if r["settled"] else "") for i, r in enumerate(last)})
    return text + "\n" + wrap(f"next: {s['next']}", width, "    ")
