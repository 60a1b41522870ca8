"""The ``vtrm-gate`` command: init, step, demo, replay, cache.

``init`` creates a simulated workspace, or with ``--llm`` one whose units are answered by an
OpenAI-compatible chat model; ``step`` dispatches on the workspace's kind. The API key comes
from ``OPENAI_API_KEY`` / ``VTRM_API_KEY`` only and is never written or printed.

Heavy modules (numpy, polars, matplotlib) are imported inside the subcommands that need
them. One error boundary (`main`): bad input and expected failures (a bad value, an OSError
such as a full disk or a read-only workspace, an SQLite error, a locked workspace) print one
line and exit 2, with no traceback (``VTRM_DEBUG=1`` shows it); INFRA (the guard tripped,
nothing measured) exits 3; SIGINT and SIGTERM exit 130 after marking the step aborted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXIT_BAD_INPUT = 2
EXIT_GUARD = 3


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


_INT_MAX = 2**63 - 1  # SQLite's INTEGER: epochs, steps and seeds are stored as one


def _int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type`` accepting integers from ``low`` to 2**63 - 1."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= v <= _INT_MAX:
            raise argparse.ArgumentTypeError(f"expected an integer from {low} to {_INT_MAX}, "
                                             f"got {text}")
        return v

    return parse


_positive_int = _int_at_least(1)
_nonneg_int = _int_at_least(0)


def _float_in(low: float, high: float, upper_open: bool) -> Callable[[str], float]:
    """An argparse ``type`` accepting finite numbers in [low, high) or [low, high]."""
    bracket = ")" if upper_open else "]"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        ok = low <= v < high if upper_open else low <= v <= high
        if not (ok and math.isfinite(v)):
            raise argparse.ArgumentTypeError(f"expected a finite number in [{low:g}, "
                                             f"{high:g}{bracket}, got {text}")
        return v

    return parse


_nonneg_float = _float_in(0.0, math.inf, upper_open=True)
_rate = _float_in(0.0, 1.0, upper_open=True)


# ---- live terminal progress -----------------------------------------------------------


class TerminalProgress:
    """Per-type progress on stderr: a line when a type decides, a status line now and then.

    A subscriber of the gate's event bus: it never blocks the scheduler.
    """

    def __init__(self, stream: Any = None, every_s: float = 2.0, quiet: bool = False):
        self.stream = stream or sys.stderr
        self.every_s, self.quiet = every_s, quiet
        self.ladder: dict[str, int] = {}
        self.consumed: dict[str, int] = {}
        self.decided: dict[str, str] = {}
        self.in_flight = 0
        self.retries = 0
        self.t0: float | None = None
        self._last = 0.0

    def _clock(self, t: float) -> str:
        s = int(t - (self.t0 or 0.0))
        return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"

    def __call__(self, ev: Any) -> None:
        from .scheduler import (
            GateAborted,
            GateFinished,
            GateStarted,
            PrefixAdvanced,
            TaskFinished,
            TaskProgress,
            TaskStarted,
            TypeDecided,
        )

        if self.quiet:
            return
        if isinstance(ev, GateStarted):
            self.t0 = ev.t
            self.ladder = dict(zip(ev.task_types, ev.ladder_sizes, strict=True))
            self._print(f"[{self._clock(ev.t)}] gate started: {len(ev.task_types)} types, "
                        f"{sum(ev.ladder_sizes)} ladder units, {ev.concurrency} slots")
        elif isinstance(ev, TaskStarted):
            self.in_flight = ev.in_flight
        elif isinstance(ev, TaskFinished) and ev.status != "cache_hit":
            self.in_flight = max(0, self.in_flight - 1)
        elif isinstance(ev, PrefixAdvanced):
            self.consumed[ev.task_type] = ev.ladder_rank + 1
        elif isinstance(ev, TaskProgress) and ev.status == "retrying":
            self.retries += 1
        elif isinstance(ev, TypeDecided):
            o = ev.outcome
            self.decided[ev.task_type] = str(o.action)
            where = "empty ladder" if o.stop_rank is None else (
                f"after {o.n_consumed}/{o.n_ladder} units")
            self._print(f"[{self._clock(ev.t)}] {ev.task_type:<22} {o.action!s:<11} {where}"
                        f"  W={o.W} L={o.L} E+={o.e_plus:.3g}  "
                        f"({len(self.decided)}/{len(self.ladder)} decided)")
        elif isinstance(ev, GateFinished | GateAborted):
            what = "finished" if isinstance(ev, GateFinished) else f"ABORTED: {ev.reason}"
            self._print(f"[{self._clock(ev.t)}] gate {what}")
            return
        now = time.monotonic()
        if now - self._last >= self.every_s and self.ladder:
            self._last = now
            busy = [f"{t.split()[0][:6]} {self.consumed.get(t, 0)}/{n}"
                    for t, n in self.ladder.items() if t not in self.decided]
            retrying = f" | {self.retries} retries" if self.retries else ""
            self._print(f"[{self._clock(ev.t)}] in flight {self.in_flight:>2}{retrying} | "
                        + ", ".join(busy[:6]) + (" ..." if len(busy) > 6 else ""))

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


# ---- subcommands ----------------------------------------------------------------------


def _load_config(args: argparse.Namespace) -> Any:
    from .config import load_config

    cfg = load_config(getattr(args, "config", None))
    flags = {k: getattr(args, k, None) for k in ("dispatch", "cancel_after_freeze")}
    flags = {k: v for k, v in flags.items() if v is not None}  # a flag beats file and env
    return dataclasses.replace(cfg, **flags) if flags else cfg


def cmd_init(args: argparse.Namespace) -> int:
    from .harness.atomic_dir import only_lock_file

    root = Path(args.workspace)
    if root.exists() and (not root.is_dir() or not only_lock_file(root)):
        raise CliError(f"{root}: exists and is not empty; choose a new directory")
    llm_only = [f"--{n.replace('_', '-')}" for n in ("units", "base_url", "model", "skills",
                                                      "seed_record", "backend", "endpoints",
                                                      "max_frames", "max_side")
                if getattr(args, n) is not None]
    if args.llm:
        return _init_llm(root, args)
    if llm_only:
        raise CliError(f"{', '.join(llm_only)} need --llm (an LLM workspace)")
    from .backends import init_simulated
    from .sim import SimConfig

    sim = SimConfig(seed=args.seed, infra_rate=args.infra_rate)
    ws = init_simulated(root, sim, heldout_fraction=args.heldout_fraction,
                        probation_rule=args.probation_rule)
    ws.close()
    out = {"workspace": str(root), "types": len(sim.resolved_pool_sizes()), "seed": args.seed}
    _emit(args, out, f"created simulated workspace {root} ({out['types']} types, "
                     f"seed {args.seed})")
    return 0


def _init_llm(root: Path, args: argparse.Namespace) -> int:
    from .harness import Workspace

    needed = ("units",) if args.backend else (
        ("units", "model") if args.endpoints else ("units", "base_url", "model"))
    missing = [f"--{n.replace('_', '-')}" for n in needed if not getattr(args, n)]
    if missing:
        raise CliError(f"init --llm needs {', '.join(missing)}")
    if args.backend:
        from .plugin import load_factory

        load_factory(args.backend)  # refuse a factory that does not import, before writing
    ws = Workspace.init_llm(root, args.units, base_url=args.base_url, model=args.model,
                            seed=args.seed, skills_dir=args.skills,
                            seed_record=args.seed_record, backend=args.backend,
                            endpoints_file=args.endpoints,
                            media={k: v for k, v in (("max_frames", args.max_frames),
                                                     ("max_side", args.max_side))
                                   if v is not None})
    out = {"workspace": str(root), "kind": "llm", "types": len(ws.pool),
           "units": sum(len(u) for u in ws.pool.values()), "model": args.model,
           "seed": args.seed}
    ws.close()
    _emit(args, out, f"created llm workspace {root} ({out['types']} types, {out['units']} "
                     f"units, model {args.model}, seed {args.seed})")
    return 0


def _api_key(env: dict[str, str]) -> str:
    return env.get("OPENAI_API_KEY") or env.get("VTRM_API_KEY") or ""


def _agent_printer(quiet: bool) -> Callable[[Any], None]:
    """Retries and give-ups of the chat agent, one line each on stderr."""

    def show(ev: Any) -> None:
        if quiet or ev.kind == "request":
            return
        what = (f"retry {ev.attempt} in {ev.delay_s:.1f}s" if ev.kind == "retry"
                else f"gave up after {ev.attempt} attempt(s)")
        print(f"[agent] {ev.step} {ev.unit_id} ({ev.run_id}): {what}: {ev.error}",
              file=sys.stderr, flush=True)

    return show


def _run_llm_step(ws: Any, epoch: int, step: int, args: argparse.Namespace,
                  progress: TerminalProgress) -> tuple[Any, dict[str, Any]]:
    """Rollout cases, then the step, for an ``llm`` workspace; returns (result, cache info)."""
    from ._sync import run_sync
    from .backends import EndpointUnreachableError, check_endpoint, llm_backend, rollout_cases
    from .cache import ResponseCache, environment
    from .endpoints import EndpointsError, agent_endpoints, gate_concurrency
    from .harness import run_step

    cfg = _load_config(args)
    try:
        endpoints = agent_endpoints(ws.config.agent, ws.root)
    except EndpointsError as exc:
        raise CliError(str(exc)) from None
    unreachable = []
    for ep in endpoints:  # before anything starts or is written (embedded Redis, rows)
        try:
            check_endpoint(ep.url)
        except EndpointUnreachableError as exc:
            unreachable.append(str(exc))
    if len(unreachable) == len(endpoints):
        raise CliError("; ".join(unreachable))
    env = environment()
    cache = ResponseCache(cfg.redis_url, ttl=cfg.redis_cache_ttl, prefix=cfg.cache_prefix,
                          enabled=cfg.cache_enabled, workspace=ws.root)
    concurrency = args.concurrency or cfg.concurrency
    if len(endpoints) > 1:  # the sum of the caps, unless set lower (32 = the default: unset)
        concurrency = gate_concurrency(args.concurrency or (
            cfg.concurrency if cfg.concurrency != 32 else None), endpoints)
    with _writer_lock(ws.root, args):  # the rollout reads the state the step will replace
        ws.reload_state()
        backend = llm_backend(ws, cache=cache, api_key=_api_key(env),
                              on_event=_agent_printer(args.json), concurrency=concurrency,
                              share=cfg.cache_share)

        async def go() -> Any:
            try:
                cases = await rollout_cases(backend, ws, epoch, step, cfg.guard)
                return await run_step(ws, epoch, step, infer=backend.infer,
                                      evolver=backend.evolver, cases=cases,
                                      cache_stats=backend.cache_stats, params=cfg.gate,
                                      guard=cfg.guard, concurrency=concurrency,
                                      force=args.force, subscribers=[progress],
                                      dispatch=cfg.dispatch,
                                      cancel_after_freeze=cfg.cancel_after_freeze)
            finally:
                await backend.aclose()

        res = run_sync(go())
    info = {"url": cache.masked_url, "prefix": cache.prefix, "enabled": cache.enabled,
            "http_requests": backend.agent.http_requests,
            "runs": {r: cache.stats(r).as_dict() for r in sorted(cache.runs())},
            "endpoints": [e.as_dict() for e in backend.endpoint_stats]}
    return res, info


def _cache_lines(info: dict[str, Any]) -> str:
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
        from .endpoints import EndpointStats, endpoint_lines

        lines.append(endpoint_lines([EndpointStats(**e) for e in info["endpoints"]]))
    return "\n".join(lines)


def _run_step(root: Path, epoch: int, step: int, args: argparse.Namespace,
              progress: TerminalProgress) -> Any:
    from .backends import simulated_backend
    from .harness import Workspace, run_step
    from .sim import run_virtual

    cfg = _load_config(args)
    with _writer_lock(root, args), Workspace.open(root) as ws:
        scale = args.time_scale  # None: the virtual clock
        backend = simulated_backend(ws, time_scale=1.0 if scale is None else scale)
        coro = run_step(ws, epoch, step, infer=backend.infer, evolver=backend.evolver,
                        cases=backend.cases, params=cfg.gate, guard=cfg.guard,
                        concurrency=args.concurrency or cfg.concurrency, force=args.force,
                        subscribers=[progress], dispatch=cfg.dispatch,
                        cancel_after_freeze=cfg.cancel_after_freeze)
        if scale is None:  # virtual clock: hours of simulated inference in seconds
            return run_virtual(coro)
        from ._sync import run_sync

        return run_sync(coro)


def _writer_lock(root: Path, args: argparse.Namespace) -> Any:
    """The workspace's writer lock for this command (a second writer exits 2 at once)."""
    from .harness import workspace_lock

    what = f" e{args.epoch} s{args.step}" if hasattr(args, "epoch") else ""
    return workspace_lock(root, f"vtrm-gate {args.command}{what}")


