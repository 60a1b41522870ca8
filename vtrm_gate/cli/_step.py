"""``vtrm-gate step``, ``demo`` and ``replay``: run (or re-run) one gate step through the
workspace's own agent (`vtrm_gate.backends.step_workspace`), and replay a recorded one."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import CliError
from ._args import a_path, add_run_flags, emit, nonneg_int, positive_int, run_options
from ._progress import TerminalProgress, agent_printer
from ._table import Column, pad, render, terminal_width, wrap

DEMO_SEED = 2
"""The demo's world: notebooks 01-05's ``sim_step(2)``."""


def register(sub: Any) -> None:
    """Add ``step``, ``demo`` and ``replay`` to the ``vtrm-gate`` subcommands."""
    s = sub.add_parser("step", help="run or re-run one gate step (phases A-D)")
    s.add_argument("--workspace", type=a_path, required=True)
    s.add_argument("--epoch", type=positive_int, required=True)
    s.add_argument("--step", type=positive_int, required=True)
    s.add_argument("--force", action="store_true",
                   help="re-run even if the step's manifest changed")
    add_run_flags(s)
    s.set_defaults(func=cmd_step)

    d = sub.add_parser("demo", help="init + one step of a 12-type simulated world")
    d.add_argument("--workspace", type=a_path, default="workspace-demo")
    d.add_argument("--seed", type=nonneg_int, default=None,
                   help=f"the simulated world's seed (default {DEMO_SEED}, as notebooks 01-05's "
                        f"sim_step({DEMO_SEED}); an existing demo workspace keeps its own)")
    d.add_argument("--figures", type=a_path, default=None,
                   help="where the demo's figure and summary go (default: WORKSPACE/figures, "
                        "git-ignored like the workspace)")
    d.add_argument("--force", action="store_true",
                   help="re-run even if the step's manifest changed")
    add_run_flags(d, backend=False)
    d.set_defaults(func=cmd_demo)

    r = sub.add_parser("replay", help="prefix vs block replay of a recorded step, or of "
                                      "every gate of an outcomes file")
    r.add_argument("--workspace", type=a_path, help="the workspace (with --epoch and --step)")
    r.add_argument("--epoch", type=positive_int)
    r.add_argument("--step", type=positive_int)
    r.add_argument("--outcomes", type=a_path,
                   help="an outcomes table (.csv, .parquet, .jsonl; schema in docs/worlds.md) "
                        "instead of a workspace: every gate")
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
    summary = step_summary(run.result) | {"clock": run.clock}
    text = decision_table(run.result, _clock_name(run.clock))
    if run.report:
        summary["llm_cache"] = run.report
        text += "\n" + wrap(cache_lines(run.report), terminal_width(), indent="      ")
    summary["rerun"] = rerun_note(run.result)
    if summary["rerun"]:
        text += "\n" + wrap(summary["rerun"], terminal_width())
    emit(args, summary, text)
    return 0


def rerun_note(res: Any) -> str | None:
    """What a re-run of a recorded step did (it was silent: exit 0, no word), else None."""
    if not (res.rerun_of_applied or res.reused_candidates or any(res.cleared.values())):
        return None
    what = ("recorded and applied before; it ran again from the state before it"
            if res.rerun_of_applied else "started before and not finished; it ran again")
    hits = 0 if res.gate is None else res.gate.total("cache_hits")
    reused = "recorded candidates reused, " if res.reused_candidates else ""
    return (f"re-run: step e{res.epoch} s{res.step} was {what} (log rows replaced, {reused}"
            f"base arm from BaselineCache for {hits} calls); its tokens and time are now "
            f"this run's, the earlier run's are kept in replaced_runs (vtrm-gate compare "
            f"shows them)")


def step_summary(res: Any) -> dict[str, Any]:
    g = res.gate
    return {
        "epoch": res.epoch, "step": res.step, "step_run_id": res.step_run_id,
        "makespan_s": None if g is None else g.wall_time_s,
        "peak_in_flight": None if g is None else g.peak_in_flight,
        "tokens": None if g is None else g.tokens,
        # calls stopped past a freeze or past every stop: their answers were never stored
        "cancelled_in_flight": None if g is None else g.total("cancelled_in_flight"),
        "types": res.frame().to_dicts(),
    }


def _num(v: Any, fmt: str = "{}") -> str:
    return "" if v is None else fmt.format(v)


def stopped_at(stop_rank: int | None, n_ladder: int) -> str:
    """The 1-based "k of n" where a type decided, for display (``stop_rank`` stays 0-based
    in the data, the log and JSON)."""
    return "" if stop_rank is None else f"{stop_rank + 1} of {n_ladder}"


def _clock_name(clock: str) -> str:
    """How the step's makespan is labelled: simulated only on the virtual clock."""
    return "simulated" if clock == "virtual" else "wall clock"


