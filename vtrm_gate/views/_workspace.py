"""A workspace opened for reading in a notebook: polars frames of every table and its
figures (`open_workspace`), where a run stands (`run_status`), two runs side by side
(`compare_runs`), and every table written to Parquet or CSV (`export_tables`).

Read-only: the workspace's files are read and its SQLite log is opened ``mode=ro``; no lock
is taken, so a workspace can be opened while ``train`` writes it (each frame is read when it
is asked for, so it shows what the writer has committed so far).
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import polars as pl

from .._env import EXPORT_FORMATS, user_path
from .._ids import PROBATION_STEP
from ..errors import WorkspaceError
from ..harness import (
    TABLES,
    HarnessLog,
    Workspace,
    read_heldout,
    read_holder,
    read_manifest,
    temp_sibling,
    train_started,
    workspace_outcomes,
    write_outcomes,
)
from ..options import DEFAULT_DECISION_RULE, EXECUTION_FIELDS
from ..stats import Action, GateParams, TrajectoryPoint, TypeOutcome
from ._figures import GateFigure, plot_trajectories
from ._train_figures import plot_phase_times, plot_training_curve

PHASES = ("rollout", "evolution", "gate", "settlement", "evaluation")
_FILE_SUFFIXES = frozenset({".csv", ".parquet", ".jsonl", ".ndjson", ".json"})
"""An export's --out ending so names one file, not the directory export writes."""


