"""``vtrm-gate replay --outcomes FILE``: a JSON list, one object per gate; every bad file is
exit 2 and one line naming the file, the row and the column, never a traceback or a hang."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vtrm_gate.cli._main import main
from vtrm_gate.harness import MAX_OUTCOME_ROWS, read_outcomes

HEAD = "epoch,step,task_type,unit_id,ladder_rank,base_correct,cand_correct,infra\n"
GOOD = ["1,1,OCR,u0,0,0,1,0", "1,1,OCR,u1,1,1,1,0", "1,1,OCR,u2,2,,,1",
        "1,1,Counting,u0,0,true,false,false", "2,1,OCR,u0,0,1,0,0"]


def _write(tmp: Path, lines: list[str], head: str = HEAD, name: str = "o.csv") -> Path:
    path = tmp / name
    path.write_text(head + "".join(f"{x}\n" for x in lines))
    return path


def test_replay_outcomes_prints_one_object_per_gate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, GOOD)
    assert main(["replay", "--outcomes", str(path), "--json", "--block", "2"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["epoch"], r["step"], r["task_type"]) for r in rows] == [
        (1, 1, "Counting"), (1, 1, "OCR"), (2, 1, "OCR")]
    need = {"prefix_action", "prefix_stop_rank", "block_action", "block_stop_rank",
            "units_saved"}
    assert all(need <= set(r) for r in rows)
    ocr = rows[1]
    assert (ocr["prefix_W"], ocr["prefix_L"], ocr["prefix_stop_rank"]) == (1, 0, 2)
    assert main(["replay", "--outcomes", str(path)]) == 0
    assert "3 gates" in capsys.readouterr().out


def test_replay_outcomes_counts_the_cooldowns_the_prefix_rule_charges_and_blocks_do_not(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Gate 1: a loss then ties. The prefix rule ends FUTILE at unit 5 (PROVISIONAL is out of
    # reach: 0.5 * 1.5**3 < 2), blocks of 8 reach the ladder's end: INERTIA, no cooldown.
    # Gate 2: eight wins, ACCEPT under both. Gate 3: eight losses, FUTILE (at once out of
    # reach) and REJECT (E- = 1.5**8 at the block's end): a cooldown under both.
    futile = ["1,1,OCR,u0,0,1,0,0", *(f"1,1,OCR,u{i},{i},1,1,0" for i in range(1, 8))]
    wins = [f"1,1,Counting,u{i},{i},0,1,0" for i in range(8)]
    losses = [f"2,1,OCR,u{i},{i},1,0,0" for i in range(8)]
    path = _write(tmp_path, [*futile, *wins, *losses])
    assert main(["replay", "--outcomes", str(path), "--json"]) == 0
    rows = {(r["epoch"], r["task_type"]): r for r in json.loads(capsys.readouterr().out)}
    assert [(r["prefix_action"], r["block_action"]) for r in rows.values()] == [
        ("ACCEPT", "ACCEPT"), ("FUTILE", "INERTIA"), ("FUTILE", "REJECT")]
    assert rows[(1, "OCR")]["prefix_stop_rank"] == 4
    assert main(["replay", "--outcomes", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("the prefix rule ends 1 of them in REJECT or FUTILE (a cooldown) where blocks do "
            "not, and 0 the other way") in out


BAD = [
    (HEAD.replace(",infra", ""), [x.rsplit(",", 1)[0] for x in GOOD], None, "'infra'"),
    (HEAD, [*GOOD[:2], "1,1,OCR,u2,2,0,1,0,7"], 3, "9 fields"),
    (HEAD, [*GOOD[:2], "1,1,OCR,u2,2,yes,1,0"], 3, "'base_correct'"),
    (HEAD, [*GOOD[:2], "1,1,OCR,u2,2,0,,0"], 3, "'cand_correct'"),
    (HEAD, [*GOOD[:2], "1,1,OCR,u2,2,0,1,maybe"], 3, "'infra'"),
    (HEAD, [*GOOD[:2], "1,1,OCR,u9,1,0,1,0"], 3, "duplicate rank"),
    (HEAD, [*GOOD[:2], "1,1,OCR,u3,3,0,1,0"], 3, "gap"),
    (HEAD, ["1,1,OCR,u0,1,0,1,0", "1,1,OCR,u1,2,1,1,0"], 1,
     "no rank 0: ladder_rank is 0-based"),  # an old gate's log that counts from 1
    (HEAD, [*GOOD[:2], "1,1,OCR,u1,2,0,1,0"], 3, "unit twice"),
    (HEAD, [*GOOD[:2], "1,1,???,u0,0,0,1,0"], 3, "unknown type"),
    (HEAD, [*GOOD[:2], "1,1,ocr,u0,0,0,1,0"], 3, "unknown type"),
    (HEAD, [*GOOD[:2], "1,1,OCR,u2,-2,0,1,0"], 3, "'ladder_rank'"),
    (HEAD, [*GOOD[:2], "x,1,OCR,u2,2,0,1,0"], 3, "'epoch'"),
    (HEAD, [*GOOD[:2], "1,1,,u2,2,0,1,0"], 3, "'task_type'"),
    (HEAD, [f"1,1,OCR,u{i},{i},0,1,0" for i in range(41)], 41, "n_max"),
    (HEAD, [], None, "no rows"),
    (HEAD.replace("\n", ",cand_correct\n"), [f"{x},1" for x in GOOD], None,
     "'cand_correct' twice"),  # which one is the candidate's outcome? Refused, not guessed
]


@pytest.mark.parametrize(("head", "lines", "row", "what"), BAD)
def test_a_bad_outcomes_file_is_one_line_naming_file_row_and_column(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], head: str, lines: list[str],
        row: int | None, what: str) -> None:
    path = _write(tmp_path, lines, head)
    assert main(["replay", "--outcomes", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and what in err, err
    if row is not None:
        assert f"row {row}," in err, err


@pytest.mark.parametrize(("name", "data", "what"), [
    ("o.txt", b"x", "unknown outcomes format"),
    ("o.parquet", b"PAR1 not really", "cannot read as PARQUET"),
    ("o.jsonl", b'{"epoch": 1, \n', "cannot read as JSONL"),
    ("o.csv", b"\xff\xfe\x00garbage\x00\n\x01", "o.csv"),
    ("o.csv", (HEAD + "1,1,Acci\u00f3n,u0,0,0,1,0\n").encode("cp1252"),
     "not UTF-8 (save it as UTF-8"),  # Excel's plain "CSV" on Windows
    ("none.csv", None, "no such outcomes file"),
    # Excel's "Unicode Text" and PowerShell's default: was "missing column 'epoch'"
    ("o.csv", (HEAD + "1,1,OCR,u0,0,0,1,0\n").encode("utf-16"), "UTF-16 (save it as UTF-8"),
])
def test_an_unreadable_outcomes_file_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, data: bytes | None,
        what: str) -> None:
    path = tmp_path / name
    if data is not None:
        path.write_bytes(data)
    assert main(["replay", "--outcomes", str(path), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["exit"] == 2 and what in out["error"], out


def test_too_many_rows_is_refused_without_reading_the_rest(tmp_path: Path) -> None:
    """One row past the cap (the file is read lazily: a 10^7-row file reads no further)."""
    path = tmp_path / "big.csv"
    with path.open("w") as f:
        f.write(HEAD)
        f.write("1,1,OCR,u0,0,0,1,0\n" * (MAX_OUTCOME_ROWS + 1))
    r = subprocess.run([sys.executable, "-m", "vtrm_gate", "replay", "--outcomes", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"row {MAX_OUTCOME_ROWS + 1}" in r.stderr and str(path) in r.stderr


def test_replay_needs_a_workspace_or_outcomes_not_both(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--epoch", "1", "--step", "1"]) == 2
    assert "--workspace" in capsys.readouterr().err
    path = _write(tmp_path, GOOD)
    assert main(["replay", "--outcomes", str(path), "--epoch", "1"]) == 2
    assert "--epoch" in capsys.readouterr().err


def _jsonl_row(rank: int, **extra: object) -> str:
    row = {"epoch": 1, "step": 1, "task_type": "OCR", "unit_id": f"u{rank}",
           "ladder_rank": rank, "base_correct": 0, "infra": 0}
    body = json.dumps({**row, **extra})[1:-1]
    return "{" + body + ', "cand_correct": 1}\n'


def test_a_jsonl_object_naming_a_column_twice_is_refused_a_nested_one_is_not(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """polars keeps a repeated key's first value and Python's json its last: which outcome
    was meant cannot be guessed, so the row is named. A key of an extra column's nested
    object is not a column, and the blank line is not a row."""
    path = tmp_path / "o.jsonl"
    ok = [_jsonl_row(0, meta={"cand_correct": 0, "epoch": 9}), "\n", _jsonl_row(1)]
    path.write_text("".join(ok))
    assert main(["replay", "--outcomes", str(path), "--json"]) == 0
    (gate,) = json.loads(capsys.readouterr().out)
    assert (gate["prefix_W"], gate["prefix_L"], gate["n_rows"]) == (2, 0, 2)
    path.write_text("".join([*ok, _jsonl_row(2, cand_correct=0)]))
    assert main(["replay", "--outcomes", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "row 3, column 'cand_correct': the key twice" in err, err


@pytest.mark.parametrize("tail", ["\n", "\n\n\n", ",,,,,,,\n", " \n"])
def test_blank_lines_at_the_end_are_no_rows(tmp_path: Path, tail: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A file an editor or ``echo >>`` left with blank lines at its end was refused ("row 6,
    column 'task_type': must not be empty") though every row was good."""
    path = _write(tmp_path, GOOD)
    path.write_text(path.read_text() + tail)
    assert main(["replay", "--outcomes", str(path), "--json"]) == 0, capsys.readouterr().err
    assert len(json.loads(capsys.readouterr().out)) == 3


