"""polars views of gate values: decision tables, trajectories, counters, events, OC grids.

No plotting and no I/O: each function turns `vtrm_gate.stats` / `vtrm_gate.gate`
values into a `pl.DataFrame` with a fixed schema (so empty inputs still have the columns),
sorted deterministically, so notebooks can print them and nbval can compare them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from typing import Any

import numpy as np
import polars as pl

from ..gate import (
    GateAborted,
    GateEvent,
    GateFinished,
    GateResult,
    GateStarted,
    PrefixAdvanced,
    TaskFinished,
    TaskStarted,
    TypeCounters,
    TypeDecided,
)
from ..stats import (
    Action,
    GateParams,
    Pair,
    TypeOutcome,
    as_params,
    operating_characteristics,
    replay_blocks,
    replay_prefix,
    wilson_interval,
)

EFFECT: dict[Action, str] = {
    Action.ACCEPT: "replace", Action.PROVISIONAL: "probation", Action.INERTIA: "keep",
    Action.FUTILE: "keep + cooldown", Action.REJECT: "keep + cooldown",
    Action.CONTINUE: "undecided"}
"""What each exit does in Phase D at the SPEC's defaults: INERTIA, FUTILE and REJECT all keep
the baseline, but FUTILE and REJECT also sit the type out for ``cooldown_steps`` (and put
the candidate in the rejected buffer). INERTIA vs FUTILE is no "same effect": that cooldown
is the whole accuracy gap between v3 and the old gate (docs/training.md)."""

OUTCOME_SCHEMA: dict[str, pl.DataType] = {
    "task_type": pl.String(),
    "action": pl.String(),
    "W": pl.Int64(),
    "L": pl.Int64(),
    "n_used": pl.Int64(),
    "e_plus": pl.Float64(),
    "e_minus": pl.Float64(),
    "stop_rank": pl.Int64(),
    "n_consumed": pl.Int64(),
    "n_ladder": pl.Int64(),
}

TRAJECTORY_SCHEMA: dict[str, pl.DataType] = {
    "task_type": pl.String(),
    "step": pl.Int64(),
    "ladder_rank": pl.Int64(),
    "d": pl.Int64(),
    "W": pl.Int64(),
    "L": pl.Int64(),
    "n_used": pl.Int64(),
    "e_plus": pl.Float64(),
    "e_minus": pl.Float64(),
    "action": pl.String(),
}

EVENT_SCHEMA: dict[str, pl.DataType] = {
    "seq": pl.Int64(),
    "t": pl.Float64(),
    "kind": pl.String(),
    "task_type": pl.String(),
    "unit_id": pl.String(),
    "arm": pl.String(),
    "ladder_rank": pl.Int64(),
    "status": pl.String(),
    "correct": pl.Boolean(),
    "infra": pl.Boolean(),
    "in_flight": pl.Int64(),
    "d": pl.Int64(),
    "W": pl.Int64(),
    "L": pl.Int64(),
    "e_plus": pl.Float64(),
    "e_minus": pl.Float64(),
    "action": pl.String(),
    "detail": pl.String(),
}


def outcomes_frame(outcomes: Mapping[str, TypeOutcome]) -> pl.DataFrame:
    """The decision table: one row per type, sorted by task_type."""
    rows = [{"task_type": t, "action": str(o.action), "W": o.W, "L": o.L, "n_used": o.n_used,
             "e_plus": o.e_plus, "e_minus": o.e_minus, "stop_rank": o.stop_rank,
             "n_consumed": o.n_consumed, "n_ladder": o.n_ladder}
            for t, o in sorted(outcomes.items())]
    return pl.DataFrame(rows, schema=OUTCOME_SCHEMA, orient="row")


def trajectory_frame(outcomes: Mapping[str, TypeOutcome]) -> pl.DataFrame:
    """One row per consumed unit (INFRA included, ``d`` null), in consumption order.

    ``step`` counts consumed units from 1, so ``(step, e_plus)`` is the e+ trajectory.
    """
    rows = [{"task_type": t, "step": i, "ladder_rank": p.ladder_rank, "d": p.d, "W": p.W,
             "L": p.L, "n_used": p.n_used, "e_plus": p.e_plus, "e_minus": p.e_minus,
             "action": str(p.action)}
            for t, o in sorted(outcomes.items())
            for i, p in enumerate(o.trajectory, start=1)]
    return pl.DataFrame(rows, schema=TRAJECTORY_SCHEMA, orient="row")


_COUNTER_FIELDS = tuple(f.name for f in fields(TypeCounters))


def counters_frame(gate_result: GateResult) -> pl.DataFrame:
    """Per-type work accounting of one gate run, with the decision, sorted by task_type.

    ``counted`` = completed calls that fed the statistics (completed minus those finished
    after the freeze); ``wasted`` = discarded after freeze + cancelled in flight.
    """
    schema: dict[str, pl.DataType] = {"task_type": pl.String(), "action": pl.String()}
    schema |= {name: pl.Int64() for name in _COUNTER_FIELDS}
    schema |= {"counted": pl.Int64(), "wasted": pl.Int64()}
    rows = []
    for t, c in sorted(gate_result.counters.items()):
        o = gate_result.outcomes.get(t)
        row: dict[str, Any] = {"task_type": t, "action": str(o.action) if o else None}
        row |= {name: getattr(c, name) for name in _COUNTER_FIELDS}
        row["counted"] = c.completed - c.discarded_after_freeze
        row["wasted"] = c.discarded_after_freeze + c.cancelled_in_flight
        rows.append(row)
    return pl.DataFrame(rows, schema=schema, orient="row")


def _event_row(ev: GateEvent) -> dict[str, Any]:
    row: dict[str, Any] = {"t": ev.t, "kind": type(ev).__name__}
    if isinstance(ev, TaskStarted):
        row |= {"task_type": ev.task.task_type, "unit_id": ev.task.unit_id,
                "arm": ev.task.arm, "ladder_rank": ev.task.ladder_rank,
                "in_flight": ev.in_flight}
    elif isinstance(ev, TaskFinished):
        row |= {"task_type": ev.task.task_type, "unit_id": ev.task.unit_id,
                "arm": ev.task.arm, "ladder_rank": ev.task.ladder_rank, "status": ev.status,
                "correct": ev.result.correct, "infra": ev.result.infra,
                "detail": ev.result.error}
    elif isinstance(ev, PrefixAdvanced):
        row |= {"task_type": ev.task_type, "unit_id": ev.unit_id,
                "ladder_rank": ev.ladder_rank, "d": ev.d, "W": ev.W, "L": ev.L,
                "e_plus": ev.e_plus, "e_minus": ev.e_minus, "action": str(ev.action)}
    elif isinstance(ev, TypeDecided):
        o = ev.outcome
        row |= {"task_type": ev.task_type, "ladder_rank": o.stop_rank, "W": o.W, "L": o.L,
                "e_plus": o.e_plus, "e_minus": o.e_minus, "action": str(o.action)}
    elif isinstance(ev, GateStarted):
        row |= {"in_flight": 0, "detail": f"{len(ev.task_types)} types, "
                f"{sum(ev.ladder_sizes)} units, concurrency {ev.concurrency}"}
    elif isinstance(ev, GateFinished):
        row |= {"detail": f"peak in flight {ev.result.peak_in_flight}, "
                f"{ev.result.tokens} tokens"}
    elif isinstance(ev, GateAborted):
        row |= {"detail": ev.reason}
    return row


def events_frame(events: Iterable[GateEvent]) -> pl.DataFrame:
    """One row per event in arrival order (``seq``); columns not relevant to a kind are null."""
    rows = [{"seq": i, **_event_row(ev)} for i, ev in enumerate(events)]
    return pl.DataFrame(rows, schema=EVENT_SCHEMA, orient="row")


def oc_grid(params: GateParams, p_wins: Iterable[float], discordances: Iterable[float],
            n_units: int | Iterable[int], infra_rate: float = 0.0) -> pl.DataFrame:
    """Exact operating characteristics (`operating_characteristics`) over a parameter grid.

    One row per (n_units, discordance, p_win), with every exit probability and the
    expected units and pairs consumed.
    """
    ns: list[Any] = ([n_units] if isinstance(n_units, int | np.integer)
                     else list(n_units))
    for n in ns:
        if isinstance(n, bool | np.bool_) or not isinstance(n, int | np.integer) or n < 1:
            raise ValueError(f"n_units must be an integer >= 1 or a sequence of them, got "
                             f"{n_units!r}")
    rows = [operating_characteristics(params, float(p), float(d), int(n), infra_rate).as_dict()
            for n, d, p in itertools.product(ns, list(discordances), list(p_wins))]
    schema: dict[str, pl.DataType] = {
        "n_units": pl.Int64(), "discordance": pl.Float64(), "p_win": pl.Float64(),
        "infra_rate": pl.Float64(), "p_accept": pl.Float64(), "p_provisional": pl.Float64(),
        "p_inertia": pl.Float64(), "p_futile": pl.Float64(), "p_reject": pl.Float64(),
        "expected_units": pl.Float64(), "expected_pairs": pl.Float64()}
    return pl.DataFrame([{k: r[k] for k in schema} for r in rows], schema=schema,
                        orient="row")


def compare_replays(outcome_sets: Mapping[str, Sequence[Pair]], params: GateParams | None = None,
                    block: int = 8) -> pl.DataFrame:
    """Per type: the old block replay vs the v3 prefix replay of the same outcomes.

    ``*_units`` are consumed units (each costs two inference calls unless the base arm is
    cached); ``agree`` says whether both replays reached the same action, ``same_effect``
    whether the actions do the same in Phase D (`EFFECT`: FUTILE's cooldown sets it apart
    from INERTIA).
    """
    params = as_params(params)
    schema: dict[str, pl.DataType] = {
        "task_type": pl.String(), "n_ladder": pl.Int64(),
        "prefix_action": pl.String(), "block_action": pl.String(),
        "prefix_stop_rank": pl.Int64(), "block_stop_rank": pl.Int64(),
        "prefix_units": pl.Int64(), "block_units": pl.Int64(), "units_saved": pl.Int64(),
        "prefix_e_plus": pl.Float64(), "block_e_plus": pl.Float64(), "agree": pl.Boolean(),
        "same_effect": pl.Boolean()}
    rows = []
    for t, outcomes in sorted(outcome_sets.items()):
        pre = replay_prefix(outcomes, params)
        blk = replay_blocks(outcomes, params, block=block)
        rows.append({
            "task_type": t, "n_ladder": len(outcomes),
            "prefix_action": str(pre.action), "block_action": str(blk.action),
            "prefix_stop_rank": pre.stop_rank, "block_stop_rank": blk.stop_rank,
            "prefix_units": pre.n_consumed, "block_units": blk.n_consumed,
            "units_saved": blk.n_consumed - pre.n_consumed,
            "prefix_e_plus": pre.e_plus, "block_e_plus": blk.e_plus,
            "agree": pre.action is blk.action,
            "same_effect": EFFECT[pre.action] == EFFECT[blk.action]})
    return pl.DataFrame(rows, schema=schema, orient="row")


CALLS_SCHEMA: dict[str, pl.DataType] = {
    "task_type": pl.String(), "action": pl.String(), "n_ladder": pl.Int64(),
    "stop_rank": pl.Int64(), "started": pl.Int64(), "needed_calls": pl.Int64(),
    "past_stop_calls": pl.Int64(), "cache_hits": pl.Int64(), "never_started": pl.Int64()}


def call_accounting(events: Iterable[GateEvent]) -> pl.DataFrame:
    """Per type, where its 2 × ladder calls went, from one gate's events.

    ``needed_calls``: started for units up to the stop rank; ``past_stop_calls``: started
    for units beyond it (waste, whether they finished before the freeze or after);
    ``cache_hits``: base arms answered by the BaselineCache; ``never_started``: the rest.
    Events missing calls (a handle's summarised history, a subscriber that fell behind) are
    refused when the gate's end says so: the count would be wrong without a word.
    """
    started: dict[str, list[int]] = {}
    hits: dict[str, int] = {}
    sizes: dict[str, int] = {}
    outcomes: dict[str, TypeOutcome] = {}
    final: GateResult | None = None
    for ev in events:
        if isinstance(ev, GateFinished):
            final = ev.result
        elif isinstance(ev, GateStarted):
            sizes.update(zip(ev.task_types, ev.ladder_sizes, strict=True))
        elif isinstance(ev, TaskStarted):
            started.setdefault(ev.task.task_type, []).append(ev.task.ladder_rank)
        elif isinstance(ev, TaskFinished) and ev.status == "cache_hit":
            hits[ev.task.task_type] = hits.get(ev.task.task_type, 0) + 1
        elif isinstance(ev, TypeDecided):
            outcomes[ev.task_type] = ev.outcome
    if final is not None:
        _check_complete(final, started, hits)
    rows = []
    for t in sorted(sizes):
        o = outcomes.get(t)
        stop = o.stop_rank if o is not None else None
        ranks = started.get(t, [])
        needed = sum(r <= stop for r in ranks) if stop is not None else 0
        rows.append({"task_type": t, "action": str(o.action) if o else None,
                     "n_ladder": sizes[t], "stop_rank": stop, "started": len(ranks),
                     "needed_calls": needed, "past_stop_calls": len(ranks) - needed,
                     "cache_hits": hits.get(t, 0),
                     "never_started": 2 * sizes[t] - len(ranks) - hits.get(t, 0)})
    return pl.DataFrame(rows, schema=CALLS_SCHEMA, orient="row")


def _check_complete(final: GateResult, started: Mapping[str, list[int]],
                    hits: Mapping[str, int]) -> None:
    """ValueError when the events hold fewer calls than the gate's own counters."""
    for t, c in final.counters.items():
        seen = (len(started.get(t, ())), hits.get(t, 0))
        if seen != (c.started, c.cache_hits):
            raise ValueError(
                f"call_accounting: the events miss calls of type {t!r} ({seen[0]} started and "
                f"{seen[1]} cache hits among them, {c.started} and {c.cache_hits} in the "
                f"gate's counters): pass every event, e.g. subscribers=[events.append], not a "
                f"handle's history past its history_limit")


QUALITY_CLASSES = ("better", "neutral", "worse")


def decision_quality_frame(quality: Mapping[str, Any]) -> pl.DataFrame:
    """`vtrm_gate.sim.quality_report` as a table per true class: gated, applied (and how:
    ACCEPTed, kept by a settlement), the applied share with its 95% Wilson interval, rolled
    back, superseded before settlement, and the reference runs' applied counts."""
    rows = []
    for c in QUALITY_CLASSES:
        n, k = quality["gated"][c], quality["applied"][c]
        lo = hi = None
        if n:
            w_lo, w_hi = wilson_interval(k, n)
            lo, hi = max(0.0, float(w_lo)), min(1.0, float(w_hi))
        rows.append({"true_class": c, "gated": n, "applied": k,
                     "accepted": quality["applied_by"]["accepted"][c],
                     "kept": quality["provisional_kept"][c],
                     "applied_share": k / n if n else None, "share_lo": lo, "share_hi": hi,
                     "rolled_back": quality["provisional_rolled_back"][c],
                     "superseded": quality["provisional_superseded"][c],
                     "accept_all_applied": quality["policies"]["accept_all"]["applied"][c],
                     "oracle_applied": quality["policies"]["oracle"]["applied"][c]})
    return pl.DataFrame(rows, infer_schema_length=None)


def gain_frame(rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any] | None
               ) -> pl.DataFrame:
    """One epoch's held-out gain (current - initial) per type, then the two overall views:
    pooled over units (Newcombe) and the mean over types (MOVER), each row naming its
    method and 95% interval."""
    out = [{"what": r["task_type"], "version": r["version"], "units": r["n_pairs"],
            "acc_initial": r["acc_initial"], "acc_current": r["acc_current"],
            "gain": r["gain"], "gain_lo": r["gain_lo"], "gain_hi": r["gain_hi"],
            "method": r["gain_method"]} for r in sorted(rows, key=lambda r: r["task_type"])]
    if summary:
        for key, label in (("gain_pooled", "overall: pooled over units"),
                           ("gain_mean_over_types", "overall: mean over types")):
            g = summary[key]
            out.append({"what": label, "version": None, "units": g["n"],
                        "acc_initial": summary["acc_initial"] if key == "gain_pooled" else None,
                        "acc_current": summary["acc_current"] if key == "gain_pooled" else None,
                        "gain": g["estimate"], "gain_lo": g["lo"], "gain_hi": g["hi"],
                        "method": g["method"]})
    return pl.DataFrame(out, infer_schema_length=None)


SWEEP_BASELINES = ("no_gate", "old", "v3", "oracle")


def harmful_sweep_frame(sweep: Mapping[str, Any]) -> pl.DataFrame:
    """`benchmarks.bench_power`'s ``harmful_sweep`` as a table: per share of harmful
    candidates, each baseline's mean final true accuracy (no gate, old gate, v3, oracle) and
    v3 − no gate paired by seed with its 95% interval over seeds (fractions, not points)."""
    rows = []
    for p in sweep["points"]:
        by = {e["label"]: e for e in p["summary"]}
        rows.append({"p_harmful": p["p_harmful"], "seeds": p["seeds"],
                     **{b: by[b]["accuracy"][0] for b in SWEEP_BASELINES},
                     "v3_vs_no_gate": by["v3"]["vs_no_gate"][0],
                     "lo": by["v3"]["vs_no_gate"][1], "hi": by["v3"]["vs_no_gate"][2]})
    return pl.DataFrame(rows, infer_schema_length=None)
