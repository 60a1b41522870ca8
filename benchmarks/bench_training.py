"""A whole training run (3 epochs x 5 steps, 12 types) on the virtual clock: old serial vs v3.

Per seed, the real `train` runs a simulated workspace (continuous gate, parallel evolution,
concurrent settlement, held-out evaluation) and reports its loop-clock time per phase; the
OLD serial pattern is timed on exactly the same inputs (types serial, blocks of 8, arms
serial, serial evolution, serial settlement and evaluation; no BaselineCache). Decision
quality comes from the simulator's ground truth, against an "accept every candidate" run and
an "oracle gate" run on the same seed. With ``--probation`` (part of the default run) each
probation rule is run on the same seeds: leak, power and probe units spent, plus the exact
probe operating characteristics.

Run: ``python -m benchmarks.bench_training [--quick] [--seeds N]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import machine, print_table
from vtrm_gate.backends import run_simulated_training
from vtrm_gate.gate import GuardParams
from vtrm_gate.options import RunOptions
from vtrm_gate.sim import SimConfig
from vtrm_gate.stats import EContinueRule, EHarmRule, WNetRule, probe_oc

EPOCHS, STEPS = 3, 5
# The SPEC's guard at the simulator's post-retry INFRA rate: a default run aborts <= 0.69% of
# the time (bench_guard), so the benchmark measures the run, not the guard.
GUARD = GuardParams()
RULES = ("w_net", "e_continue", "e_harm")


# Execution policies of the calls a decision no longer needs (issue 17): the old default
# (wait for every call), and not waiting once every type has decided, with and without
# cancelling a frozen type's worthless calls at its freeze.
EXECUTION = {
    "wait (before issue 17)": {"past_stop": "wait", "cancel_after_freeze": False},
    "past_stop=cancel": {"past_stop": "cancel", "cancel_after_freeze": False},
    "past_stop=cancel + cancel_after_freeze": {"past_stop": "cancel",
                                               "cancel_after_freeze": True},
}


def run_seed(seed: int, rule: str = "w_net", **execution: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        ws, _, summary = run_simulated_training(
            Path(d) / "ws", SimConfig(seed=seed), EPOCHS, STEPS,
            RunOptions(guard=GUARD, **execution), probation_rule=rule)
        wall = time.perf_counter() - t
        units = sum(n or 0 for (n,) in ws.log.select("step_report", ["n_consumed"], step=0,
                                                       status="probation"))
        rows = [r for r in ws.log.select(
            "step_report", ["epoch", "step", "task_type", "action", "started", "cache_hits",
                            "cancelled_in_flight"], order_by=["epoch", "step", "task_type"])
                if r[1] > 0]
        calls = [sum(r[k] or 0 for r in rows) for k in (4, 5, 6)]
        actions = [r[:4] for r in rows]
        ws.close()
    q = summary["quality"]
    return {"seed": seed, "rule": rule, "wall_s": wall, "summary": summary, "q": q,
            "probe_units": units, "gate_calls": calls[0], "baseline_hits": calls[1],
            "cancelled": calls[2], "actions": actions}


def execution_study(n: int) -> None:
    """The whole training run under each execution policy, same seeds: total and gate time
    (work moved or dropped is not hidden: it shows as calls and BaselineCache hits)."""
    by_policy = {name: [run_seed(s, **kw) for s in range(n)] for name, kw in EXECUTION.items()}
    ref = by_policy["wait (before issue 17)"]
    rows = []
    for name, rs in by_policy.items():
        rows.append({
            "policy": name,
            "total_h_median": _h(statistics.median(r["summary"]["v3_total_s"] for r in rs)),
            "gate_h_median": _h(statistics.median(r["summary"]["v3_phases_s"]["gate"]
                                                  for r in rs)),
            "total_vs_wait": statistics.median(
                r["summary"]["v3_total_s"] / w["summary"]["v3_total_s"]
                for r, w in zip(rs, ref, strict=True)),
            "gate_calls": sum(r["gate_calls"] for r in rs),
            "baseline_hits": sum(r["baseline_hits"] for r in rs),
            "cancelled_in_flight": sum(r["cancelled"] for r in rs),
            "same_actions_as_wait": sum(r["actions"] == w["actions"]
                                        for r, w in zip(rs, ref, strict=True)),
            "acc_gate_median": statistics.median(r["q"]["mean_accuracy"]["gate"] for r in rs)})
    print_table(f"execution policies, whole training run ({n} seeds x {EPOCHS}x{STEPS} steps; "
                f"gate_calls / baseline_hits / cancelled summed over seeds; same_actions: "
                f"seeds whose every step decision equals the wait run's)", rows)


def _h(s: float) -> float:
    return s / 3600


def main(quick: bool = False, seeds: int | None = None, probation: bool = True,
         execution: bool = True) -> None:
    n = seeds or (3 if quick else 10)
    print(f"machine: {machine()}")
    print(f"{n} seeds, {EPOCHS} epochs x {STEPS} steps, 12 types, virtual clock, the SPEC's "
          f"guard")
    runs = [run_seed(s) for s in range(n)]
    phases = ("rollout", "evolution", "gate", "settlement", "evaluation")
    rows = []
    for ph in phases:
        old = [r["summary"]["old_phases_s"][ph] for r in runs]
        new = [r["summary"]["v3_phases_s"][ph] for r in runs]
        ratio = [o / v for o, v in zip(old, new, strict=True) if v > 0]
        rows.append({"phase": ph, "old_h_median": _h(statistics.median(old)),
                     "v3_h_median": _h(statistics.median(new)),
                     "speedup_median": statistics.median(ratio) if ratio else None})
    tot_old = [r["summary"]["old_total_s"] for r in runs]
    tot_new = [r["summary"]["v3_total_s"] for r in runs]
    sp = [o / v for o, v in zip(tot_old, tot_new, strict=True)]
    rows.append({"phase": "TOTAL", "old_h_median": _h(statistics.median(tot_old)),
                 "v3_h_median": _h(statistics.median(tot_new)),
                 "speedup_median": statistics.median(sp)})
    print_table("time of a training run per phase (simulated hours; old serial vs v3)", rows)
    print(f"speedup worst {min(sp):.2f}x, best {max(sp):.2f}x; old total "
          f"{_h(min(tot_old)):.1f}-{_h(max(tot_old)):.1f} h, v3 "
          f"{_h(min(tot_new)):.1f}-{_h(max(tot_new)):.1f} h; wall per run median "
          f"{statistics.median(r['wall_s'] for r in runs):.1f} s")

    qrows = []
    for r in runs:
        q = r["q"]
        m = q["mean_accuracy"]
        qrows.append({"seed": r["seed"], "better_gated": q["gated"]["better"],
                      "applied_better": q["applied"]["better"],
                      "applied_neutral": q["applied"]["neutral"],
                      "applied_worse": q["applied"]["worse"],
                      "missed_better": q["missed_better"],
                      "acc_initial": m["initial"], "acc_gate": m["gate"],
                      "acc_accept_all": m["accept_all"], "acc_oracle": m["oracle"]})
    print_table("decision quality against the simulator's ground truth (v3, w_net probation)",
                qrows)
    for k in ("acc_initial", "acc_gate", "acc_accept_all", "acc_oracle"):
        print(f"  median {k}: {statistics.median(r[k] for r in qrows):.4f}")
    old_applied = {"better": 0, "neutral": 0, "worse": 0}
    new_applied = {"better": 0, "neutral": 0, "worse": 0}
    for r in runs:
        truth = {(e, s, t): c for e, s, t, c in _truth(r)}
        for e, s, t, a in r["summary"]["old_gate_decisions"]:
            if a in ("ACCEPT", "PROVISIONAL") and (e, s, t) in truth:
                old_applied[truth[(e, s, t)]] += 1
        for cls, k in r["q"]["applied"].items():
            new_applied[cls] += k
    print(f"old block gate on the same steps (before probation), applied by true class: "
          f"{old_applied}; v3 after probation: {new_applied}")

    if probation:
        probation_study(runs, n)
    if execution:
        execution_study(n)


def _truth(run: dict[str, Any]) -> list[tuple[int, int, str, str]]:
    return run["q"].get("truth_rows", [])


def probation_study(w_net_runs: list[dict[str, Any]], n: int) -> None:
    """Leak, power and units spent of each probation rule, end to end on the same seeds."""
    by_rule = {"w_net": w_net_runs}
    for rule in RULES[1:]:
        by_rule[rule] = [run_seed(s, rule) for s in range(n)]
    rows = []
    for rule, rs in by_rule.items():
        kept = {c: sum(r["q"]["provisional_kept"][c] for r in rs) for c in ("better", "neutral",
                                                                         "worse")}
        rolled = {c: sum(r["q"]["provisional_rolled_back"][c] for r in rs)
                  for c in ("better", "neutral", "worse")}
        bad_prov = kept["neutral"] + kept["worse"] + rolled["neutral"] + rolled["worse"]
        good_prov = kept["better"] + rolled["better"]
        applied = {c: sum(r["q"]["applied"][c] for r in rs) for c in ("better", "neutral",
                                                                     "worse")}
        gated_better = sum(r["q"]["gated"]["better"] for r in rs)
        rows.append({
            "rule": rule,
            "leak_applied_neutral_or_worse": applied["neutral"] + applied["worse"],
            "provisional_bad_kept": f"{kept['neutral'] + kept['worse']}/{bad_prov}",
            "provisional_good_kept": f"{kept['better']}/{good_prov}",
            "applied_better": f"{applied['better']}/{gated_better}",
            "probe_units_total": sum(r["probe_units"] for r in rs),
            "acc_gate_median": statistics.median(r["q"]["mean_accuracy"]["gate"] for r in rs),
        })
    print_table(f"probation rules end to end ({n} seeds x {EPOCHS}x{STEPS} steps)", rows)
    orows = []
    for name, rule in (("w_net", WNetRule(0)), ("e_continue (E+ 2.25 from the gate)",
                                               EContinueRule(2.25)),
                       ("e_continue (E+ 5.06)", EContinueRule(5.0625)),
                       ("e_harm", EHarmRule())):
        for p_win in (0.5, 0.75, 0.9):
            for disc in (0.2, 0.5):
                oc = probe_oc(rule, p_win, disc, 40)
                orows.append({"rule": name, "p_win": p_win, "discordance": disc,
                              "p_keep": oc.p_keep, "expected_units": oc.expected_units})
    print_table("exact probe operating characteristics (40 fresh units)", orows)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--no-probation", action="store_true")
    ap.add_argument("--no-execution", action="store_true",
                    help="skip the execution-policy study (past_stop, cancel_after_freeze)")
    ap.add_argument("--only-execution", action="store_true",
                    help="only the execution-policy study")
    a = ap.parse_args()
    if a.only_execution:
        print(f"machine: {machine()}")
        execution_study(a.seeds or (3 if a.quick else 10))
    else:
        main(quick=a.quick, seeds=a.seeds, probation=not a.no_probation,
             execution=not a.no_execution)
    sys.exit(0)
