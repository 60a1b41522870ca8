"""Hostile pass (h8): bad bytes in the files a user hands the CLI are named, exit 2, and
nothing is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vtrm_gate._env import read_dotenv
from vtrm_gate.options import resolve_options

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "vtrm_gate", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=240, env=env)


def test_dotenv_with_bad_bytes_names_the_file(tmp_path):
    dotenv = tmp_path / ".env"
    dotenv.write_bytes(b"VTRM_CONCURRENCY=4\nX=\xff\xfe\n")
    with pytest.raises(ValueError, match=r"\.env.*not UTF-8.*byte 21"):
        read_dotenv(dotenv)
    with pytest.raises(ValueError, match=r"\.env.*not UTF-8"):
        resolve_options(env={}, dotenv=dotenv)


def test_step_with_a_bad_dotenv_exits_2_naming_it_and_writes_nothing(tmp_path):
    assert cli("init", "ws", cwd=tmp_path).returncode == 0
    before = sorted(p.name for p in (tmp_path / "ws").iterdir())
    (tmp_path / ".env").write_bytes(b"X=\xff\n")
    r = cli("step", "--workspace", "ws", "--epoch", "1", "--step", "1", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert ".env" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in (tmp_path / "ws").iterdir()) == before
    assert not (tmp_path / "ws" / "manifests").exists() or \
        not list((tmp_path / "ws" / "manifests").iterdir())


_UNIT = ('{"unit_id": "u%d", "task_type": "时间推理", "question": "视频里发生了什么？", '
         '"options": ["甲", "乙"], "answer": "A"}\n')


@pytest.mark.parametrize("encoding, said", [
    ("gbk", "it reads as GB18030 / GBK (Chinese Windows' default): save it as UTF-8"),
    ("utf-16", "it is UTF-16 (Windows' \"Unicode\"): save it as UTF-8"),
    ("latin-1", "(invalid continuation byte at byte 0): save it as UTF-8")])
def test_a_file_saved_in_a_windows_encoding_is_told_which_and_what_to_do(
        tmp_path, encoding, said):
    """Hostile pass (h13): a units file or a skill saved by Notepad or Excel on Chinese
    Windows (GBK) said only "not UTF-8 text (invalid start byte)"."""
    units = tmp_path / "units.jsonl"
    text = "".join(_UNIT % i for i in range(4))
    units.write_bytes((text if encoding != "latin-1" else "\u00e9" + text[1:])
                      .encode(encoding, errors="replace"))
    r = cli("init", "ws", "--llm", "--units", str(units), "--base-url",
            "http://127.0.0.1:9/v1", "--model", "m", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "units.jsonl: not UTF-8 text" in r.stderr and said in r.stderr, r.stderr
    assert not (tmp_path / "ws").exists()


def test_a_skill_saved_as_gbk_is_named_with_its_encoding(tmp_path):
    units = tmp_path / "units.jsonl"
    units.write_text("".join(_UNIT % i for i in range(4)), encoding="utf-8")
    skills = tmp_path / "skills"
    skills.mkdir()
    (skills / "时间推理.md").write_bytes("# 时间推理\n先看完整个视频。\n".encode("gbk"))
    r = cli("init", "ws", "--llm", "--units", str(units), "--skills", str(skills),
            "--base-url", "http://127.0.0.1:9/v1", "--model", "m", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "时间推理.md: not UTF-8 text" in r.stderr and "GB18030 / GBK" in r.stderr, r.stderr
