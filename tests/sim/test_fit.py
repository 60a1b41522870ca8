"""Fitting a world: empirical Bayes across gates recovers the shares of harmful / neutral /
helpful candidates, from sequences cut by the gate's own stopping rule, and from simulated
3 x 5 runs of three known worlds through the CLI."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
from pathlib import Path

import numpy as np
import pytest

from vtrm_gate.cli._main import main
from vtrm_gate.sim import PRESETS, World, fit_world, logit_per_theta
from vtrm_gate.stats import (
    BOOT_CHUNK,
    BOOT_GROUP,
    MAX_BOOT,
    GateParams,
    bootstrap_effects,
    fit_effects,
    replay_prefix,
)

SHARES = ("p_harmful", "p_neutral", "p_helpful")


def _stopped_gates(shares: tuple[float, float, float], n_gates: int,
                   seed: int) -> tuple[list[int], list[int]]:
    """Gates of 40 units, discordance 0.25, each candidate's class drawn from ``shares``,
    |theta| uniform in 1.9 x [0.3, 0.9]; each sequence cut where the v3 gate stops."""
    rng = random.Random(seed)
    wins, losses = [], []
    for _ in range(n_gates):
        cls = rng.choices((-1, 0, 1), shares)[0]
        theta = cls * 1.9 * rng.uniform(0.3, 0.9)
        p_win = 1 / (1 + math.exp(-theta))
        pairs = [((False, True) if rng.random() < p_win else (True, False))
                 if rng.random() < 0.25 else (True, True) for _ in range(40)]
        out = replay_prefix(pairs, GateParams())
        wins.append(out.W)
        losses.append(out.L)
    return wins, losses


@pytest.mark.parametrize(("shares", "seed"), [((0.6, 0.25, 0.15), 1), ((0.15, 0.7, 0.15), 2),
                                             ((0.15, 0.25, 0.6), 3)])
def test_many_stopped_gates_recover_the_shares(shares: tuple[float, float, float],
                                               seed: int) -> None:
    """1,500 gates (each cut by the stopping rule, ~6 discordant pairs): a share's sampling
    sd alone is <= 0.013; measured error of the fit at 70 gates is ~0.15, at 1,500 it should
    be ~0.15 * sqrt(70 / 1500) = 0.03: tolerance 0.08."""
    w, l = _stopped_gates(shares, 1500, seed)
    fit = fit_effects(w, l, bounds=(0.3 * 1.9, 0.9 * 1.9))
    got = (fit.p_harmful, fit.p_neutral, fit.p_helpful)
    assert all(abs(g - s) < 0.08 for g, s in zip(got, shares, strict=True)), got
    assert abs(sum(got) - 1) < 1e-9 and fit.n_gates == 1500
    assert fit.posterior.shape == (1500, 3)


def test_the_bootstrap_is_seeded_and_brackets_the_fit() -> None:
    w, l = _stopped_gates((0.3, 0.4, 0.3), 200, seed=3)
    a = bootstrap_effects(w, l, 50, seed=7)
    assert (a == bootstrap_effects(w, l, 50, seed=7)).all()
    assert not (a == bootstrap_effects(w, l, 50, seed=8)).all()
    assert abs(a.sum(axis=1) - 1).max() < 1e-9
    fit = fit_effects(w, l)
    assert a[:, 1].min() <= fit.p_neutral <= a[:, 1].max()


def test_the_bootstrap_draws_in_bounded_groups_with_progress_and_the_same_numbers() -> None:
    """1,030 resamples are drawn, refitted and reported a group at a time (memory bounded by
    the group, not by ``n_boot``: ``--boot 1000000000`` grew until the OOM killer, silently);
    the numbers are the ones drawn all at once before (sha256 taken before the change)."""
    w, l = _stopped_gates((0.3, 0.4, 0.3), 120, seed=4)
    seen: list[int] = []
    a = bootstrap_effects(w, l, 1030, seed=5, progress=seen.append)
    assert hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() == (
        "137816b6995f79797ae8c58aaaadf6685cd2a7d4050a8799b953780e427bd2f8")
    assert seen == [BOOT_GROUP, 1030] and BOOT_GROUP % BOOT_CHUNK == 0


@pytest.mark.parametrize("n_boot", [0, -1, MAX_BOOT + 1, True, 2.5, 10**9])
def test_a_bootstrap_size_out_of_range_is_refused_naming_it(n_boot: object) -> None:
    with pytest.raises(ValueError, match=f"n_boot must be a whole number from 1 to {MAX_BOOT:,}"):
        bootstrap_effects([1, 2], [2, 1], n_boot)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_boot must be"):  # before reading the source
        fit_world(Path("/nonexistent/outcomes.csv"), n_boot=n_boot)  # type: ignore[arg-type]


def test_fit_refuses_a_bootstrap_over_the_cap_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--outcomes", "/nonexistent.csv", "--boot", str(MAX_BOOT + 1)])
    assert exc.value.code == 2
    assert f"expected an integer from 1 to {MAX_BOOT}" in capsys.readouterr().err


def test_a_long_fit_shows_its_bootstrap_progress_on_stderr(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import vtrm_gate.cli._progress as progress

    monkeypatch.setattr(progress, "STATUS_EVERY_S", 0.0)  # every group, not once a second
    good = tmp_path / "o.csv"
    good.write_text(_HEADER + "1,1,OCR,u0,0,0,1,0\n1,1,OCR,u1,1,1,1,0\n")
    assert main(["fit", "--outcomes", str(good), "--boot", str(BOOT_GROUP + 5), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["n_boot"] == BOOT_GROUP + 5
    # not a terminal: one line per group (a terminal redraws one line in place)
    assert [line.split(" resamples")[0] for line in err.splitlines()] == [
        f"... bootstrap: {BOOT_GROUP:,} of {BOOT_GROUP + 5:,}",
        f"... bootstrap: {BOOT_GROUP + 5:,} of {BOOT_GROUP + 5:,}"], err


def test_the_bootstrap_on_local_processes_equals_the_serial_one() -> None:
    """The resamples are drawn here and refitted in chunks on 2 spawned workers: the same
    array, bit for bit, as serially (profiled sizes too: the heaviest refit)."""
    from vtrm_gate.sim import sweep_executor, sweep_map
    from vtrm_gate.stats import BOOT_CHUNK

    w, l = _stopped_gates((0.3, 0.4, 0.3), 300, seed=5)
    n = 2 * BOOT_CHUNK + 3  # a short last chunk
    serial = bootstrap_effects(w, l, n, seed=11)
    pids: set[int] = set()
    with sweep_executor(workers=2) as ex:
        par = bootstrap_effects(w, l, n, seed=11,
                                map_fn=lambda fn, items: sweep_map(fn, items, ex))
        pids = {p.pid for p in ex._processes.values()}  # type: ignore[attr-defined]
    assert par.shape == (n, 3) and (par == serial).all()
    assert len(pids) == 2 and os.getpid() not in pids
    assert len({tuple(r) for r in serial}) > 1  # the replicates differ: a real comparison


def test_the_simulators_theta_scale_is_about_1_9_per_logit_unit() -> None:
    """Measured over the default world's 12 types (unit_correlation 0.7)."""
    assert 1.8 < logit_per_theta() < 2.0


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 3 x 5 run (seed 1, no epoch-end evaluation) in each of three known worlds."""
    out = {}
    for name in ("mostly_harmful", "mostly_neutral", "mostly_helpful"):
        root = tmp_path_factory.mktemp(name) / "ws"
        assert main(["init", str(root), "--seed", "1", "--world", name]) == 0
        assert main(["train", "--workspace", str(root), "--epochs", "3", "--steps-per-epoch",
                     "5", "--no-eval", "--json"]) == 0
        out[name] = root
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mostly_harmful", "mostly_neutral", "mostly_helpful"])
def test_fit_recovers_the_shares_of_a_known_world(
        runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        name: str) -> None:
    """Tolerance 0.3 a share. A 3 x 5 run gates 66-90 candidates with ~6 discordant pairs
    each; at 70 gates the share's sampling sd alone is sqrt(.25 / 70) = 0.06 and the fit's
    measured error (9 runs, 3 seeds a world) was at most 0.28, its bootstrap sd 0.04-0.15:
    0.3 is ~2 bootstrap sd of the neutral share. The majority class must be the world's."""
    capsys.readouterr()
    out = tmp_path / "world.json"
    assert main(["fit", "--workspace", str(runs[name]), "--json", "--out", str(out)]) == 0
    d = json.loads(capsys.readouterr().out)
    world = PRESETS[name]
    assert d["n_gates"] >= 60 and sum(r["n_gates"] for r in d["types"]) == d["n_gates"]
    assert abs(sum(d[k] for k in SHARES) - 1) < 1e-9
    for k in SHARES:
        assert abs(d[k] - getattr(world, k)) <= 0.3, (k, d[k])
        lo, hi = d["intervals"][k]
        assert lo <= d[k] <= hi
    assert max(SHARES, key=d.get) == max(SHARES, key=lambda k: getattr(world, k))
    fitted = World.from_json(out)
    assert (fitted.p_harmful, fitted.size_min, fitted.size_max) == (d["p_harmful"], 0.3, 0.9)
    row = d["types"][0]
    assert 0 <= row["base_accuracy_ci"][0] <= row["base_accuracy"] <= row["base_accuracy_ci"][1]


