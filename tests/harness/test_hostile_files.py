"""Tampered workspace files (issue 19 #7 #13 #14): every JSON file a workspace reads is
validated (types, ranges, known type names, unit ids of the right type, depth) and a fault
is exit 2 with one line naming the file and the field; a hypothesis fuzz mutates every
workspace file and `train` either exits 2 or runs cleanly, never with a traceback; a
damaged ``harness.sqlite`` is found by ``PRAGMA quick_check`` before a training run (and
when a writer opens a log a killed writer left) and is exit 2 naming the file."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vtrm_gate import cli
from vtrm_gate.harness import workspace_lock
from vtrm_gate.sim import SimConfig, init_simulated

CONFIG = SimConfig(seed=4, pool_sizes={"Action Reasoning": 40, "Counting Problem": 30,
                                       "OCR Problems": 12},
                   effects={"Action Reasoning": "helpful", "Counting Problem": "harmful",
                            "OCR Problems": "helpful"}, infra_rate=0.0)
TRAIN = ["--epochs", "2", "--steps-per-epoch", "2", "--concurrency", "8"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulated workspace after one epoch of two steps (probation settled, cooldowns,
    a rejected buffer, manifests, train.json, an evaluation): the fuzz's starting point."""
    root = tmp_path_factory.mktemp("hostile") / "base"
    init_simulated(root, CONFIG, heldout_fraction=0.2, probation_rule="e_continue",
                   cooldown_steps=1).close()
    code, _, err = run_cli(["train", "--workspace", str(root), "--epochs", "1",
                            "--steps-per-epoch", "2", "--concurrency", "8"])
    assert code == 0, err
    state = json.loads((root / "state.json").read_text())
    assert state["rejected"] and state["cooldown_until"], state  # the buffers hold something
    return root