def _step_summary(res: Any) -> dict[str, Any]:
    g = res.gate
    return {
        "epoch": res.epoch, "step": res.step, "step_run_id": res.step_run_id,
        "makespan_s": None if g is None else g.wall_time_s,
        "peak_in_flight": None if g is None else g.peak_in_flight,
        "tokens": None if g is None else g.tokens,
        "types": res.frame().to_dicts(),
    }


def plugin_cache(ws: Any, cfg: Any) -> Any:
    """The response cache a bring-your-own backend is given (config, workspace, share)."""
    from .cache import ResponseCache, cache_namespace

    cache = ResponseCache(cfg.redis_url, ttl=cfg.redis_cache_ttl, prefix=cfg.cache_prefix,
                          enabled=cfg.cache_enabled, workspace=ws.root)
    if cfg.cache_share:
        cache.namespace = cache_namespace(ws.workspace_id, cfg.cache_share)
    return cache


def _run_plugin_step(ws: Any, spec: str, args: argparse.Namespace,
                     progress: TerminalProgress) -> tuple[Any, dict[str, Any]]:
    """A step with your own agent (`vtrm_gate.plugin`): the factory named by ``spec``."""
    from ._sync import run_sync
    from .cache import environment
    from .plugin import BackendContext, run_backend_step

    cfg = _load_config(args)
    cache = plugin_cache(ws, cfg)
    ctx = BackendContext(ws, cache, args.concurrency or cfg.concurrency, environment())

    async def go() -> Any:
        try:
            return await run_backend_step(ws, args.epoch, args.step, spec, ctx,
                                          params=cfg.gate, guard=cfg.guard, force=args.force,
                                          subscribers=[progress])
        finally:
            await cache.aclose()

    res = run_sync(go())
    info = {"url": cache.masked_url, "prefix": cache.prefix, "enabled": cache.enabled,
            "backend": spec, "runs": {r: cache.stats(r).as_dict() for r in sorted(cache.runs())}}
    return res, info