class WorkspaceView:
    """A workspace opened read-only: ``.decisions``, ``.gate_evidence``, ``.predictions``,
    ``.evaluation``, ``.settlements``, ``.timings``, ``.infra`` (polars frames, read on
    access) and ``training_curve()``, ``phase_times()``, ``trajectories(epoch, step)``
    (self-displaying figures). Displays itself as a short summary."""

    def __init__(self, ws: Workspace | str | Path):
        """``ws``: an opened workspace, or its path (opened read-only, as `open_workspace`);
        a path was kept as the workspace and failed at the first frame."""
        self.ws = ws if isinstance(ws, Workspace) else Workspace.open(ws, readonly=True)

    @property
    def root(self) -> Path:
        return self.ws.root

    def close(self) -> None:
        self.ws.close()

    def __enter__(self) -> WorkspaceView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reload(self) -> WorkspaceView:
        """Re-read the training state (``state.json``) a running writer may have moved on."""
        self.ws.state = Workspace.open(self.root, readonly=True).state
        return self

    # ---- frames ---------------------------------------------------------------------------

    def table(self, name: str) -> pl.DataFrame:
        """Any table of the log by name (`vtrm_gate.harness.TABLES`)."""
        return self.ws.log.frame(name)

    @property
    def decisions(self) -> pl.DataFrame:
        """One row per type and gate step (``step_report``, steps >= 1): status, decision,
        W, L, e-values, where it stopped, work counters, what Phase D applied."""
        return self.table("step_report").filter(pl.col("step") >= 1)

    @property
    def gate_evidence(self) -> pl.DataFrame:
        """One row per consumed ladder unit of every gate (settlements' probes included)."""
        return self.table("gate_evidence")

    @property
    def predictions(self) -> pl.DataFrame:
        """One row per inference call (both arms, every gate, probe and evaluation)."""
        return self.table("predictions")

    @property
    def evaluation(self) -> pl.DataFrame:
        """One row per epoch and type: held-out accuracy of the current and initial skills."""
        return self.table("evaluation")

    @property
    def settlements(self) -> pl.DataFrame:
        """One row per type an epoch-end settlement decided (action PROBATION_PASSED /
        PROBATION_FAILED, the probe's W, L, e-values, what was applied)."""
        return self.table("step_report").filter(pl.col("step") == PROBATION_STEP)

    @property
    def timings(self) -> pl.DataFrame:
        """Loop-clock seconds per phase of every step (step 0: settlement, -1: evaluation)."""
        return self.table("timings")

    @property
    def infra(self) -> pl.DataFrame:
        """The calls that failed for infrastructure reasons (INFRA predictions, with their
        error); ``table("infra_aborts")`` counts the gates the INFRA guard aborted."""
        return self.predictions.filter(pl.col("infra") == 1)

    # ---- figures --------------------------------------------------------------------------

    def curve(self) -> pl.DataFrame:
        """Per type and epoch: measured held-out accuracy, true accuracy (simulated), the
        gain, the epoch's accepts / provisional applications / rollbacks."""
        from ..sim import training_curve

        if not self.table("evaluation").height:
            raise WorkspaceError(f"{self.root}: no evaluation recorded yet (a training run "
                                 f"with a held-out split evaluates at each epoch end)")
        return training_curve(self.ws, _world(self.ws))

    def training_curve(self) -> GateFigure:
        """The training curve per type (`plot_training_curve`)."""
        heldout = {t: len(u) for t, u in read_heldout(self.ws).items()}
        return plot_training_curve(self.curve(), n_heldout=heldout)

    def phase_times(self) -> GateFigure:
        """Hours per phase: v3 as recorded; on a simulated workspace run on the virtual
        clock also the old serial gate replayed on the same inputs
        (`vtrm_gate.sim.serial_phase_times`). Phases timed on real time (``time_scale``, a
        backend of one's own) are drawn alone, in real hours: the old gate's simulated hours
        are not comparable with them. Nothing timed, or both clocks: `WorkspaceError`."""
        timings = self.timings
        if not timings.height:
            raise WorkspaceError(f"{self.root}: no step timed yet (run a step first)")
        new = phase_seconds(timings)
        world = _world(self.ws)
        if world is None:
            return plot_phase_times(None, new, unit="hours (loop clock)")
        clock = timings_clock(timings, simulated=True)
        if clock == "real":
            return plot_phase_times(None, new, unit="hours of real time (not simulated)")
        if clock == "mixed":
            real = timings.filter(pl.col("clock") == "real")
            steps = sorted({(e, s) for e, s in real.select("epoch", "step").iter_rows()})
            raise WorkspaceError(
                f"{self.root}: phase times mix the virtual clock and real time (real: "
                f"{', '.join(f'e{e} s{s}' for e, s in steps[:5])}"
                f"{' ...' if len(steps) > 5 else ''}); re-run those steps on one clock")
        # the phases this workspace timed, on both sides: a bare `step` times its gate only,
        # and the old gate's replayed rollout beside v3's 0 h inflated the speed-up (h17)
        timed = set(timings["phase"])
        old = {p: v for p, v in old_phase_seconds(self.ws, world, timings).items() if p in timed}
        return plot_phase_times(old, {p: v for p, v in new.items() if p in timed},
                                rerun=_rerun_steps(self.ws, timings))

    def trajectories(self, epoch: int, step: int, layout: str = "overview") -> GateFigure:
        """The E+/E− trajectories of the gate of step (epoch, step), from its gate evidence."""
        outcomes, params = step_outcomes(self.ws, epoch, step)
        return cast(GateFigure, plot_trajectories(outcomes, params, layout=layout))

    # ---- summaries ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Where the run stands (`run_status`)."""
        return run_status(self.reload().ws)

    def export(self, out: str | Path, fmt: str = "parquet") -> dict[str, tuple[Path, int]]:
        """Every table to ``out/<table>.<fmt>`` (`export_tables`)."""
        return export_tables(self.ws, out, fmt)

    def __repr__(self) -> str:
        return f"WorkspaceView({str(self.root)!r})"

    def _repr_html_(self) -> str:
        s = self.status()
        pos = s["position"]
        rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{v}</td></tr>"
                       for k, v in s["counts"].items())
        return (f"<b>{html.escape(str(self.root))}</b> ({s['kind']}, {len(self.ws.pool)} types)"
                f"<br>last step: {pos['last_step'] or 'none'}; settled epochs: "
                f"{pos['settled_epochs'] or 'none'}; on probation: "
                f"{', '.join(s['probation']) or 'none'}<br>next: "
                f"<code>{html.escape(s['next'])}</code><table>{rows}</table>")


def open_workspace(path: str | Path) -> WorkspaceView:
    """Open a workspace for reading (no lock, SQLite ``mode=ro``): frames and figures."""
    return WorkspaceView(Workspace.open(Path(path), readonly=True))


def _world(ws: Workspace) -> Any:
    """The simulated world of a simulated workspace, else None."""
    if ws.config.kind != "simulated":
        return None
    from ..sim import simulated_backend

    return simulated_backend(ws).world


def phase_seconds(timings: pl.DataFrame) -> dict[str, float]:
    """Seconds per phase summed over every recorded step (`PHASES` order, zeros kept)."""
    got = dict(timings.group_by("phase").agg(pl.col("seconds").sum()).iter_rows())
    return {p: float(got.get(p) or 0.0) for p in PHASES}


