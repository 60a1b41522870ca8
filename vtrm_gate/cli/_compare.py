"""``vtrm-gate compare A B``: two runs side by side - decisions, final accuracy (simulated:
true accuracy; otherwise the last held-out evaluation), time and calls, per type and
overall. Read-only on both workspaces."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from ..errors import shown
from ._args import a_path, emit
from ._table import Column, render, terminal_width, wrap

_CLOCKS = {"virtual": "virtual clock", "real": "real time",
           "mixed": "virtual and real time mixed"}


def register(sub: Any) -> None:
    """Add ``compare`` to the ``vtrm-gate`` subcommands."""
    c = sub.add_parser("compare", help="two workspaces' runs side by side (decisions, "
                                       "accuracy, time, calls)")
    c.add_argument("a", metavar="A", type=a_path, help="the first workspace")
    c.add_argument("b", metavar="B", type=a_path, help="the second workspace")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from ..views import compare_runs

    data = compare_runs(args.a, args.b)
    emit(args, data, compare_text(data, terminal_width()))
    return 0


def _pct(v: float | None, signed: bool = False) -> str:
    if v is None:
        return ""
    return f"{100 * v:+.1f}" if signed else f"{100 * v:.1f}"


def compare_text(d: Mapping[str, Any], width: int) -> str:
    """Per type and overall: accuracy (%) of A and B and B - A, calls, decisions."""
    from ..views import decision_letters as decisions_cell

    rows = [(t, r["a"] or {}, r["b"] or {}, r["accuracy_diff"]) for t, r in d["types"].items()]
    oa, ob = d["a"]["overall"], d["b"]["overall"]
    rows.append(("overall", oa, ob, d["diff"]["accuracy"]))
    cell = lambda f: tuple(f(r) for r in rows)  # noqa: E731
    cols = [Column("type", cell(lambda r: r[0])),
            Column("acc A", cell(lambda r: _pct(r[1].get("accuracy"))), True),
            Column("acc B", cell(lambda r: _pct(r[2].get("accuracy"))), True),
            Column("B-A", cell(lambda r: _pct(r[3], True)), True),
            Column("calls A / B", cell(lambda r: f"{r[1].get('calls', '-')} / "
                                                 f"{r[2].get('calls', '-')}"), True,
                   drop_rank=2),
            Column("decisions A", cell(lambda r: decisions_cell(r[1].get("decisions"))),
                   drop_rank=1),
            Column("decisions B", cell(lambda r: decisions_cell(r[2].get("decisions"))),
                   drop_rank=1)]
    times = f"time: A {_hours(oa)}, B {_hours(ob)}"
    if d["diff"]["seconds"] is None and None not in (oa["seconds"], ob["seconds"]):
        times += "; not comparable"
    lines = [f"A: {d['a']['workspace']} ({d['a']['kind']}, probation {d['a']['probation_rule']}"
             f", seed {d['a']['seed']})",
             f"B: {d['b']['workspace']} ({d['b']['kind']}, probation {d['b']['probation_rule']}"
             f", seed {d['b']['seed']})",
             f"accuracy (%): A {d['a']['accuracy_source']}; B {d['b']['accuracy_source']}; "
             f"decisions: A ACCEPT, P PROVISIONAL, I INERTIA, F FUTILE, R REJECT",
             f"{times}; tokens: A {oa['tokens']:,}, B {ob['tokens']:,}; calls: fresh "
             f"inference calls",
             _settings_line(d["settings"])]
    if oa["replaced"]["runs"] or ob["replaced"]["runs"]:
        lines.insert(-1, "runs replaced by a re-run (not counted above): " + ", ".join(
            f"{side} {_replaced(o['replaced'])}" for side, o in (("A", oa), ("B", ob))))
    only = {side: [t for t, r in d["types"].items() if r[side] and not r[other]]
            for side, other in (("a", "b"), ("b", "a"))}
    if d["diff"]["accuracy_types"] < len(d["types"]):
        why = "; ".join(f"only in {s.upper()}: {', '.join(ts)}" for s, ts in only.items() if ts)
        lines.insert(3, f"overall B-A: over the {d['diff']['accuracy_types']} types both runs "
                        f"measured ({why or 'the others lack an accuracy in one run'})")
    return render(cols, width) + "\n" + "\n".join(wrap(ln, width, "    ") for ln in lines)


def _settings_line(differ: Mapping[str, Mapping[str, Any]]) -> str:
    """The settings that set the two runs apart, each with A's value and B's."""
    if not differ:
        return "settings: the same"
    return "settings that differ: " + "; ".join(
        f"{name} A {_value(v['a'])}, B {_value(v['b'])}" for name, v in differ.items())


def _value(v: Any) -> str:
    return "not set" if v is None else json.dumps(v) if isinstance(v, bool | list) else \
        shown(v) if isinstance(v, str) and len(v) > 60 else str(v)


def _replaced(r: Mapping[str, Any]) -> str:
    """The runs a re-run replaced, and what they cost."""
    from ..gate import hours

    return (f"{r['runs']} ({r['calls']:,} calls, {r['tokens']:,} tokens, {hours(r['seconds'])} "
            f"recorded)" if r["runs"] else "none")


def _hours(overall: Mapping[str, Any]) -> str:
    """A run's time and the clock it was measured on (two clocks are never compared)."""
    from ..gate import hours

    s = overall["seconds"]
    return "no timings recorded" if s is None else f"{hours(s)} ({_CLOCKS[overall['clock']]})"