def cmd_step(args: argparse.Namespace) -> int:
    from .harness import Workspace
    from .plugin import is_factory_spec

    progress = TerminalProgress(quiet=args.json)
    ws = Workspace.open(Path(args.workspace))  # validates; writes nothing
    spec = args.backend or ws.config.agent.get("backend")
    if args.backend or is_factory_spec(spec):
        try:
            res, info = _run_plugin_step(ws, spec, args, progress)
        finally:
            ws.close()
        summary = {**_step_summary(res), "llm_cache": info}
        _emit(args, summary, _decision_table(res, clock="wall clock") + "\n"
              + _cache_lines(info))
        return 0
    if ws.config.kind != "llm":
        ws.close()
        res = _run_step(Path(args.workspace), args.epoch, args.step, args, progress)
        _emit(args, _step_summary(res), _decision_table(res))
        return 0
    try:
        res, info = _run_llm_step(ws, args.epoch, args.step, args, progress)
    finally:
        ws.close()
    summary = {**_step_summary(res), "llm_cache": info}
    _emit(args, summary, _decision_table(res, clock="wall clock") + "\n" + _cache_lines(info))
    return 0


def _decision_table(res: Any, clock: str = "simulated") -> str:
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


def cmd_demo(args: argparse.Namespace) -> int:
    from .backends import init_simulated
    from .sim import SimConfig

    root = Path(args.workspace)
    if not (root / "workspace.json").exists():
        if root.exists() and any(root.iterdir()):
            raise CliError(f"{root}: exists, is not empty and is not a workspace")
        init_simulated(root, SimConfig(seed=args.seed)).close()
    progress = TerminalProgress(quiet=args.json)
    res = _run_step(root, 1, 1, args, progress)
    figdir = Path(args.figures)
    files = _demo_figures(res, figdir)
    summary = _step_summary(res)
    summary["figures"] = [str(f) for f in files]
    summary_path = figdir / "demo_summary.json"
    summary_path.write_text(json.dumps(summary, indent=2, default=str))
    text = _decision_table(res) + f"\nwrote {', '.join(map(str, files))} and {summary_path}"
    _emit(args, summary, text)
    return 0