def timings_clock(timings: pl.DataFrame, simulated: bool) -> str | None:
    """The clock of a workspace's timings: ``virtual``, ``real``, ``mixed`` (not to be
    summed), or None (nothing timed). Rows written before the column existed count as the
    workspace's usual clock (virtual when simulated)."""
    if not timings.height:
        return None
    clocks = set(timings["clock"].fill_null("virtual" if simulated else "real"))
    return clocks.pop() if len(clocks) == 1 else "mixed"


def _rerun_steps(ws: Workspace, timings: pl.DataFrame) -> str | None:
    """The timed steps run more than once (a finished run re-run, a killed run resumed):
    their timings are the last run's, which reused the earlier one's answers."""
    timed = set(timings.select("epoch", "step").iter_rows())
    steps = sorted({(e, s) for e, s in ws.log.frame("replaced_runs").select("epoch", "step")
                    .iter_rows() if (e, s) in timed})
    if not steps:
        return None
    names = [f"e{e} s{s}" if s >= 1 else f"e{e} {'settlement' if s == 0 else 'evaluation'}"
             for e, s in steps]
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def old_phase_seconds(ws: Workspace, world: Any, timings: pl.DataFrame) -> dict[str, float]:
    """The old serial gate's seconds per phase on the recorded inputs (simulated only)."""
    from ..sim import serial_phase_times

    steps = [(e, s) for e, s in ws.log.query(
        "SELECT DISTINCT epoch, step FROM step_report WHERE step >= 1")]
    old = serial_phase_times(ws, world, steps, ws.state.settled_epochs, [
        e for (e,) in ws.log.query("SELECT DISTINCT epoch FROM evaluation")])["phases"]
    serial = timings.filter(pl.col("phase") == "evolution")["serial_s"].fill_null(0.0).sum()
    return {"rollout": old["rollout"], "evolution": float(serial), "gate": old["gate"],
            "settlement": old["settlement"], "evaluation": old["evaluation"]}


def step_outcomes(ws: Workspace, epoch: int, step: int
                  ) -> tuple[dict[str, TypeOutcome], GateParams]:
    """Each gated type's `TypeOutcome` of step (epoch, step), rebuilt from its gate evidence
    and report rows, and the step's `GateParams` (from its manifest)."""
    manifest = read_manifest(ws, epoch, step)
    if manifest is None:
        raise WorkspaceError(f"{ws.manifest_path(epoch, step).relative_to(ws.root)}: missing; "
                             f"step e{epoch} s{step} has not been run in this workspace")
    params = GateParams(**manifest["inputs"]["config"]["params"])
    ev = ws.log.step_frame("gate_evidence", epoch, step)
    out = {}
    for r in ws.log.step_frame("step_report", epoch, step).filter(
            pl.col("action").is_not_null()).iter_rows(named=True):
        rows = ev.filter(pl.col("task_type") == r["task_type"]).sort("ladder_rank")
        traj = tuple(TrajectoryPoint(p["ladder_rank"], p["d"], p["W"], p["L"], p["n_used"],
                                     p["e_plus"], p["e_minus"], Action(p["action"]))
                     for p in rows.iter_rows(named=True))
        out[r["task_type"]] = TypeOutcome(Action(r["action"]), r["W"], r["L"], r["n_used"],
                                          r["e_plus"], r["e_minus"], r["stop_rank"], traj,
                                          r["n_consumed"] or len(traj), r["n_ladder"] or 0)
    return out, params


# ---- export ---------------------------------------------------------------------------------