def run_cli(argv: list[str]) -> tuple[int, str, list[str]]:
    """``vtrm-gate argv`` in this process: (exit code, stdout, stderr lines). An exception
    escaping ``main`` (a traceback for the user) fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue().strip().splitlines()


def copy(base: Path, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    return Path(shutil.copytree(base, dest, ignore=shutil.ignore_patterns(".lock")))


def edit(path: Path, fn: Callable[[Any], Any]) -> None:
    path.write_text(json.dumps(fn(json.loads(path.read_text()))))


def first_type(root: Path) -> str:
    return sorted(json.loads((root / "pool.json").read_text()))[0]


def deep(n: int) -> str:
    return "[" * n + "]" * n


# ---- named faults: exit 2, one line naming the file and the field -----------------------


def _other_types_unit(root: Path) -> dict[str, Any]:
    held = json.loads((root / "heldout.json").read_text())
    a, b = sorted(held)[:2]
    return {**held, a: held[a] + [held[b][0]]}


CASES: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "probation a list": ("state.json", lambda r: edit(r / "state.json", lambda v: {
        **v, "probation": [1]}), "state.probation"),
    "rejected a list": ("state.json", lambda r: edit(r / "state.json", lambda v: {
        **v, "rejected": [1]}), "state.rejected"),
    "probation a string": ("state.json", lambda r: edit(r / "state.json", lambda v: {
        **v, "probation": "x"}), "state.probation"),
    "probation of an unknown type": ("state.json", lambda r: edit(r / "state.json", lambda v: {
        **v, "probation": {"Nope": {"version": 2, "prev_version": 1, "epoch": 1,
                                    "step": 1}}}), "'Nope'"),
    "cooldown of an unknown type": ("state.json", lambda r: edit(r / "state.json", lambda v: {
        **v, "cooldown_until": {"Nope": 3}}), "'Nope'"),
    "rejected of an unknown type": ("state.json", lambda r: edit(r / "state.json", lambda v: {
        **v, "rejected": {"Nope": []}}), "'Nope'"),
    "probation past the latest version": ("state.json", lambda r: edit(
        r / "state.json", lambda v: {**v, "probation": {first_type(r): {
            "version": 99, "prev_version": 1, "epoch": 1, "step": 1}}}), "probation"),
    "a version past SQLite's integers": ("state.json", lambda r: edit(
        r / "state.json", lambda v: {**v, "steps_applied": 2**70}), "steps_applied"),
    "state nested 100k deep": ("state.json", lambda r: (r / "state.json").write_text(
        deep(100_000)), "nested"),
    "train.json nested 100k deep": ("train.json", lambda r: (r / "train.json").write_text(
        deep(100_000)), "nested"),
    "train.json a list": ("train.json", lambda r: (r / "train.json").write_text("[]"),
                          "must be an object"),
    "train.json config a list": ("train.json", lambda r: edit(r / "train.json", lambda v: {
        **v, "config": []}), "config"),
    "pool.json nested deep": ("pool.json", lambda r: (r / "pool.json").write_text(
        deep(5000)), "nested"),
    "workspace.json nested deep": ("workspace.json", lambda r: (r / "workspace.json")
                                   .write_text('{"a":' * 5000 + "1" + "}" * 5000), "nested"),
    "a NaN in state.json": ("state.json", lambda r: (r / "state.json").write_text(
        (r / "state.json").read_text().replace('"steps_applied": 2', '"steps_applied": NaN')),
        "NaN"),
    "manifest a list": ("e1_s2.json", lambda r: (r / "manifests/e1_s2.json").write_text("[]"),
                        "manifest"),
    "manifest cases a list": ("e1_s2.json", lambda r: edit(
        r / "manifests/e1_s2.json", lambda v: {**v, "inputs": {**v["inputs"], "cases": []}}),
        "inputs.cases"),
    "heldout naming another type's unit": ("heldout.json", lambda r: (
        r / "heldout.json").write_text(json.dumps(_other_types_unit(r))), "not a unit of"),
    "heldout naming an unknown unit": ("heldout.json", lambda r: edit(
        r / "heldout.json", lambda v: {**v, sorted(v)[0]: [*v[sorted(v)[0]], "zzz"]}),
        "'zzz'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_tampered_file_is_exit_2_naming_file_and_field(trained: Path, tmp_path: Path,
                                                        case: str) -> None:
    name, tamper, field = CASES[case]
    ws = copy(trained, tmp_path / "ws")
    tamper(ws)
    before = {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()}
    code, out, err = run_cli(["train", "--workspace", str(ws), *TRAIN])
    assert code == 2 and len(err) == 1, (code, err)
    assert name in err[0] and field in err[0], err
    assert "finished" not in out  # refused before anything ran
    after = {p: p.read_bytes() for p in ws.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == {p: b for p, b in before.items() if p.name != ".lock"}


def test_an_evaluation_row_of_the_wrong_type_is_exit_2_naming_table_and_column(
        trained: Path, tmp_path: Path) -> None:
    ws = copy(trained, tmp_path / "ws")
    con = sqlite3.connect(ws / "harness.sqlite")
    con.execute("UPDATE evaluation SET n_current = 'abc'")
    con.commit()
    con.close()
    before = files_of(ws)
    code, _out, err = run_cli(["train", "--workspace", str(ws), *TRAIN])
    assert code == 2 and len(err) == 1, err
    assert "harness.sqlite" in err[0] and "evaluation" in err[0] and "n_current" in err[0]
    assert files_of(ws) == before  # issue 27 row 9: train.json was rewritten (epochs 2)


def test_a_missing_manifest_is_refused_before_anything_is_written(trained: Path,
                                                                  tmp_path: Path) -> None:
    ws = copy(trained, tmp_path / "ws")
    (ws / "manifests" / "e1_s1.json").unlink()
    before = files_of(ws)
    code, out, err = run_cli(["train", "--workspace", str(ws), *TRAIN])
    assert code == 2 and len(err) == 1, err
    assert "e1 s1 never ran (no manifest)" in err[0] and not out.strip()
    assert files_of(ws) == before  # train.json untouched (it said epochs 1; TRAIN says 2)


def files_of(root: Path) -> dict[Path, bytes]:
    """Every file's bytes but the lock's (its holder record changes with each writer) and
    the database's (a reader's checkpoint moves pages between its files)."""
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()
            and p.name != ".lock" and not p.name.startswith("harness.sqlite")}


def test_heldout_units_of_another_type_are_refused_before_the_first_step(
        trained: Path, tmp_path: Path) -> None:
    ws = copy(trained, tmp_path / "ws")
    (ws / "heldout.json").write_text(json.dumps(_other_types_unit(ws)))
    state = (ws / "state.json").read_bytes()
    code, out, _err = run_cli(["train", "--workspace", str(ws), *TRAIN])
    assert code == 2 and (ws / "state.json").read_bytes() == state and not out.strip()


# ---- the database ------------------------------------------------------------------------


def damage(db: Path) -> None:
    """4 KiB of random bytes written into the middle of the database file."""
    import random

    size = db.stat().st_size
    with open(db, "r+b") as f:
        f.seek(size // 2 // 4096 * 4096)
        f.write(random.Random(13).randbytes(4096))


def test_train_refuses_a_damaged_log_before_it_runs(trained: Path, tmp_path: Path) -> None:
    ws = copy(trained, tmp_path / "ws")
    damage(ws / "harness.sqlite")
    state = (ws / "state.json").read_bytes()
    code, _out, err = run_cli(["train", "--workspace", str(ws), *TRAIN])
    assert code == 2 and len(err) == 1, err  # main: a whole epoch ran and exited 0
    assert "harness.sqlite" in err[0] and "quick_check" in err[0]
    assert (ws / "state.json").read_bytes() == state


def test_a_writer_after_an_unclean_stop_checks_the_log(trained: Path, tmp_path: Path) -> None:
    ws = copy(trained, tmp_path / "ws")
    lock = workspace_lock(ws, "killed writer").acquire()
    assert not lock.unclean  # copied without .lock: no earlier holder on record
    lock._key = None  # the holder dies without releasing: its record stays in .lock
    from vtrm_gate.harness import _lock

    fd, _, _, directory = _lock._HELD.pop(ws.resolve())
    import os

    os.close(fd)  # the kernel drops both its locks when it dies
    os.close(directory)
    damage(ws / "harness.sqlite")
    code, _, err = run_cli(["step", "--workspace", str(ws), "--epoch", "2", "--step", "1"])
    assert code == 2 and "quick_check" in err[0], err
    # a clean release leaves no record: the next writer does not check again
    fresh = copy(trained, tmp_path / "fresh")
    with workspace_lock(fresh, "a"):
        pass
    with workspace_lock(fresh, "b") as again:
        assert not again.unclean


# ---- the fuzz -----------------------------------------------------------------------------


JSON_FILES = ("workspace.json", "pool.json", "seed_record.json", "state.json",
              "heldout.json", "train.json", "manifests/e1_s1.json", "manifests/e1_s2.json")
TEXT_FILES = ("skills/action-reasoning.md", "history/counting-problem/v1.md",
              "skills/default-strategy.md")

leaf = (st.none() | st.booleans() | st.integers(min_value=-2**80, max_value=2**80)
        | st.floats(allow_nan=False) | st.text(max_size=12)
        | st.sampled_from(["Action Reasoning", "OCR Problems", "Nope", "", "e_continue"]))
values = st.recursive(leaf, lambda kids: st.lists(kids, max_size=3)
                      | st.dictionaries(st.text(max_size=8), kids, max_size=3), max_leaves=8)
# What a node is most often confused with: another container, a scalar, a huge number.
RETYPED = ([], [1], {}, {"Nope": 1}, "x", 2**70, -1, None, True, 1.5, [[1, 2]], {"a": []})


def _paths(v: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(v, dict):
        for k, x in v.items():
            out += _paths(x, (*prefix, k))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            out += _paths(x, (*prefix, i))
    return out


def _set(doc: Any, path: tuple[Any, ...], new: Any, delete: bool) -> Any:
    if not path:
        return new
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return doc


@st.composite
def mutations(draw: st.DrawFn) -> tuple[str, str, Any]:
    """(file, kind, argument) of one tampering: a node of a JSON file replaced (by another
    type, a random value, a deep nest) or deleted, or a file's bytes replaced or cut."""
    kind = draw(st.sampled_from(["retype", "retype", "retype", "replace", "delete", "deep",
                                 "bytes", "truncate", "text"]))
    if kind == "text":
        return draw(st.sampled_from(TEXT_FILES)), kind, draw(st.binary(max_size=30))
    name = draw(st.sampled_from(JSON_FILES))
    if kind == "bytes":
        return name, kind, draw(st.binary(max_size=40))
    if kind == "truncate":
        return name, kind, draw(st.floats(0, 1))
    where = draw(st.integers(0, 10_000))
    new = {"retype": st.sampled_from(RETYPED), "replace": values,
           "deep": st.sampled_from([100, 100_000]), "delete": st.none()}[kind]
    return name, kind, (where, draw(new))


