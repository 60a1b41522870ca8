"""``vtrm-gate train`` and ``vtrm-gate settle``: the training run from the command line.

``train`` runs (or resumes) epochs x steps with epoch-end settlement and evaluation, one line
per step / settlement / evaluation, then a summary; on a simulated workspace the summary adds
the old-serial vs v3 time per phase and the decision quality against the simulator's ground
truth. Exit 2 (one line) on bad sizes, a locked workspace or a changed configuration; exit 3
on an INFRA guard abort (finished steps kept: the next ``train`` resumes at the aborted step).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cli import CliError, _emit, _load_config, _nonneg_float, _positive_int, plugin_cache


def _positive(name: str, text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise CliError(f"--{name} must be a positive integer, got {text!r}") from None
    if v < 1:
        raise CliError(f"--{name} must be a positive integer, got {v}")
    return v


def _backend(ws: Any, args: argparse.Namespace, concurrency: int) -> tuple[Any, Any, Any]:
    """(infer, evolver, rollout) for the workspace's kind, and a closer."""
    if ws.config.kind == "simulated":
        from .backends import simulated_backend

        be = simulated_backend(ws, time_scale=1.0 if args.time_scale is None
                               else args.time_scale)
        return be, be.rollout(ws, concurrency), None
    if ws.config.kind == "llm":
        from .backends import EndpointUnreachableError, check_endpoint, llm_backend, rollout_cases
        from .cache import environment

        try:
            check_endpoint(ws.config.agent["base_url"])
        except EndpointUnreachableError as exc:
            raise CliError(str(exc)) from None
        env = environment()
        be = llm_backend(ws, api_key=env.get("OPENAI_API_KEY") or env.get("VTRM_API_KEY") or "",
                         concurrency=concurrency)

        async def rollout(epoch: int, step: int) -> dict[str, list[str]]:
            return await rollout_cases(be, ws, epoch, step)

        return be, rollout, be.aclose
    raise CliError(f"{ws.root}: train needs a simulated or llm workspace (kind "
                   f"{ws.config.kind!r}); drive custom workspaces from Python (harness.train)")


@dataclass(frozen=True)
class _Agent:
    """What train / settle drive: infer, evolver, a case source, a closer, the sim world."""

    infer: Any
    evolver: Any
    rollout: Any = None
    cases: Any = None
    close: Callable[[], Awaitable[None]] | None = None
    world: Any = None


async def _open_agent(ws: Any, args: argparse.Namespace, cfg: Any, concurrency: int) -> _Agent:
    """Your own agent (``--backend`` or the workspace's ``agent.backend`` factory), else the
    workspace kind's built-in backend. Called inside the run's event loop."""
    from .plugin import is_factory_spec

    spec = args.backend or ws.config.agent.get("backend")
    if args.backend or is_factory_spec(spec):
        from .cache import environment
        from .plugin import BackendContext, open_backend

        cache = plugin_cache(ws, cfg)
        try:
            be = await open_backend(ws, spec, BackendContext(ws, cache, concurrency,
                                                             environment()))
        except BaseException:
            await cache.aclose()
            raise

        async def close() -> None:
            try:
                if be.aclose is not None:
                    await be.aclose()
            finally:
                await cache.aclose()

        return _Agent(be.infer, be.evolver, be.rollout, be.cases, close)
    built, rollout, closer = _backend(ws, args, concurrency)
    return _Agent(built.infer, built.evolver, rollout, None, closer,
                  getattr(built, "world", None))


def _run(args: argparse.Namespace, coro_fn: Any) -> Any:
    """Run on the virtual clock (simulated, no --time-scale) or on real time."""
    if args.time_scale is None and args._kind == "simulated":
        from .sim import run_virtual

        return run_virtual(coro_fn())
    from ._sync import run_sync

    return run_sync(coro_fn())


def cmd_train(args: argparse.Namespace) -> int:
    from .backends import training_summary
    from .harness import Workspace, train

    epochs = _positive("epochs", args.epochs)
    steps = _positive("steps-per-epoch", args.steps_per_epoch)
    cfg = _load_config(args)
    concurrency = args.concurrency or cfg.concurrency
    ws = Workspace.open(Path(args.workspace))
    opened: list[_Agent] = []
    try:
        args._kind = ws.config.kind

        def show(ev: Any) -> None:
            if args.json:
                print(json.dumps({"event": ev.kind, "epoch": ev.epoch, "step": ev.step,
                                  "done_before": ev.done_before, "seconds": ev.seconds,
                                  "line": ev.line}), flush=True)
            else:
                print(ev.line, flush=True)

        def after(w: Any) -> None:
            if opened and opened[0].world is not None:
                from .backends import record_ground_truth

                record_ground_truth(w, opened[0].world)

        async def go() -> Any:
            agent = await _open_agent(ws, args, cfg, concurrency)
            opened.append(agent)
            try:
                return await train(ws, epochs, steps, infer=agent.infer, evolver=agent.evolver,
                                   rollout=agent.rollout, cases=agent.cases, params=cfg.gate,
                                   guard=cfg.guard, concurrency=concurrency,
                                   evaluate=False if args.no_eval else None,
                                   on_event=show, after=after)
            finally:
                if agent.close is not None:
                    await agent.close()

        res = _run(args, go)
        world = opened[0].world if opened else None
        summary = training_summary(ws, world, res) if world is not None else {
            "epochs": res.epochs, "steps_per_epoch": res.steps_per_epoch,
            "done_before": res.done_before, "v3_phases_s": dict(res.phases),
            "v3_total_s": res.total_s}
    finally:
        ws.close()
    if args.json:
        print(json.dumps({"event": "summary", **summary}, default=str))
    else:
        print(summary_text(summary))
    return 0


