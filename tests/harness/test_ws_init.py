"""``init`` writes a whole workspace or nothing: a failure mid-way (a full disk) leaves no
trace, and bad units (invalid text, types that differ only in case) are refused first."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from vtrm_gate.harness import Workspace, WorkspaceError

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, fsize: int | None = None) -> subprocess.CompletedProcess[str]:
    def limit() -> None:  # a "full disk": writes past fsize bytes fail with EFBIG
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run([sys.executable, "-m", "vtrm_gate", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=240, env=dict(os.environ),
                          preexec_fn=limit)


def unit(uid: str, task_type: str, question: str = "What happens?") -> str:
    return json.dumps({"unit_id": uid, "task_type": task_type, "question": question,
                       "options": ["a", "bb"], "answer": "B"})


@pytest.mark.parametrize("fsize", [2_000, 40_000])
def test_init_that_fails_mid_way_leaves_nothing(tmp_path: Path, fsize: int) -> None:
    parent = tmp_path / "parent"
    parent.mkdir()
    r = cli("init", str(parent / "ws"), fsize=fsize)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "File too large" in r.stderr
    assert list(parent.iterdir()) == []  # neither the workspace nor its build directory
    # the same init with room to write succeeds, and only the workspace is there
    assert cli("init", str(parent / "ws")).returncode == 0
    assert [p.name for p in parent.iterdir()] == ["ws"]
    Workspace.open(parent / "ws").close()


def test_init_into_an_existing_empty_directory_replaces_it_whole(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    assert cli("init", str(root)).returncode == 0
    Workspace.open(root).close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ws"]


def test_a_killed_init_leaves_only_its_build_dir_which_the_next_init_removes(
        tmp_path: Path) -> None:
    stale = tmp_path / ".ws.init-999999"  # the build dir of an init killed by -9
    (stale / "skills").mkdir(parents=True)
    assert cli("init", str(tmp_path / "ws")).returncode == 0
    assert [p.name for p in tmp_path.iterdir()] == ["ws"]


def test_a_lone_surrogate_in_a_units_file_is_refused_at_init_with_its_line(
        tmp_path: Path) -> None:
    units = tmp_path / "units.jsonl"
    units.write_text(unit("u1", "OCR Problems") + "\n"
                     + unit("u2", "OCR Problems", "What does SURR say?").replace(
                         "SURR", "\\ud800") + "\n")  # a JSON escape of a lone surrogate
    r = cli("init", str(tmp_path / "ws"), "--llm", "--units", str(units), "--base-url",
            "http://127.0.0.1:9/v1", "--model", "m")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"{units}: line 2: invalid text: a lone surrogate \\ud800" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["units.jsonl"]


def test_types_differing_only_in_case_are_refused_at_init_before_anything_is_written(
        tmp_path: Path) -> None:
    units = tmp_path / "units.jsonl"
    units.write_text(unit("u1", "OCR Problems") + "\n" + unit("u2", "OCR problems") + "\n")
    r = cli("init", str(tmp_path / "ws"), "--llm", "--units", str(units), "--base-url",
            "http://127.0.0.1:9/v1", "--model", "m")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "'OCR Problems' and 'OCR problems' differ only in case or punctuation" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["units.jsonl"]
    with pytest.raises(WorkspaceError, match="differ only in case or punctuation"):
        Workspace.create(tmp_path / "py", pool={"Spatial: Reasoning": ["a"],
                                                "spatial reasoning": ["b"]},
                         skills={"Spatial: Reasoning": "x", "spatial reasoning": "y"})
    assert not (tmp_path / "py").exists()


def test_a_seed_record_given_as_text_is_refused_not_stored_as_true(tmp_path: Path) -> None:
    """``Workspace.create(seed_record={"A": {"u1": "False"}})`` stored ``true`` (the text is
    truthy), which orders every later ladder; it is refused, and nothing is created."""
    pool, skills = {"A": ["u1", "u2"]}, {"A": "x"}
    with pytest.raises(WorkspaceError, match=r"^create: seed_record\['A'\]\['u1'\] must be True "
                                             r"or False \(or 1 or 0\), got 'False' \(a str\)"):
        Workspace.create(tmp_path / "ws", pool=pool, skills=skills,
                         seed_record={"A": {"u1": "False", "u2": "True"}})
    assert not (tmp_path / "ws").exists()
    with Workspace.create(tmp_path / "ok", pool=pool, skills=skills,
                          seed_record={"A": {"u1": 0, "u2": True}}) as ws:
        assert ws.seed_record == {"A": {"u1": False, "u2": True}}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"pool": {"A": "unit-7"}}, r"create: pool\['A'\] must be a list of unit ids, got a str "
                                r"\('unit-7'\)"),
    ({"pool": {"A": {"u2", "u1"}}}, r"create: pool\['A'\] must be a list of unit ids, got a "
                                    r"set \(it has no order: pass sorted\(\.\.\.\)\)"),
    ({"pool": ["A"]}, r"create: pool must be a mapping \{task type: \[unit ids\]\}, got list"),
    ({"skills": {"A": "x", "B": "y"}}, r"create: skills for types not in the pool: \['B'\]"),
    ({"skills": {"A": b"x"}}, r"create: skill text of 'A' must be text, got bytes"),
    ({"seed_record": {"A": ["u1"]}}, r"create: seed_record\['A'\] must be a mapping "
                                     r"\{unit id: True/False\}, got list"),
    ({"default_strategy": None}, r"create: default_strategy must be text, got NoneType"),
    ({"config": {"seed": 1}}, r"create: config must be a WorkspaceConfig, got dict"),
    ({"files": {"notes.md": b"x"}}, r"create: extra file 'notes.md' must be text, got bytes"),
    ({"files": {"": "x"}}, r"create: extra file '' must be a new relative path"),
])
def test_create_refuses_what_it_would_have_split_dropped_or_crashed_on(
        tmp_path: Path, kwargs: dict, message: str) -> None:
    """``pool={"A": "unit-7"}`` became the units u, n, i, t, -, 7; a skill of a type not in
    the pool was dropped without a word; the rest failed deep inside (AttributeError,
    IsADirectoryError naming a temporary directory). Each is refused, nothing created."""
    args = {"pool": {"A": ["u1", "u2"]}, "skills": {"A": "x"}} | kwargs
    with pytest.raises((WorkspaceError, TypeError), match=f"^{message}"):
        Workspace.create(tmp_path / "ws", **args)
    assert not (tmp_path / "ws").exists()
