"""Hostile pass (h8): a credential put in the chat endpoint URL (``user:pass@`` or a
``?api_key=`` query) is refused at ``init`` instead of being written to workspace.json and
every manifest (and sent as Basic auth in place of the API key)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_backends import cli, evolve_reply, write_units

from vtrm_gate.errors import ConfigError
from vtrm_gate.llm import LLMAgent, init_llm
from vtrm_gate.testing import ChatServer
from vtrm_gate.testing.chat import ToolChatServer


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


@pytest.mark.parametrize("backend", ["llm", "vtrm_gate.llm:tool_backend"])
def test_a_base_url_with_a_query_keeps_it_after_each_path(tmp_path: Path, backend: str):
    """Hostile pass (h23): ``--base-url http://h/v1?api-version=…`` was taken, then every
    call went to ``/v1?api-version=…/chat/completions``: a 404 each, the step INFRA."""
    query = "api-version=2024-06-01"
    with (ChatServer if backend == "llm" else ToolChatServer)() as server:
        server.evolve_reply = evolve_reply
        url = f"{server.url}?{query}"
        ws = tmp_path / "ws"
        # the tool backend reads its URL from VTRM_BASE_URL (init refuses --base-url with
        # --backend: it was dropped without a word)
        made = ["--llm", "--base-url", url] if backend == "llm" else [
            "--llm", "--backend", backend]
        r = cli("init", str(ws), *made, "--units", str(write_units(tmp_path / "u.jsonl")),
                "--model", "m", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        r = cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "1", cwd=tmp_path,
                env={"VTRM_BASE_URL": url, "VTRM_MODEL": "m"})
        assert r.returncode == 0, r.stderr
        assert server.requests and set(server.queries) == {query}


@pytest.mark.parametrize("key, said", [
    ("\u201csk-hunter2\u201d", "character 1 of 12 is U+201C (a curly quote)"),
    ("sk-hunter2\u00a0", "character 11 of 11 is U+00A0 (a non-breaking space)"),
    ("sk-hunter2 x", "character 11 of 12 is U+0020 (a space)"),
    ("sk-hunter2\u6d4b", "character 11 of 11 is U+6D4B,"),
    ('"sk-hunter2"', "characters 1 and 12 of 12 are quotes around the key"),
    ("'sk-hunter2'", "characters 1 and 12 of 12 are quotes around the key")])
def test_an_api_key_no_header_can_carry_exits_2_naming_the_variable_not_the_key(
        tmp_path: Path, chat_server: ChatServer, key: str, said: str) -> None:
    """Hostile pass (h13): a key pasted with curly quotes or a non-breaking space ended the
    step with "this is a bug in vtrm_gate" and httpx's UnicodeEncodeError traceback (the
    Authorization header is ASCII). Now it exits 2 before any request, naming the variable
    and the character's place, never the key."""
    chat_server.evolve_reply = evolve_reply
    ws = tmp_path / "ws"
    assert cli("init", str(ws), "--llm", "--units", str(write_units(tmp_path / "u.jsonl")),
               "--base-url", chat_server.url, "--model", "m", cwd=tmp_path).returncode == 0
    before = {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()}
    r = cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "1", cwd=tmp_path,
            env={"OPENAI_API_KEY": key})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"OPENAI_API_KEY: {said}" in r.stderr and "hunter2" not in r.stderr + r.stdout
    assert not chat_server.requests
    assert {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()} == before
    with pytest.raises(ConfigError, match=r"LLMAgent\(api_key=\): character"):
        LLMAgent({}, base_url=chat_server.url, model="m", api_key=key)
