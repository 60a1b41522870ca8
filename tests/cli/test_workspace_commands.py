"""``vtrm-gate export``, ``status`` and ``compare`` on simulated 3 x 5 training runs, checked
against the workspaces' own records (SQLite, state.json). The command runs in-process
through `vtrm_gate.cli.main` (the CLI's one entry point), once as a real subprocess."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest

from vtrm_gate.cli import main
from vtrm_gate.harness import (
    TABLES,
    Workspace,
    read_outcomes,
    workspace_lock,
    workspace_outcomes,
)
from vtrm_gate.sim import SimConfig, SimWorld, init_simulated
from vtrm_gate.testing import train_small_workspace

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(capsys, monkeypatch):
    """``vtrm-gate ARGS`` in this process at ``COLUMNS=80``: exit code, stdout, stderr."""
    monkeypatch.setenv("COLUMNS", "80")

    def run(*args: str) -> Run:
        code = main(list(args))
        out = capsys.readouterr()
        return Run(code, out.out, out.err)

    return run


def sql(ws: Path, query: str, params: tuple = ()) -> list[tuple]:
    con = sqlite3.connect(f"file:{ws / 'harness.sqlite'}?mode=ro", uri=True)
    try:
        return con.execute(query, params).fetchall()
    finally:
        con.close()


@pytest.fixture(scope="module")
def run_b(tmp_path_factory):
    """A second, shorter run (2 x 3): another seed and the w_net probation rule."""
    return train_small_workspace(tmp_path_factory.mktemp("b") / "ws", 2, 3, seed=6,
                                 probation_rule="w_net")


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_export_writes_every_table_with_the_sqlite_row_counts(trained_workspace, tmp_path,
                                                              fmt, cli):
    ws, _ = trained_workspace
    args = ["export", "--workspace", str(ws), "--out", str(tmp_path / "out"), "--format", fmt,
            "--json"]
    r = cli(*args) if fmt == "parquet" else subprocess.run(  # once as a real process
        [sys.executable, "-m", "vtrm_gate", *args], capture_output=True, text=True, cwd=ROOT,
        timeout=240)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out["tables"]) == {*TABLES, "outcomes"}  # and what fit and replay read
    assert read_outcomes(out["tables"]["outcomes"]["file"]).equals(workspace_outcomes(ws))
    read = pl.read_parquet if fmt == "parquet" else pl.read_csv
    for t in TABLES:
        path = tmp_path / "out" / f"{t}.{fmt}"
        df = read(path)
        want = sql(ws, f"SELECT COUNT(*) FROM {t}")[0][0]
        cols = [row[1] for row in sql(ws, f"PRAGMA table_info({t})")]
        assert df.height == want == out["tables"][t]["rows"], t
        assert df.columns == cols, t
    assert sql(ws, "SELECT COUNT(*) FROM timings")[0][0] > 0
    assert not list((tmp_path / "out").glob(".*.tmp"))


def test_csv_for_excel_is_the_csv_with_a_byte_order_mark(trained_workspace, tmp_path, cli):
    """Excel on Windows reads a CSV without a byte order mark as the system code page: a
    Chinese type name became mojibake. ``--format csv-excel`` writes the same CSV files, each
    opening with the mark Excel takes as "UTF-8" (polars and pandas skip it)."""
    ws, _ = trained_workspace
    for fmt in ("csv", "csv-excel"):
        r = cli("export", "--workspace", str(ws), "--out", str(tmp_path / fmt), "--format", fmt)
        assert r.returncode == 0, r.stderr
    for t in TABLES:
        plain = (tmp_path / "csv" / f"{t}.csv").read_bytes()
        excel = (tmp_path / "csv-excel" / f"{t}.csv").read_bytes()
        assert excel == b"\xef\xbb\xbf" + plain, t
        assert pl.read_csv(tmp_path / "csv-excel" / f"{t}.csv").columns == \
            pl.read_csv(tmp_path / "csv" / f"{t}.csv").columns


def test_exported_values_equal_the_log(trained_workspace, tmp_path, cli):
    ws, _ = trained_workspace
    assert cli("export", "--workspace", str(ws), "--out", str(tmp_path)).returncode == 0
    ev = pl.read_parquet(tmp_path / "gate_evidence.parquet")
    rows = sql(ws, "SELECT epoch, step, task_type, ladder_rank, e_plus FROM gate_evidence "
                   "ORDER BY epoch, step, task_type, ladder_rank")
    assert ev.select("epoch", "step", "task_type", "ladder_rank", "e_plus").rows() == rows


def test_status_matches_state_json_and_the_log(trained_workspace, cli):
    ws, _ = trained_workspace
    r = cli("status", "--workspace", str(ws), "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert set(s) >= {"workspace", "kind", "types", "position", "probation", "cooldown", "policy",
                      "last_decisions", "decisions", "counts", "infra", "writer", "next"}
    state = json.loads((ws / "state.json").read_text())
    assert s["position"]["last_step"] == state["last_step"] == [3, 5]
    assert s["position"]["settled_epochs"] == state["settled_epochs"] == [1, 2, 3]
    assert s["position"]["plan"] == {"epochs": 3, "steps_per_epoch": 5}
    assert s["position"]["evaluated_epochs"] == [
        e for (e,) in sql(ws, "SELECT DISTINCT epoch FROM evaluation ORDER BY epoch")]
    assert s["probation"] == state["probation"] == {}
    assert s["policy"] == {"cooldown_steps": 2, "futile_cooldown": True, "rejected_max": 5,
                           "probation_rule": "e_continue", "probation_order": "shuffle",
                           "probation_units": 40}
    assert set(s["cooldown"]) == {t for t, u in state["cooldown_until"].items()
                                  if u > state["steps_applied"]}
    assert s["counts"] == {t: sql(ws, f"SELECT COUNT(*) FROM {t}")[0][0] for t in TABLES}
    assert s["decisions"] == dict(sql(ws, "SELECT action, COUNT(*) FROM step_report WHERE "
                                          "step >= 1 AND action IS NOT NULL GROUP BY action"))
    assert [d["task_type"] for d in s["last_decisions"]] == [
        t for (t,) in sql(ws, "SELECT task_type FROM step_report WHERE epoch = 3 AND step = 5 "
                              "ORDER BY task_type")]
    assert s["infra"] == {"calls": sql(ws, "SELECT COUNT(*) FROM predictions WHERE infra = 1"
                                       )[0][0], "aborts": 0}
    assert s["writer"] is None
    assert s["next"].startswith("none: the run's 3 epochs are done")


def test_status_names_the_writer_holding_the_lock_and_says_wait(tmp_path, cli):
    ws = tmp_path / "ws"
    init_simulated(ws).close()
    with workspace_lock(ws, "test writer"):
        r = cli("status", "--workspace", str(ws), "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert f"pid {os.getpid()} (test writer)" in s["writer"]
    assert s["next"].startswith("wait: a writer holds")


def test_status_of_a_fresh_workspace_says_run_the_first_step(tmp_path, cli):
    init_simulated(tmp_path / "ws").close()
    s = json.loads(cli("status", "--workspace", str(tmp_path / "ws"), "--json").stdout)
    assert s["position"]["last_step"] is None and s["decisions"] == {}
    assert s["next"] == f"vtrm-gate step --workspace {tmp_path / 'ws'} --epoch 1 --step 1"


def test_status_says_which_exits_cost_a_cooldown(tmp_path, cli):
    init_simulated(tmp_path / "spec").close()
    init_simulated(tmp_path / "free", futile_cooldown=False, cooldown_steps=3).close()
    spec, free = (" ".join(cli("status", "--workspace", str(tmp_path / n)).stdout.split())
                  for n in ("spec", "free"))
    assert "policy: cooldown 2 steps after REJECT and FUTILE; probation e_continue" in spec
    assert "policy: cooldown 3 steps after REJECT (not FUTILE); probation" in free


def _calls(ws: Path, task_type: str | None = None) -> int:
    where = "" if task_type is None else " AND task_type = ?"
    return sql(ws, f"SELECT COUNT(*) FROM predictions WHERE cached = 0{where}",
               () if task_type is None else (task_type,))[0][0]


def test_compare_numbers_are_the_workspaces_own(trained_workspace, run_b, cli):
    (a, res_a), (b, res_b) = trained_workspace, run_b
    r = cli("compare", str(a), str(b), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d) == {"a", "b", "diff", "types", "settings"}
    assert d["settings"] == {"seed": {"a": 5, "b": 6},
                             "probation_rule": {"a": "e_continue", "b": "w_net"}}
    for side, ws, res in (("a", a, res_a), ("b", b, res_b)):
        o = d[side]["overall"]
        assert o["seconds"] == pytest.approx(res.total_s, rel=1e-9)  # timings = the run's
        assert o["calls"] == _calls(ws)
        assert o["decisions"] == dict(sql(ws, "SELECT action, COUNT(*) FROM step_report "
                                              "WHERE step >= 1 AND action IS NOT NULL "
                                              "GROUP BY action"))
        with Workspace.open(ws, readonly=True) as w:
            world = SimWorld(SimConfig(**w.config.sim))
            acc = {t: world.true_accuracy(t, w.skill_text(t)) for t in w.task_types}
        assert d[side]["accuracy_source"] == "true accuracy (simulator)"
        for t, v in acc.items():
            assert d["types"][t][side]["accuracy"] == pytest.approx(v)
            assert d["types"][t][side]["calls"] == _calls(ws, t)
        assert o["accuracy"] == pytest.approx(sum(acc.values()) / len(acc))
    assert d["a"]["probation_rule"] == "e_continue" and d["b"]["probation_rule"] == "w_net"
    assert d["diff"]["calls"] == d["b"]["overall"]["calls"] - d["a"]["overall"]["calls"]
    assert d["diff"]["accuracy"] == pytest.approx(
        d["b"]["overall"]["accuracy"] - d["a"]["overall"]["accuracy"])


def test_compare_never_subtracts_times_of_two_clocks(tmp_path, cli):
    """One workspace stepped on the virtual clock, one on real time (``--time-scale 0``):
    compare said "time (loop clock): A 1.06 h, B 0.00 h" and its diff subtracted them. Each
    time now names its clock, and times of two clocks are not differenced."""
    for name, extra, label in (("virtual", [], "simulated"),
                               ("real", ["--time-scale", "0"], "wall clock")):
        init_simulated(tmp_path / name, SimConfig(seed=3)).close()
        r = cli("step", "--workspace", str(tmp_path / name), "--epoch", "1", "--step", "1",
                *extra)
        assert r.returncode == 0, r.stderr
        assert re.search(rf" (h|s) \({label}\), peak in flight",  # was "simulated"
                         " ".join(r.stdout.split()))
        r = cli("step", "--workspace", str(tmp_path / name), "--epoch", "1", "--step", "1",
                *extra, "--json")
        assert json.loads(r.stdout)["clock"] == name
    a, b = str(tmp_path / "virtual"), str(tmp_path / "real")
    d = json.loads(cli("compare", a, b, "--json").stdout)
    assert (d["a"]["overall"]["clock"], d["b"]["overall"]["clock"]) == ("virtual", "real")
    assert d["a"]["overall"]["seconds"] > 0 and d["diff"]["seconds"] is None
    text = " ".join(cli("compare", a, b).stdout.split())
    assert "time: A " in text and " h (virtual clock), B " in text and \
        re.search(r" (h|s) \(real time\); not comparable", text)
    same = json.loads(cli("compare", a, a, "--json").stdout)
    assert same["diff"]["seconds"] == 0.0 and same["a"]["overall"]["clock"] == "virtual"


def test_compare_counts_what_replaced_runs_cost_beside_the_recorded_run(tmp_path, cli):
    """A step re-run (to check the cache, or after a kill) replaced the first run's rows, so
    compare showed only the re-run's calls and time: the first run's cost was nowhere."""
    ws = tmp_path / "ws"
    init_simulated(ws, SimConfig(seed=3)).close()
    step = ("step", "--workspace", str(ws), "--epoch", "1", "--step", "1")
    assert cli(*step).returncode == 0
    first = (_calls(ws), sql(ws, "SELECT SUM(tokens) FROM predictions")[0][0],
             sql(ws, "SELECT SUM(seconds) FROM timings")[0][0])
    assert cli(*step).returncode == 0
    d = json.loads(cli("compare", str(ws), str(ws), "--json").stdout)
    assert d["a"]["overall"]["replaced"] == {"runs": 1, "calls": first[0], "tokens": first[1],
                                             "seconds": pytest.approx(first[2])}
    assert d["a"]["overall"]["calls"] == _calls(ws) < first[0]  # the re-run's own
    text = " ".join(cli("compare", str(ws), str(ws)).stdout.split())
    assert (f"runs replaced by a re-run (not counted above): A 1 ({first[0]:,} calls, "
            f"{first[1]:,} tokens, ") in text, text


def test_compare_names_every_setting_that_differs_once(tmp_path, cli):
    """Two runs compared with no word on what set them apart: a cooldown off, a fitted world,
    another seed. compare now lists each differing setting once, by its workspace.json name
    (a simulated world resolved: no world given is the preset default), A's value and B's."""
    (tmp_path / "w.json").write_text('{"size_min": 0.3, "size_max": 2.5}')
    assert cli("init", str(tmp_path / "a"), "--seed", "1").returncode == 0
    assert cli("init", str(tmp_path / "b"), "--seed", "1", "--no-futile-cooldown",
               "--world", str(tmp_path / "w.json")).returncode == 0
    d = json.loads(cli("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json").stdout)
    assert d["settings"] == {"futile_cooldown": {"a": True, "b": False},
                             "sim.world.scope": {"a": "type", "b": "candidate"},
                             "sim.world.size_max": {"a": 0.9, "b": 2.5}}
    text = " ".join(cli("compare", str(tmp_path / "a"), str(tmp_path / "b")).stdout.split())
    assert ("settings that differ: futile_cooldown A true, B false; sim.world.size_max A 0.9, "
            "B 2.5; sim.world.scope A type, B candidate") in text, text
    same = " ".join(cli("compare", str(tmp_path / "a"), str(tmp_path / "a")).stdout.split())
    assert "settings: the same" in same
    assert json.loads(cli("compare", str(tmp_path / "a"), str(tmp_path / "a"),
                          "--json").stdout)["settings"] == {}


def test_compare_names_the_run_options_the_recorded_steps_ran_with(tmp_path, cli):
    """Notebook 07 compares v3 with the old gate's rule in the same world: a run option
    (``--decision-rule old_blocks``), recorded in each step's manifest, not workspace.json.
    compare reads them by their option names; steps of one run that differ give a list."""
    for name in ("a", "b"):
        assert cli("init", str(tmp_path / name), "--seed", "1").returncode == 0
    step = ("step", "--epoch", "1", "--step")
    assert cli(*step, "1", "--workspace", str(tmp_path / "a")).returncode == 0
    assert cli(*step, "1", "--workspace", str(tmp_path / "b"), "--decision-rule", "old_blocks",
               "--concurrency", "8").returncode == 0
    assert cli(*step, "2", "--workspace", str(tmp_path / "b"), "--decision-rule", "old_blocks",
               "--concurrency", "16").returncode == 0
    d = json.loads(cli("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json").stdout)
    assert d["settings"] == {"decision_rule": {"a": "paired_betting", "b": "old_blocks"},
                             "concurrency": {"a": 32, "b": [8, 16]}}
    text = " ".join(cli("compare", str(tmp_path / "a"), str(tmp_path / "b")).stdout.split())
    assert ("settings that differ: decision_rule A paired_betting, B old_blocks; concurrency "
            "A 32, B [8, 16]") in text, text
    # a damaged manifest: one line naming which of the two workspaces holds it (it said
    # only "manifests/e1_s2.json: ...")
    (tmp_path / "b" / "manifests" / "e1_s2.json").write_bytes(b"\xff\xfe{")
    r = cli("compare", str(tmp_path / "a"), str(tmp_path / "b"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"{tmp_path / 'b'}: manifests/e1_s2.json: not UTF-8 text" in r.stderr, r.stderr


@pytest.mark.parametrize("command", ["status", "compare", "export"])
def test_text_output_fits_80_columns(trained_workspace, run_b, tmp_path, command, cli):
    a, b = trained_workspace[0], run_b[0]
    args = {"status": ["status", "--workspace", str(a)], "compare": ["compare", str(a), str(b)],
            "export": ["export", "--workspace", str(a), "--out", str(tmp_path)]}[command]
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) > 5 and max(map(len, lines)) <= 80, max(lines, key=len)


@pytest.mark.parametrize("args, fragment", [
    (["status", "--workspace", "/nonexistent/ws"], "no such workspace directory"),
    (["export", "--workspace", "/nonexistent/ws", "--out", "x"], "no such workspace"),
    (["compare", "/nonexistent/a", "/nonexistent/b"], "no such workspace directory"),
])
def test_bad_input_exits_2_with_one_line(args, fragment, cli):
    r = cli(*args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and fragment in r.stderr and "Traceback" not in r.stderr
    j = cli(*args, "--json")
    assert j.returncode == 2 and json.loads(j.stdout)["exit"] == 2


def test_export_into_a_file_is_refused_and_the_file_kept(trained_workspace, tmp_path, cli):
    target = tmp_path / "not-a-dir"
    target.write_text("keep me")
    r = cli("export", "--workspace", str(trained_workspace[0]), "--out", str(target))
    assert r.returncode == 2 and "exists and is not a directory" in r.stderr
    assert r.stderr.count("\n") == 1 and target.read_text() == "keep me"


def test_docs_list_every_exported_table_with_its_columns():
    from vtrm_gate.harness._log import SCHEMA

    api = (ROOT / "docs" / "api.md").read_text()
    for table, (cols, _) in SCHEMA.items():
        row = next((ln for ln in api.splitlines() if ln.startswith(f"| `{table}` |")), None)
        assert row is not None, f"docs/api.md lists no exported table {table}"
        assert row.rstrip(" |").rsplit("| ", 1)[1] == ", ".join(c for c, _ in cols), table


@pytest.mark.parametrize("name", ["o.csv", "tables.PARQUET", "o.jsonl"])
def test_export_to_a_file_name_is_refused_naming_the_directory_it_writes(
        trained_workspace, tmp_path, cli, name):
    """``export --out o.csv`` made a directory "o.csv" of eleven Parquet files: export writes
    a directory of tables, so a new --out that looks like one file is refused, writing
    nothing (an existing directory of that name is still written to)."""
    ws, _ = trained_workspace
    r = cli("export", "--workspace", str(ws), "--out", str(tmp_path / name))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert (f"{tmp_path / name}: export writes a directory of tables (one file per table), "
            f"not one file") in r.stderr, r.stderr
    assert not (tmp_path / name).exists()
    (tmp_path / name).mkdir()
    assert cli("export", "--workspace", str(ws), "--out", str(tmp_path / name)).returncode == 0
    assert (tmp_path / name / "predictions.parquet").is_file()


def test_compare_differences_accuracy_over_the_types_both_runs_measured(tmp_path, cli):
    """Two untrained runs with the same skills, one with a type more: every per-type
    difference was 0.0, but the overall B - A was -0.0345, a mean over other types."""
    pools = {"Action Reasoning": 40, "Counting Problem": 40, "OCR Problems": 40}
    init_simulated(tmp_path / "a", SimConfig(seed=1, pool_sizes=pools)).close()
    init_simulated(tmp_path / "b", SimConfig(seed=1, pool_sizes={
        t: n for t, n in pools.items() if t != "OCR Problems"})).close()
    d = json.loads(cli("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json").stdout)
    assert [r["accuracy_diff"] for r in d["types"].values() if r["b"]] == [0.0, 0.0]
    assert d["a"]["overall"]["accuracy"] != d["b"]["overall"]["accuracy"]  # each run's own
    assert d["diff"]["accuracy"] == 0.0 and d["diff"]["accuracy_types"] == 2
    text = " ".join(cli("compare", str(tmp_path / "a"), str(tmp_path / "b")).stdout.split())
    assert ("overall B-A: over the 2 types both runs measured (only in A: OCR Problems)"
            in text), text


def test_status_after_a_settlement_points_to_the_next_epoch(tmp_path, cli):
    """After ``settle --epoch 1`` (the way status itself suggests to end an epoch), status
    said "next: vtrm-gate step ... --epoch 1 --step 2", which step then refused: "epoch 1
    was settled; its steps can no longer run"."""
    ws = str(tmp_path / "ws")
    init_simulated(tmp_path / "ws", SimConfig(seed=3)).close()
    assert cli("step", "--workspace", ws, "--epoch", "1", "--step", "1").returncode == 0
    assert cli("settle", "--workspace", ws, "--epoch", "1").returncode == 0
    nxt = json.loads(cli("status", "--workspace", ws, "--json").stdout)["next"]
    assert nxt == f"vtrm-gate step --workspace {ws} --epoch 2 --step 1"
    assert cli(*nxt.split()[1:]).returncode == 0  # and it runs


