"""Workspace: the layout on disk, validation that names the bad file, atomic state."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_harness_toy import make_workspace, skill

from vtrm_gate._ids import content_hash
from vtrm_gate.harness import TrainingState, Workspace, WorkspaceError
from vtrm_gate.sim import TASK_TYPES, SimConfig

SIZES = {"Counting Problem": 30, "OCR Problems": 12}


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_workspace_layout_opens_by_hand(tmp_path):
    ws = make_workspace(tmp_path / "ws", SIZES)
    root = ws.root
    for name in ("workspace.json", "pool.json", "seed_record.json", "state.json",
                 "harness.sqlite", "skills/default-strategy.md", "skills/counting-problem.md",
                 "skills/ocr-problems.md", "history/ocr-problems/v1.md"):
        assert (root / name).is_file(), name
    assert (root / "candidates").is_dir() and (root / "manifests").is_dir()
    assert json.loads((root / "pool.json").read_text())["OCR Problems"][0] == "ocr-problems-000"
    state = json.loads((root / "state.json").read_text())
    assert state["skills"]["OCR Problems"] == {
        "version": 1, "latest": 1, "hash": content_hash(skill("OCR Problems", 5))}
    again = Workspace.open(root)
    assert again.task_types == ("Counting Problem", "OCR Problems")
    assert again.skill_text("OCR Problems") == skill("OCR Problems", 5)


def test_init_simulated_builds_the_twelve_types(tmp_path):
    from vtrm_gate.sim import init_simulated

    ws = init_simulated(tmp_path / "sim", SimConfig(seed=1))
    assert set(ws.task_types) == set(TASK_TYPES)
    assert ws.config.kind == "simulated" and ws.config.sim["seed"] == 1
    assert "time_scale" not in ws.config.agent  # latency does not change a measurement
    assert len(ws.pool["Spatial Perception"]) == 9
    assert (ws.root / "skills" / "spatial-perception.md").read_text().startswith(
        "# Spatial Perception")


def test_create_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "notes.txt").write_text("mine")
    with pytest.raises(WorkspaceError, match="not an empty directory"):
        make_workspace(tmp_path / "ws", SIZES)
    assert os.listdir(tmp_path / "ws") == ["notes.txt"]


def _break(root: Path, name: str, text: str | None) -> None:
    p = root / name
    if text is None:
        p.unlink()
    else:
        p.write_text(text)


@pytest.mark.parametrize(("name", "text", "message"), [
    ("state.json", None, r"state\.json: missing"),
    ("state.json", "{not json", r"state\.json: malformed JSON at line 1"),
    ("state.json", '{"format": 1, "skills": []}', r"state\.json: state\.skills must be"),
    ("pool.json", '{"OCR Problems": ["a"],\n "OCR Problems": ["b"]}',
     r"pool\.json: malformed JSON at line 2 column 2: duplicate key 'OCR Problems'"),
    ("pool.json", "[]", r"pool\.json: must be a non-empty object"),
    ("pool.json", '{"Counting Problem": ["a", "a"], "OCR Problems": []}',
     r"pool\.json: type 'Counting Problem': duplicate unit id 'a'"),
    ("seed_record.json", '{"Counting Problem": {"zzz": true}}',
     r"seed_record\.json: type 'Counting Problem': unit 'zzz' is not in the type's pool"),
    ("skills/ocr-problems.md", None, r"skills/ocr-problems\.md: missing skill file"),
    ("skills/ocr-problems.md", "  \n", r"skills/ocr-problems\.md: empty skill file"),
    ("skills/ocr-problems.md", "# hand edit\nlevel=9\n",
     r"skills/ocr-problems\.md: content matches neither state\.json's version v1"),
    ("skills/default-strategy.md", None, r"skills/default-strategy\.md: missing"),
    ("workspace.json", '{"gate_block": 8}', r"workspace\.json: unknown keys \['gate_block'\]"),
    ("workspace.json", '{"cooldown_steps": -1}', r"workspace\.json: cooldown_steps must be"),
    ("workspace.json", '{"futile_cooldown": 0}',
     r"workspace\.json: futile_cooldown must be true or false, got 0"),
    ("harness.sqlite", "not a database", r"harness\.sqlite: not an SQLite database"),
])
def test_bad_workspace_file_is_named_and_nothing_is_written(tmp_path, name, text, message):
    root = make_workspace(tmp_path / "ws", SIZES).root
    _break(root, name, text)
    before = _snapshot(root)
    with pytest.raises(WorkspaceError, match=message):
        Workspace.open(root)
    assert _snapshot(root) == before


def test_missing_workspace_directory_is_named(tmp_path):
    with pytest.raises(WorkspaceError, match="no such workspace directory"):
        Workspace.open(tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(WorkspaceError, match=r"workspace\.json: missing"):
        Workspace.open(tmp_path / "empty")
    assert os.listdir(tmp_path / "empty") == []


def test_bad_workspace_fails_run_step_before_writing(tmp_path):
    from test_harness_toy import ToyEvolver, ToyInfer

    from vtrm_gate.harness import run_step_sync

    root = make_workspace(tmp_path / "ws", SIZES).root
    _break(root, "pool.json", "{")
    before = _snapshot(root)
    with pytest.raises(WorkspaceError, match=r"pool\.json"):
        run_step_sync(root, 1, 1, infer=ToyInfer(), evolver=ToyEvolver({}), cases={})
    assert _snapshot(root) == before


def test_state_round_trips_and_is_written_atomically(tmp_path):
    ws = make_workspace(tmp_path / "ws", SIZES)
    state = ws.state
    assert TrainingState.from_json(state.to_json()) == state
    ws.save_state(state)
    leftovers = [p.name for p in ws.root.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_interrupted_checkpoint_is_finished_not_refused(tmp_path):
    """state.json written, skills/ not yet: opening works and the step re-syncs skills/."""
    ws = make_workspace(tmp_path / "ws", SIZES)
    text = skill("OCR Problems", 6)
    from dataclasses import replace

    from vtrm_gate.harness import SkillRef, atomic_write, write_json

    atomic_write(ws.history_path("OCR Problems", 2), text)
    new = replace(ws.state, skills={**ws.state.skills,
                                    "OCR Problems": SkillRef(2, content_hash(text), 2)})
    write_json(ws.state_path, new.to_json())  # crash before skills/ is rewritten
    again = Workspace.open(ws.root)
    assert again.stale_skills == ("OCR Problems",)
    assert again.skill_text("OCR Problems") == text
    again.sync_skills()
    assert (ws.root / "skills" / "ocr-problems.md").read_text() == text


def test_a_workspace_made_from_python_gets_inits_probation_rule(tmp_path):
    # Issue 27 row 16: WorkspaceConfig() defaulted to the unguarded w_net bet while
    # `vtrm-gate init` defaults to e_continue; both now write e_continue.
    from vtrm_gate.sim import init_simulated

    ws = init_simulated(tmp_path / "ws", SimConfig(seed=1))
    ws.close()
    assert json.loads((ws.root / "workspace.json").read_text())["probation_rule"] == (
        "e_continue")
    assert Workspace.open(ws.root).config.probation_rule == "e_continue"


@pytest.mark.parametrize("rule", ["w_net", "e_harm", None])
def test_an_existing_workspace_keeps_the_rule_its_file_says(tmp_path, rule):
    # A file written before the default changed (no key: it ran with w_net) keeps its rule.
    from vtrm_gate.sim import init_simulated

    root = tmp_path / "ws"
    init_simulated(root, SimConfig(seed=1)).close()
    cfg = json.loads((root / "workspace.json").read_text())
    cfg.pop("probation_rule")
    if rule is not None:
        cfg["probation_rule"] = rule
    (root / "workspace.json").write_text(json.dumps(cfg))
    before = _snapshot(root)
    assert Workspace.open(root).config.probation_rule == (rule or "w_net")
    assert _snapshot(root) == before  # opening rewrites nothing


def test_a_skill_file_edited_while_a_step_runs_is_kept_beside_it(tmp_path, caplog):
    """Hostile pass (h24): an edit to skills/<type>.md made during a step was overwritten
    when the step checkpointed, without a word (between steps it is refused at open)."""
    import logging

    ws = make_workspace(tmp_path / "ws", SIZES)
    path = ws.root / "skills" / "ocr-problems.md"
    edit = path.read_text() + "- my own rule, typed mid-step\n"
    path.write_text(edit)  # the step holds the workspace, opened before the edit
    with caplog.at_level(logging.WARNING, "vtrm_gate.harness"):
        ws.save_state(ws.state)
    assert path.read_text() == ws.skill_text("OCR Problems")
    [kept] = (ws.root / "skills").glob("ocr-problems.hand-edit-*.md")
    assert kept.read_text() == edit
    assert "skills/ocr-problems.md was edited by hand" in caplog.text and kept.name in caplog.text
    Workspace.open(ws.root).close()  # the kept copy does not spoil the workspace


def test_a_workspace_moved_while_in_use_is_never_written_at_its_old_path(tmp_path):
    """Hostile pass (h24): ``mv ws ws-moved; vtrm-gate init ws`` during a step: the step went
    on writing state.json, history/ and skills/ at the path ``ws``, into the new workspace
    (it said "1 applied" with another run's skills), and exited 0."""
    ws = make_workspace(tmp_path / "ws", SIZES)
    (tmp_path / "ws").rename(tmp_path / "ws-moved")
    other = make_workspace(tmp_path / "ws", SIZES)  # a new workspace at the old path
    before = _snapshot(other.root)
    with pytest.raises(WorkspaceError, match=r"was moved or replaced"):
        ws.save_state(ws.state)
    assert _snapshot(other.root) == before
    (tmp_path / "ws").rename(tmp_path / "ws-other")
    with pytest.raises(WorkspaceError, match=r"was moved or replaced"):
        ws.save_state(ws.state)  # nothing there: not re-created either
    assert not (tmp_path / "ws").exists()