def _demo_figures(res: Any, figdir: Path) -> list[Path]:
    from .figures import plot_trajectories, save  # object API: no backend to set

    if res.gate is None:
        return []
    fig = plot_trajectories(res.gate.outcomes, None)
    return [save(fig, "demo_trajectories", figdir)]


def cmd_replay(args: argparse.Namespace) -> int:
    import polars as pl

    from .harness import replay_step

    df = replay_step(args.workspace, args.epoch, args.step, block=args.block)
    brief = [c for c in ("task_type", "live_action", "prefix_action", "prefix_stop_rank",
                         "prefix_units", "block_action", "block_stop_rank", "block_units",
                         "block_unrun_needed", "agree") if c in df.columns]
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=220, fmt_str_lengths=40,
                   tbl_hide_dataframe_shape=True, float_precision=3):
        text = str(df.select(brief)) + "\n(--json for every column)"
    _emit(args, {"epoch": args.epoch, "step": args.step, "block": args.block,
                 "types": df.to_dicts()}, text)
    return 0


def _emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, default=str))
    else:
        print(text)


# ---- parser ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vtrm-gate",
        description="Continuous concurrent e-process gate for skill evolution.")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--json", action="store_true", help="machine-readable output")

    i = sub.add_parser("init", help="create a simulated (or, with --llm, an LLM) workspace")
    i.add_argument("workspace", help="new directory for the workspace")
    i.add_argument("--seed", type=_nonneg_int, default=0)
    i.add_argument("--infra-rate", type=_rate, default=0.003,
                   help="simulated INFRA failure rate")
    i.add_argument("--heldout-fraction", type=float, default=0.2,
                   help="simulated: share of each type's units held out for the epoch-end "
                        "evaluation (never gated)")
    i.add_argument("--probation-rule", default="e_continue",
                   choices=("w_net", "e_continue", "e_harm"),
                   help="how epoch-end probation decides (default e_continue: the "
                        "recommended, anytime-valid rule; see README, statistics)")
    i.add_argument("--llm", action="store_true",
                   help="units answered by an OpenAI-compatible chat model (key from "
                        "OPENAI_API_KEY / VTRM_API_KEY at step time)")
    i.add_argument("--units", help="--llm: JSON-lines units file (unit_id, task_type, "
                                   "question, options, answer)")
    i.add_argument("--base-url", help="--llm: chat endpoint, e.g. https://api.openai.com/v1 "
                                      "(several: comma-separated, each capped at 32 calls)")
    i.add_argument("--endpoints", help="--llm: file of endpoints, 'URL [max_concurrency]' a "
                                       "line (or a JSON list); read at every step")
    i.add_argument("--model", help="--llm: model name")
    i.add_argument("--skills", help="--llm: directory of initial skills <slug>.md")
    i.add_argument("--seed-record", help="--llm: JSON {unit_id: true|false} of the seed "
                                         "baseline (ladder order only)")
    i.add_argument("--max-frames", type=_positive_int, default=None,
                   help="--llm: frames sent per unit with media (evenly spread; default 8)")
    i.add_argument("--max-side", type=_nonneg_int, default=None,
                   help="--llm: resize frames to this longest side in pixels (0: as stored; "
                        "default 768)")
    i.add_argument("--backend", help="--llm: your own agent, a factory "
                                     "'package.module:function' (see README, Bring your own "
                                     "agent) instead of --base-url/--model")
    common(i)
    i.set_defaults(func=cmd_init)

    def step_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--concurrency", type=_positive_int, default=None,
                        help="slot pool size (default: config, 32)")
        sp.add_argument("--config", help="config file (TOML or JSON); env and .env apply too")
        sp.add_argument("--time-scale", type=_nonneg_float, default=None,
                        help="real seconds per simulated second (default: virtual clock)")
        sp.add_argument("--dispatch", choices=("round_robin", "need_aware"), default=None,
                        help="which type the gate feeds next (default: config, round_robin)")
        sp.add_argument("--cancel-after-freeze", action=argparse.BooleanOptionalAction,
                        default=None, help="cancel a frozen type's in-flight calls "
                        "(default: config, off)")
        sp.add_argument("--force", action="store_true",
                        help="re-run even if the step's manifest changed")

    s = sub.add_parser("step", help="run or re-run one gate step (phases A-D)")
    s.add_argument("--workspace", required=True)
    s.add_argument("--epoch", type=_positive_int, required=True)
    s.add_argument("--step", type=_positive_int, required=True)
    s.add_argument("--backend", help="your own agent: a factory 'package.module:function' "
                                     "returning a vtrm_gate.plugin.AgentBackend (default: "
                                     "the workspace's agent.backend)")
    step_args(s)
    common(s)
    s.set_defaults(func=cmd_step)

    d = sub.add_parser("demo", help="init + one step of a 12-type simulated world")
    d.add_argument("--workspace", default="workspace-demo")
    d.add_argument("--seed", type=_nonneg_int, default=2)  # notebooks 01-05: sim_step(2)
    d.add_argument("--figures", default="figures")
    step_args(d)
    common(d)
    d.set_defaults(func=cmd_demo)

    r = sub.add_parser("replay", help="prefix vs block replay of a recorded step")
    r.add_argument("--workspace", required=True)
    r.add_argument("--epoch", type=_positive_int, required=True)
    r.add_argument("--step", type=_positive_int, required=True)
    r.add_argument("--block", type=_positive_int, default=8)
    common(r)
    r.set_defaults(func=cmd_replay)

    from . import cli_cache, cli_train

    cli_cache.register(sub)
    cli_train.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """The CLI's one error boundary: an expected failure is exit 2 (3: INFRA) and one line."""
    args = build_parser().parse_args(argv)
    _sigterm_as_sigint()
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `vtrm-gate ... | head`: the reader left; not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("vtrm-gate: interrupted; run the same command again to resume (finished work "
              "is kept)", file=sys.stderr)
        return 130
    except Exception as exc:  # map known user-facing errors to exit codes, re-raise bugs
        code = _exit_code(exc)
        if code is None or os.environ.get("VTRM_DEBUG"):
            raise
        print(f"vtrm-gate: error: {_one_line(exc)}", file=sys.stderr)
        return code


