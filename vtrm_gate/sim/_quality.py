"""The simulator's ground truth against what a training run did: decision quality by true
class, the old serial gate's time per phase on the same inputs, the training curve.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .._ids import content_hash, eval_run_id, probation_run_id
from ..gate import TypePlan
from ..harness import (
    FATES,
    StepStatus,
    Workspace,
    read_manifest,
    recorded_manifests,
    settled_audit,
)
from ..stats import GateParams
from ._schedules import block_serial_schedule, simulate_policy
from ._workspace import check_world
from ._world import TRUE_MARGIN, SimWorld

# ---- the simulator's ground truth and the decision-quality report --------------------------


def record_ground_truth(workspace: Workspace, world: SimWorld) -> int:
    """Write the true effect of every gated candidate of every recorded step into the
    ``ground_truth`` table (simulated workspaces only; idempotent). Returns rows written."""
    check_world(workspace, world)
    rows = []
    for m in recorded_manifests(workspace):
        e, s = m["epoch"], m["step"]
        for t, c in sorted(m["candidates"].items()):
            if c.get("status") != StepStatus.GATED:
                continue
            base = workspace.version_text(t, m["inputs"]["base_skills"][t]["version"])
            cand = (workspace.root / c["file"]).read_text(encoding="utf-8")
            tr = world.true_effect(t, base, cand)
            rows.append((e, s, t, content_hash(base), content_hash(cand), tr.base_acc,
                         tr.cand_acc, tr.effect, tr.p_win, tr.true_class))
    workspace.log.upsert("ground_truth", rows)
    return len(rows)


CLASSES = ("better", "neutral", "worse")


def quality_report(workspace: Workspace, world: SimWorld, epochs: int,
                   steps_per_epoch: int) -> dict[str, Any]:
    """What the gate did to the skills, measured against the simulator's ground truth.

    Counts by true class, every gated candidate once by its fate (`settled_audit`): changes
    applied (ACCEPTed against a settled version, or PROVISIONAL kept by a settlement), rolled
    back, superseded by a later candidate before settlement, good candidates missed; and the
    end-of-run
    true accuracy per type against the initial skills, an "accept every candidate" run and
    an "oracle gate" run on the same seed.
    """
    record_ground_truth(workspace, world)
    truth = {(e, s, t): c for e, s, t, c in workspace.log.select(
        "ground_truth", ["epoch", "step", "task_type", "true_class"])}
    counts = _decision_counts(workspace, truth)
    cfg = workspace.config
    pools = {t: list(us) for t, us in workspace.pool.items()}
    runs = {p: simulate_policy(world, epochs, steps_per_epoch, p, pools=pools,
                               cooldown_steps=cfg.cooldown_steps, rejected_max=cfg.rejected_max)
            for p in ("accept_all", "oracle")}
    acc = _accuracy(workspace, world, runs)
    mean = {k: sum(r[k] for r in acc) / len(acc) for k in ("initial", "gate", "accept_all",
                                                           "oracle")}
    policy: dict[str, dict[str, Any]] = {
        p: {"applied": dict.fromkeys(CLASSES, 0), "candidates": len(r.decisions)}
        for p, r in runs.items()}
    for p, r in runs.items():
        for *_, on, tr in r.decisions:
            if on:
                policy[p]["applied"][tr.true_class] += 1
    applied = counts["applied"]
    return {**counts, "leak": applied["neutral"] + applied["worse"], "accuracy": acc,
            "truth_rows": sorted((e, s, t, c) for (e, s, t), c in truth.items()),
            "mean_accuracy": mean, "policies": policy, "margin": TRUE_MARGIN}


def _decision_counts(workspace: Workspace, truth: Mapping[tuple[int, int, str], str]
                     ) -> dict[str, Any]:
    """Gated candidates by true class, each counted once by its fate (`settled_audit`):
    applied = ACCEPTed or kept by a settlement; missed = truly better and not applied."""
    audit = settled_audit(workspace)
    fates = {f: dict.fromkeys(CLASSES, 0) for f in FATES}
    gated = dict.fromkeys(CLASSES, 0)
    for f in audit.fates:
        cls = truth.get((f.epoch, f.step, f.task_type))
        if cls is not None:
            gated[cls] += 1
            fates[f.fate][cls] += 1
    applied = {c: fates["accepted"][c] + fates["kept"][c] for c in CLASSES}
    return {"gated": gated, "applied": applied,
            "applied_by": {"accepted": fates["accepted"], "kept": fates["kept"]},
            "fates": fates, "missed_better": gated["better"] - applied["better"],
            "provisional_kept": fates["kept"], "provisional_rolled_back": fates["rolled_back"],
            "provisional_superseded": fates["superseded"],
            "settled_violations": list(audit.violations)}


def _accuracy(workspace: Workspace, world: SimWorld, runs: Mapping[str, Any]
              ) -> list[dict[str, Any]]:
    """Per type: true accuracy of the initial skill, this gate's, and the policies'."""
    state = workspace.state
    return [{"task_type": t,
             "initial": world.true_accuracy(t, world.initial_skill(t)),
             "gate": world.true_accuracy(t, workspace.skill_text(t, state)),
             "accept_all": world.true_accuracy(t, runs["accept_all"].skills[t]),
             "oracle": world.true_accuracy(t, runs["oracle"].skills[t]),
             "version": state.skills[t].version}
            for t in workspace.task_types]


def _serial_blocks_s(world: SimWorld, plan: TypePlan, n_units: int, block: int = 8) -> float:
    """Old-gate time of the first ``n_units`` of a plan: blocks of ``block`` units one after
    another, base arm then candidate arm (a block's arm runs its units concurrently)."""
    total = 0.0
    for start in range(0, n_units, block):
        ranks = range(start, min(start + block, n_units))
        for arm in ("base", "cand"):
            total += max(world.outcome(plan.task(r, arm)).latency_s for r in ranks)
    return total


def _logged_units(workspace: Workspace, run_id: str) -> list[str]:
    return workspace.log.run_units(run_id)


def serial_phase_times(workspace: Workspace, world: SimWorld,
                       steps: Iterable[tuple[int, int]], settled: Iterable[int] = (),
                       evaluated: Iterable[int] = (), block: int = 8) -> dict[str, Any]:
    """The OLD serial gate's simulated time per phase on the same inputs as a v3 run (the
    recorded manifests of ``steps``, the probes of ``settled`` epochs, the held-out units of
    ``evaluated`` epochs), and the old gate's decisions on those steps.

    Old: rollout types one after another (a type's batch concurrent); gate
    `block_serial_schedule` (types serial, blocks of 8, arms serial, block-end decisions);
    settlement and evaluation the same block-serial pattern over the whole probe / held-out
    split. No BaselineCache: every call runs. (Serial evolution is the sum of the evolver's
    call times: `TrainResult.serial_evolution_s`.)
    """
    check_world(workspace, world)
    phases = dict.fromkeys(("rollout", "gate", "settlement", "evaluation"), 0.0)
    decisions: list[tuple[int, int, str, str]] = []
    for e, s in sorted(steps):
        m = read_manifest(workspace, e, s)
        if m is None:
            continue
        base = {t: workspace.version_text(t, b["version"])
                for t, b in m["inputs"]["base_skills"].items()}
        for t in m["inputs"]["cases"]:
            batch = world.rollout(t, e, s, base[t], workspace.pool[t])
            phases["rollout"] += max((r.latency_s for _, r in batch), default=0.0)
        plans = [TypePlan(t, m["inputs"]["ladders"][t], base[t],
                          (workspace.root / c["file"]).read_text(encoding="utf-8"),
                          m["step_run_id"])
                 for t, c in sorted(m["candidates"].items())
                 if c.get("status") == StepStatus.GATED]
        if plans:  # the old gate with the step's own parameters (n_max, lambda, ...)
            params = GateParams(**m["inputs"]["config"]["params"])
            old = block_serial_schedule(world, plans, params, block=block)
            phases["gate"] += old["makespan_s"]
            decisions += [(e, s, t, str(o.action)) for t, o in old["outcomes"].items()]
    for kind, epochs, stem in (("settlement", settled, probation_run_id),
                               ("evaluation", evaluated, eval_run_id)):
        for e in sorted(epochs):
            srid = stem(e)
            for t in workspace.task_types:
                probe = TypePlan(t, ["-"], step_run_id=srid)
                units = _logged_units(workspace, probe.run_id("base"))
                hashes = {arm: h for arm in ("base", "cand")
                          if (h := workspace.log.run_skill_hash(probe.run_id(arm)))}
                plan = _plan_from_hashes(workspace, t, units, srid, hashes) if units else None
                if plan is not None:
                    phases[kind] += _serial_blocks_s(world, plan, len(units), block)
    return {"phases": phases, "gate_decisions": decisions}


def _plan_from_hashes(workspace: Workspace, task_type: str, units: list[str], srid: str,
                      hashes: Mapping[str, str]) -> TypePlan | None:
    """A plan whose arm skills are the recorded versions with the logged content hashes."""
    latest = workspace.state.skills[task_type].latest
    by_hash = {}
    for v in range(1, latest + 1):
        p = workspace.history_path(task_type, v)
        if p.is_file():
            text = p.read_text(encoding="utf-8")
            by_hash[content_hash(text)] = text
    base, cand = by_hash.get(hashes.get("base", "")), by_hash.get(hashes.get("cand", ""))
    if base is None or cand is None:
        return None
    return TypePlan(task_type, units, base, cand, srid)


def training_summary(ws: Workspace, world: SimWorld, res: Any) -> dict[str, Any]:
    """A simulated training run's summary: loop-clock time per phase of v3 (what ``res``
    ran) and of the old serial gate on the same inputs, the old gate's decisions there, and
    the decision quality against the ground truth (`quality_report`)."""
    out: dict[str, Any] = {"epochs": res.epochs, "steps_per_epoch": res.steps_per_epoch,
                           "done_before": res.done_before,
                           "v3_phases_s": dict(res.phases), "v3_total_s": res.total_s}
    old = serial_phase_times(ws, world, res.steps, res.settlements,
                             [e for e, ev in res.evaluations.items() if not ev.already_done])
    phases = {"rollout": old["phases"]["rollout"], "evolution": res.serial_evolution_s,
              "gate": old["phases"]["gate"], "settlement": old["phases"]["settlement"],
              "evaluation": old["phases"]["evaluation"]}
    out["old_phases_s"] = phases
    out["old_total_s"] = sum(phases.values())
    out["old_gate_decisions"] = old["gate_decisions"]
    out["quality"] = quality_report(ws, world, res.epochs, res.steps_per_epoch)
    return out


def training_curve(ws: Workspace, world: SimWorld | None) -> Any:
    """Per type and epoch (0 = the initial skills): measured held-out accuracy, true
    accuracy (null without a simulated ``world``), the measured gain over the initial skill
    (paired, with its 95% Newcombe interval; exactly 0 for an unchanged skill, measured
    once) and the epoch's decisions (accepted, provisional, rolled back) - a polars frame."""
    import polars as pl

    if world is not None:
        check_world(ws, world)
    ev = ws.log.select("evaluation", ["epoch", "task_type", "version", "acc_initial",
                                      "acc_current", "gain", "gain_lo", "gain_hi"],
                       order_by=["epoch", "task_type"])
    marks: dict[tuple[int, str], dict[str, int]] = {}
    for e, t, action in ws.log.select("step_report", ["epoch", "task_type", "action"]):
        if action not in ("ACCEPT", "PROVISIONAL", "PROBATION_FAILED"):
            continue
        key = {"ACCEPT": "accepted", "PROVISIONAL": "provisional",
               "PROBATION_FAILED": "rolled_back"}[action]
        m = marks.setdefault((e, t), {"accepted": 0, "provisional": 0, "rolled_back": 0})
        m[key] += 1
    rows = []
    seen0: set[str] = set()
    none = {"accepted": 0, "provisional": 0, "rolled_back": 0}
    for e, t, v, acc0, acc, gain, lo, hi in ev:
        if t not in seen0:
            seen0.add(t)
            rows.append({"epoch": 0, "task_type": t, "version": 1, "measured": acc0,
                         "true": _true(world, ws, t, 1),
                         "gain": 0.0, "gain_lo": 0.0, "gain_hi": 0.0, **none})
        rows.append({"epoch": e, "task_type": t, "version": v, "measured": acc,
                     "true": _true(world, ws, t, v),
                     "gain": gain, "gain_lo": lo, "gain_hi": hi,
                     **marks.get((e, t), none)})
    return pl.DataFrame(rows, infer_schema_length=None).sort("task_type", "epoch")


def _true(world: SimWorld | None, ws: Workspace, task_type: str, version: int) -> float | None:
    """A recorded version's true accuracy in the simulator (None: no simulator)."""
    if world is None:
        return None
    return world.true_accuracy(task_type, ws.version_text(task_type, version))
