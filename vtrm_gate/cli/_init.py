"""``vtrm-gate init``: a simulated workspace, or with ``--llm`` one whose units an
OpenAI-compatible chat model (or your own agent) answers."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .._env import DEFAULT_CONCURRENCY
from ..errors import CliError
from ._args import a_path, emit, nonneg_int, positive_int, rate
from ._table import terminal_width, wrap

LLM_ONLY = ("units", "base_url", "model", "skills", "seed_record", "backend", "endpoints",
            "max_frames", "max_side", "task_description")
SIMULATED_ONLY = ("infra_rate", "world")


def register(sub: Any) -> None:
    """Add ``init`` to the ``vtrm-gate`` subcommands."""
    i = sub.add_parser("init", help="create a simulated (or, with --llm, an LLM) workspace")
    i.add_argument("workspace", type=a_path, help="new directory for the workspace")
    i.add_argument("--seed", type=nonneg_int, default=0)
    i.add_argument("--infra-rate", type=rate, default=None,
                   help="simulated workspaces only: the simulator's INFRA failure rate per "
                        "call after retries (default 0.0004: vtrm_gate.sim.DEFAULT_INFRA_RATE)")
    i.add_argument("--world", default=None,
                   help="simulated workspaces only: the distribution of candidate effects, a "
                        "JSON file of vtrm_gate.sim.World fields or a preset (default, "
                        "mostly_harmful, mostly_neutral, mostly_helpful; see docs/worlds.md)")
    i.add_argument("--heldout-fraction", type=rate, default=None,
                   help="share of each type's units held out for the epoch-end evaluation "
                        "(never gated; default 0.2, 0 with --llm)")
    i.add_argument("--probation-rule", default="e_continue",
                   choices=("w_net", "e_continue", "e_harm"),
                   help="how epoch-end probation decides (default e_continue: the "
                        "recommended, anytime-valid rule; see docs/statistics.md)")
    i.add_argument("--probation-order", default="shuffle",
                   choices=("shuffle", "seed_wrong_first"),
                   help="the settlement probe's order (default shuffle; seed_wrong_first: "
                        "units the seed baseline got wrong first, like a ladder)")
    i.add_argument("--cooldown-steps", type=nonneg_int, default=2,
                   help="steps a type sits out after its candidate is rejected (default 2)")
    i.add_argument("--futile-cooldown", action=argparse.BooleanOptionalAction, default=True,
                   help="whether a FUTILE exit puts its type in cooldown as a REJECT does "
                        "(default: yes, the SPEC's; --no-futile-cooldown evolves it again "
                        "next step, as after INERTIA: see docs/training.md)")
    i.add_argument("--llm", action="store_true",
                   help="units answered by an OpenAI-compatible chat model (key from "
                        "OPENAI_API_KEY / VTRM_API_KEY at step time)")
    i.add_argument("--units", help="--llm: JSON-lines units file (unit_id, task_type, "
                                   "question, options, answer)")
    i.add_argument("--base-url", help="--llm: chat endpoint, e.g. https://api.openai.com/v1 "
                                      "(several: comma-separated, each capped at "
                                      f"{DEFAULT_CONCURRENCY} calls)")
    i.add_argument("--endpoints", help="--llm: file of endpoints, 'URL [max_concurrency]' a "
                                       "line (or a JSON list); read at every step")
    i.add_argument("--model", help="--llm: model name")
    i.add_argument("--skills", help="--llm: directory of initial skills <slug>.md")
    i.add_argument("--seed-record", help="--llm: JSON {unit_id: true|false} of the seed "
                                         "baseline (ladder order only)")
    i.add_argument("--max-frames", type=positive_int, default=None,
                   help="--llm: frames sent per unit with media (evenly spread; default 8)")
    i.add_argument("--max-side", type=nonneg_int, default=None,
                   help="--llm: resize frames to this longest side in pixels (0: as stored; "
                        "default 768)")
    i.add_argument("--task-description",
                   help="--llm: what the agent answers, named in the prompts and default "
                        "skills; overrides the units file's task_description (default: "
                        "that, else 'multiple-choice questions', with 'about a video' for "
                        "units that show media)")
    i.add_argument("--backend", help="--llm: your own agent, a factory "
                                     "'package.module:function' (see docs/real-agents.md) "
                                     "instead of --base-url/--model")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.set_defaults(func=cmd_init)


def cmd_init(args: argparse.Namespace) -> int:
    from ..harness import only_lock_file

    root = Path(args.workspace)
    if root.exists() and not root.is_dir():
        raise CliError(f"{root}: exists and is not a directory (a file, a FIFO or a device); "
                       f"choose a new directory")
    if root.exists() and not only_lock_file(root):
        raise CliError(f"{root}: exists and is not empty; choose a new directory")
    if args.llm:
        return _init_llm(root, args)
    given = [f"--{n.replace('_', '-')}" for n in LLM_ONLY if getattr(args, n) is not None]
    if given:
        raise CliError(f"{', '.join(given)} need --llm (an LLM workspace)")
    from ..sim import SimConfig, World, init_simulated

    chosen: dict[str, Any] = {
        k: v for k, v in (("infra_rate", args.infra_rate),
                          ("world", args.world and World.from_json(args.world)))
        if v is not None}
    try:
        sim = SimConfig(seed=args.seed, **chosen)
    except ValueError as exc:  # a world file's per-type shares for types it does not have
        raise CliError(f"{args.world}: {exc}" if args.world else str(exc)) from None
    ws = init_simulated(root, sim, heldout_fraction=0.2 if args.heldout_fraction is None
                        else args.heldout_fraction, probation_rule=args.probation_rule,
                        probation_order=args.probation_order, **_cooldown(args))
    ws.close()
    w = sim.resolved_world()
    out = {"workspace": str(root), "types": len(sim.resolved_pool_sizes()), "seed": args.seed,
           "world": w.to_dict()}
    emit(args, out, wrap(f"created simulated workspace {root} ({out['types']} types, "
                         f"seed {args.seed}; candidates {w.p_harmful:.0%} harmful, "
                         f"{w.p_neutral:.0%} neutral, {w.p_helpful:.0%} helpful, drawn per "
                         f"{w.scope})", terminal_width()))
    return 0


def _cooldown(args: argparse.Namespace) -> dict[str, Any]:
    """The training policy's cooldown fields of `WorkspaceConfig`, as given."""
    return {"cooldown_steps": args.cooldown_steps, "futile_cooldown": args.futile_cooldown}


