"""Argument types and the run flags every command shares, and the one place flags become a
`RunOptions` (`run_options`). Light at import: argparse only."""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any

from .._env import (
    DEFAULT_CONCURRENCY,
    DEFAULT_DEADLINE_S,
    DEFAULT_MAX_RETRIES,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TIMEOUT_S,
    MAX_TIME_SCALE,
)
from ..errors import CliError, OutputError, shown

INT_MAX = 2**63 - 1  # SQLite's INTEGER: epochs, steps and seeds are stored as one
RUN_FLAGS = ("concurrency", "dispatch", "cancel_after_freeze", "past_stop", "time_scale",
             "backend", "decision_rule", "adaptive", "timeout", "deadline", "max_retries",
             "max_tokens_think", "max_tokens_answer", "max_tokens_evolve")
"""Flags that set a `RunOptions` key of the same name (flag > environment > file)."""
TABLE_FLAGS = {"guard_rule": "guard.rule"}
"""Flags that set a key of a table (``--guard-rule`` sets ``guard.rule``)."""


def a_path(text: str) -> str:
    """An argparse ``type`` for a path: refuses an empty one, which would mean the working
    directory ("" wrote an export's files there)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a path, got {shown(text)}")
    return text


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type`` accepting integers from ``low`` to 2**63 - 1."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {shown(text)}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text}")
        if v > INT_MAX:
            raise argparse.ArgumentTypeError(f"expected an integer <= 2**63 - 1 (SQLite's "
                                             f"largest), got {text}")
        return v

    return parse


def float_in(low: float, high: float, upper_open: bool) -> Callable[[str], float]:
    """An argparse ``type`` accepting finite numbers in [low, high) or [low, high]."""
    bracket = ")" if upper_open else "]"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {shown(text)}") from None
        ok = low <= v < high if upper_open else low <= v <= high
        if not (ok and math.isfinite(v)):
            raise argparse.ArgumentTypeError(f"expected a finite number in [{low:g}, "
                                             f"{high:g}{bracket}, got {text}")
        return v

    return parse


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type`` accepting integers from ``low`` to ``high``."""

    def parse(text: str) -> int:
        v = int_at_least(-INT_MAX)(text)
        if not low <= v <= high:  # the range on either side ("-1": not ">= 1" alone)
            raise argparse.ArgumentTypeError(f"expected an integer from {low} to {high}, "
                                             f"got {text}")
        return v

    return parse


positive_int = int_at_least(1)
nonneg_int = int_at_least(0)
nonneg_float = float_in(0.0, math.inf, upper_open=True)
rate = float_in(0.0, 1.0, upper_open=True)


def positive_float(text: str) -> float:
    """An argparse ``type`` accepting finite numbers > 0."""
    v = nonneg_float(text)
    if v == 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return v


def positive(name: str, text: str) -> int:
    """``--name``'s value as a positive integer, or `CliError` naming it."""
    try:
        v = int(text)
    except ValueError:
        raise CliError(f"--{name} must be a positive integer, got {shown(text)}") from None
    if not 1 <= v <= INT_MAX:
        raise CliError(f"--{name} must be a positive integer (at most {INT_MAX}), got {v}")
    return v


