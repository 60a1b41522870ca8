"""Hostile frames (issue 19): a frame file is refused at ``init`` when it lies outside the
units directory, is too large or claims too many pixels, or is not an image; one broken
after ``init`` leaves its unit out of the ladder (named in the step report) instead of
aborting the step; one deleted while the gate runs is INFRA for that unit only; the MIME
type of a data URI comes from the image's format."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from vtrm_gate import cli
from vtrm_gate.cache import ResponseCache
from vtrm_gate.errors import MediaError
from vtrm_gate.gate import GuardParams
from vtrm_gate.harness import MediaOptions, StepResult, Workspace, frame_path, run_step
from vtrm_gate.llm import RetryPolicy, data_uri, init_llm, llm_backend, rollout_cases
from vtrm_gate.options import RunOptions
from vtrm_gate.testing import RedisTarget
from vtrm_gate.testing.chat import HELPFUL_MARKER
from vtrm_gate.testing.media import MediaChatServer

FAST = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.02, max_total_s=60.0)
LONG = "the longest option, by a clear margin"
TYPES = ("Counting Problem", "OCR Problems")


def png(path: Path, colour: int = 0, size: tuple[int, int] = (64, 48)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (colour % 256, 40, 90)).save(path, format="PNG")


def write_units(root: Path, n: int = 16, frames: int = 2) -> Path:
    """``n`` units per type, each with ``frames`` small PNG frames under ``root/frames``."""
    lines = []
    for t, task_type in enumerate(TYPES):
        for i in range(n):
            options = [f"opt {k}" for k in range(4)]
            options[1 + i % 3] = LONG
            fr = []
            for k in range(frames):
                rel = f"frames/t{t}_u{i:02d}_{k}.png"
                png(root / rel, 7 * i + k + 50 * t)
                fr.append({"image": rel, "t": float(k)})
            lines.append({"unit_id": f"t{t}u{i:02d}", "task_type": task_type,
                          "question": f"How many birds in clip {t}/{i}?", "options": options,
                          "answer": "ABCD"[1 + i % 3], "media": {"frames": fr}})
    path = root / "units.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def units_with_frame(root: Path, image: str) -> Path:
    """One type of 3 units; unit 'u1' shows ``image``."""
    png(root / "frames/ok.png")
    lines = [{"unit_id": f"u{i}", "task_type": "T", "question": "q?", "options": ["a", "b"],
              "answer": "A", "media": {"frames": [image if i == 1 else "frames/ok.png"]}}
             for i in range(3)]
    path = root / "units.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def init_cli(tmp_path: Path, units: Path, capsys: pytest.CaptureFixture[str],
             *extra: str) -> tuple[int, list[str]]:
    code = cli.main(["init", str(tmp_path / "ws"), "--llm", "--units", str(units),
                     "--base-url", "http://127.0.0.1:9/v1", "--model", "m", *extra])
    return code, capsys.readouterr().err.strip().splitlines()


def bomb_png(path: Path, side: int = 20000) -> None:
    """A tiny PNG whose header claims ``side`` x ``side`` pixels (a decompression bomb)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    row = b"\x00" + b"\x00" * ((side + 7) // 8)
    idat = zlib.compress(row * 64)  # a few rows: the header is what matters
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat)
                     + chunk(b"IEND", b""))


# ---- init --------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["dotdot", "absolute", "symlink"])
def test_init_refuses_a_frame_outside_the_units_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str) -> None:
    secret = tmp_path / "outside" / "secret.png"
    png(secret, 200)
    src = tmp_path / "units"
    image = {"dotdot": "../outside/secret.png", "absolute": str(secret),
             "symlink": "frames/link.png"}[where]
    if where == "symlink":
        (src / "frames").mkdir(parents=True)
        os.symlink(secret, src / "frames/link.png")
    code, err = init_cli(tmp_path, units_with_frame(src, image), capsys)
    assert code == 2 and len(err) == 1, err
    assert "unit 'u1'" in err[0] and image in err[0] and "units directory" in err[0]
    assert not (tmp_path / "ws").exists()