def test_exports_into_one_directory_at_once_do_not_collide(trained_workspace, tmp_path):
    """Two exports into one directory shared each file's temporary name: one failed with
    ``cx/.predictions.csv.tmp: No such file or directory`` when the other renamed it."""
    from concurrent.futures import ThreadPoolExecutor

    from vtrm_gate.views import open_workspace

    out = tmp_path / "cx"
    with open_workspace(trained_workspace[0]) as view, ThreadPoolExecutor(3) as pool:
        for _ in range(4):
            done = [f.result() for f in [pool.submit(view.export, out, "csv") for _ in range(3)]]
            assert {t: n for t, (_, n) in done[0].items()} == {
                t: n for t, (_, n) in done[-1].items()}
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_status_names_runs_of_epochs_as_ranges():
    """A long run's status listed every settled epoch (135 numbers on one line)."""
    from vtrm_gate.cli._status import _runs

    assert _runs([]) == "none" and _runs([2]) == "2"
    assert _runs([*range(1, 136), 137, 139, 140]) == "1-135, 137, 139-140"


def test_status_after_a_settlement_says_how_the_last_steps_probation_ended(tmp_path, cli):
    """The last step's PROVISIONAL row still read "rolled back to v1 if it fails at the end
    of epoch 1" once epoch 1 had settled it, and nowhere said how it ended."""
    ws, _ = train_small_workspace(tmp_path / "ws", epochs=1, steps_per_epoch=2, seed=5)
    s = json.loads(cli("status", "--workspace", str(ws), "--json").stdout)
    settled = dict(sql(ws, "SELECT task_type, applied FROM step_report WHERE epoch = 1 AND "
                           "step = 0"))
    rows = {r["task_type"]: r for r in s["last_decisions"]}
    bets = [t for t, r in rows.items() if r["action"] == "PROVISIONAL"]
    assert bets == ["OCR Problems"] and settled[bets[0]].startswith("rolled back v3 -> v1")
    assert rows["OCR Problems"]["settled"] == settled["OCR Problems"]
    assert all(r["settled"] is None for t, r in rows.items() if t not in bets)
    text = " ".join(cli("status", "--workspace", str(ws)).stdout.split())
    assert "at the end of epoch 1: rolled back v3 -> v1 (e_continue" in text, text


def test_a_workspace_from_before_a_table_existed_still_shows_and_exports(tmp_path, cli):
    """`status` and `export` open the log read-only, so a table a newer version added is
    missing from an older workspace's file: `status` counted its rows and failed."""
    ws, _ = train_small_workspace(tmp_path / "ws", epochs=1, steps_per_epoch=1)
    con = sqlite3.connect(ws / "harness.sqlite")
    con.execute("DROP TABLE replaced_runs")
    con.commit()
    con.close()
    r = cli("status", "--workspace", str(ws), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["counts"]["replaced_runs"] == 0
    assert cli("export", "--workspace", str(ws), "--out", str(tmp_path / "x")).returncode == 0
    assert pl.read_parquet(tmp_path / "x" / "replaced_runs.parquet").columns[:3] == [
        "epoch", "step", "replaced"]
