"""``vtrm-gate train`` and ``vtrm-gate settle``: the training run from the command line.

``train`` runs (or resumes) epochs x steps with epoch-end settlement and evaluation, one line
per step / settlement / evaluation, then a summary; on a simulated workspace the summary adds
the old-serial vs v3 time per phase and the decision quality against the simulator's ground
truth. Both go through `vtrm_gate.backends` (the one opener, the one options object) like
``step``. Exit 2 (one line) on bad sizes, a locked workspace or a changed configuration;
exit 3 on an INFRA guard abort (finished steps kept: the next ``train`` resumes there).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ._args import a_path, add_run_flags, emit, positive, run_options
from ._progress import TerminalProgress, agent_printer
from ._table import terminal_width, wrap


def register(sub: Any) -> None:
    """Add ``train`` and ``settle`` to the ``vtrm-gate`` subcommands."""
    t = sub.add_parser("train", help="run or resume a training run (epochs of steps, "
                                     "epoch-end settlement and evaluation)")
    t.add_argument("--workspace", type=a_path, required=True)
    t.add_argument("--epochs", required=True, help="number of epochs (positive integer)")
    t.add_argument("--steps-per-epoch", required=True, help="steps per epoch")
    t.add_argument("--no-eval", action="store_true", help="skip the epoch-end evaluation")
    add_run_flags(t)
    t.set_defaults(func=cmd_train)

    s = sub.add_parser("settle", help="settle an epoch's probation (through the slot pool)")
    s.add_argument("--workspace", type=a_path, required=True)
    s.add_argument("--epoch", required=True, help="the epoch to settle")
    add_run_flags(s)
    s.set_defaults(func=cmd_settle)


TRAIN_STATUS_EVERY_S = 10.0
"""`train`'s gate status line on stderr at most this often (a step: `TerminalProgress`'s 2 s)."""


def _printer(args: argparse.Namespace) -> Any:
    def show(ev: Any) -> None:
        if args.json:
            out = {"event": ev.kind, "epoch": ev.epoch, "step": ev.step,
                   "done_before": ev.done_before, "seconds": ev.seconds, "line": ev.line}
            if ev.kind == "settle" and ev.data is not None:
                out["types"] = {t: {"kept": o.passed, "version": o.version,
                                    "prev_version": o.prev_version, "rule": o.rule,
                                    "evidence": o.evidence}
                                for t, o in sorted(ev.data.outcomes.items())}
            print(json.dumps(out), flush=True)
        else:  # one event a paragraph, within COLUMNS (was up to 281 characters)
            print(wrap(ev.line, terminal_width(), indent="      "), flush=True)

    return show


def cmd_train(args: argparse.Namespace) -> int:
    from ..backends import run_on_clock, train_workspace
    from ..harness import Workspace

    epochs = positive("epochs", args.epochs)
    steps = positive("steps-per-epoch", args.steps_per_epoch)
    options = run_options(args)
    ws = Workspace.open(Path(args.workspace))
    try:
        run = run_on_clock(ws, options, lambda: train_workspace(
            ws, epochs, steps, options, evaluate=False if args.no_eval else None,
            subscribers=[TerminalProgress(quiet=args.json, every_s=TRAIN_STATUS_EVERY_S)],
            on_event=_printer(args), on_agent_event=agent_printer(args.json),
            command="vtrm-gate train"))
    finally:
        ws.close()
    assert run.summary is not None  # train_workspace always summarises
    if args.json:
        print(json.dumps({"event": "summary", **run.summary}, default=str))
    else:
        print(wrap(summary_text(run.summary, run.kind), terminal_width(), indent="    "))
    return 0


def cmd_settle(args: argparse.Namespace) -> int:
    from ..backends import run_on_clock, settle_workspace
    from ..harness import Workspace

    epoch = positive("epoch", args.epoch)
    options = run_options(args)
    ws = Workspace.open(Path(args.workspace))
    try:
        res = run_on_clock(ws, options, lambda: settle_workspace(
            ws, epoch, options, on_agent_event=agent_printer(args.json))).result
    finally:
        ws.close()
    data = {"epoch": epoch, "already_settled": res.already_settled,
            "rule": ws.config.probation_rule,
            "types": {t: {"version": o.version, "prev_version": o.prev_version, "W": o.W,
                          "L": o.L, "n_used": o.n_used, "kept": o.passed, "rule": o.rule,
                          "evidence": o.evidence, "applied": o.applied}
                      for t, o in res.outcomes.items()}}
    if res.already_settled:
        text = f"epoch {epoch} was settled before (nothing changed)"
    elif not res.outcomes:
        text = f"epoch {epoch}: nothing on probation"
    else:
        text = "\n".join(f"{t}: {o.line}" for t, o in sorted(res.outcomes.items()))
    emit(args, data, wrap(text, terminal_width(), indent="    "))
    return 0


def _time_unit(clock: str, total_s: float) -> tuple[str, float]:
    """Simulated runs in simulated hours; a wall-clock run in hours, minutes or seconds,
    whichever shows its total (a two-minute run is not "0.03 h")."""
    if clock == "virtual":
        return "simulated hours", 3600.0
    if total_s >= 3600:
        return "wall hours", 3600.0
    return ("wall minutes", 60.0) if total_s >= 60 else ("wall seconds", 1.0)


def summary_text(summary: Any, kind: str = "simulated") -> str:
    """The end-of-run summary: time per phase, the held-out gain with its intervals and (on
    a simulated workspace) the decision quality against the ground truth."""
    from ..harness import gain_text

    lines = []
    v3 = summary["v3_phases_s"]
    if summary.get("done_before"):
        lines.append(f"({summary['done_before']} steps/settlements/evaluations were done by "
                     f"an earlier run; times below cover this run only)")
    old = summary.get("old_phases_s")
    total = summary["v3_total_s"]
    clock = summary.get("clock") or ("virtual" if kind == "simulated" else "real")
    unit, per = _time_unit(clock, total)
    lines.append(f"time per phase ({unit})   " + ("old serial      v3" if old else "v3"))
    for k, v in v3.items():
        lines.append(f"  {k:<12}" + (f"{old[k] / per:>20.2f}" if old else "")
                     + f"{v / per:>10.2f}")
    if old:
        speed = summary["old_total_s"] / total if total else float("nan")
        lines.append(f"  {'total':<12}{summary['old_total_s'] / per:>20.2f}"
                     f"{total / per:>10.2f}   ({speed:.1f}x)")
    else:
        lines.append(f"  {'total':<12}{total / per:>10.2f}")
    ev = summary.get("evaluation")
    if ev:
        lines.append(f"held-out accuracy after epoch {ev['epoch']}: {ev['acc_current']:.1%} "
                     f"(initial skills {ev['acc_initial']:.1%}, {ev['units']} units); "
                     f"{gain_text(ev)}")
    q = summary.get("quality")
    if q:
        a, k, r = q["applied"], q["provisional_kept"], q["provisional_rolled_back"]
        acc, sup = q["applied_by"]["accepted"], q["provisional_superseded"]
        bad = q.get("settled_violations", [])
        lines.append(f"changes applied after settlement: {sum(a.values())} (ACCEPTed "
                     f"{sum(acc.values())}, kept by a settlement {sum(k.values())}; truly "
                     f"better {a['better']}, neutral {a['neutral']}, worse {a['worse']}; "
                     f"neutral = |true gain| < {q['margin']:.0%}); good candidates missed "
                     f"{q['missed_better']} of {q['gated']['better']}; "
                     + ("every standing version settled" if not bad
                        else f"{len(bad)} UNSETTLED: {bad[0]}"))
        lines.append(f"probation: kept {sum(k.values())} (better {k['better']}, neutral "
                     f"{k['neutral']}, worse {k['worse']}), rolled back {sum(r.values())} "
                     f"(better {r['better']}, neutral {r['neutral']}, worse {r['worse']}), "
                     f"superseded before settlement {sum(sup.values())}")
        m = q["mean_accuracy"]
        lines.append(f"true accuracy (mean over types): initial {m['initial']:.1%}, this gate "
                     f"{m['gate']:.1%}, accept-every-candidate {m['accept_all']:.1%}, oracle "
                     f"gate {m['oracle']:.1%}")
    return "\n".join(lines)