def apply(root: Path, name: str, kind: str, arg: Any) -> None:
    path = root / name
    if kind in ("bytes", "text"):
        path.write_bytes(arg)
        return
    if kind == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[:int(len(data) * arg)])
        return
    doc = json.loads(path.read_text())
    paths = _paths(doc)
    where, new = arg
    target = paths[where % len(paths)]
    if kind == "deep":  # spliced in as text: json.dumps itself cannot nest that deep
        marker = "__deep__"
        text = json.dumps(_set(doc, target, marker, False))
        path.write_text(text.replace(json.dumps(marker), "[" * new + "]" * new, 1))
        return
    path.write_text(json.dumps(_set(doc, target, new, kind == "delete" and bool(target))))


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                  HealthCheck.too_slow])
@given(change=mutations())
def test_any_tampered_file_is_exit_2_or_a_clean_run(trained: Path, tmp_path: Path,
                                                   change: tuple[str, str, Any]) -> None:
    ws = copy(trained, tmp_path / "fuzz")
    apply(ws, *change)
    code, _out, err = run_cli(["train", "--workspace", str(ws), *TRAIN])
    assert code in (0, 2), (change, code, err)
    if code == 2:
        assert len(err) == 1, (change, err)


def test_the_fuzz_reaches_every_file(trained: Path) -> None:
    for name in (*JSON_FILES, *TEXT_FILES):
        assert (trained / name).is_file(), name


