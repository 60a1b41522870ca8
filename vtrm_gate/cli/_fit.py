"""``vtrm-gate fit``: the world behind a workspace's gates or an outcomes file (per-type
baseline accuracy and discordance, the shares of harmful / neutral / helpful candidates by
empirical Bayes across gates), optionally written as a `vtrm_gate.sim.World` file."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from .._env import DEFAULT_BOOT, MAX_BOOT, MAX_WORKERS, user_path
from ..errors import CliError
from ._args import a_path, emit, int_in, nonneg_int
from ._progress import status_line
from ._table import Column, render, terminal_width, wrap


def register(sub: Any) -> None:
    """Add ``fit`` to the ``vtrm-gate`` subcommands."""
    f = sub.add_parser("fit", help="fit the world (shares of harmful / neutral / helpful "
                                   "candidates) to a workspace or an outcomes file")
    src = f.add_mutually_exclusive_group(required=True)
    src.add_argument("--workspace", type=a_path, help="a workspace: its recorded gates")
    src.add_argument("--outcomes", type=a_path, help="an outcomes table (.csv, .parquet, .jsonl)")
    f.add_argument("--out", type=a_path, help="write the fitted world here (a World JSON file for "
                                 "init --world)")
    f.add_argument("--boot", type=int_in(1, MAX_BOOT), default=DEFAULT_BOOT,
                   help=f"bootstrap resamples of the gates, 1 to {MAX_BOOT:,} (default "
                        f"{DEFAULT_BOOT})")
    f.add_argument("--seed", type=nonneg_int, default=0, help="the bootstrap's seed")
    f.add_argument("--free-sizes", action="store_true",
                   help="fit the effect sizes too (default: the simulator's 0.3-0.9 logit; "
                        "needs a few hundred gates, see docs/worlds.md)")
    f.add_argument("--jobs", type=int_in(1, MAX_WORKERS), default=1,
                   help=f"local processes for the bootstrap, 1 to {MAX_WORKERS} (default 1: "
                        f"here, serially)")
    f.add_argument("--scheduler", help="run the bootstrap on the Dask cluster at "
                                       "tcp://HOST:PORT (its workers import vtrm_gate)")
    f.add_argument("--json", action="store_true", help="machine-readable output")
    f.set_defaults(func=cmd_fit)


def cmd_fit(args: argparse.Namespace) -> int:
    from ..harness import Workspace
    from ..sim import fit_world

    if args.workspace is not None:
        root = Path(args.workspace)
        Workspace.open(root, readonly=True).close()  # a missing or broken one: one line
        source: Any = root
    else:
        source = Path(args.outcomes)
        if source.is_dir():
            raise CliError(f"{source}: is a directory; --outcomes takes a file (a workspace: "
                           f"--workspace)")
    _check_out(args.out, args.workspace, args.outcomes)  # before the bootstrap, not after
    if args.scheduler and args.jobs != 1:
        raise CliError("--jobs and --scheduler: give one (--scheduler runs the bootstrap on "
                       "the Dask cluster's workers; --jobs N on N local processes)")
    line, done = status_line()
    t0 = time.monotonic()

    def show(n: int) -> None:
        left = (time.monotonic() - t0) / n * (args.boot - n)
        line(f"... bootstrap: {n:,} of {args.boot:,} resamples refitted (~{left:,.0f} s left)")

    try:
        with _executor(args.jobs, args.scheduler) as ex:
            fit = fit_world(source, n_boot=args.boot, seed=args.seed,
                            free_sizes=args.free_sizes, executor=ex, progress=show)
    finally:
        done()
    if args.out:
        fit.world.to_json(args.out)
    data = fit.to_dict()
    emit(args, data, _text(data, args.out))
    return 0


def _check_out(out: str | None, workspace: str | None, outcomes: str | None) -> None:
    """``--out`` names a file the fit may write: not a directory, in one that exists, not
    inside the workspace it reads (``--out ws/state.json`` broke the workspace) and not the
    outcomes file it reads (overwritten with the world's JSON)."""
    if out is None:
        return
    path = user_path(out).resolve()
    if path.is_dir():
        raise CliError(f"--out {out}: is a directory; name a file such as world.json")
    if path.exists() and not path.is_file():  # a FIFO blocked the write for ever
        raise CliError(f"--out {out}: is not a regular file (a FIFO or a device); name a "
                       f"file such as world.json")
    if not path.parent.is_dir():
        raise CliError(f"--out {out}: directory {path.parent} does not exist")
    if workspace is not None and path.is_relative_to(user_path(workspace).resolve()):
        raise CliError(f"--out {out}: is inside the workspace being fitted; write the world "
                       f"elsewhere (its files are the workspace's own)")
    if outcomes is not None and path.exists() and path.samefile(user_path(outcomes)):
        raise CliError(f"--out {out}: is the --outcomes file being fitted; write the world "
                       f"elsewhere, such as world.json")


@contextlib.contextmanager
def _executor(jobs: int, scheduler: str | None) -> Iterator[Executor | None]:
    """The bootstrap's engine: a Dask cluster, ``jobs`` local processes, or None (here)."""
    from ..sim import sweep_executor

    if jobs == 1 and not scheduler:
        yield None
        return
    with sweep_executor(scheduler, jobs) as ex:
        yield ex


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _text(d: dict[str, Any], out: str | None) -> str:
    ci = d["intervals"]
    head = (f"{d['n_gates']} gates: candidates "
            + ", ".join(f"{_pct(d[k])} {k[2:]} ({_pct(ci[k][0])}-{_pct(ci[k][1])})"
                        for k in ("p_harmful", "p_neutral", "p_helpful"))
            + f"; {round(100 * d['level'])}% bootstrap intervals over gates")
    rows = d["types"]
    get = lambda k, f: tuple(f(r[k]) for r in rows)  # noqa: E731
    cols = [Column("type", get("task_type", str)), Column("gates", get("n_gates", str), True),
            Column("units", get("n_units", str), True),
            Column("base acc", get("base_accuracy", lambda x: f"{x:.2f}"), True),
            Column("discordance", get("discordance", lambda x: f"{x:.2f}"), True),
            Column("harmful", get("p_harmful", _pct), True, drop_rank=1),
            Column("neutral", get("p_neutral", _pct), True, drop_rank=1),
            Column("helpful", get("p_helpful", _pct), True, drop_rank=1)]
    width = terminal_width()
    tail = ("per type: accuracy and discordance on the units its gates consumed; shares: "
            "its gates' mean posterior under the shared fit"
            + (f"; world written to {out}" if out else ""))
    return wrap(head, width) + "\n" + render(cols, width) + "\n" + wrap(tail, width)