def export_tables(workspace: Workspace, out: str | Path, fmt: str = "parquet"
                  ) -> dict[str, tuple[Path, int]]:
    """Write every log table to ``out/<table>.<parquet|csv>`` (Parquet, CSV, or CSV for
    Excel: `EXPORT_FORMATS`; the columns of
    `vtrm_gate.harness.TABLES`, docs/api.md), and the recorded gates' ``outcomes`` (the
    table `fit` and `replay --outcomes` read: `write_outcomes`). Each file appears whole
    (written aside, then renamed). Returns ``{table: (file, rows written)}``."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    out = user_path(out)
    if out.exists() and not out.is_dir():
        raise WorkspaceError(f"{out}: exists and is not a directory")
    if not out.exists() and out.suffix.lower() in _FILE_SUFFIXES:
        raise WorkspaceError(f"{out}: export writes a directory of tables (one file per "
                             f"table), not one file; name a directory (--format csv for CSV "
                             f"files); the outcomes table that fit and replay read: "
                             f"write_outcomes(workspace, {out.name!r})")
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for t in TABLES:
        df = workspace.log.frame(t)
        path = out / f"{t}.{fmt.split('-')[0]}"
        tmp = temp_sibling(path)
        if fmt == "parquet":
            df.write_parquet(tmp)
        else:
            df.write_csv(tmp, include_bom=fmt == "csv-excel")
        tmp.replace(path)
        files[t] = (path, df.height)
    outcomes = workspace_outcomes(workspace)  # what fit and replay --outcomes read
    if outcomes.height:  # (gate_evidence holds each gate's consumed prefix only)
        path = out / f"outcomes.{'parquet' if fmt == 'parquet' else 'csv'}"
        files["outcomes"] = (write_outcomes(outcomes, path), outcomes.height)
    return files


# ---- status -----------------------------------------------------------------------------------


def run_status(ws: Workspace) -> dict[str, Any]:
    """Where a run stands: its position (last step, settled and evaluated epochs, the
    recorded training plan), pending probations, cooldowns, the last step's decisions,
    counts, INFRA, the writer holding the lock (if any) and the next command to run."""
    st, log = ws.state, ws.log
    plan = train_started(ws)
    evaluated = sorted({e for (e,) in log.query("SELECT DISTINCT epoch FROM evaluation")})
    position = {"last_step": list(st.last_step) if st.last_step else None,
                "steps_applied": st.steps_applied, "settled_epochs": list(st.settled_epochs),
                "evaluated_epochs": evaluated,
                "plan": None if plan is None else {
                    "epochs": plan["epochs"],
                    "steps_per_epoch": plan["config"].get("steps_per_epoch")}}
    last = [] if st.last_step is None else _last_decisions(ws, *st.last_step)
    holder = read_holder(ws.root)
    counts = {t: log.frame(t).height if t == "timings" else log.count(t) for t in TABLES}
    infra = {"calls": log.count("predictions", infra=1),
             "aborts": sum(a for (a,) in log.query("SELECT aborts FROM infra_aborts"))}
    return {"workspace": str(ws.root), "kind": ws.config.kind, "types": len(ws.pool),
            "position": position,
            "probation": {t: {"version": p.version, "prev_version": p.prev_version,
                              "epoch": p.epoch, "step": p.step}
                          for t, p in sorted(st.probation.items())},
            "cooldown": {t: {"until_steps_applied": u} for t, u in
                         sorted(st.cooldown_until.items()) if st.in_cooldown(t)},
            "policy": {k: getattr(ws.config, k) for k in POLICY_FIELDS},
            "last_decisions": last, "decisions": _action_counts(log), "counts": counts,
            "infra": infra, "writer": None if holder is None else holder.describe(),
            "next": next_command(ws, position, holder is not None)}


def _last_decisions(ws: Workspace, epoch: int, step: int) -> list[dict[str, Any]]:
    """The step's rows; a PROVISIONAL one's ``settled`` says how its epoch's settlement ended
    the bet (None until then: its ``applied`` only says what a failure would restore)."""
    settled = {} if epoch not in ws.state.settled_epochs else {
        r["task_type"]: r["applied"]
        for r in ws.log.step_frame("step_report", epoch, PROBATION_STEP).iter_rows(named=True)}
    return [{**{k: r[k] for k in ("task_type", "status", "action", "W", "L", "applied")},
             "settled": settled.get(r["task_type"]) if r["action"] == "PROVISIONAL" else None}
            for r in ws.log.step_frame("step_report", epoch, step).iter_rows(named=True)]


POLICY_FIELDS = ("cooldown_steps", "futile_cooldown", "rejected_max", "probation_rule",
                 "probation_order", "probation_units")
"""The workspace's training policy (`WorkspaceConfig`, fixed at ``init``) that `status` shows."""


def _action_counts(log: HarnessLog) -> dict[str, int]:
    """Decisions of every gate step so far, by action (settlements not included)."""
    rows = log.query("SELECT action, COUNT(*) FROM step_report WHERE step >= 1 AND action "
                     "IS NOT NULL GROUP BY action")
    return {a: n for a, n in sorted(rows)}


