"""Hostile pass (h13): question types named in another script. "时间推理" was refused at
`init` as having "no letters or digits to name it by"; a name with no ASCII letter or digit
now names its files and run ids by its own letters, through a whole step, its re-run, the
status, the replay and the export. Names with an ASCII letter keep the slug they had."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from test_backends import cli, cli_env, cli_init, rerunnable_step, unit_line

from vtrm_gate import slugify
from vtrm_gate._ids import slug_clash
from vtrm_gate.cli._table import text_width
from vtrm_gate.errors import InputError
from vtrm_gate.testing import ChatServer, RedisTarget
from vtrm_gate.testing.chat import HELPFUL_MARKER

TYPES = {"时间推理": (24, lambda i: i % 4), "Подсчёт объектов": (12, lambda i: 1 + i % 3),
         "OCR Problems": (9, lambda i: 0)}


def _units(path: Path) -> Path:
    lines = [json.dumps(unit_line(t, i, pos(i)), ensure_ascii=False)
             for t, (n, pos) in TYPES.items() for i in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _helpful(task_type: str, skill: str, body: dict) -> str:
    return f"```markdown\n{skill.rstrip()}\n- {HELPFUL_MARKER}\n```"


def test_slugs_of_names_in_other_scripts_and_the_ones_that_stay() -> None:
    assert slugify("时间推理") == "时间推理"
    assert slugify("Подсчёт  объектов!") == "подсчёт-объектов"
    assert slugify("Café scene") == "caf-scene"  # an ASCII letter: the slug it always had
    assert slugify("\u1112\u1161\u11ab") == slugify("한") == "한"  # one spelling (NFC)
    assert slugify("ΛΌΓΟΣ") == slugify("λόγος") == "λόγοσ"  # one file on macOS (APFS)
    assert "two Unicode spellings" in slug_clash("\u1112\u1161\u11ab", "한")
    assert "differ only in case" in slug_clash("Время", "время")
    assert slugify("Action Reasoning") == "action-reasoning"
    with pytest.raises(InputError, match="no letters or digits"):
        slugify("_ — _")
    with pytest.raises(InputError, match="by 123 bytes, at most 120"):
        slugify("时" * 41)  # 41 characters, 3 bytes each: a file name counts bytes
    assert slugify("时" * 40) == "时" * 40


@pytest.mark.parametrize(("a", "b", "said"), [
    ("\u00e9cole", "e\u0301cole", "one name in two Unicode spellings"),
    ("abc", "ab\u200bc", "look alike"),
    ("OCR", "\uff2f\uff23\uff32", "look alike")])
def test_two_type_names_that_look_the_same_are_refused(a: str, b: str, said: str) -> None:
    """"école" composed and decomposed were two types (slugs "cole" and "e-cole") shown as
    two identical rows; a zero-width space or full-width letters did the same."""
    from vtrm_gate._ids import type_slugs

    with pytest.raises(InputError, match=said):
        type_slugs([a, b])


def test_a_workspace_of_types_named_in_other_scripts_runs_a_step_and_its_rerun(
        tmp_path: Path, chat_server: ChatServer, redis_target: RedisTarget) -> None:
    chat_server.evolve_reply = _helpful
    ws = tmp_path / "ws"
    cli_init(ws, _units(tmp_path / "units.jsonl"), chat_server, tmp_path)
    assert {p.name for p in (ws / "skills").glob("*.md")} >= {
        "时间推理.md", "подсчёт-объектов.md", "ocr-problems.md"}
    env = cli_env(redis_target, COLUMNS="200")
    step = rerunnable_step(ws)
    r = cli(*step, "--json", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    actions = {t["task_type"]: t["action"] for t in out["types"]}
    assert actions["时间推理"] == "ACCEPT" and actions["OCR Problems"] is None
    assert "e1_s1_gate_时间推理_cand" in out["llm_cache"]["runs"]
    assert "e1_s1_rollout_подсчёт-объектов" in out["llm_cache"]["runs"]
    assert HELPFUL_MARKER in (ws / "skills" / "时间推理.md").read_text(encoding="utf-8")
    assert (ws / "history" / "时间推理" / "v2.md").is_file()
    n = len(chat_server.requests)
    r = cli(*step, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert len(chat_server.requests) == n  # the re-run is served from Redis
    assert "时间推理" in r.stdout
    rates = [ln for ln in r.stdout.splitlines() if " hit rate " in ln]
    assert any("时间推理" in ln for ln in rates)
    assert len({text_width(ln[:ln.index(" hit rate ")]) for ln in rates}) == 1, rates
    for cmd in (("status", "--workspace", str(ws)),
                ("replay", "--workspace", str(ws), "--epoch", "1", "--step", "1"),
                ("export", "--workspace", str(ws), "--out", str(tmp_path / "out"))):
        r = cli(*cmd, cwd=tmp_path, env=env)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (cmd, r.stderr)
        assert "时间推理" in r.stdout or cmd[0] == "export", (cmd, r.stdout)
    evidence = pl.read_parquet(tmp_path / "out" / "gate_evidence.parquet")
    assert {"时间推理", "Подсчёт объектов"} <= set(evidence["task_type"])


def test_types_whose_ascii_parts_meet_are_told_why_they_clash(tmp_path: Path) -> None:
    """"OCR 问题" and "OCR 识别" are both 'ocr' on disk (a name with an ASCII letter keeps
    its ASCII slug); the refusal said they "differ only in case or punctuation"."""
    units = tmp_path / "units.jsonl"
    lines = [unit_line(t, i, 0) | {"unit_id": f"{k}-{i}"}
             for k, t in enumerate(("OCR 问题", "OCR 识别")) for i in range(3)]
    units.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines),
                     encoding="utf-8")
    r = cli("init", str(tmp_path / "ws"), "--llm", "--units", str(units), "--base-url",
            "http://127.0.0.1:9/v1", "--model", "m", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "'OCR 问题' and 'OCR 识别' are both named 'ocr' on disk" in r.stderr
    assert "differ only in case" not in r.stderr
    assert not (tmp_path / "ws").exists()


def test_an_answer_typed_as_a_full_width_letter_is_read_as_its_letter(tmp_path: Path) -> None:
    """Hostile pass (h13): a Chinese input method types "Ｂ" (U+FF22); the units file was
    refused with "answer must be one letter of 'AB', got 'Ｂ'", a message that looks like
    it refuses a B. Full-width and other compatibility letters are read as their letter."""
    from vtrm_gate.harness import read_units

    units = tmp_path / "units.jsonl"
    units.write_text("".join(json.dumps(unit_line("时间推理", i, 0) | {"answer": a},
                                        ensure_ascii=False) + "\n"
                             for i, a in enumerate(("Ｂ", "ｃ", " Ａ "))), encoding="utf-8")
    assert [u.answer for u in read_units(units).values()] == ["B", "C", "A"]
    assert read_units(str(units)) == read_units(units)  # a notebook's text path ('str'
    # object has no attribute 'is_file')
    units.write_text(json.dumps(unit_line("时间推理", 0, 0) | {"answer": "Ｚ"},
                                ensure_ascii=False) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="answer must be one letter of 'ABCD', got 'Ｚ'"):
        read_units(units)