def add_run_flags(sp: argparse.ArgumentParser, *, backend: bool = True) -> None:
    """The flags of a run: slots, config file, clock, dispatch, cancel policy, agent."""
    sp.add_argument("--concurrency", type=positive_int, default=None,
                    help=f"slot pool size (default: config, else {DEFAULT_CONCURRENCY}, or the "
                         "summed caps of several endpoints)")
    sp.add_argument("--config", type=a_path,
                    help="config file (TOML or JSON); env and .env apply too")
    sp.add_argument("--time-scale", type=float_in(0.0, MAX_TIME_SCALE, upper_open=False),
                    default=None,
                    help=f"real seconds per simulated second, 0 to {MAX_TIME_SCALE:g} "
                         f"(default: virtual clock)")
    # literals, not gate.DISPATCH_NAMES: --help imports no numpy (tests/cli keep them equal)
    sp.add_argument("--dispatch", choices=("round_robin", "need_aware", "expected_need"),
                    default=None, help="which type the gate feeds next (default: config, "
                                       "expected_need; decisions do not depend on it)")
    sp.add_argument("--decision-rule", choices=("paired_betting", "lambda_mixture",
                                                "old_blocks"), default=None,
                    help="the gate's decision rule (default: config, paired_betting; the "
                         "others are opt-in with the same guarantee, see docs/statistics.md)")
    sp.add_argument("--guard-rule", choices=("ratio", "sequential"), default=None,
                    help="INFRA guard: ratio (> max_ratio once >= min_calls, the default) or "
                         "sequential (an anytime-valid test of 'INFRA rate > max_ratio')")
    sp.add_argument("--cancel-after-freeze", action=argparse.BooleanOptionalAction,
                    default=None, help="cancel a frozen type's in-flight calls whose answers "
                                       "serve nothing more (default: config, on)")
    sp.add_argument("--past-stop", choices=("cancel", "wait"), default=None,
                    help="once every type has decided: cancel the calls still in flight or "
                         "wait for them (default: config, cancel)")
    add_agent_flags(sp)
    if backend:
        sp.add_argument("--backend", help="your own agent: a factory 'package.module:function' "
                                          "returning a vtrm_gate.llm.AgentBackend (default: "
                                          "the workspace's agent.backend, else its kind's "
                                          "agent)")
    sp.add_argument("--json", action="store_true", help="machine-readable output")


def add_agent_flags(sp: argparse.ArgumentParser) -> None:
    """The flags of an LLM workspace's calls: concurrency policy, timeouts, retries, budgets."""
    g = sp.add_argument_group("LLM calls (llm workspaces; default: config, env, then below)")
    g.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=None,
                   help="adapt each endpoint's concurrency to its latency, within "
                        "--concurrency (default on)")
    g.add_argument("--timeout", type=positive_float, default=None,
                   help="each attempt's timeout in seconds, longer for an endpoint observed "
                        f"slower (default {DEFAULT_TIMEOUT_S:g})")
    g.add_argument("--deadline", type=positive_float, default=None,
                   help=f"each call's deadline in seconds, retries included (default "
                        f"{DEFAULT_DEADLINE_S:g})")
    g.add_argument("--max-retries", type=int_in(0, 100), default=None,
                   help=f"retries after the first attempt (default {DEFAULT_MAX_RETRIES})")
    for call_kind, default in DEFAULT_MAX_TOKENS.items():
        g.add_argument(f"--max-tokens-{call_kind}", type=int_in(0, 1_000_000), default=None,
                       help=f"the {call_kind} call's reply budget; 0: none sent (default "
                            f"{default}; it keys the caches)")


def run_options(args: argparse.Namespace, **extra: Any) -> Any:
    """The run's `RunOptions`, resolved once: these flags > environment (.env) > --config
    file > defaults. ``extra`` adds flags of the command's own (dotted keys)."""
    from ..options import resolve_options

    flags = {k: getattr(args, k, None) for k in RUN_FLAGS}
    flags |= {key: getattr(args, dest, None) for dest, key in TABLE_FLAGS.items()}
    names = {key: f"--{dest.replace('_', '-')}" for dest, key in TABLE_FLAGS.items()}
    return resolve_options({**flags, **extra}, config=getattr(args, "config", None),
                           flag_names=names)


APPLYING = frozenset({"init", "step", "demo", "train", "settle"})
"""Commands whose work is saved before their output is printed: running one again for an
output that could not be written would redo it."""


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    """Print ``text``, or ``data`` as JSON under ``--json``; `OutputError` when stdout
    cannot take it (a full disk, a closed file: not a pipe whose reader left)."""
    try:
        print(json.dumps(data, indent=2, default=str) if getattr(args, "json", False)
              else text, flush=True)
    except BrokenPipeError:
        raise
    except OSError as exc:
        drop_stdout()
        done = (f"{args.command} finished and its work is saved (vtrm-gate status shows "
                f"where the run stands; do not run it again for its output)"
                if args.command in APPLYING else f"{args.command} itself finished")
        raise OutputError(f"cannot write the output to stdout ({exc.strerror or exc}); "
                          f"{done}") from None


def drop_stdout() -> None:
    """Point stdout's file descriptor at /dev/null after a write to it failed, so the
    interpreter's last flush of the unwritten text does not fail again at exit."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # not a real file (a notebook's, a test's capture): nothing to flush at exit
    finally:
        os.close(null)
