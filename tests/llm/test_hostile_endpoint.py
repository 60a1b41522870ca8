"""Hostile endpoints (issue 27 #1): the probe a step makes before anything (``GET
/models``) ends within its own timeout and reads no body, whatever the server does (a
trickle, a never-ending body, a 50 MB error); a step against a server that never finishes its
answer's head exits 2 "unreachable" naming the URL."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
from test_backends import write_units

from vtrm_gate import cli
from vtrm_gate.errors import EndpointUnreachableError
from vtrm_gate.llm import check_endpoint, init_llm
from vtrm_gate.testing import ChatServer, Fault, RedisTarget


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fault", [
    Fault(trickle_s=1.0),  # the head at once, then the body one byte a second
    Fault(chunked_bytes=10**15),  # a chunked body that never ends
    Fault(status=500, message="x" * (50 << 20)),  # a 50 MB error body
], ids=["trickle", "endless", "huge-error"])
def test_the_probe_takes_the_head_as_proof_and_reads_no_body(chat_server: ChatServer,
                                                             fault: Fault) -> None:
    chat_server.probe_fault = fault
    check_endpoint(chat_server.url, timeout=10.0)  # any status proves the server is there
    assert chat_server.probes == 1
    if fault.chunked_bytes:  # the probe closed the connection: the server saw it leave
        assert chat_server.client_left.wait(10)


@pytest.mark.timeout(30)
def test_a_head_that_never_ends_is_unreachable_at_the_probe_timeout(
        chat_server: ChatServer) -> None:
    chat_server.probe_fault = Fault(trickle_s=0.05, trickle_head=True)
    with pytest.raises(EndpointUnreachableError,
                       match=rf"{chat_server.url} is unreachable \(no answer within 1 s"):
        check_endpoint(chat_server.url, timeout=1.0)


@pytest.mark.timeout(60)
def test_a_step_against_a_trickling_server_exits_2_unreachable_naming_it(
        tmp_path: Path, chat_server: ChatServer, redis_target: RedisTarget,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ws = init_llm(tmp_path / "ws", write_units(tmp_path / "u.jsonl"), base_url=chat_server.url,
                  model="m", seed=1)
    ws.close()
    before = {p: p.read_bytes() for p in ws.root.rglob("*") if p.is_file()}
    monkeypatch.setenv("REDIS_URL", redis_target.url)
    monkeypatch.setenv("VTRM_CACHE_PREFIX", redis_target.prefix)
    chat_server.probe_fault = Fault(trickle_s=0.05, trickle_head=True)
    code = cli.main(["step", "--workspace", str(ws.root), "--epoch", "1", "--step", "1",
                     "--timeout", "1", "--deadline", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"chat endpoint {chat_server.url} is unreachable" in err[0], err
    assert not chat_server.requests  # no chat call, nothing written
    assert {p: p.read_bytes() for p in ws.root.rglob("*") if p.is_file()
            and p.name != ".lock"} == {p: b for p, b in before.items() if p.name != ".lock"}


@pytest.mark.timeout(120)
def test_a_busy_server_that_answers_the_probe_late_is_waited_for_like_a_call(
        tmp_path: Path, chat_server: ChatServer, redis_target: RedisTarget,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """llama.cpp's single-slot server answers ``GET /models`` only between generations: a
    re-run started while it finished a call the killed run had sent was "unreachable (no
    answer within 5 s)" (a CI failure). The connection opens at once, so the probe waits
    for the head as long as one attempt would (``--timeout``), and the step runs."""
    ws = init_llm(tmp_path / "ws", write_units(tmp_path / "u.jsonl"), base_url=chat_server.url,
                  model="m", seed=1)
    ws.close()
    monkeypatch.setenv("REDIS_URL", redis_target.url)
    monkeypatch.setenv("VTRM_CACHE_PREFIX", redis_target.prefix)
    chat_server.probe_fault = Fault(sleep=6.0, status=404)  # busy for 6 s, then any answer
    code = cli.main(["step", "--workspace", str(ws.root), "--epoch", "1", "--step", "1",
                     "--timeout", "10"])
    assert code == 0, capsys.readouterr().err
    assert chat_server.probes == 1 and chat_server.requests


@pytest.mark.timeout(30)  # refused at once, never the minute the head may take
def test_a_refused_connection_is_unreachable_at_once_naming_the_url() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    with pytest.raises(EndpointUnreachableError, match=rf"{url} is unreachable \(ConnectError"):
        check_endpoint(url, timeout=60.0, connect_timeout=5.0)


@pytest.mark.timeout(120)
def test_a_retry_is_shown_on_stderr_without_a_deprecated_name(
        tmp_path: Path, chat_server: ChatServer, redis_target: RedisTarget,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's retry line read the event's deprecated ``step`` (a DeprecationWarning every
    retry, and an AttributeError once the name goes in 0.3.0); it reads ``call_kind``."""
    ws = init_llm(tmp_path / "ws", write_units(tmp_path / "u.jsonl"), base_url=chat_server.url,
                  model="m", seed=1)
    ws.close()
    monkeypatch.setenv("REDIS_URL", redis_target.url)
    monkeypatch.setenv("VTRM_CACHE_PREFIX", redis_target.prefix)
    chat_server.inject(Fault(status=503, retry_after="0", step="answer"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        code = cli.main(["step", "--workspace", str(ws.root), "--epoch", "1", "--step", "1"])
    err = capsys.readouterr().err
    assert code == 0, err
    [line] = [ln for ln in err.splitlines() if ln.startswith("[agent] ")]
    assert re.fullmatch(r"\[agent\] answer \S+ \(\S+\): retry 1 in \d+\.\ds: .*503.*", line), line
