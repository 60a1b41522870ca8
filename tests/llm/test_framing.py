"""The task the prompts name comes from the workspace (issue 26 #4): text-only units get no
video wording (system prompt, evolver prompt, default skills); a workspace's
``task_description`` is named everywhere instead; units that show media keep "about a
video"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.llm.test_backends import make_ws, step_once
from tests.llm.test_media import MediaChatServer, evolve
from tests.llm.test_media import step as media_step
from tests.llm.test_media import write_units as media_units
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
