"""Hostile pass (h8): a credential put in the chat endpoint URL (``user:pass@`` or a
``?api_key=`` query) is refused at ``init`` instead of being written to workspace.json and
every manifest (and sent as Basic auth in place of the API key)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_backends import cli, write_units

from vtrm_gate.llm import init_llm


@pytest.mark.parametrize("url", [
    "http://bob:hunter2@127.0.0.1:9/v1",
    "http://hunter2@127.0.0.1:9/v1",
    "https://api.example.com/v1?api_key=hunter2",
    "https://api.example.com/v1?key=x&Api-Key=hunter2",
])
def test_credentials_in_the_base_url_are_refused_and_not_written(tmp_path: Path, url: str):
    units = write_units(tmp_path / "units.jsonl")
    r = cli("init", "ws", "--llm", "--units", str(units), "--base-url", url, "--model", "m",
            cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "hunter2" not in r.stderr + r.stdout
    assert "credential" in r.stderr and "OPENAI_API_KEY" in r.stderr
    assert not (tmp_path / "ws").exists() or not any(
        b"hunter2" in p.read_bytes() for p in (tmp_path / "ws").rglob("*") if p.is_file())
    with pytest.raises(ValueError, match="credential"):
        init_llm(tmp_path / "ws2", units, base_url=url, model="m")


def test_a_plain_query_is_still_accepted(tmp_path: Path):
    units = write_units(tmp_path / "units.jsonl")
    ws = init_llm(tmp_path / "ws", units, model="m",
                            base_url="https://x.openai.azure.com/openai?api-version=2024-06-01")
    assert ws.config.agent["base_url"].endswith("api-version=2024-06-01")
    ws.close()
