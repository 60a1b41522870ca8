"""What the researcher sees matches what runs (issue 26 #4): ``vtrm-gate options`` shows the
budgets a run uses (never None for one with a default), and the prompt's task framing comes
from the workspace (``init --llm --task-description``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.llm.test_backends import write_units
from vtrm_gate.cli._main import main
from vtrm_gate.llm import init_llm
from vtrm_gate.options import resolve_options


def _options(ws: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, dict]:
    assert main(["options", "--workspace", str(ws), "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)["options"]


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # no .env here
    for k in ("THINK", "ANSWER", "EVOLVE"):
        monkeypatch.delenv(f"VTRM_MAX_TOKENS_{k}", raising=False)
    return tmp_path


def test_options_shows_the_effective_budgets_and_where_they_come_from(
        clean_env: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    units = write_units(clean_env / "units.jsonl")
    ws = init_llm(clean_env / "ws", units, base_url="http://127.0.0.1:9/v1", model="m")
    ws.close()
    opts = _options(clean_env / "ws", capsys)
    assert {k: opts[f"max_tokens_{k}"] for k in ("think", "answer", "evolve")} == {
        "think": {"value": 512, "source": "default"},
        "answer": {"value": 64, "source": "default"},
        "evolve": {"value": 2048, "source": "default"}}
    # the same numbers the run takes
    assert resolve_options(env={}, dotenv=None).max_tokens() == {
        "think": 512, "answer": 64, "evolve": 2048}
    monkeypatch.setenv("VTRM_MAX_TOKENS_ANSWER", "0")
    assert main(["options", "--workspace", str(clean_env / "ws")]) == 0
    text = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1] for line in text.splitlines()
            if line.startswith("max_tokens_")}
    assert rows == {"max_tokens_think": "512", "max_tokens_answer": "0",
                    "max_tokens_evolve": "2048"}


def test_a_workspace_budget_is_shown_as_the_workspaces(
        clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    units = write_units(clean_env / "units.jsonl")
    init_llm(clean_env / "ws", units, base_url="http://127.0.0.1:9/v1", model="m",
             max_tokens=100).close()
    opts = _options(clean_env / "ws", capsys, "--config", _conf(clean_env))
    assert opts["max_tokens_think"] == {"value": 100, "source": "workspace agent.max_tokens"}
    assert opts["max_tokens_answer"] == {"value": 16, "source": f"file {_conf(clean_env)}"}
    assert opts["max_tokens_evolve"] == {"value": 2048, "source": "default"}


def _conf(tmp: Path) -> str:
    p = tmp / "c.toml"
    p.write_text("max_tokens_answer = 16\n")
    return str(p)