@pytest.mark.parametrize("text,got", [('"2"', "'2'"), ("-1", "-1"), ("1e400", "inf"),
                                      ("0", "0"), ("true", "True")])
@pytest.mark.parametrize("command", ["step", "train"])
def test_train_json_steps_per_epoch_is_validated_by_every_reader(
        trained: Path, tmp_path: Path, text: str, got: str, command: str) -> None:
    # Issue 27 row 10: `step` ran with exit 0 on "2", -1 and 1e400 (inf, past the text check).
    ws = copy(trained, tmp_path / "ws")
    raw = (ws / "train.json").read_text()
    assert '"steps_per_epoch": 2' in raw
    (ws / "train.json").write_text(raw.replace('"steps_per_epoch": 2',
                                               f'"steps_per_epoch": {text}'))
    before = files_of(ws)
    argv = (["step", "--workspace", str(ws), "--epoch", "2", "--step", "1"] if command == "step"
            else ["train", "--workspace", str(ws), *TRAIN])
    code, out, err = run_cli(argv)
    assert code == 2 and len(err) == 1, (code, err)
    assert "train.json" in err[0] and "config.steps_per_epoch" in err[0] and got in err[0]
    assert files_of(ws) == before and not out.strip()


BIG = 3_000_000


def _big_kind(ws: Path) -> None:
    edit(ws / "workspace.json", lambda d: {**d, "kind": "k" * BIG})


def _big_type_in_seed_record(ws: Path) -> None:  # quoted by a message without `shown`
    edit(ws / "seed_record.json", lambda d: {**d, "t" * BIG: {}})


def _big_spaced_kind(ws: Path) -> None:  # a value of many short words
    edit(ws / "workspace.json", lambda d: {**d, "kind": "k " * (BIG // 2)})


@pytest.mark.parametrize("damage_with,named", [(_big_kind, "workspace.json: kind"),
                                               (_big_type_in_seed_record, "seed_record.json"),
                                               (_big_spaced_kind, "workspace.json: kind")])
@pytest.mark.parametrize("as_json", [False, True])
def test_an_error_quotes_a_huge_value_cut_with_its_length(
        trained: Path, tmp_path: Path, damage_with: Callable[[Path], None], named: str,
        as_json: bool) -> None:
    # Issue 27 row 11: a 3 MB value made a 3,000,121-byte error line (and --json the same).
    ws = copy(trained, tmp_path / "ws")
    damage_with(ws)
    argv = ["step", "--workspace", str(ws), "--epoch", "2", "--step", "1"]
    code, out, err = run_cli(argv + (["--json"] if as_json else []))
    assert code == 2
    line = json.loads(out)["error"] if as_json else err[0]
    assert len(err) == (0 if as_json else 1) and len(line) < 400, len(line)
    assert named in line and ("3,000,000 characters" in line or "3,000,002 characters" in line
                              or "characters in all" in line), line


def test_a_json_file_holding_a_lone_surrogate_is_written_escaped_and_reads_back(
        tmp_path: Path) -> None:
    """A workspace JSON file is written readable (UTF-8 kept); a value holding a lone
    surrogate, which has no UTF-8 form, stopped the write. It is written escaped."""
    from vtrm_gate.harness._files import write_json

    value = {"note": "x\ud800y", "name": "größe"}
    write_json(tmp_path / "a.json", value)
    text = (tmp_path / "a.json").read_text(encoding="utf-8")
    assert json.loads(text) == value and "\\ud800" in text
    write_json(tmp_path / "b.json", {"name": "größe"})
    assert "größe" in (tmp_path / "b.json").read_text(encoding="utf-8")  # kept readable
