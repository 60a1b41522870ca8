"""The CLI's one error boundary: every expected failure is exit 2 and one line, no traceback;
readers work on a read-only workspace."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "vtrm_gate", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=240, env={**os.environ, "REDIS_URL": ""})


def one_line_exit_2(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr


@pytest.fixture(scope="module")
def stepped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("errors") / "ws"
    assert cli("init", str(ws), "--seed", "3").returncode == 0
    r = cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "1")
    assert r.returncode == 0, r.stderr
    return ws


def files_of(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != ".lock"}


@pytest.mark.parametrize("config,fragment", [
    (b'concurrency = "\xff\xfe"\n', "is not UTF-8 text"),
    (b"redis_url = 123\n", "redis_url must be a string"),
    (b'redis_url = ["redis://localhost"]\n', "redis_url must be a string"),
    (b'[gate]\ne_confirm = "x"\n', "e_confirm"),
])
def test_a_bad_config_file_is_one_line(stepped: Path, tmp_path: Path, config: bytes,
                                       fragment: str) -> None:
    cfg = tmp_path / "gate.toml"
    cfg.write_bytes(config)
    before = files_of(stepped)
    r = cli("step", "--workspace", str(stepped), "--epoch", "1", "--step", "2", "--config",
            str(cfg))
    assert fragment in one_line_exit_2(r)
    assert files_of(stepped) == before


@pytest.mark.parametrize("args,fragment", [
    (["step", "--epoch", "99999999999999999999999", "--step", "1"], "--epoch"),
    (["step", "--epoch", "1", "--step", "1", "--time-scale", "nan"], "--time-scale"),
    (["step", "--epoch", "1", "--step", "1", "--time-scale", "inf"], "--time-scale"),
    (["replay", "--epoch", "1", "--step", "99999999999999999999999"], "--step"),
])
def test_out_of_range_numbers_are_one_line(stepped: Path, args: list[str],
                                           fragment: str) -> None:
    r = cli(args[0], "--workspace", str(stepped), *args[1:])
    assert r.returncode == 2 and fragment in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("rate", ["2", "nan", "-0.1", "1", "inf"])
def test_init_refuses_a_bad_infra_rate_and_writes_nothing(tmp_path: Path, rate: str) -> None:
    r = cli("init", str(tmp_path / "ws"), "--infra-rate", rate)
    assert r.returncode == 2 and "--infra-rate" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "ws").exists()


def test_a_corrupt_sqlite_file_is_one_line_naming_the_file(stepped: Path,
                                                           tmp_path: Path) -> None:
    """A damaged log is named (the message said only "SQLite: database disk image is
    malformed", with no file) and nothing else is touched."""
    ws = tmp_path / "ws"
    shutil.copytree(stepped, ws)
    log = ws / "harness.sqlite"
    log.write_bytes(b"SQLite format 3\x00" + b"\x07" * 4096)
    for args in (["replay"], ["step"]):
        r = cli(*args, "--workspace", str(ws), "--epoch", "1", "--step", "1")
        assert f"{log}: file is not a database (SQLITE_NOTADB)" in one_line_exit_2(r)
    damaged = tmp_path / "damaged"  # a valid header, then bad bytes in its pages
    shutil.copytree(stepped, damaged)
    for f in damaged.glob("harness.sqlite-*"):
        f.unlink()
    raw = bytearray((stepped / "harness.sqlite").read_bytes())
    raw[100:300] = bytes(range(200))
    (damaged / "harness.sqlite").write_bytes(raw)
    before = {p.name: p.read_bytes() for p in damaged.rglob("*.json")}
    for args in (["status"], ["step", "--epoch", "1", "--step", "2"]):
        r = cli(*args, "--workspace", str(damaged))
        assert f"{damaged / 'harness.sqlite'}: database disk image is malformed " \
               f"(SQLITE_CORRUPT)" in one_line_exit_2(r)
    assert {p.name: p.read_bytes() for p in damaged.rglob("*.json")} == before


def _read_only(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI with ``ws`` mounted read-only (a private mount namespace), or with its
    write permission removed when not root."""
    cmd = [PY, "-m", "vtrm_gate", *args]
    if os.geteuid() != 0:
        for p in [ws, *ws.rglob("*")]:
            p.chmod(p.stat().st_mode & ~0o222)
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=240)
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs a private mount namespace (unshare -m) to mount read-only")
    script = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && '
              'exec "$@"')
    return subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", str(ws), *cmd],
                          capture_output=True, text=True, cwd=ROOT, timeout=240)


def test_replay_works_on_a_read_only_workspace_and_step_is_one_line(
        stepped: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(stepped, ws)
    r = _read_only(ws, "replay", "--workspace", str(ws), "--epoch", "1", "--step", "1",
                   "--json")
    assert r.returncode == 0, r.stderr
    assert '"prefix_matches_live": true' in r.stdout
    r = _read_only(ws, "step", "--workspace", str(ws), "--epoch", "1", "--step", "2")
    err = one_line_exit_2(r)
    assert "Read-only file system" in err or "Permission denied" in err