def next_command(ws: Workspace, position: Mapping[str, Any], locked: bool) -> str:
    """The command that moves the run on from where it stands."""
    w = f"--workspace {ws.root}"
    if locked:
        return f"wait: a writer holds {ws.root} (vtrm-gate status {w} again later)"
    plan, last = position["plan"], ws.state.last_step
    if plan is not None and plan["steps_per_epoch"]:
        e, s = plan["epochs"], plan["steps_per_epoch"]
        done = last == (e, s) and e in ws.state.settled_epochs
        if done and (e in position["evaluated_epochs"] or not read_heldout(ws)):
            return (f"none: the run's {e} epochs are done (vtrm-gate train {w} --epochs "
                    f"{e + 1} --steps-per-epoch {s} trains one more)")
        return f"vtrm-gate train {w} --epochs {e} --steps-per-epoch {s}"
    if last is None:
        return f"vtrm-gate step {w} --epoch 1 --step 1"
    e, s = last
    if e in ws.state.settled_epochs:  # its steps can no longer run
        return f"vtrm-gate step {w} --epoch {e + 1} --step 1"
    if any(p.epoch <= e for p in ws.state.probation.values()):
        return (f"vtrm-gate step {w} --epoch {e} --step {s + 1} (or, to end epoch {e}: "
                f"vtrm-gate settle {w} --epoch {e})")
    return f"vtrm-gate step {w} --epoch {e} --step {s + 1}"


# ---- two runs side by side ----------------------------------------------------------------


def run_numbers(ws: Workspace, world: Any) -> dict[str, Any]:
    """One run's decisions, final accuracy, time and calls, per type and overall. Final
    accuracy: true accuracy of the current skills (simulated: ``world``, `_world`), else the
    last evaluated epoch's held-out accuracy (None when nothing was evaluated)."""
    acc, source = _final_accuracy(ws, world)
    dec = ws.log.frame("step_report", "step >= 1 AND action IS NOT NULL")
    pred = ws.log.frame("predictions")
    timings = ws.log.frame("timings")
    types: dict[str, dict[str, Any]] = {}
    for t in ws.task_types:
        d, p = dec.filter(pl.col("task_type") == t), pred.filter(pl.col("task_type") == t)
        types[t] = {"decisions": dict(sorted(d["action"].value_counts().iter_rows())),
                    "accuracy": acc.get(t), "version": ws.state.skills[t].version,
                    "calls": int((p["cached"] == 0).sum()), "tokens": int(p["tokens"].sum())}
    known = [a for a in acc.values() if a is not None]
    overall = {"decisions": dict(sorted(dec["action"].value_counts().iter_rows())),
               "accuracy": sum(known) / len(known) if known else None,
               "calls": sum(r["calls"] for r in types.values()),
               "tokens": sum(r["tokens"] for r in types.values()),
               "seconds": float(timings["seconds"].sum()) if timings.height else None,
               "clock": timings_clock(timings, world is not None),
               "phases": phase_seconds(timings), "replaced": _replaced(ws)}
    return {"workspace": str(ws.root), "kind": ws.config.kind, "accuracy_source": source,
            "probation_rule": ws.config.probation_rule, "seed": ws.config.seed,
            "last_step": list(ws.state.last_step) if ws.state.last_step else None,
            "overall": overall, "types": types}


def _replaced(ws: Workspace) -> dict[str, Any]:
    """What the runs a re-run replaced had cost (a re-run to check the cache, a killed run
    resumed): fresh calls, tokens, and the recorded seconds of those that finished."""
    r = ws.log.frame("replaced_runs")
    return {"runs": r.height, "calls": int(r["fresh_calls"].sum()),
            "tokens": int(r["tokens"].sum()), "seconds": float(r["seconds"].sum())}


def _final_accuracy(ws: Workspace, world: Any) -> tuple[dict[str, float | None], str]:
    if world is not None:
        return ({t: world.true_accuracy(t, ws.skill_text(t)) for t in ws.task_types},
                "true accuracy (simulator)")
    ev = ws.log.frame("evaluation", "epoch >= 0")
    if not ev.height:
        return dict.fromkeys(ws.task_types), "none (no held-out evaluation recorded)"
    last = cast(int, ev["epoch"].max())
    rows = dict(ev.filter(pl.col("epoch") == last).select("task_type", "acc_current")
                .iter_rows())
    return ({t: rows.get(t) for t in ws.task_types},
            f"held-out accuracy after epoch {last}")


DECISION_LETTERS = {"ACCEPT": "A", "PROVISIONAL": "P", "INERTIA": "I", "FUTILE": "F",
                    "REJECT": "R"}


def decision_letters(counts: Mapping[str, int] | None) -> str:
    """Decision counts in a few letters: ``A2 P1 F3`` (ACCEPT 2, PROVISIONAL 1, FUTILE 3)."""
    return " ".join(f"{DECISION_LETTERS.get(a, a)}{n}" for a, n in (counts or {}).items()
                    if n) or "-"