def test_init_refuses_a_frame_path_with_a_nul_byte_naming_unit_and_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 27 #13: "embedded null byte", naming neither unit nor file
    code, err = init_cli(tmp_path, units_with_frame(tmp_path / "units", "frames/a\x00b.png"),
                         capsys)
    assert code == 2 and len(err) == 1, err
    assert "unit 'u1'" in err[0] and "frame 'frames/a\\x00b.png'" in err[0], err
    assert "NUL byte" in err[0] and not (tmp_path / "ws").exists()
    with pytest.raises(MediaError, match=r"frame 'x\\x00\.png': .*NUL byte"):
        frame_path(tmp_path, "x\x00.png")  # also when the units file changes after init


def test_init_refuses_a_frame_over_the_size_cap_without_reading_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "units"
    units = units_with_frame(src, "frames/huge.png")
    with open(src / "frames/huge.png", "wb") as f:  # 2 GB, sparse: nothing is allocated
        f.truncate(2 << 30)
    code, err = init_cli(tmp_path, units, capsys)
    assert code == 2 and len(err) == 1, err
    assert "unit 'u1'" in err[0] and "frames/huge.png" in err[0] and "bytes" in err[0]
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize(("side", "says"), [
    (20000, "400000000 pixels"),  # past Pillow's own guard: its message
    (7000, "7000x7000 = 49000000 pixels, over media.max_pixels 40000000"),
])
def test_init_refuses_a_decompression_bomb_by_its_header(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], side: int, says: str) -> None:
    src = tmp_path / "units"
    units = units_with_frame(src, "frames/bomb.png")
    bomb_png(src / "frames/bomb.png", side)
    assert (src / "frames/bomb.png").stat().st_size < 100_000
    code, err = init_cli(tmp_path, units, capsys)
    assert code == 2 and len(err) == 1, err
    assert "unit 'u1'" in err[0] and "frames/bomb.png" in err[0] and says in err[0], err


@pytest.mark.parametrize("content", [b"just some text\n", b'<svg xmlns="http://www.w3.org/'
                                     b'2000/svg" width="10" height="10"></svg>'])
def test_init_refuses_a_frame_that_is_not_an_image(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes) -> None:
    src = tmp_path / "units"
    units = units_with_frame(src, "frames/fake.png")
    (src / "frames/fake.png").write_bytes(content)
    code, err = init_cli(tmp_path, units, capsys)
    assert code == 2 and len(err) == 1, err
    assert "unit 'u1'" in err[0] and "frames/fake.png" in err[0] and "image" in err[0]


def test_caps_are_settings_and_are_validated(tmp_path: Path) -> None:
    src = tmp_path / "units"
    units = units_with_frame(src, "frames/ok.png")
    ws = init_llm(tmp_path / "ws", units, base_url="http://x/v1", model="m",
                  media={"max_frame_bytes": 1 << 20, "max_pixels": 10_000})
    assert MediaOptions.from_agent(ws.config.agent, ws.root).max_pixels == 10_000
    ws.close()
    with pytest.raises(ValueError, match="max_pixels"):
        MediaOptions(max_pixels=0)
    with pytest.raises(ValueError, match="max_frame_bytes"):
        MediaOptions(max_frame_bytes=-1)
    png(src / "frames/ok.png", size=(200, 100))  # 20,000 pixels > a cap of 10,000
    with pytest.raises(ValueError, match=r"200x100 .*max_pixels 10000"):
        init_llm(tmp_path / "ws2", units, base_url="http://x/v1", model="m",
                 media={"max_pixels": 10_000})


# ---- MIME type from the format ----------------------------------------------------------


def _mime_and_format(uri: str) -> tuple[str, str]:
    head, b64 = uri.split(",", 1)
    with Image.open(io.BytesIO(base64.b64decode(b64))) as im:
        return head, im.format


def test_a_bmp_frame_is_sent_as_an_image_type_the_endpoint_accepts() -> None:
    buf = io.BytesIO()
    Image.new("RGB", (32, 16), (1, 2, 3)).save(buf, format="BMP")
    # Issue 19 #12: BMP went out as data:application/octet-stream
    assert _mime_and_format(data_uri(buf.getvalue(), 0)) == ("data:image/png;base64", "PNG")
    assert _mime_and_format(data_uri(buf.getvalue(), 8)) == ("data:image/png;base64", "PNG")


def test_the_mime_type_follows_the_bytes_not_the_name() -> None:
    for fmt, mime in (("PNG", "image/png"), ("JPEG", "image/jpeg"), ("GIF", "image/gif"),
                      ("WEBP", "image/webp")):
        buf = io.BytesIO()
        Image.new("RGB", (32, 16), (1, 2, 3)).save(buf, format=fmt)
        assert _mime_and_format(data_uri(buf.getvalue(), 0)) == (f"data:{mime};base64", fmt)


