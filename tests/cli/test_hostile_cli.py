"""Hostile pass (h8): a re-run refused because its inputs changed tells a CLI user the
flag to pass (``--force``), not the Python keyword (``force=True``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli import cli

from vtrm_gate._ids import MAX_SLUG, slugify
from vtrm_gate.errors import InputError


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


def _units(path: Path, task_type: str) -> Path:
    lines = [{"unit_id": f"u{i}", "task_type": "OCR" if i % 2 else task_type,
              "question": f"Q{i}?", "options": ["a", "b", "c"], "answer": "B"}
             for i in range(12)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.parametrize("task_type, said", [
    ("T" * 5000, "by 5000 bytes, at most 120"), ("OC\nR", "control character ('\\n')"),
    ("Counting\x00", "control character ('\\x00')"),
    ("Cou\tnting", "control character ('\\t')"),
    ("OCR\u202eevil", "control character ('\\u202e')"),
    ("OCR\u2028two", "control character ('\\u2028')")])
def test_a_type_name_no_file_can_carry_is_refused_naming_it(
        tmp_path: Path, task_type: str, said: str) -> None:
    """Hostile pass: a 5,000-character type name failed `init` with "cannot create the
    workspace there: File name too long" (the workspace was fine: the type's skill file was
    not); a name holding a newline or NUL became a type of its own beside "OCR" that the
    tables printed across lines. Both are refused at the units file, naming the type."""
    r = cli("init", str(tmp_path / "ws"), "--llm", "--units", str(_units(tmp_path / "u.jsonl",
                                                                        task_type)),
            "--base-url", "http://127.0.0.1:9/v1", "--model", "m")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "u.jsonl: line 1" in r.stderr and "task type" in r.stderr and said in r.stderr
    assert "cannot create the workspace" not in r.stderr
    assert not (tmp_path / "ws").exists()


def test_slugify_bounds_a_type_name() -> None:
    assert slugify("A" * MAX_SLUG) == "a" * MAX_SLUG
    with pytest.raises(InputError, match=f"at most {MAX_SLUG}"):
        slugify("A" * (MAX_SLUG + 1))
    assert slugify("Action — Reasoning") == "action-reasoning"  # punctuation, not control
