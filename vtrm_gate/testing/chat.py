"""A real local ``/v1/chat/completions`` server for tests (deterministic answers, injected
faults, usage fields), plus the ``chat_server`` fixture. Used by the agent, evolver and
backend tests, in process and against the ``vtrm-gate`` command run as a subprocess."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ..cache import RUN_HEADER, header_run_id
from ..llm import EVOLVE_PREFIX, THINK_PROMPT

EvolveReply = Callable[[str, str, dict[str, Any]], str]
"""``reply(task_type, current_skill, body) -> reply text`` of an evolution request."""

HELPFUL_MARKER = "strategy: longest"


def append_marker(task_type: str, current_skill: str, body: dict[str, Any]) -> str:
    """The default evolution reply: the current skill plus the helpful marker, fenced."""
    return f"```markdown\n{current_skill.rstrip()}\n- {HELPFUL_MARKER}\n```"


@dataclass(frozen=True)
class Fault:
    """What the server does to the next matching request instead of answering at once."""

    status: int | None = None
    retry_after: str | None = None
    sleep: float = 0.0
    body: str | None = None
    step: str | None = None  # "think" / "answer" / None = any
    echo_auth: bool = False  # the error body repeats the request's credential headers
    trickle_s: float = 0.0  # send a 200's body one byte every trickle_s seconds
    trickle_head: bool = False  # with trickle_s: the status line and headers trickle too
    chunked_bytes: int = 0  # send a 200 with a chunked body of this many bytes
    gzip: bool = False  # answer normally, gzip-encoded (Content-Encoding: gzip)
    raw: bytes | None = None  # a 200 with exactly these body bytes, sent with ``encoding``
    encoding: str = ""  # the Content-Encoding of a ``raw`` reply (e.g. "gzip, gzip")
    content_type: str = "application/json"  # of a 200 with ``body`` (text/html: a portal)
    message: str = "injected"  # the error message of a ``status`` reply


class ChatServer:
    """A deterministic ``/v1/chat/completions`` endpoint on 127.0.0.1.

    Answer rule, read from the skill (system message): ``strategy: longest`` picks the
    longest option, ``strategy: last`` the last one, otherwise A. ``mode: empty`` /
    ``mode: filter`` / ``mode: ramble`` return empty choices / a content-filtered choice / an
    unparseable answer. An evolution request (`vtrm_gate.llm.LLMEvolver`'s prompt) is
    answered by ``evolve_reply(task_type, current_skill, body)`` (default: the current skill
    plus ``strategy: longest``, so the candidate is helpful where the longest option is right).

    Every POST body is kept in ``requests`` (its Authorization header in ``auth``, the run
    its caller named, ``X-Vtrm-Run`` %-decoded, in ``run_ids``: "" for none);
    ``in_flight`` / ``peak_in_flight`` count the requests being handled at once, and
    ``hold_until(n)`` makes requests wait until ``n`` are in flight together (a concurrency
    property measured without a clock). ``GET /v1/models`` (the endpoint probe) lists one
    model, or suffers ``probe_fault``: a trickle, a never-ending body, a huge error.
    """

    def __init__(self, evolve_reply: EvolveReply = append_marker) -> None:
        self.evolve_reply = evolve_reply
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.accept_encoding: list[str | None] = []
        self.queries: list[str] = []
        """The query string of every request, /models probes included ("" for none)."""
        self.run_ids: list[str] = []
        self.faults: deque[Fault] = deque()
        self.probe_fault: Fault | None = None
        self.echo: Callable[[str], str] | None = None
        """``echo(authorization header)``: text appended to every think/answer reply (a
        server that repeats the caller's credential inside a normal 200)."""
        self.probes = 0
        self.lock = threading.Lock()
        self.in_flight = 0
        self.peak_in_flight = 0
        self.body_bytes_sent = 0
        """Bytes of trickled / chunked bodies written so far (all faults together)."""
        self.client_left = threading.Event()
        """Set when a trickled or chunked body could not be written: the client closed."""
        self._held = threading.Condition(self.lock)
        self._hold_n, self._hold_timeout = 0, 0.0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                outer.handle(self)

            def do_GET(self) -> None:
                outer.probe(self)

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # the default backlog of 5 would throttle the client

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,),
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def start(self) -> ChatServer:
        self.thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> ChatServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def of_step(self, step: str) -> list[dict[str, Any]]:
        """The requests of one step kind: ``think``, ``answer`` or ``evolve``."""
        with self.lock:
            return [r for r in self.requests if self.step_of(r) == step]

    def inject(self, *faults: Fault) -> None:
        with self.lock:
            self.faults.extend(faults)

    def hold_until(self, n: int, timeout: float = 30.0) -> None:
        """Make requests wait until ``n`` are in flight together (or ``timeout`` passes: a
        safety net, so a client with a hidden cap fails a test instead of hanging it)."""
        self._hold_n, self._hold_timeout = n, timeout

    def steps(self) -> list[str]:
        return [self.step_of(r) for r in self.requests]

    @staticmethod
    def step_of(body: dict[str, Any]) -> str:
        if body["messages"][0]["content"].startswith(EVOLVE_PREFIX):
            return "evolve"
        return "think" if THINK_PROMPT in str(body["messages"][-1].get("content")) \
            else "answer"

    def _fault_for(self, step: str) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.step in (None, step):
                    self.faults.remove(f)
                    return f
        return None

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        with self.lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            self._held.notify_all()
            # released for good once n were in flight together
            if self._hold_n and self._held.wait_for(
                    lambda: self.peak_in_flight >= self._hold_n, self._hold_timeout):
                self._hold_n = 0
        try:
            self._handle(h)
        finally:
            with self.lock:
                self.in_flight -= 1

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        n = int(h.headers.get("content-length", 0))
        body = json.loads(h.rfile.read(n))
        path, _, query = h.path.partition("?")
        with self.lock:
            self.queries.append(query)
        if path != "/v1/chat/completions":
            return self.reply(h, 404, {"error": {"message": f"no route {h.path}"}})
        with self.lock:
            self.requests.append(body)
            self.auth.append(h.headers.get("authorization"))
            self.accept_encoding.append(h.headers.get("accept-encoding"))
            self.run_ids.append(header_run_id(h.headers.get(RUN_HEADER)))
        step = self.step_of(body)
        fault = self._fault_for(step)
        if fault is not None:
            return self.suffer(h, fault, body, step)
        doc = self.answer(body, step)
        if self.echo is not None and step != "evolve" and doc["choices"]:
            doc["choices"][0]["message"]["content"] += self.echo(
                h.headers.get("authorization") or "")
        return self.reply(h, 200, doc)

    def probe(self, h: BaseHTTPRequestHandler) -> None:
        """``GET .../models``: one model listed, or ``probe_fault`` suffered."""
        with self.lock:
            self.probes += 1
        path, _, query = h.path.partition("?")
        with self.lock:
            self.queries.append(query)
        if not path.endswith("/models"):
            return self.reply(h, 404, {"error": {"message": f"no route {h.path}"}})
        if self.probe_fault is not None:
            return self.suffer(h, self.probe_fault, None, None)
        return self.reply(h, 200, {"object": "list", "data": [{"id": "m", "object": "model"}]})

    def suffer(self, h: BaseHTTPRequestHandler, fault: Fault, body: dict[str, Any] | None,
               step: str | None) -> None:
        """Answer with ``fault`` (``body``/``step``: the chat request, None for a probe)."""
        if fault.sleep:
            time.sleep(fault.sleep)
        if fault.status is not None:
            headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
            error: dict[str, Any] = {"message": fault.message}
            if fault.echo_auth:  # as some gateways do: the credential in the error text
                auth, key = h.headers.get("authorization"), h.headers.get("api-key")
                error = {"message": f"invalid credentials: Authorization: {auth}; "
                                    f"api-key={key}",
                         "request_headers": {"authorization": auth, "api-key": key}}
            return self.reply(h, fault.status, {"error": error}, headers)
        if fault.trickle_s or fault.chunked_bytes:
            return self.stream(h, fault)
        if fault.raw is not None:
            encoded = {"Content-Encoding": fault.encoding} if fault.encoding else {}
            return self.reply_raw(h, 200, fault.raw, encoded)
        if fault.body is not None:
            return self.reply_raw(h, 200, fault.body.encode(),
                                  {"Content-Type": fault.content_type})
        if fault.gzip and body is not None and step is not None:
            data = gzip.compress(json.dumps(self.answer(body, step)).encode())
            return self.reply_raw(h, 200, data, {"Content-Encoding": "gzip"})
        if body is not None and step is not None:
            return self.reply(h, 200, self.answer(body, step))
        return self.reply(h, 200, {"object": "list", "data": []})

    def evolution(self, body: dict[str, Any]) -> str:
        """The reply text to an evolution request (see ``evolve_reply``)."""
        prompt = body["messages"][-1]["content"]
        m = re.search(r"^Question type: (.*)$", prompt, flags=re.M)
        skill = re.search(r"<current_skill>\n(.*?)\n</current_skill>", prompt, flags=re.S)
        return self.evolve_reply(m.group(1) if m else "", skill.group(1) if skill else "",
                                 body)

    def answer(self, body: dict[str, Any], step: str) -> dict[str, Any]:
        if step == "evolve":
            return self.completion(body, self.evolution(body))
        skill = body["messages"][0]["content"]
        question = body["messages"][1]["content"]
        options = re.findall(r"^([A-Z])\. (.*)$", question, flags=re.M)
        finish = "stop"
        if "mode: empty" in skill:
            return {"id": "x", "object": "chat.completion", "choices": [], "usage": {}}
        if step == "think":
            text = f"Let me weigh the {len(options)} options."
        elif "mode: filter" in skill:
            text, finish = "", "content_filter"
        elif "mode: ramble" in skill:
            text = "I cannot decide between them."
        elif "strategy: longest" in skill:
            text = f"The answer is ({max(options, key=lambda o: len(o[1]))[0]})."
        elif "strategy: last" in skill:
            text = options[-1][0]
        else:
            text = "A"
        return self.completion(body, text, finish)

    def completion(self, body: dict[str, Any], text: str,
                   finish: str = "stop") -> dict[str, Any]:
        """A chat.completion document carrying ``text``, with usage counted in words."""
        prompt_tokens = sum(len(str(m.get("content") or "").split()) for m in body["messages"])
        completion_tokens = len(text.split())
        return {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion",
                "created": int(time.time()), "model": body["model"],
                "choices": [{"index": 0, "finish_reason": finish,
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": prompt_tokens,
                          "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}}

    def stream(self, h: BaseHTTPRequestHandler, fault: Fault) -> None:
        """A 200 whose body trickles or never seems to end; stops when the client leaves."""
        chunk = 64 * 1024
        try:
            if fault.trickle_head:  # byte by byte, headers included
                for byte in (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"X-Padding: " + b"x" * 100_000):
                    time.sleep(fault.trickle_s)
                    h.wfile.write(bytes([byte]))
                    h.wfile.flush()
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            if fault.trickle_s:
                h.send_header("Content-Length", "1000000")
            else:
                h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            h.wfile.flush()
            sent = 0
            while fault.trickle_s or sent < fault.chunked_bytes:
                if fault.trickle_s:
                    time.sleep(fault.trickle_s)
                    h.wfile.write(b" ")
                    n = 1
                else:
                    n = min(chunk, fault.chunked_bytes - sent)
                    h.wfile.write(b"%x\r\n" % n + b" " * n + b"\r\n")
                h.wfile.flush()
                sent += n
                with self.lock:
                    self.body_bytes_sent += n
            h.wfile.write(b"0\r\n\r\n")
        except OSError:  # BrokenPipe / ConnectionReset: the client closed the connection
            self.client_left.set()
        h.close_connection = True

    def reply(self, h: BaseHTTPRequestHandler, status: int, doc: Any,
              headers: dict[str, str] | None = None) -> None:
        self.reply_raw(h, status, json.dumps(doc).encode(), headers)

    @staticmethod
    def reply_raw(h: BaseHTTPRequestHandler, status: int, data: bytes,
                  headers: dict[str, str] | None = None) -> None:
        try:
            h.send_response(status)
            h.send_header("Content-Length", str(len(data)))
            for k, v in {"Content-Type": "application/json", **(headers or {})}.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out and left


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    """A fresh `ChatServer` on a free local port, stopped after the test."""
    with ChatServer() as server:
        yield server




class ToolChatServer(ChatServer):
    """A scripted multi-turn function-calling model (for `vtrm_gate.llm.ToolAgent`).

    A unit's trajectory is deterministic (but for its tool-call ids, new on every request as
    a real server's are, so a turn asked again changes every later turn): it succeeds when
    the sha256 of its options falls below the skill's strength (``strong`` with
    `HELPFUL_MARKER` in the skill, else ``weak``); a success reads ``short`` parts with
    ``look`` and answers the longest option, a failure reads ``long`` parts and answers the
    shortest, so longer trajectories are the wrong ones.
    Evolution requests are answered as `ChatServer` does. ``pause_after(n)`` holds every
    request after the n-th until `resume` (a crash "in the middle of a step" made on cue).
    """

    def __init__(self, *, weak: float = 0.4, strong: float = 0.85, short: int = 1,
                 long: int = 3, evolve_reply: EvolveReply = append_marker) -> None:
        super().__init__(evolve_reply)
        self.weak, self.strong, self.short, self.long = weak, strong, short, long
        self._pause_n = 0
        self._resumed = threading.Event()
        self.paused = threading.Event()
        """Set once a request is being held by `pause_after`."""

    def pause_after(self, n: int) -> None:
        self._pause_n, self._resumed = n, threading.Event()

    def resume(self) -> None:
        """Release the held requests unanswered (their client is gone) and stop holding."""
        self._pause_n = 0
        self._resumed.set()

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        with self.lock:
            held = bool(self._pause_n) and len(self.requests) >= self._pause_n
        if held:
            self.paused.set()
            self._resumed.wait(60)
            h.close_connection = True
            return  # the client died meanwhile (or gave up): no answer
        super().handle(h)

    def succeeds(self, skill: str, options: list[str]) -> bool:
        """Whether the skill's trajectory on a unit with these options ends right."""
        digest = hashlib.sha256("\x1f".join(options).encode()).hexdigest()
        strength = self.strong if HELPFUL_MARKER in skill else self.weak
        return int(digest[:8], 16) / 0x1_0000_0000 < strength

    def answer(self, body: dict[str, Any], step: str) -> dict[str, Any]:
        if step == "evolve":
            return self.completion(body, self.evolution(body))
        msgs = body["messages"]
        skill = "".join(str(m.get("content")) for m in msgs if m["role"] == "system")
        user = next(str(m.get("content")) for m in msgs if m["role"] == "user")
        options = [o for _, o in re.findall(r"^([A-Z])\. (.*)$", user, flags=re.M)]
        ok = self.succeeds(skill, options)
        looked = sum(1 for m in msgs if m["role"] == "tool")
        call_id = f"call_{len(self.requests)}"  # new on every request, as a real server's
        if looked < (self.short if ok else self.long):
            return self.tool_call(body, call_id, "look", {"part": looked + 1})
        pick = max if ok else min
        letter = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[options.index(pick(options, key=len))]
        return self.tool_call(body, call_id, "answer", {"letter": letter})

    def tool_call(self, body: dict[str, Any], call_id: str, name: str,
                  args: dict[str, Any]) -> dict[str, Any]:
        """A chat.completion whose message calls one tool."""
        doc = self.completion(body, "")
        doc["choices"][0]["finish_reason"] = "tool_calls"
        doc["choices"][0]["message"] = {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": name, "arguments": json.dumps(args)}}]}
        return doc