@pytest.mark.slow
def test_fit_reads_the_same_gates_from_an_outcomes_file(
        runs: dict[str, Path], tmp_path: Path) -> None:
    from vtrm_gate import write_outcomes

    path = write_outcomes(runs["mostly_neutral"], tmp_path / "o.parquet")
    a, b = fit_world(runs["mostly_neutral"]), fit_world(path)
    assert (a.n_gates, a.p_harmful, a.p_neutral, a.intervals) == (
        b.n_gates, b.p_harmful, b.p_neutral, b.intervals)


def test_fit_refuses_bad_sources_in_one_line(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "o.csv"
    bad.write_text("epoch,step,task_type,unit_id,ladder_rank,base_correct,cand_correct,infra\n"
                   "1,1,OCR,u0,0,0,1,0\n1,1,OCR,u1,1,0,2,0\n")
    for args, what in ((["--outcomes", str(bad)], "row 2, column 'cand_correct'"),
                       (["--workspace", str(tmp_path / "none")], "none"),
                       (["--outcomes", str(tmp_path)], "is a directory")):
        assert main(["fit", *args]) == 2
        err = capsys.readouterr().err
        assert what in err and err.count("\n") == 1, err


_HEADER = "epoch,step,task_type,unit_id,ladder_rank,base_correct,cand_correct,infra\n"


def test_fit_of_sources_with_nothing_measured_is_bad_input_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A fresh workspace (no gate yet; was a polars traceback, exit 1) and an outcomes file
    whose every pair is INFRA: exit 2, one line naming the source."""
    infra = tmp_path / "infra.csv"
    infra.write_text(_HEADER + "1,1,OCR,u0,0,0,1,1\n1,1,OCR,u1,1,1,0,1\n")
    fresh = tmp_path / "ws"
    assert main(["init", str(fresh), "--seed", "1"]) == 0
    capsys.readouterr()
    for args, name in ((["--outcomes", str(infra)], str(infra)),
                       (["--workspace", str(fresh)], str(fresh))):
        assert main(["fit", *args]) == 2
        err = capsys.readouterr().err
        assert f"{name}: no gate with a measured pair" in err and err.count("\n") == 1, err


def test_a_valueerror_inside_fit_is_reported_as_a_bug_not_bad_input(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI no longer maps every ValueError of ``fit_world`` to exit 2: an internal one
    (injected into the effects fit, on a valid file) is a bug, exit 1 with its traceback."""
    import vtrm_gate.sim._fit as fit_module

    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("internal: shapes disagree")

    good = tmp_path / "o.csv"
    good.write_text(_HEADER + "1,1,OCR,u0,0,0,1,0\n1,1,OCR,u1,1,1,1,0\n")
    assert main(["fit", "--outcomes", str(good), "--boot", "5"]) == 0
    monkeypatch.setattr(fit_module, "fit_effects", broken)
    capsys.readouterr()
    assert main(["fit", "--outcomes", str(good), "--boot", "5"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "this is a bug in vtrm_gate" in err, err
    assert "internal: shapes disagree" in err


@pytest.mark.slow
def test_fit_with_jobs_prints_the_serial_fit(runs: dict[str, Path],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    outs = []
    for extra in ([], ["--jobs", "2"]):
        assert main(["fit", "--workspace", str(runs["mostly_helpful"]), "--json",
                     "--boot", "60", *extra]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0] == outs[1] and outs[0]["n_boot"] == 60
    assert outs[0]["intervals"]["p_helpful"][0] < outs[0]["intervals"]["p_helpful"][1]


@pytest.mark.slow
def test_fit_on_a_dask_cluster_prints_the_serial_fit(
        runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """``fit --scheduler`` on a real 2-process Dask cluster (loopback) prints the serial fit,
    bit for bit, and its bootstrap's refits ran on the cluster: ceil(60 / 25) = 3 chunks."""
    from dask.distributed import LocalCluster

    from vtrm_gate.stats import BOOT_CHUNK

    capsys.readouterr()
    args = ["fit", "--workspace", str(runs["mostly_helpful"]), "--json", "--boot", "60"]
    assert main(args) == 0
    serial = json.loads(capsys.readouterr().out)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster:
        assert main([*args, "--scheduler", cluster.scheduler_address]) == 0
        refits = cluster.scheduler.task_prefixes["refit_shares"].state_counts
        workers = {w.pid for w in cluster.scheduler.workers.values()}
    assert json.loads(capsys.readouterr().out) == serial
    assert refits["memory"] == math.ceil(60 / BOOT_CHUNK) == 3
    assert len(workers) == 2 and os.getpid() not in workers
    lo, hi = serial["intervals"]["p_helpful"]
    assert lo < hi  # the resamples differ: a real comparison


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"free_sizes": "false"}, "free_sizes must be True or False, got 'false'"),
    ({"level": -0.5}, "level must be a number between 0 and 1 (exclusive), got -0.5"),
    ({"level": 95}, "level must be a number between 0 and 1 (exclusive), got 95"),
    ({"level": 1}, "level must be a number between 0 and 1"),
    ({"level": True}, "level must be a number between 0 and 1"),
    ({"seed": -1}, "seed must be an integer >= 0, got -1"),
    ({"seed": 1.5}, "seed must be an integer >= 0, got 1.5"),
    ({"executor": "local"}, "executor must be a concurrent.futures Executor "
                            "(sim.sweep_executor) or None, got str"),
])
def test_fit_arguments_are_checked_before_the_source_is_read(kwargs: dict, message: str) -> None:
    """``free_sizes="false"`` turned size fitting on (truthy text) and changed the fit;
    ``level=-0.5`` gave reversed intervals; the rest failed deep in numpy or the pool."""
    with pytest.raises(ValueError, match=re.escape(message)):
        fit_world(Path("/nonexistent/outcomes.csv"), **kwargs)


def test_fit_of_a_frame_reads_it_under_the_params_given(tmp_path: Path) -> None:
    """A 60-unit ladder under ``GateParams(n_max=60)`` replays, and the fit read the frame
    under the default n_max = 40 and refused it."""
    import polars as pl

    from vtrm_gate.stats import GateParams

    rng = np.random.default_rng(3)
    rows = [{"epoch": 1, "step": g + 1, "task_type": "OCR", "unit_id": f"u{r}",
             "ladder_rank": r, "base_correct": bool(rng.random() < 0.5),
             "cand_correct": bool(rng.random() < 0.6), "infra": False}
            for g in range(8) for r in range(60)]
    frame = pl.DataFrame(rows)
    path = tmp_path / "o.csv"
    frame.write_csv(path)
    a = fit_world(frame, n_boot=5, params=GateParams(n_max=60))
    b = fit_world(path, n_boot=5, params=GateParams(n_max=60))
    assert a.n_gates == b.n_gates == 8 and a.p_helpful == b.p_helpful