def test_a_blank_line_between_rows_is_still_named(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, [*GOOD[:2], "", *GOOD[2:]])
    assert main(["replay", "--outcomes", str(path)]) == 2
    assert "row 3, column 'task_type': must not be empty" in capsys.readouterr().err


def test_spaces_around_header_names_are_read(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, [", ".join(x.split(",")) for x in GOOD],
                  head=", ".join(HEAD.split(",")))
    assert main(["replay", "--outcomes", str(path), "--json"]) == 0, capsys.readouterr().err
    assert len(json.loads(capsys.readouterr().out)) == 3


@pytest.mark.parametrize("sep", [";", "\t", "|"])
def test_a_csv_with_another_separator_is_named_as_such(tmp_path: Path, sep: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A spreadsheet saved with ';' (a European locale) or tabs: "missing column 'epoch'",
    though every column is there."""
    path = _write(tmp_path, [x.replace(",", sep) for x in GOOD], head=HEAD.replace(",", sep))
    assert main(["replay", "--outcomes", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"separated by {sep!r}" in err and "comma-separated" in err, err
    assert len(err.strip().splitlines()) == 1


def test_a_table_pandas_wrote_with_missing_values_is_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """pandas stores an integer column with a missing value as floats, so its ``to_csv``
    writes ``1.0`` for 1 (the rows below are what it writes for 0/1 outcomes with an INFRA
    row's left empty, and tokens with one missing): they were refused."""
    path = _write(tmp_path, ["1,1,OCR,u0,0,0.0,1.0,0,120.0", "1,1,OCR,u1,1,1.0,1.0,0,",
                             "1,1,OCR,u2,2,,,1,80.0"], head=HEAD.replace("\n", ",tokens\n"))
    assert main(["replay", "--outcomes", str(path), "--json"]) == 0, capsys.readouterr().err
    [row] = json.loads(capsys.readouterr().out)
    assert (row["prefix_W"], row["prefix_L"], row["n_rows"]) == (1, 0, 3)
    assert row["prefix_tokens"] == 200


@pytest.mark.parametrize("cell", ["1.5", "1e3", "0.5", "-0.0"])
def test_a_fraction_is_still_no_count_or_outcome(tmp_path: Path, cell: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    for line in (f"1,1,OCR,u2,{cell},0,1,0", f"1,1,OCR,u2,2,{cell},1,0"):
        path = _write(tmp_path, [*GOOD[:2], line])
        assert main(["replay", "--outcomes", str(path)]) == 2
        assert "row 3, column" in capsys.readouterr().err


def test_a_jsonl_table_that_opens_with_a_byte_order_mark_is_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """polars reads a CSV's byte order mark but not a JSON-lines file's: "cannot read as
    JSONL: InternalError(TapeError) at character 0 ('ï')"."""
    path = _write(tmp_path, GOOD)
    assert main(["replay", "--outcomes", str(path), "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    jsonl = tmp_path / "o.jsonl"
    frame = read_outcomes(path)
    frame.write_ndjson(jsonl)
    jsonl.write_bytes(b"\xef\xbb\xbf" + jsonl.read_bytes() + b"\n")
    assert main(["replay", "--outcomes", str(jsonl), "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out) == plain


def test_a_log_that_numbers_steps_past_a_billion_is_read_and_the_message_names_the_range(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A log whose step is a global counter or a Unix time (1733241600) was refused as "must
    be an integer >= 0": it is one, and counts up to 18 digits are read now (int64); past
    that the message names the range."""
    path = _write(tmp_path, [f"1,1733241600,OCR,u{i},{i},0,1,0" for i in range(3)])
    assert main(["replay", "--outcomes", str(path), "--json"]) == 0, capsys.readouterr().err
    [row] = json.loads(capsys.readouterr().out)
    assert (row["step"], row["prefix_W"]) == (1733241600, 3)
    assert main(["fit", "--outcomes", str(path), "--boot", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n_gates"] == 1
    path = _write(tmp_path, ["1,1,OCR,u0,0,0,1,0", f"1,{10**18},OCR,u0,0,0,1,0"])
    assert main(["replay", "--outcomes", str(path)]) == 2
    err = capsys.readouterr().err
    assert ("row 2, column 'step': must be a whole number from 0 to 999999999999999999, got "
            "'1000000000000000000'") in err, err


def test_an_exported_gate_evidence_table_is_refused_and_export_writes_the_outcomes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Hostile pass (h26): ``export`` wrote gate_evidence, which has every outcomes column
    but no n_ladder, so ``fit --outcomes`` and ``replay --outcomes`` read each gate's
    consumed prefix as its whole ladder: stops moved, invented block decisions, and a fit of
    30% harmful where the workspace said 2%. No command wrote the outcomes table."""
    from vtrm_gate.harness import replay_outcomes, workspace_outcomes
    from vtrm_gate.sim import SimConfig, init_simulated

    ws = tmp_path / "ws"
    init_simulated(ws, SimConfig(seed=3)).close()
    assert main(["step", "--workspace", str(ws), "--epoch", "1", "--step", "1"]) == 0
    assert main(["export", "--workspace", str(ws), "--out", str(tmp_path / "x")]) == 0
    capsys.readouterr()
    assert main(["replay", "--outcomes", str(tmp_path / "x" / "gate_evidence.parquet")]) == 2
    err = capsys.readouterr().err
    assert "gate_evidence" in err and "n_ladder" in err and "outcomes.parquet" in err
    exported = replay_outcomes(tmp_path / "x" / "outcomes.parquet")
    assert exported.equals(replay_outcomes(workspace_outcomes(ws)))
