"""Hostile pass (h8): a re-run refused because its inputs changed tells a CLI user the
flag to pass (``--force``), not the Python keyword (``force=True``)."""

from __future__ import annotations

from pathlib import Path

from test_cli import cli


def test_refused_rerun_names_the_cli_flag(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    assert cli("init", str(ws), "--seed", "1").returncode == 0
    step = ("step", "--workspace", str(ws), "--epoch", "1", "--step", "1")
    assert cli(*step).returncode == 0
    conf = tmp_path / "c.toml"
    conf.write_text("[gate]\nn_max = 12\n")
    r = cli(*step, "--config", str(conf))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "n_max" in r.stderr and "--force" in r.stderr and "force=True" not in r.stderr
    r = cli(*step, "--config", str(conf), "--force")
    assert r.returncode == 0, r.stderr
