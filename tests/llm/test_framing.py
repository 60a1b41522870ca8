"""The task the prompts name comes from the workspace (issue 26 #4): text-only units get no
video wording (system prompt, evolver prompt, default skills); a workspace's
``task_description`` is named everywhere instead; units that show media keep "about a
video"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.backends.test_one_path import cache_env, run
from tests.llm.test_backends import evolve_reply, make_ws, step_once, write_units
from tests.llm.test_media import MediaChatServer, evolve
from tests.llm.test_media import step as media_step
from tests.llm.test_media import write_units as media_units
from vtrm_gate.cli._main import main
from vtrm_gate.errors import WorkspaceError
from vtrm_gate.llm import EVOLVE_PREFIX, VIDEO_TASK, init_llm
from vtrm_gate.testing import ChatServer, RedisTarget


def _systems(requests: list[dict[str, Any]]) -> list[str]:
    return [r["messages"][0]["content"] for r in requests]


def test_text_only_units_get_no_video_wording(tmp_path: Path, chat_server: ChatServer,
                                              redis_target: RedisTarget) -> None:
    ws = make_ws(tmp_path, chat_server)
    assert all("video" not in ws.skill_text(t) for t in ws.task_types)
    step_once(ws, redis_target)
    systems = _systems(chat_server.requests)
    assert len(systems) > 40 and not [s for s in systems if "video" in s]
    assert any(s.startswith("You answer multiple-choice questions. Follow") for s in systems)
    assert any(s.startswith(EVOLVE_PREFIX + " when it answers multiple-choice questions.")
               for s in systems)


def test_the_workspaces_task_description_is_named_in_every_prompt(
        tmp_path: Path, chat_server: ChatServer, redis_target: RedisTarget) -> None:
    task = "multiple-choice questions about a radiology report"
    ws = make_ws(tmp_path, chat_server, task_description=task)
    assert ws.config.agent["task_description"] == task
    assert all(task in ws.skill_text(t) for t in ws.task_types)
    step_once(ws, redis_target)
    systems = _systems(chat_server.requests)
    assert systems and all(f"answers {task}." in s or f"You answer {task}." in s
                           for s in systems)


def test_units_with_media_keep_the_video_wording(tmp_path: Path,
                                                 redis_target: RedisTarget) -> None:
    with MediaChatServer(evolve_reply=evolve) as server:
        ws = init_llm(tmp_path / "ws", media_units(tmp_path), base_url=server.url,
                      model="vision-model", seed=1)
        assert VIDEO_TASK in ws.skill_text("Counting Problem")
        media_step(ws, redis_target)
        systems = _systems(server.requests)
    assert systems and all(VIDEO_TASK in s for s in systems)


@pytest.mark.parametrize("bad", ["", "two\nlines", "x" * 301, 7])
def test_a_bad_task_description_is_refused_naming_the_field(tmp_path: Path,
                                                            chat_server: ChatServer,
                                                            bad: object) -> None:
    with pytest.raises(WorkspaceError, match=r"agent\.task_description must be one"):
        make_ws(tmp_path, chat_server, task_description=bad)
    assert not (tmp_path / "ws").exists()


# ---- the units file may name the task (a field its lines agree on); the init flag wins ----

FILE_TASK = "multiple-choice questions about a hospital discharge letter"
FLAG_TASK = "multiple-choice questions about a chest X-ray"


def _units_naming(tmp: Path, *tasks: Any, every: int = 5) -> Path:
    """The test units, with ``task_description`` on every ``every``-th line: ``tasks[k]`` on the
    k-th of those lines (the last one repeated)."""
    path = write_units(tmp / "units.jsonl")
    lines = path.read_text().splitlines()
    for k, i in enumerate(range(0, len(lines), every)):
        obj = json.loads(lines[i])
        obj["task_description"] = tasks[min(k, len(tasks) - 1)]
        lines[i] = json.dumps(obj)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("flag", [None, FLAG_TASK])
def test_the_units_files_task_description_reaches_every_prompt_through_the_cli(
        tmp_path: Path, chat_server: ChatServer, redis_target: RedisTarget,
        flag: str | None) -> None:
    """Without ``--task-description`` the units file's task is the workspace's: named in the
    default skills, the agent's system prompt and the evolver's; with it, the flag's task
    everywhere and the file's nowhere."""
    chat_server.evolve_reply = evolve_reply
    units = _units_naming(tmp_path, FILE_TASK)
    ws = tmp_path / "ws"
    r = run("init", str(ws), "--llm", "--units", str(units), "--base-url", chat_server.url,
            "--model", "m", "--seed", "1", "--json",
            *(["--task-description", flag] if flag else []), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    task = flag or FILE_TASK
    assert json.loads(r.stdout)["task_description"] == task
    assert json.loads((ws / "workspace.json").read_text())["agent"]["task_description"] == task
    slugs = ("action-reasoning", "counting-problem", "ocr-problems", "object-recognition")
    assert all(f"You answer {task}; this skill" in (ws / "skills" / f"{s}.md").read_text()
               for s in slugs)
    r = run("step", "--workspace", str(ws), "--epoch", "1", "--step", "1", cwd=tmp_path,
            env=cache_env(redis_target))
    assert r.returncode == 0, r.stderr
    systems = _systems(chat_server.requests)
    answering = [s for s in systems if s.startswith(f"You answer {task}. Follow")]
    evolving = [s for s in systems if s.startswith(f"{EVOLVE_PREFIX} when it answers {task}.")]
    assert len(answering) > 40 and len(evolving) >= 2
    assert len(answering) + len(evolving) == len(systems)  # every request names the task
    assert flag is None or not [s for s in systems if "discharge letter" in s]


@pytest.mark.parametrize(("tasks", "why"), [
    ((7,), "line 1: task_description must be one non-empty line of at most 300 characters, "
           "got 7"),
    (("",), "line 1: task_description must be one non-empty line"),
    (("two\nlines",), "line 1: task_description must be one non-empty line"),
    (("x" * 301,), "line 1: task_description must be one non-empty line of at most 300"),
    ((FILE_TASK, FILE_TASK, FLAG_TASK), f"line 11: task_description {FLAG_TASK!r} differs "
                                        f"from line 1's {FILE_TASK!r} (a units file names "
                                        f"one task)"),
])
def test_a_bad_task_description_in_the_units_file_is_exit_2_naming_file_line_and_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tasks: tuple[Any, ...],
        why: str) -> None:
    units = _units_naming(tmp_path, *tasks)
    for flag in ([], ["--task-description", FLAG_TASK]):  # the flag does not excuse the file
        code = main(["init", str(tmp_path / "ws"), "--llm", "--units", str(units),
                     "--base-url", "http://127.0.0.1:9/v1", "--model", "m", *flag])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert f"{units}: {why}" in err
        assert not (tmp_path / "ws").exists()