def decision_table(res: Any, clock: str = "simulated", width: int | None = None) -> str:
    """The step's per-type table, ``width`` columns wide (default: the terminal's), each
    row's reason (what Phase D applied, and the type's note: why it was not gated, what its
    ladder left out or cannot reach) on a line under it."""
    width = width or terminal_width()
    rows = res.frame().to_dicts()
    col = {k: tuple(r[k] for r in rows) for k in rows[0]} if rows else {}
    cells = lambda k, fmt="{}": tuple(_num(v, fmt) for v in col.get(k, ()))  # noqa: E731
    cols = [Column("type", cells("task_type")), Column("status", cells("status")),
            Column("action", cells("action")), Column("W", cells("W"), True),
            Column("L", cells("L"), True), Column("n_used", cells("n_used"), True),
            Column("E+", cells("e_plus", "{:.3g}"), True, drop_rank=1),
            Column("stopped at", tuple(stopped_at(r["stop_rank"], r["n_ladder"])
                                       if r["stop_rank"] is not None else "" for r in rows),
                   True),
            Column("calls", cells("started"), True, drop_rank=3),
            Column("tokens", cells("tokens", "{:,}"), True, drop_rank=4),
            Column("ver", cells("version"), True, drop_rank=2)]
    notes = {i: "; ".join(n for n in (r["applied"], r["note"]) if n) for i, r in enumerate(rows)}
    text = render(cols, width, notes)
    text += "\n" + wrap("stopped at: the ladder unit (1-based) where the type decided; n_used: "
                        "the paired units that counted (INFRA units skipped)", width)
    g = res.gate
    if g is not None:
        from ..gate import hours

        text += "\n" + wrap(
            f"makespan {hours(g.wall_time_s)} ({clock}), peak in flight "
            f"{g.peak_in_flight}/{g.concurrency}, tokens {g.tokens:,}, started "
            f"{g.total('started')}, base arm from BaselineCache {g.total('cache_hits')}, "
            f"discarded after freeze {g.total('discarded_after_freeze')}, never started "
            f"{g.total('cancelled_before_start')}", width)
    return text


def http_line(sent: int, cancelled: int) -> str:
    """The step's HTTP request count, saying why it may exceed the endpoints' calls: a
    request cancelled before its reply is sent but no endpoint counts it among its calls
    (the endpoint check's GET /models is in neither)."""
    line = f"  {sent} HTTP requests sent in all (retries included"
    if cancelled:
        line += (f"; {cancelled} cancelled before the reply came, so the endpoints count "
                 f"{sent - cancelled} calls")
    return line + ")"


def cache_lines(info: dict[str, Any]) -> str:
    """Hit rates per run of the LLM response cache, for the end of ``step``'s output."""
    lines = [f"LLM response cache {info['url']} (prefix {info['prefix']}"
             + ("" if info["enabled"] else ", disabled") + "):"]
    for run, st in info["runs"].items():
        served = st["hits"] + st["coalesced"]
        uncached = f", {st['bypassed']} uncached" if st["bypassed"] else ""
        refused = (f", {st['refused']} not stored (Redis refused the writes)"
                   if st.get("refused") else "")  # a re-run pays for these again
        refused += (f", {st['too_large']} not stored (larger than Redis takes)"
                    if st.get("too_large") else "")
        lines.append(f"  {pad(run, 44)} hit rate {st['hit_rate']:6.1%}  ({served}/{st['calls']} "
                     f"calls served, {st['requests']} requests{uncached}, "
                     f"{st['errors']} errors{refused})")
    if not info["runs"]:
        lines.append("  (no LLM calls)")
    if "http_requests" in info:
        lines.append(http_line(info["http_requests"], info.get("http_cancelled", 0)))
    if info.get("endpoints"):
        from ..llm import EndpointStats, endpoint_lines

        lines.append(endpoint_lines([EndpointStats(**e) for e in info["endpoints"]]))
    return "\n".join(lines)