def summary_text(summary: dict[str, Any]) -> str:
    lines = []
    v3 = summary["v3_phases_s"]
    if summary.get("done_before"):
        lines.append(f"({summary['done_before']} steps/settlements/evaluations were done by "
                     f"an earlier run; times below cover this run only)")
    old = summary.get("old_phases_s")
    lines.append("time per phase (simulated hours)   " + ("old serial      v3" if old else "v3"))
    for k, v in v3.items():
        lines.append(f"  {k:<12}" + (f"{old[k] / 3600:>20.2f}" if old else "")
                     + f"{v / 3600:>10.2f}")
    total = summary["v3_total_s"]
    if old:
        speed = summary["old_total_s"] / total if total else float("nan")
        lines.append(f"  {'total':<12}{summary['old_total_s'] / 3600:>20.2f}"
                     f"{total / 3600:>10.2f}   ({speed:.1f}x)")
    else:
        lines.append(f"  {'total':<12}{total / 3600:>10.2f}")
    q = summary.get("quality")
    if q:
        a, k, r = q["applied"], q["provisional_kept"], q["provisional_rolled_back"]
        lines.append(f"changes applied after settlement: {sum(a.values())} (truly better "
                     f"{a['better']}, neutral {a['neutral']}, worse {a['worse']}; neutral = "
                     f"|true gain| < {q['margin']:.0%}); good candidates missed "
                     f"{q['missed_better']} of {q['gated']['better']}")
        lines.append(f"probation: kept {sum(k.values())} (better {k['better']}, neutral "
                     f"{k['neutral']}, worse {k['worse']}), rolled back {sum(r.values())} "
                     f"(better {r['better']}, neutral {r['neutral']}, worse {r['worse']})")
        m = q["mean_accuracy"]
        lines.append(f"true accuracy (mean over types): initial {m['initial']:.1%}, this gate "
                     f"{m['gate']:.1%}, accept-every-candidate {m['accept_all']:.1%}, oracle "
                     f"gate {m['oracle']:.1%}")
    return "\n".join(lines)


def cmd_settle(args: argparse.Namespace) -> int:
    from .harness import Workspace, settle_probation, workspace_lock

    epoch = _positive("epoch", args.epoch)
    cfg = _load_config(args)
    concurrency = args.concurrency or cfg.concurrency
    ws = Workspace.open(Path(args.workspace))
    try:
        args._kind = ws.config.kind
        with workspace_lock(ws.root, "settle"):
            async def go() -> Any:
                agent = await _open_agent(ws, args, cfg, concurrency)
                try:
                    return await settle_probation(ws, epoch, infer=agent.infer,
                                                  concurrency=concurrency, params=cfg.gate,
                                                  guard=cfg.guard)
                finally:
                    if agent.close is not None:
                        await agent.close()

            res = _run(args, go)
    finally:
        ws.close()
    data = {"epoch": epoch, "already_settled": res.already_settled,
            "types": {t: {"version": o.version, "prev_version": o.prev_version, "W": o.W,
                          "L": o.L, "n_used": o.n_used, "kept": o.passed,
                          "applied": o.applied} for t, o in res.outcomes.items()}}
    if res.already_settled:
        text = f"epoch {epoch} was settled before (nothing changed)"
    elif not res.outcomes:
        text = f"epoch {epoch}: nothing on probation"
    else:
        text = "\n".join(f"{t}: {o.applied}" for t, o in sorted(res.outcomes.items()))
    _emit(args, data, text)
    return 0


def register(sub: Any) -> None:
    """Add ``train`` and ``settle`` to the ``vtrm-gate`` subcommands."""
    def run_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--workspace", required=True)
        sp.add_argument("--concurrency", type=_positive_int, default=None,
                        help="slot pool size (default: config, 32)")
        sp.add_argument("--config", help="config file (TOML or JSON); env and .env apply too")
        sp.add_argument("--time-scale", type=_nonneg_float, default=None,
                        help="real seconds per simulated second (default: virtual clock)")
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        sp.add_argument("--backend", help="your own agent: a factory 'package.module:function' "
                                          "returning a vtrm_gate.plugin.AgentBackend (default: "
                                          "the workspace's agent.backend, else its kind's agent)")

    t = sub.add_parser("train", help="run or resume a training run (epochs of steps, "
                                     "epoch-end settlement and evaluation)")
    t.add_argument("--epochs", required=True, help="number of epochs (positive integer)")
    t.add_argument("--steps-per-epoch", required=True, help="steps per epoch")
    t.add_argument("--no-eval", action="store_true", help="skip the epoch-end evaluation")
    run_args(t)
    t.set_defaults(func=cmd_train)

    s = sub.add_parser("settle", help="settle an epoch's probation (through the slot pool)")
    s.add_argument("--epoch", required=True, help="the epoch to settle")
    run_args(s)
    s.set_defaults(func=cmd_settle)
