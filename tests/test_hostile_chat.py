"""Hostile pass (h8): a chat endpoint that answers with a redirect (``http://`` behind an
``https://`` redirect, a moved API) is an INFRA error at once naming the target, not a
'malformed JSON body' retried until the attempts run out."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_llm import FAST, UNITS

from vtrm_gate.llm import LLMAgent, LLMInfraError


@pytest.fixture
def redirecting() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(308)
            self.send_header("Location", "https://bob:hunter2@127.0.0.1:9/v1/chat/completions")
            self.send_header("Content-Length", "0")
            self.end_headers()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_redirect_is_infra_at_once_naming_the_target(redirecting: str) -> None:
    a = LLMAgent(UNITS, base_url=redirecting, model="m", retry=FAST, rng=random.Random(0))

    async def go() -> None:
        try:
            await a.chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        finally:
            await a.aclose()

    with pytest.raises(LLMInfraError) as err:
        asyncio.run(go())
    assert a.http_requests == 1  # a redirect is not transient: no retries
    msg = str(err.value)
    assert "308" in msg and "redirect" in msg and "https://bob:***@127.0.0.1:9/v1" in msg
    assert "hunter2" not in msg
