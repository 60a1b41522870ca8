"""Video frames in the prompt: units with frame images (local files and URLs) and a video URL
go to the loopback chat server as OpenAI-style content parts (data URIs for local files,
capped and resized), and every media reference is part of the response-cache key and of the
BaselineCache key."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from vtrm_gate import cli
from vtrm_gate.cache import KeyParts, ResponseCache
from vtrm_gate.gate import UnitTask
from vtrm_gate.harness import (
    REF_SCHEME,
    Frame,
    MediaOptions,
    StepResult,
    Workspace,
    WorkspaceError,
    parse_media,
    pick_frames,
    run_step,
)
from vtrm_gate.llm import (
    MCQ,
    LLMAgent,
    MediaResolver,
    RetryPolicy,
    init_llm,
    llm_backend,
    rollout_cases,
)
from vtrm_gate.options import RunOptions
from vtrm_gate.testing import RedisTarget
from vtrm_gate.testing.chat import HELPFUL_MARKER
from vtrm_gate.testing.media import MediaChatServer

FAST = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.02, max_total_s=120.0)
LONG = "the longest option, by a clear margin"
REMOTE = "http://127.0.0.1:9/remote-frame.jpg"
VIDEO = "http://127.0.0.1:9/clip.mp4"


def make_frames(root: Path, unit: int, n: int = 10) -> list[dict[str, Any]]:
    """``n`` 1000x600 PNG frames of one unit (distinct colours), at 0.5 s steps."""
    frames = []
    for k in range(n):
        rel = f"frames/u{unit:02d}_{k}.png"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (1000, 600), ((unit * 37) % 256, k * 20, 90)).save(root / rel)
        frames.append({"image": rel, "t": k * 0.5})
    return frames


def write_units(root: Path) -> Path:
    lines = []
    for i in range(12):  # base ("A") always wrong, the candidate (longest) always right
        options = [f"opt {k}" for k in range(4)]
        options[1 + i % 3] = LONG
        media = {"frames": [*make_frames(root, i), {"image": REMOTE, "t": 9.0}],
                 "video": {"url": VIDEO, "start": 0, "end": 10}}
        lines.append({"unit_id": f"u{i:02d}", "task_type": "Counting Problem",
                      "question": f"How many birds in clip {i}?", "options": options,
                      "answer": "ABCD"[1 + i % 3], "media": media})
    path = root / "units.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def evolve(task_type: str, skill: str, body: dict[str, Any]) -> str:
    return f"```markdown\n{skill.rstrip()}\n- {HELPFUL_MARKER}\n```"


def step(ws: Workspace, target: RedisTarget) -> tuple[StepResult, ResponseCache]:
    cache = ResponseCache(target.url, prefix=target.prefix)
    backend = llm_backend(ws, RunOptions(), cache=cache, api_key="k", env={}, retry=FAST)

    async def go() -> StepResult:
        try:
            cases = await rollout_cases(backend, ws, 1, 1)
            return await run_step(ws, 1, 1, infer=backend.infer, evolver=backend.evolver,
                                  cases=cases, cache_stats=backend.cache_stats,
                                  options=RunOptions(concurrency=16))
        finally:
            await backend.aclose()

    return asyncio.run(go()), cache


@pytest.fixture
def media_server() -> Any:
    with MediaChatServer(evolve_reply=evolve) as server:
        yield server


def test_frames_reach_the_server_capped_resized_with_urls_video_and_timestamps(
        tmp_path: Path, redis_target: RedisTarget, media_server: MediaChatServer) -> None:
    ws = init_llm(tmp_path / "ws", write_units(tmp_path), base_url=media_server.url,
                            model="vision-model", seed=1,
                            media={"max_frames": 4, "max_side": 256})
    res, _ = step(ws, redis_target)
    assert res.decisions == {"Counting Problem": "PROVISIONAL"}  # 4 ladder units, all won
    answering = [i for i, r in enumerate(media_server.requests)
                 if media_server.step_of(r) != "evolve"]
    assert answering
    for i in answering:
        got = media_server.received[i]
        assert len(got) == 4  # 11 frames, capped at 4, evenly spread (the last is remote)
        assert [g.kind for g in got] == ["data", "data", "data", "url"]
        assert got[-1].url == REMOTE
        assert all(g.size == (256, 154) for g in got[:3])  # 1000x600 resized to side 256
        assert media_server.videos[i] == [VIDEO]
        user = media_server.requests[i]["messages"][1]["content"]
        stamps = [p["text"] for p in user if p["type"] == "text" and p["text"].startswith(
            "Frame at")]
        assert stamps == ["Frame at 0 s:", "Frame at 1.5 s:", "Frame at 3.5 s:",
                          "Frame at 9 s:"]
    # the three local frames of one unit are different images
    assert len({g.sha256 for g in media_server.received[answering[0]][:3]}) == 3
    ws.close()


def test_a_changed_frame_changes_both_cache_keys_of_that_unit_only(
        tmp_path: Path, redis_target: RedisTarget, media_server: MediaChatServer) -> None:
    ws = init_llm(tmp_path / "ws", write_units(tmp_path), base_url=media_server.url,
                            model="vision-model", seed=1, media={"max_frames": 4})
    step(ws, redis_target)
    keys_before = {u: ws.unit_key("Counting Problem", u) for u in ws.units}
    n_before = len(media_server.requests)
    again, _ = step(ws, redis_target)
    assert len(media_server.requests) == n_before  # a re-run is served from the caches
    ws.close()
    # repaint a frame that is sent (frame 3 of unit u05: index round(1 * 10 / 3) = 3)
    Image.new("RGB", (1000, 600), (1, 2, 3)).save(tmp_path / "frames/u05_3.png")
    ws = Workspace.open(tmp_path / "ws")
    keys_after = {u: ws.unit_key("Counting Problem", u) for u in ws.units}
    assert {u for u in ws.units if keys_after[u] != keys_before[u]} == {"u05"}
    third, _ = step(ws, redis_target)
    assert third.decisions == again.decisions
    fresh = media_server.requests[n_before:]
    assert fresh and all("clip 5?" in json.dumps(r) for r in fresh)  # only u05 was re-asked
    ws.close()


def test_the_response_cache_key_holds_path_hash_and_url_not_pixels(tmp_path: Path) -> None:
    frames = make_frames(tmp_path, 1, n=2)
    media = parse_media({"frames": [*frames, REMOTE], "video": VIDEO})
    resolver = MediaResolver(MediaOptions(str(tmp_path), max_frames=8, max_side=64))
    agent = LLMAgent({"u": MCQ("q?", ("a", "b"), "A", media)}, base_url="http://x/v1",
                     model="m", media=resolver)
    task = UnitTask("T", "u", "base", 0, "run", "skill")
    msgs = agent.messages(task, agent.units["u"])
    key_text = json.dumps(KeyParts("m", "http://x/v1", tuple(msgs)).components())
    h0 = resolver.file_hash(frames[0]["image"])
    assert f"{REF_SCHEME}frames/u01_0.png?max_side=64#sha256={h0}" in key_text
    assert REMOTE in key_text and VIDEO in key_text and "base64" not in key_text
    wire = resolver.resolve({"model": "m", "messages": msgs})
    assert "data:image/png;base64," in json.dumps(wire) and REF_SCHEME not in json.dumps(wire)


def test_init_llm_refuses_a_missing_local_frame(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    units = write_units(tmp_path)
    (tmp_path / "frames/u03_7.png").unlink()
    code = cli.main(["init", str(tmp_path / "ws"), "--llm", "--units", str(units),
                     "--base-url", "http://127.0.0.1:9/v1", "--model", "m"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "unit 'u03'" in err[0] and "frames/u03_7.png" in err[0]
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize(("media", "match"), [
    ({"frames": "a.png"}, "media.frames must be a list"),
    ({"frames": [{"image": "a.png", "t": -1}]}, r"frames\[0\]\.t"),
    ({"frames": [{"path": "a.png"}]}, r"frames\[0\] must be"),
    ({"video": "ftp://v"}, "media.video must be"),
    ({"audio": "x"}, "media must be an object"),
])
def test_bad_media_is_refused_naming_the_field(media: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_media(media)


def test_frame_cap_keeps_first_and_last_in_order() -> None:
    frames = [Frame(str(i)) for i in range(10)]
    assert [f.image for f in pick_frames(frames, 4)] == ["0", "3", "6", "9"]
    assert pick_frames(frames, 20) == frames


def test_bad_media_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError, match="max_frames"):
        init_llm(tmp_path / "ws", write_units(tmp_path), base_url="http://x/v1",
                           model="m", media={"max_frames": 0})
