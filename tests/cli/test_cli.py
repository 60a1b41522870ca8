"""The `vtrm-gate` command, run as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path | None = None, env: dict | None = None):
    return subprocess.run([sys.executable, "-m", "vtrm_gate", *args], capture_output=True,
                          text=True, cwd=cwd or ROOT, timeout=240,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def stepped(tmp_path_factory):
    ws = tmp_path_factory.mktemp("cli") / "ws"
    r = cli("init", str(ws), "--seed", "3")
    assert r.returncode == 0, r.stderr
    r = cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "1", "--json")
    assert r.returncode == 0, r.stderr
    return ws, json.loads(r.stdout)


def test_step_json_summary_and_decisions(stepped):
    ws, out = stepped
    assert out["epoch"] == 1 and len(out["types"]) == 12
    assert out["peak_in_flight"] <= 32
    assert out["makespan_s"] > 1800  # simulated hours, replayed on the virtual clock
    from vtrm_gate.harness import HarnessLog

    with HarnessLog(ws / "harness.sqlite") as log:
        ev = log.frame("gate_evidence")
    gated = [t for t in out["types"] if t["action"]]
    assert ev.height == sum(t["stop_rank"] + 1 for t in gated)


def test_a_step_records_its_gate_makespan_in_timings(stepped):
    ws, out = stepped
    from vtrm_gate.harness import HarnessLog

    with HarnessLog(ws / "harness.sqlite", readonly=True) as log:
        rows = log.frame("timings").select("epoch", "step", "phase", "seconds").rows()
    assert rows == [(1, 1, "gate", out["makespan_s"])]


def test_rerun_gives_same_decisions_and_hits_the_baseline_cache(stepped):
    ws, first = stepped
    r = cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "1", "--json")
    assert r.returncode == 0, r.stderr
    second = json.loads(r.stdout)
    key = ("task_type", "action", "W", "L", "stop_rank")
    assert [{k: t[k] for k in key} for t in second["types"]] == [
        {k: t[k] for k in key} for t in first["types"]]
    assert sum(t["cache_hits"] or 0 for t in second["types"]) > 0


def test_replay_reports_prefix_vs_block(stepped):
    ws, _ = stepped
    r = cli("replay", "--workspace", str(ws), "--epoch", "1", "--step", "1", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["types"]
    assert all(row["prefix_matches_live"] for row in rows if row["live_action"])
    text = cli("replay", "--workspace", str(ws), "--epoch", "1", "--step", "1").stdout
    assert text.splitlines()[0].split()[:6] == ["type", "live", "prefix", "stopped", "units",
                                                "block"]


def test_demo_writes_figures_and_summary(tmp_path):
    r = cli("demo", "--workspace", str(tmp_path / "ws"), "--figures", str(tmp_path / "figs"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "figs" / "demo_trajectories.png").stat().st_size > 10_000
    summary = json.loads((tmp_path / "figs" / "demo_summary.json").read_text())
    assert len(summary["types"]) == 12
    assert "decided" in r.stderr  # live per-type progress
    assert "ACCEPT" in r.stdout or "PROVISIONAL" in r.stdout


@pytest.mark.parametrize("args,fragment", [
    (["step", "--workspace", "/nonexistent/ws", "--epoch", "1", "--step", "1"],
     "no such workspace"),
    (["step", "--workspace", ".", "--epoch", "0", "--step", "1"], "--epoch"),
    (["replay", "--workspace", "/nonexistent/ws", "--epoch", "1", "--step", "1"],
     "no such workspace"),
    (["cache", "renew", "--ttl", "0", "--url", "redis://localhost:1"], "ttl"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_exits_2_without_traceback(args, fragment):
    r = cli(*args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert fragment in r.stderr
    assert "Traceback" not in r.stderr


def test_removed_gate_block_config_is_refused(stepped, tmp_path):
    ws, _ = stepped
    cfg = tmp_path / "gate.toml"
    cfg.write_text("gate_block = 8\n")
    before = (ws / "state.json").read_bytes()
    r = cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "2", "--config", str(cfg))
    assert r.returncode == 2 and "gate_block was removed" in r.stderr
    assert (ws / "state.json").read_bytes() == before


def test_malformed_state_file_is_named_and_nothing_written(tmp_path):
    ws = tmp_path / "ws"
    assert cli("init", str(ws)).returncode == 0
    (ws / "state.json").write_text("{not json")
    files = {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()}
    r = cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "1")
    assert r.returncode == 2 and "state.json" in r.stderr and "Traceback" not in r.stderr
    assert {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()} == files


def test_init_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "x").write_text("mine")
    r = cli("init", str(tmp_path))
    assert r.returncode == 2 and "not empty" in r.stderr


def test_help_starts_fast_without_heavy_imports():
    code = ("import sys; from vtrm_gate.cli import build_parser; build_parser(); "
            "heavy = {'numpy', 'polars', 'matplotlib'} & set(sys.modules); "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_paths_that_would_land_elsewhere_are_refused_before_any_work(tmp_path):
    """``export --out ""`` wrote 11 files into the working directory and ``demo --figures
    ""`` its figure; ``fit --out ws/state.json`` overwrote the workspace's own state (status
    then failed); ``demo --figures FILE`` ran the whole step, then failed."""
    ws = tmp_path / "ws"
    assert cli("init", str(ws), "--seed", "3", cwd=tmp_path).returncode == 0
    assert cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "1",
               cwd=tmp_path).returncode == 0
    before = {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()}
    (tmp_path / "afile").write_text("x")
    for args, said in (
            (["export", "--workspace", str(ws), "--out", ""], "--out: expected a path, got ''"),
            (["demo", "--workspace", str(tmp_path / "d"), "--figures", " "],
             "--figures: expected a path, got ' '"),
            (["init", ""], "expected a path, got ''"),
            (["fit", "--workspace", str(ws), "--boot", "3", "--out", str(ws / "state.json")],
             "is inside the workspace being fitted"),
            (["fit", "--workspace", str(ws), "--boot", "3", "--out",
              str(tmp_path / "no" / "w.json")], "does not exist"),
            (["demo", "--workspace", str(tmp_path / "d"), "--figures", str(tmp_path / "afile")],
             "exists and is not a directory")):
        r = cli(*args, cwd=tmp_path)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "ws"]  # no demo ran
