"""``vtrm-gate step``, ``demo`` and ``replay``: run (or re-run) one gate step through the
workspace's own agent (`vtrm_gate.backends.step_workspace`), and replay a recorded one."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..errors import CliError
from ._args import add_run_flags, emit, nonneg_int, positive_int, run_options
from ._progress import TerminalProgress, agent_printer


def register(sub: Any) -> None:
    """Add ``step``, ``demo`` and ``replay`` to the ``vtrm-gate`` subcommands."""
    s = sub.add_parser("step", help="run or re-run one gate step (phases A-D)")
    s.add_argument("--workspace", required=True)
    s.add_argument("--epoch", type=positive_int, required=True)
    s.add_argument("--step", type=positive_int, required=True)
    s.add_argument("--force", action="store_true",
                   help="re-run even if the step's manifest changed")
    add_run_flags(s)
    s.set_defaults(func=cmd_step)

    d = sub.add_parser("demo", help="init + one step of a 12-type simulated world")
    d.add_argument("--workspace", default="workspace-demo")
    d.add_argument("--seed", type=nonneg_int, default=2)  # notebooks 01-05: sim_step(2)
    d.add_argument("--figures", default="figures")
    d.add_argument("--force", action="store_true",
                   help="re-run even if the step's manifest changed")
    add_run_flags(d, backend=False)
    d.set_defaults(func=cmd_demo)

    r = sub.add_parser("replay", help="prefix vs block replay of a recorded step")
    r.add_argument("--workspace", required=True)
    r.add_argument("--epoch", type=positive_int, required=True)
    r.add_argument("--step", type=positive_int, required=True)
    r.add_argument("--block", type=positive_int, default=8)
    r.add_argument("--json", action="store_true", help="machine-readable output")
    r.set_defaults(func=cmd_replay)


def run_step_command(root: Path, epoch: int, step: int, args: argparse.Namespace) -> Any:
    """One step of the workspace at ``root`` with the options the flags resolve to."""
    from ..backends import run_on_clock, step_workspace
    from ..harness import Workspace

    options = run_options(args)
    progress = TerminalProgress(quiet=args.json)
    ws = Workspace.open(root)  # validates; writes nothing
    try:
        return run_on_clock(ws, options, lambda: step_workspace(
            ws, epoch, step, options, force=args.force, subscribers=[progress],
            on_agent_event=agent_printer(args.json),
            command=f"vtrm-gate {args.command} e{epoch} s{step}"))
    finally:
        ws.close()


def cmd_step(args: argparse.Namespace) -> int:
    run = run_step_command(Path(args.workspace), args.epoch, args.step, args)
    summary = step_summary(run.result)
    text = decision_table(run.result, clock="simulated" if run.kind == "simulated"
                          else "wall clock")
    if run.report:
        summary["llm_cache"] = run.report
        text += "\n" + cache_lines(run.report)
    emit(args, summary, text)
    return 0


def step_summary(res: Any) -> dict[str, Any]:
    g = res.gate
    return {
        "epoch": res.epoch, "step": res.step, "step_run_id": res.step_run_id,
        "makespan_s": None if g is None else g.wall_time_s,
        "peak_in_flight": None if g is None else g.peak_in_flight,
        "tokens": None if g is None else g.tokens,
        "types": res.frame().to_dicts(),
    }


def decision_table(res: Any, clock: str = "simulated") -> str:
    import polars as pl

    df = res.frame().select("task_type", "status", "action", "W", "L", "n_used", "e_plus",
                            "stop_rank", "n_ladder", "started", "tokens", "version", "applied")
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=200, fmt_str_lengths=30,
                   tbl_hide_dataframe_shape=True, float_precision=3):
        text = str(df)
    g = res.gate
    if g is not None:
        text += (f"\nmakespan {g.wall_time_s / 3600:.2f} h ({clock}), peak in flight "
                 f"{g.peak_in_flight}/{g.concurrency}, tokens {g.tokens:,}, started "
                 f"{g.total('started')}, cache hits {g.total('cache_hits')}, discarded after "
                 f"freeze {g.total('discarded_after_freeze')}, never started "
                 f"{g.total('cancelled_before_start')}")
    return text


def cache_lines(info: dict[str, Any]) -> str:
    """Hit rates per run of the LLM response cache, for the end of ``step``'s output."""
    lines = [f"LLM response cache {info['url']} (prefix {info['prefix']}"
             + ("" if info["enabled"] else ", disabled") + "):"]
    for run, st in info["runs"].items():
        served = st["hits"] + st["coalesced"]
        uncached = f", {st['bypassed']} uncached" if st["bypassed"] else ""
        lines.append(f"  {run:<44} hit rate {st['hit_rate']:6.1%}  ({served}/{st['calls']} "
                     f"calls served, {st['requests']} requests{uncached}, "
                     f"{st['errors']} errors)")
    if not info["runs"]:
        lines.append("  (no LLM calls)")
    if "http_requests" in info:
        lines.append(f"  {info['http_requests']} HTTP requests sent in all (retries included)")
    if info.get("endpoints"):
        from ..llm import EndpointStats, endpoint_lines

        lines.append(endpoint_lines([EndpointStats(**e) for e in info["endpoints"]]))
    return "\n".join(lines)


def cmd_demo(args: argparse.Namespace) -> int:
    from ..sim import SimConfig, init_simulated

    root = Path(args.workspace)
    if not (root / "workspace.json").exists():
        if root.exists() and any(root.iterdir()):
            raise CliError(f"{root}: exists, is not empty and is not a workspace")
        init_simulated(root, SimConfig(seed=args.seed)).close()
    args.backend = None
    res = run_step_command(root, 1, 1, args).result
    figdir = Path(args.figures)
    files = _demo_figures(res, figdir)
    summary = step_summary(res)
    summary["figures"] = [str(f) for f in files]
    summary_path = figdir / "demo_summary.json"
    summary_path.write_text(json.dumps(summary, indent=2, default=str))
    text = decision_table(res) + f"\nwrote {', '.join(map(str, files))} and {summary_path}"
    emit(args, summary, text)
    return 0


def _demo_figures(res: Any, figdir: Path) -> list[Path]:
    from ..views import plot_trajectories, save  # object API: no backend to set

    if res.gate is None:
        return []
    fig = plot_trajectories(res.gate.outcomes, None)
    return [save(fig, "demo_trajectories", figdir)]


def cmd_replay(args: argparse.Namespace) -> int:
    import polars as pl

    from ..harness import replay_step

    df = replay_step(args.workspace, args.epoch, args.step, block=args.block)
    brief = [c for c in ("task_type", "live_action", "prefix_action", "prefix_stop_rank",
                         "prefix_units", "block_action", "block_stop_rank", "block_units",
                         "block_unrun_needed", "agree") if c in df.columns]
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=220, fmt_str_lengths=40,
                   tbl_hide_dataframe_shape=True, float_precision=3):
        text = str(df.select(brief)) + "\n(--json for every column)"
    emit(args, {"epoch": args.epoch, "step": args.step, "block": args.block,
                "types": df.to_dicts()}, text)
    return 0