# ---- a step with broken frames -----------------------------------------------------------


def evolve(task_type: str, skill: str, body: dict[str, Any]) -> str:
    return f"```markdown\n{skill.rstrip()}\n- {HELPFUL_MARKER}\n```"


def run(ws: Workspace, target: RedisTarget, on_event: Any = None,
        concurrency: int = 4) -> StepResult:
    cache = ResponseCache(target.url, prefix=target.prefix)
    backend = llm_backend(ws, RunOptions(), cache=cache, api_key="k", env={}, retry=FAST,
                          on_event=on_event)
    options = RunOptions(concurrency=concurrency, guard=GuardParams(max_ratio=0.5))

    async def go() -> StepResult:
        try:
            cases = await rollout_cases(backend, ws, 1, 1)
            return await run_step(ws, 1, 1, infer=backend.infer, evolver=backend.evolver,
                                  cases=cases, options=options)
        finally:
            await backend.aclose()

    return asyncio.run(go())


@pytest.fixture
def server() -> Any:
    with MediaChatServer(evolve_reply=evolve) as srv:
        yield srv


def test_frames_broken_after_init_leave_their_units_out_of_the_ladder_with_a_note(
        tmp_path: Path, redis_target: RedisTarget, server: MediaChatServer) -> None:
    ws = init_llm(tmp_path / "ws", write_units(tmp_path), base_url=server.url, model="m",
                  seed=1)
    fr = tmp_path / "frames"
    broken = {"t0u03": "t0_u03_1.png", "t0u07": "t0_u07_0.png", "t0u11": "t0_u11_1.png",
              "t1u05": "t1_u05_0.png"}
    (fr / broken["t0u03"]).write_bytes(b"not an image at all")
    (fr / broken["t0u07"]).write_bytes(b'<svg xmlns="http://www.w3.org/2000/svg"/>')
    data = (fr / broken["t0u11"]).read_bytes()
    (fr / broken["t0u11"]).write_bytes(data[:len(data) // 2])  # truncated
    (fr / broken["t1u05"]).write_bytes(data[:8] + b"\x00" * 40)  # a PNG signature, no header
    res = run(ws, redis_target)
    assert server.requests and all(g.kind == "data" for got in server.received for g in got)
    assert set(res.decisions) == set(TYPES)  # both types were gated: the step went on
    notes = dict(ws.log.select("step_report", ["task_type", "note"], epoch=1, step=1))
    for unit, name in broken.items():
        t = TYPES[int(unit[1])]
        assert unit not in res.types[t].ladder
        assert f"{unit!r}" in notes[t] and f"frames/{name}" in notes[t], notes[t]
    used = {u for (u,) in ws.log.select("predictions", ["unit_id"])}
    assert not used & set(broken)
    ws.close()


def test_a_frame_deleted_while_the_gate_runs_is_infra_for_that_unit_only(
        tmp_path: Path, redis_target: RedisTarget, server: MediaChatServer) -> None:
    ws = init_llm(tmp_path / "ws", write_units(tmp_path), base_url=server.url, model="m",
                  seed=1)
    deleted: list[str] = []

    def on_event(ev: Any) -> None:  # at the first gate call, delete a frame of a later unit
        if ev.kind == "request" and "_gate_" in ev.run_id and not deleted:
            manifest = json.loads((ws.manifest_path(1, 1)).read_text())
            victim = manifest["inputs"]["ladders"][TYPES[0]][-1]
            name = f"t0_u{victim[3:]}_0.png"
            (tmp_path / "frames" / name).unlink()
            deleted.extend([victim, name])

    res = run(ws, redis_target, on_event=on_event, concurrency=1)
    victim, name = deleted
    assert set(res.decisions) == set(TYPES)
    rows = ws.log.select("predictions", ["unit_id", "arm", "infra", "error"],
                         task_type=TYPES[0])
    infra = {(u, a): e for u, a, i, e in rows if i}
    assert {u for u, _ in infra} == {victim}, rows  # the last ladder unit: always reached
    assert all(name in e and victim in e for e in infra.values()), infra
    assert not any(i for _, _, i, _ in ws.log.select(
        "predictions", ["unit_id", "arm", "infra", "error"], task_type=TYPES[1]))
    ws.close()