def _sigterm_as_sigint() -> None:
    """SIGTERM behaves like Ctrl-C: the running step is cancelled, its rows marked aborted,
    leases (the embedded Redis) given up at exit, exit code 130."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        # A background job of a script inherits SIGINT ignored; re-raised SIGTERMs would be
        # lost, and asyncio only cancels a step cleanly from the default SIGINT handler.
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, lambda signum, frame: signal.raise_signal(signal.SIGINT))


def _exit_code(exc: BaseException) -> int | None:
    import sqlite3

    names = {c.__name__ for c in type(exc).__mro__}
    if names & {"InfraGuardError", "StepUnmeasuredError"}:
        return EXIT_GUARD
    if isinstance(exc, CliError | ValueError | OSError | sqlite3.Error):
        # ValueError covers WorkspaceError, ConfigError, StepRefusedError, UnicodeError
        return EXIT_BAD_INPUT
    if isinstance(exc, RuntimeError) and "same target skill file" in str(exc):
        return EXIT_BAD_INPUT
    return None


def _one_line(exc: BaseException) -> str:
    """The error's message on one line (an OSError as ``path: reason``)."""
    import sqlite3

    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        text = f"{where}{exc.strerror}"
    elif isinstance(exc, sqlite3.Error):
        text = f"SQLite: {exc}"
    else:
        text = str(exc) or type(exc).__name__
    if type(exc).__name__ == "StepRefusedError":  # its changed inputs, one per line
        return text.replace("force=True", "--force")  # the CLI's spelling of the override
    if type(exc).__name__ == "InfraGuardError":
        text += ("; once the backend is healthy, run the same command again: finished work "
                 "is kept and only the failed calls are asked again")
    return " ".join(text.split())


if __name__ == "__main__":
    raise SystemExit(main())
