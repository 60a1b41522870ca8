"""Hostile pass (h8): a re-run refused because its inputs changed tells a CLI user the
flag to pass (``--force``), not the Python keyword (``force=True``)."""

from __future__ import annotations

import json
from pathlib import Path

from test_cli import cli


def test_refused_rerun_names_the_cli_flag(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    assert cli("init", str(ws), "--seed", "1").returncode == 0
    step = ("step", "--workspace", str(ws), "--epoch", "1", "--step", "1")
    assert cli(*step).returncode == 0
    conf = tmp_path / "c.toml"
    conf.write_text("[gate]\nn_max = 12\n")
    r = cli(*step, "--config", str(conf))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "n_max" in r.stderr and "--force" in r.stderr and "force=True" not in r.stderr
    r = cli(*step, "--config", str(conf), "--force")
    assert r.returncode == 0, r.stderr


def test_a_config_that_can_accept_nothing_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    """Hostile pass: ``w_net_min = 41`` with 40-unit ladders ran a whole step (and would run
    a whole training run) that could not accept any candidate; now refused before any
    write, naming the parameters."""
    ws = tmp_path / "ws"
    assert cli("init", str(ws), "--seed", "1").returncode == 0
    before = {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()}
    conf = tmp_path / "c.toml"
    conf.write_text("[gate]\nw_net_min = 41\n")
    for cmd in (("step", "--workspace", str(ws), "--epoch", "1", "--step", "1"),
                ("train", "--workspace", str(ws), "--epochs", "1", "--steps-per-epoch", "1"),
                ("settle", "--workspace", str(ws), "--epoch", "1")):
        r = cli(*cmd, "--config", str(conf))
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "no candidate can ever be accepted" in r.stderr and "w_net_min" in r.stderr
    assert {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()} == before


def test_the_default_worlds_nine_unit_type_is_told_it_cannot_be_accepted(tmp_path: Path) -> None:
    """Hostile pass: the default world's Spatial Perception (9 units, 20% held out, its error
    cases left out) gates on a 5-unit ladder, where no candidate can be accepted at the
    default parameters (8 straight wins); the step's table now says so under the type (it
    printed only what Phase D applied), and so does --json."""
    ws = tmp_path / "ws"
    assert cli("init", str(ws), "--seed", "1").returncode == 0
    step = ("step", "--workspace", str(ws), "--epoch", "1", "--step", "1")
    r = cli(*step, env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("Spatial Perception "))
    assert "its ladder holds 5 units, and ACCEPT needs at least 8" in lines[i + 1]
    r = cli(*step, "--json")
    notes = {t["task_type"]: (t["n_ladder"], t["note"]) for t in json.loads(r.stdout)["types"]}
    n, note = notes["Spatial Perception"]
    assert n == 5 and "ACCEPT needs at least 8" in note
    assert not any("ACCEPT needs" in (v or "") for k, (n, v) in notes.items() if n >= 8)