def cmd_demo(args: argparse.Namespace) -> int:
    """init (when new) + step e1 s1 of a simulated world; figures and the summary go inside
    the workspace (git-ignored), so the clone stays clean. A workspace that ran step e1 s1
    before is re-run, and the output says so (its base arm comes from the BaselineCache)."""
    root = Path(args.workspace)
    if args.figures and Path(args.figures).exists() and not Path(args.figures).is_dir():
        raise CliError(f"--figures {args.figures}: exists and is not a directory (the demo "
                       f"writes its figure and summary into a directory)")
    rerun, args.seed = _demo_workspace(root, args.seed)
    if rerun:
        note = (f"re-run: {root} already ran step e1 s1 (seed {rerun}): base arm from "
                f"BaselineCache, so this run is shorter; remove {root} (or pass --workspace "
                f"NEW) for a fresh one")
        if not args.json:
            print(wrap(note, terminal_width(sys.stderr)), file=sys.stderr)
    args.backend = None
    run = run_step_command(root, 1, 1, args)
    res = run.result
    figdir = Path(args.figures) if args.figures else root / "figures"
    files = _demo_figures(res, figdir)
    summary = step_summary(res)
    summary["figures"] = [str(f) for f in files]
    summary["rerun"] = bool(rerun)
    summary_path = figdir / "demo_summary.json"
    summary_path.write_text(json.dumps(summary, indent=2, default=str))
    text = decision_table(res, _clock_name(run.clock)) + "\n" + wrap(
        ("re-run (base arm from BaselineCache); " if rerun else "")
        + f"wrote {', '.join(map(str, files))} and {summary_path}", terminal_width())
    text += "\n" + wrap(DEMO_POOL_NOTE.format(seed=args.seed), terminal_width())
    emit(args, summary, text)
    return 0


DEMO_POOL_NOTE = (
    "the demo gates each type's whole pool, as the notebooks' sim_step({seed}) does; `vtrm-gate "
    "init DIR --seed {seed}` holds out 20% of the units for train's epoch-end evaluation, so "
    "its step gates fewer: add --heldout-fraction 0 for the demo's numbers")
"""Why ``init --seed N`` + ``step`` and the demo differ (issue 28: they were said to agree)."""


def _demo_workspace(root: Path, seed: int | None) -> tuple[int | None, int]:
    """Create the demo's workspace if needed: (the seed of its earlier run if it has one,
    the workspace's seed). A ``--seed`` another than an existing workspace's is refused (it
    was ignored without a word)."""
    from ..harness import Workspace
    from ..sim import SimConfig, init_simulated

    if not (root / "workspace.json").exists():
        if root.exists() and any(root.iterdir()):
            raise CliError(f"{root}: exists, is not empty and is not a workspace")
        seed = DEMO_SEED if seed is None else seed
        init_simulated(root, SimConfig(seed=seed)).close()
        return None, seed
    with Workspace.open(root, readonly=True) as ws:
        if seed is not None and seed != ws.config.seed:
            raise CliError(f"--seed {seed}: {root} is a demo workspace of seed "
                           f"{ws.config.seed}; remove it, or pass --workspace NEW for seed "
                           f"{seed}")
        ran = ws.state.last_step is not None and tuple(ws.state.last_step) >= (1, 1)
        return (ws.config.seed if ran else None), ws.config.seed


def _demo_figures(res: Any, figdir: Path) -> list[Path]:
    from ..views import plot_trajectories, save  # object API: no backend to set

    if res.gate is None:
        return []
    fig = plot_trajectories(res.gate.outcomes, None)
    return [save(fig, "demo_trajectories", figdir)]