def _init_llm(root: Path, args: argparse.Namespace) -> int:
    from ..llm import init_llm, load_factory

    given = [f"--{n.replace('_', '-')}" for n in SIMULATED_ONLY if getattr(args, n) is not None]
    if given:
        raise CliError(f"{', '.join(given)} applies to simulated workspaces only, not --llm")
    needed = ("units",) if args.backend else (
        ("units", "model") if args.endpoints else ("units", "base_url", "model"))
    missing = [f"--{n.replace('_', '-')}" for n in needed if not getattr(args, n)]
    if missing:
        raise CliError(f"init --llm needs {', '.join(missing)}")
    for other in ("endpoints", "backend"):  # each takes --base-url's place: it was dropped
        if getattr(args, other) and args.base_url:
            raise CliError(f"--{other} and --base-url: give one (--{other} replaces "
                           f"--base-url, which would be ignored)")
    if args.backend:
        load_factory(args.backend)  # refuse a factory that does not import, before writing
    media = {k: v for k, v in (("max_frames", args.max_frames), ("max_side", args.max_side))
             if v is not None}
    ws = init_llm(root, args.units, base_url=args.base_url, model=args.model, seed=args.seed,
                  skills_dir=args.skills, seed_record=args.seed_record, backend=args.backend,
                  endpoints_file=args.endpoints, media=media,
                  probation_rule=args.probation_rule,
                  probation_order=args.probation_order, **_cooldown(args),
                  heldout_fraction=args.heldout_fraction or 0.0,
                  task_description=args.task_description)
    agent = {"backend": args.backend} if args.backend else {"model": args.model}
    if args.backend and args.model:
        agent["model"] = args.model
    task = ws.config.agent.get("task_description")
    out = {"workspace": str(root), "kind": "llm", "types": len(ws.pool),
           "units": sum(len(u) for u in ws.pool.values()), **agent, "seed": args.seed,
           "task_description": task}
    ws.close()
    who = ", ".join(f"{k} {v}" for k, v in agent.items())
    named = f"; the prompts name the task {task!r}" if task else ""
    emit(args, out, wrap(f"created llm workspace {root} ({out['types']} types, "
                         f"{out['units']} units, {who}, seed {args.seed}){named}",
                         terminal_width()))
    return 0
