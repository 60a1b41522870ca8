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
