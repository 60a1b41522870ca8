"""Hostile pass (h13): a path written with ``~`` in a notebook. ``init_simulated("~/ws")``
made a directory named "~" in the working directory (one ``rm -rf ~`` from losing a home),
and ``open_workspace("~/ws")`` said there was no such workspace; pandas and polars expand
``~``, and so does every path vtrm_gate takes now."""

from __future__ import annotations

from pathlib import Path

import pytest

from vtrm_gate import open_workspace, read_outcomes, write_outcomes
from vtrm_gate.harness import OutcomesError, Workspace
from vtrm_gate.sim import init_simulated
from vtrm_gate.views import WorkspaceView


def test_a_tilde_path_is_the_home_directory_everywhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    init_simulated("~/ws").close()
    assert (home / "ws" / "workspace.json").is_file()
    assert not any(cwd.iterdir())  # no directory named "~"
    with open_workspace("~/ws") as view:
        assert view.root == home / "ws" and view.decisions.height == 0
    with WorkspaceView("~/ws") as view:  # a path, not only an opened Workspace
        assert "WorkspaceView" in repr(view) and view.decisions.height == 0
    Workspace.open("~/ws").close()
    with pytest.raises(OutcomesError, match="no gated step to write"):  # no gate yet
        write_outcomes("~/ws", "~/gates.csv")
    (home / "log.csv").write_text("epoch,step,task_type,unit_id,ladder_rank,base_correct,"
                                  "cand_correct,infra\n1,1,OCR,u1,0,0,1,0\n")
    assert read_outcomes("~/log.csv").height == 1
    out = write_outcomes(read_outcomes("~/log.csv"), "~/gates.csv")
    assert out == home / "gates.csv" and read_outcomes("~/gates.csv").height == 1
    assert not any(cwd.iterdir())