def _settings(ws: Workspace, world: Any) -> dict[str, Any]:
    """The workspace's settings as dotted ``workspace.json`` names -> values (a simulated
    ``world``'s effects resolved: none given is the preset ``default``; its agent block
    repeats ``sim`` and is left out; the identity and file format aside), then the run
    options its steps ran with (`_run_options`)."""
    cfg = {k: v for k, v in ws.config.as_json().items() if k not in ("workspace_id", "format")}
    if world is not None:
        cfg.pop("agent")
        cfg["sim"] = {**cfg["sim"], "world": world.world.to_dict()}
    return {**_dotted(cfg), **_run_options(ws)}


def _run_options(ws: Workspace) -> dict[str, Any]:
    """The run options the recorded steps ran with, by their option names (``decision_rule``,
    ``gate.n_max``, ``dispatch``, ...; from each step's manifest): one value, or the distinct
    values in step order when the steps differed."""
    seen: dict[str, list[Any]] = {}
    rows = ws.log.query("SELECT DISTINCT epoch, step FROM step_report WHERE step >= 1 "
                        "ORDER BY epoch, step")
    for epoch, step in rows:
        m = read_manifest(ws, epoch, step)
        if m is None:
            continue
        cfg = m["inputs"]["config"]
        opts = {"decision_rule": cfg.get("decision_rule", DEFAULT_DECISION_RULE),
                "gate": cfg["params"], "guard": cfg["guard"],
                **{k: m.get(k) for k in EXECUTION_FIELDS}}
        for k, v in _dotted(opts).items():
            if v not in seen.setdefault(k, []):
                seen[k].append(v)
    return {k: vs[0] if len(vs) == 1 else vs for k, vs in seen.items()}


def _dotted(value: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in value.items():
        if isinstance(v, Mapping) and v:
            out.update(_dotted(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _settings_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each setting whose value differs, once: ``{name: {"a": .., "b": ..}}`` (None: not
    set); a name repeating a shorter one's difference (``sim.seed`` of ``seed``) is left out."""
    out: dict[str, dict[str, Any]] = {}
    for k in sorted(set(a) | set(b), key=lambda k: (k.count("."), k)):
        pair = {"a": a.get(k), "b": b.get(k)}
        leaf = k.rsplit(".", 1)[-1]
        if pair["a"] != pair["b"] and not any(
                n.rsplit(".", 1)[-1] == leaf and p == pair for n, p in out.items()):
            out[k] = pair
    order = {k: i for i, k in enumerate(dict.fromkeys([*a, *b]))}  # workspace.json's
    return dict(sorted(out.items(), key=lambda kv: order[kv[0]]))


def compare_runs(a: str | Path, b: str | Path) -> dict[str, Any]:
    """Two workspaces side by side (`run_numbers` of each), per type and overall, with the
    differences B - A of accuracy, time and calls, and the settings that differ."""
    runs, configs = [], []
    for path in (a, b):
        with Workspace.open(Path(path), readonly=True) as ws:
            try:
                world = _world(ws)  # built once: 10-40 ms
                runs.append(run_numbers(ws, world))
                configs.append(_settings(ws, world))
            except WorkspaceError as exc:  # "manifests/e1_s2.json: ...": of which of the two?
                raise WorkspaceError(f"{ws.root}: {exc}") from None
    ra, rb = runs
    types = sorted(set(ra["types"]) | set(rb["types"]))

    def diff(x: Any, y: Any) -> Any:
        return None if x is None or y is None else y - x

    per_type = {t: {"a": ra["types"].get(t), "b": rb["types"].get(t),
                    "accuracy_diff": diff((ra["types"].get(t) or {}).get("accuracy"),
                                          (rb["types"].get(t) or {}).get("accuracy"))}
                for t in types}
    oa, ob = ra["overall"], rb["overall"]
    one_clock = oa["clock"] == ob["clock"] != "mixed"  # else their times are not comparable
    both = [r["accuracy_diff"] for r in per_type.values() if r["accuracy_diff"] is not None]
    return {"a": {k: v for k, v in ra.items() if k != "types"},
            "b": {k: v for k, v in rb.items() if k != "types"},
            "diff": {**{k: diff(oa[k], ob[k]) if k != "seconds" or one_clock else None
                        for k in ("seconds", "calls", "tokens")},
                     # a mean over other types is no difference: the types both measured
                     "accuracy": sum(both) / len(both) if both else None,
                     "accuracy_types": len(both)},
            "types": per_type, "settings": _settings_diff(*configs)}
