"""A cached HTTP client for any agent: `cached_http_client` (and `BackendContext.http_client`).

Its transport (`CachedTransport`) serves ``POST …/chat/completions`` through the
`ResponseCache` with the built-in agent's key material: model, base URL, messages, sampling
parameters, tools, and the salt of the run being answered (`vtrm_gate.gate.current_run_id`:
the arm's run id inside the gate's ``infer`` calls, the rollout's or the evolver's inside
theirs, else the client's ``run_id``). A multi-step agent's turns are each a cached call, so a
re-run replays a trajectory's cached prefix and goes fresh from its first miss.

Streaming requests and other endpoints pass through uncached. A 200 chat completion is
stored (an unusable answer too, like the built-in agent's), and so is the server's refusal of
the conversation itself (a context overflow, a content filter's 400: the arm's answer, as the
built-in agent records it), replayed with its status and body; a transport failure, any other
4xx, a 5xx or 429, a body that is no chat completion is handed back as the server sent it and
never stored. A request the cache cannot key (not JSON, over the size cap, too many tools, NaN) is
answered here with a 400/413 naming the problem and never sent: the openai SDK raises it as
a ``BadRequestError`` (INFRA in the gate); a body that cannot even be serialised raises a
``TypeError`` in the caller's client (a programming error: the gate stops).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import httpx

from .._env import DEFAULT_DEADLINE_S, DEFAULT_TIMEOUT_S, scrub_credentials, scrub_json
from .._ids import check_run_id
from ..cache import KeyParts, ResponseCache, protocol_failure, run_header
from ..errors import described, is_number, is_real, is_whole, plain_number, shown
from ..gate import current_run_id
from ._agent import DEFAULT_MAX_RESPONSE_BYTES, bounded_length, declared_length, parse_body
from ._body import ACCEPT_ENCODING, BodyError, BodyTooLarge, read_body
from ._endpoints import CHAT_PATH
from ._replies import error_detail, refusal, refused_reply

MAX_REQUEST_BYTES = 16 << 20
"""A chat request with frames as data URIs is megabytes; one past 16 MiB is refused here."""
MAX_TOOLS = 128
"""Tool schemas per request (the OpenAI API's own limit); more is refused here."""
CACHE_HEADER = "x-vtrm-cache"
"""Where a response says how it was served: hit, miss, coalesced, bypass, refused, pass."""
DEFAULT_RUN_ID = "unscoped"
"""The run id of calls made outside a gate task, a rollout, an evolver and `run_scope`."""
_HOP_HEADERS = ("content-length", "content-encoding", "transfer-encoding", "connection")
REFUSED_STATUS, REFUSED_BODY, REFUSED_TYPE = "vtrm_status", "vtrm_body", "vtrm_content_type"
"""A stored refusal's HTTP status, error body and content type, replayed to the caller as the
server sent them (the entry is otherwise the built-in agent's `refused_reply`)."""


class _Uncached(Exception):
    """A reply that must reach the caller as the server sent it, and never be stored."""

    def __init__(self, status: int, headers: httpx.Headers, content: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.headers, self.content = status, headers, content


def _is_chat(request: httpx.Request) -> bool:
    return request.method == "POST" and request.url.path.rstrip("/").endswith(CHAT_PATH)


def _base_url(request: httpx.Request) -> str:
    """The request's URL without ``/chat/completions`` (and without a query): the key's
    base URL, as the built-in agent's ``base_url``."""
    path = request.url.path.rstrip("/")[:-len(CHAT_PATH)]
    return str(request.url.copy_with(path=path or "/", query=None)).rstrip("/")


def _bad_gateway(message: str) -> _Uncached:
    """A 502 the caller sees (an SDK raises its status error): the server's reply is unusable."""
    return _Uncached(502, httpx.Headers({"content-type": "application/json"}),
                     json.dumps({"error": {"message": message}}).encode())


def _kept_headers(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _HOP_HEADERS}


class CachedTransport(httpx.AsyncBaseTransport):
    """An `httpx.AsyncBaseTransport` that serves chat completions through ``cache`` and
    sends everything else (and every miss) through ``transport`` (default: a real
    `httpx.AsyncHTTPTransport`). ``sent`` counts the requests that reached the server."""

    def __init__(self, cache: ResponseCache, *, run_id: str = DEFAULT_RUN_ID,
                 transport: httpx.AsyncBaseTransport | None = None,
                 max_request_bytes: int = MAX_REQUEST_BYTES, max_tools: int = MAX_TOOLS,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
                 secrets: Iterable[str] = (), deadline: float = DEFAULT_DEADLINE_S) -> None:
        check_run_id(run_id, "cached client")
        if not (is_real(deadline) and deadline > 0):
            raise ValueError(f"cached client: deadline must be a number of seconds > 0, got "
                             f"{shown(deadline)}")
        self.deadline = float(deadline)
        """A chat request's whole time, sent to read (httpx's timeouts are per read)."""
        for name, v in (("max_request_bytes", max_request_bytes), ("max_tools", max_tools),
                        ("max_response_bytes", max_response_bytes)):
            if not is_whole(v) or v < 1:
                raise ValueError(f"cached client: {name} must be an integer >= 1, got {v!r}")
        self.cache, self.run_id = cache, run_id
        self.inner = transport or httpx.AsyncHTTPTransport()
        self.max_request_bytes, self.max_tools = max_request_bytes, max_tools
        self.max_response_bytes = max_response_bytes
        self.secrets = tuple(secrets)
        self.sent = 0
        """Requests sent to the server (misses, pass-throughs, the SDK's retries)."""
        self.refused = 0
        """Requests answered here with a 400/413 (never sent, nothing stored)."""

    def current_run(self) -> str:
        """The run id the next call is salted with (`current_run_id`, else ``run_id``)."""
        return current_run_id() or self.run_id

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def _send(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        return await self.inner.handle_async_request(request)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not _is_chat(request):
            return self._tagged(await self._send(request), "pass")
        declared = declared_length(request.headers)
        if declared is None and request.headers.get("content-length"):
            return self._refuse(request, 400, f"Content-Length "
                                f"{shown(request.headers['content-length'])} is not a whole "
                                f"number of bytes")
        if declared is not None and declared > self.max_request_bytes:
            return self._refuse(request, 413, f"request body of "
                                f"{bounded_length(request.headers)} bytes is over "
                                f"the cached client's cap of {self.max_request_bytes} bytes "
                                f"(max_request_bytes)")
        data = await request.aread()
        if len(data) > self.max_request_bytes:
            return self._refuse(request, 413, f"request body of {len(data)} bytes is over the "
                                f"cached client's cap of {self.max_request_bytes} bytes "
                                f"(max_request_bytes)")
        body, why = self._body(data)
        if why is not None:
            return self._refuse(request, 400, why)
        assert body is not None
        if body.get("stream"):
            return self._tagged(await self._send(request), "pass")
        try:
            parts = KeyParts.from_request(body, _base_url(request),
                                          self.cache.salt(self.current_run()))
            parts.key(self.cache.prefix)  # the digest: canonical JSON of every component
        except (TypeError, ValueError, RecursionError) as exc:
            return self._refuse(request, 400, f"request body cannot key the response cache "
                                f"({described(exc)})")
        return await self._cached(request, parts)

    def _body(self, data: bytes) -> tuple[dict[str, Any] | None, str | None]:
        """The request's JSON body, or why the cache cannot key it."""
        try:
            body = parse_body(data, replace_lone_surrogates=False)  # keyed as sent
        except ValueError as exc:
            return None, f"request body is not JSON ({exc}): {data[:80]!r}"
        if not isinstance(body, dict):
            return None, f"request body is a JSON {type(body).__name__}, not an object"
        if not isinstance(body.get("model"), str) or not body["model"]:
            return None, f"request body field 'model' must be a non-empty string, got " \
                         f"{body.get('model')!r}"[:200]
        if not isinstance(body.get("messages"), list):
            return None, f"request body field 'messages' must be a list, got " \
                         f"{type(body.get('messages')).__name__}"
        tools = body.get("tools")
        if tools is not None and (not isinstance(tools, list) or len(tools) > self.max_tools):
            n = len(tools) if isinstance(tools, list) else type(tools).__name__
            return None, f"request body field 'tools' holds {n} entries; the cap is " \
                         f"{self.max_tools} tool schemas a request (max_tools)"
        return body, None

    async def _cached(self, request: httpx.Request, parts: KeyParts) -> httpx.Response:
        scrub = self._scrubber(request)

        async def call() -> dict[str, Any]:
            request.headers.update(run_header(self.current_run()))  # names the key's salt
            request.headers["accept-encoding"] = ACCEPT_ENCODING  # what read_body undoes
            status, headers, content = await self._fetch(request)
            if status != 200:
                refused = refusal(status, error_detail(content))
                if refused is None:
                    raise _Uncached(status, headers, content)
                # the arm's own answer (the conversation overflows or trips the filter):
                # stored, and replayed as the server said it
                return cast(dict[str, Any], scrub_json({
                    **refused_reply(parts.model, refused), REFUSED_STATUS: status,
                    REFUSED_BODY: content.decode("utf-8", "replace"),
                    REFUSED_TYPE: headers.get("content-type", "application/json")}, scrub))
            try:
                doc = parse_body(content)
            except ValueError as exc:
                raise _bad_gateway(f"HTTP 200 that is no chat completion: the body is not "
                                   f"JSON ({exc}); not stored") from None
            why = protocol_failure(doc) if isinstance(doc, dict) else "not a JSON object"
            if why is not None:  # an SDK would read no choices: an error it can raise
                said = error_detail(content) if why == "response carries an error" else ""
                raise _bad_gateway(scrub(f"HTTP 200 that is no chat completion: {why}"
                                         f"{f' ({said})' if said else ''}; not stored"))
            # a gateway may quote the request's credentials: never stored, never served
            return cast(dict[str, Any], scrub_json(doc, scrub))

        try:
            res = await self.cache.get_or_call(parts, call, validate=protocol_failure,
                                               run_id=self.current_run())
        except _Uncached as exc:
            return httpx.Response(exc.status, headers={**_kept_headers(exc.headers),
                                                       CACHE_HEADER: "uncached"},
                                  content=exc.content, request=request)
        status, said = res.response.get(REFUSED_STATUS), res.response.get(REFUSED_BODY)
        if is_whole(status) and isinstance(said, str):  # a stored refusal, as the server said it
            kind = res.response.get(REFUSED_TYPE)
            return httpx.Response(status, headers={
                "content-type": kind if isinstance(kind, str) else "application/json",
                CACHE_HEADER: res.source}, content=said.encode(), request=request)
        return httpx.Response(200, headers={"content-type": "application/json",
                                            CACHE_HEADER: res.source},
                              content=json.dumps(res.response).encode(), request=request)

    async def _fetch(self, request: httpx.Request) -> tuple[int, httpx.Headers, bytes]:
        """Send and read the whole reply within `deadline`; past it, `httpx.ReadTimeout`
        (what an SDK retries): a reply trickling a byte a second never tripped the per-read
        timeouts, and held its call for hours (h16)."""
        try:
            async with asyncio.timeout(self.deadline):
                r = await self._send(request)
                try:
                    return r.status_code, r.headers, await self._read_capped(r)
                finally:
                    await r.aclose()
        except TimeoutError:
            raise httpx.ReadTimeout(f"no whole reply within the cached client's deadline of "
                                    f"{self.deadline:g}s (deadline)", request=request) from None

    async def _read_capped(self, r: httpx.Response) -> bytes:
        """The body, raw and decoded bytes both capped; a 502 naming why otherwise."""
        try:
            return await read_body(r, self.max_response_bytes)
        except BodyTooLarge as exc:
            raise _bad_gateway(f"response larger than the cached client's cap of "
                               f"{self.max_response_bytes} bytes (max_response_bytes; "
                               f"{exc.where()}); not stored") from None
        except BodyError as exc:
            raise _bad_gateway(f"HTTP {r.status_code}: {exc}; not stored") from None

    def _scrubber(self, request: httpx.Request) -> Callable[[str], str]:
        """A text without ``secrets`` or the request's own credentials (`scrub_credentials`)."""
        auth = [request.headers.get(h) for h in ("authorization", "api-key", "x-api-key")]
        secrets = [*self.secrets, *(a.split()[-1] for a in auth if a and a.split())]
        return lambda text: scrub_credentials(text, secrets)

    def _refuse(self, request: httpx.Request, status: int, why: str) -> httpx.Response:
        """A 400/413 naming ``why`` (scrubbed), answered here: nothing sent, nothing stored."""
        self.refused += 1
        message = self._scrubber(request)(
            f"vtrm_gate cached client refused the request: {why}")
        return httpx.Response(status, json={"error": {
            "message": message, "type": "invalid_request_error", "code": "vtrm_cached_client"}},
            headers={CACHE_HEADER: "refused"}, request=request)

    @staticmethod
    def _tagged(response: httpx.Response, how: str) -> httpx.Response:
        response.headers[CACHE_HEADER] = how
        return response


def cached_http_client(cache: ResponseCache, *, run_id: str = DEFAULT_RUN_ID,
                       base_url: str = "", headers: Mapping[str, str] | None = None,
                       params: Mapping[str, str] | None = None,
                       timeout: float | httpx.Timeout = DEFAULT_TIMEOUT_S,
                       deadline: float | None = None,
                       transport: httpx.AsyncBaseTransport | None = None,
                       secrets: Iterable[str] = (), **limits: Any) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` whose chat completions go through ``cache`` (`CachedTransport`
    over ``transport``, default a real one): pass it as ``openai.AsyncOpenAI(http_client=…)``
    or use it as it is. ``run_id`` salts the calls made outside a gate task and `run_scope`;
    ``timeout`` is httpx's (per read), ``deadline`` a chat request's whole time (None: the
    run's default, 180 s, or the read timeout if longer: a steady reply within a raised
    ``timeout`` is never cut; no read timeout keeps the 180 s); ``limits``
    (``max_request_bytes``, ``max_tools``, ``max_response_bytes``) go to the transport."""
    read = plain_number(httpx.Timeout(timeout).read)  # a number, a 4-tuple, a Timeout
    whole = deadline if deadline is not None else max(
        DEFAULT_DEADLINE_S, float(read) if is_number(read) and is_real(read) else 0.0)
    cached = CachedTransport(cache, run_id=run_id, transport=transport, secrets=secrets,
                             deadline=whole, **limits)
    return httpx.AsyncClient(base_url=base_url, headers=headers, params=params, timeout=timeout,
                             transport=cached)