def cmd_replay(args: argparse.Namespace) -> int:
    from ..harness import replay_step

    if args.outcomes is not None:
        return _replay_outcomes(args)
    missing = [f"--{n}" for n in ("workspace", "epoch", "step") if getattr(args, n) is None]
    if missing:
        raise CliError(f"replay needs {', '.join(missing)} (or --outcomes FILE)")
    df = replay_step(args.workspace, args.epoch, args.step, block=args.block)
    rows = df.to_dicts()
    get = lambda k: tuple("" if r.get(k) is None else str(r[k]) for r in rows)  # noqa: E731
    at = lambda k: tuple("" if r.get(k) is None else f"unit {r[k] + 1}" for r in rows)  # noqa: E731
    cols = [Column("type", get("task_type")), Column("live", get("live_action")),
            Column("prefix", get("prefix_action")),
            Column("stopped", at("prefix_stop_rank"), True),
            Column("units", get("prefix_units"), True),
            Column("block", get("block_action")),
            Column("stopped", at("block_stop_rank"), True, drop_rank=2),
            Column("units", get("block_units"), True, drop_rank=1),
            Column("unrun", get("block_unrun_needed"), True, drop_rank=3),
            Column("agree", get("agree"), drop_rank=4)]
    width = terminal_width()
    text = render(cols, width) + "\n" + wrap(
        "live: the step's decision; prefix / block: replayed unit by unit / in blocks of "
        f"{args.block} (stopped: the ladder unit, 1-based, where it decided; unrun: units the "
        "block rule needs that the step never ran); --json for every column"
        + _other_rule(rows), width)
    emit(args, {"epoch": args.epoch, "step": args.step, "block": args.block,
                "types": df.to_dicts()}, text)
    return 0


def _other_rule(rows: list[dict[str, Any]]) -> str:
    """A note when the step decided with another rule than the replays' (paired betting)."""
    from ..options import DEFAULT_DECISION_RULE

    other = sorted({r["live_rule"] for r in rows} - {DEFAULT_DECISION_RULE})
    return (f"; the live gate decided with {', '.join(other)}, the replays with "
            f"{DEFAULT_DECISION_RULE} (the SPEC's rule), so live may differ from both"
            if other else "")


def _replay_outcomes(args: argparse.Namespace) -> int:
    """``replay --outcomes FILE``: every gate of the file; --json prints a list of objects."""
    from ..harness import replay_outcomes

    given = [f"--{n}" for n in ("workspace", "epoch", "step") if getattr(args, n) is not None]
    if given:
        raise CliError(f"--outcomes replays a file; drop {', '.join(given)}")
    rows = replay_outcomes(Path(args.outcomes), block=args.block).to_dicts()
    if args.json:  # every column: no table to lay out
        emit(args, rows, "")
        return 0
    get = lambda k: tuple("" if r.get(k) is None else str(r[k]) for r in rows)  # noqa: E731
    cols = [Column("gate", tuple(f"e{r['epoch']} s{r['step']}" for r in rows)),
            Column("type", get("task_type")), Column("prefix_action", get("prefix_action")),
            Column("units", get("prefix_units"), True),
            Column("block_action", get("block_action")),
            Column("units", get("block_units"), True, drop_rank=1),
            Column("saved", get("units_saved"), True, drop_rank=2)]
    saved = [r["units_saved"] for r in rows if r["units_saved"] is not None]
    width = terminal_width()
    emit(args, rows, render(cols, width) + "\n" + wrap(
        f"{len(rows)} gates; the prefix rule used {sum(saved)} fewer units than blocks of "
        f"{args.block} where both decided ({len(saved)} gates); {_cooldowns(rows)}; --json "
        "for every column", width))
    return 0


COOLING = frozenset({"REJECT", "FUTILE"})
"""The exits Phase D follows with a cooldown (FUTILE only with ``futile_cooldown``)."""


def _cooldowns(rows: list[dict[str, Any]]) -> str:
    """How often the two rules differ in charging a cooldown, where both decided: the
    prefix rule's FUTILE comes before a ladder's end, where blocks end INERTIA."""
    from ..stats import Action

    decided = {a.value for a in Action}  # not UNKNOWN (a block needing unrun units)
    both = [(r["prefix_action"] in COOLING, r["block_action"] in COOLING) for r in rows
            if r["block_action"] in decided]
    more = sum(p and not b for p, b in both)
    fewer = sum(b and not p for p, b in both)
    return (f"the prefix rule ends {more} of them in REJECT or FUTILE (a cooldown) where "
            f"blocks do not, and {fewer} the other way")
