"""OpenAI-compatible chat agent (SPEC §6): answers a multiple-choice unit with a skill file.

`LLMAgent(...).infer` is an ``infer`` for `run_gate`: it holds no semaphore of its own (the
gate's slot pool is the only limit), sends every step's call through the Redis
`ResponseCache` (so a replay reuses the longest cached prefix of the conversation), retries
429/5xx/timeouts with exponential backoff and jitter honouring ``Retry-After``, and turns
exhausted retries into an INFRA result. Every call has a hard deadline (attempts + waits)
and a response size cap (the body is streamed and abandoned past it); a malformed body
(non-finite numbers, nesting too deep) is INFRA with its reason, never an exception. Every
answer the model gave, even an unusable one, is cached, so a re-run replays the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import email.utils
import json
import logging
import math
import os
import random
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from .._api import deprecated
from .._env import (
    DEFAULT_DEADLINE_S,
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT_S,
    check_api_key,
    environment,
    mask_url,
    scrub_credentials,
    scrub_json,
    secret_values,
)
from .._env import DEFAULT_MAX_TOKENS as _DEFAULT_MAX_TOKENS
from .._env import api_key as _api_key
from .._ids import as_unicode
from ..cache import KeyParts, ResponseCache, protocol_failure, run_header, validate_response
from ..cache._keys import PROTOCOL_FAILURES, Validator
from ..errors import (
    ContextOverflowError,
    LLMInfraError,
    MediaError,
    PromptFilteredError,
    described,
    is_real,
    is_whole,
    plain_fields,
    shown,
)
from ..gate import UnitResult, UnitTask, report_progress
from ..harness import Media
from ._body import ACCEPT_ENCODING, BodyError, BodyTooLarge, read_body
from ._endpoints import Endpoint, EndpointPool, Exchange, ShardedClient
from ._media import MediaResolver
from ._replies import (
    CONTENT_PARTS_HINT,
    LETTERS,
    error_detail,
    finish_reason,
    has_content_parts,
    non_json_reply,
    parse_choice,
    refusal,
    refusal_text,
    refused_reply,
    reply_text,
    usage_tokens,
)

log = logging.getLogger("vtrm_gate.llm")

DEFAULT_BASE_URL = "https://api.openai.com/v1"

TEXT_TASK = "multiple-choice questions"
VIDEO_TASK = "multiple-choice questions about a video"
"""The task the prompts name when the workspace gives no ``task_description``: the video
wording only for units whose frames or video are sent with the question."""


def system_preamble(task: str) -> str:
    """The system prompt before the skill: the task, then "follow the skill"."""
    return f"You answer {task}. Follow the skill instructions below.\n\n"


SYSTEM_PREAMBLE = system_preamble(VIDEO_TASK)
THINK_PROMPT = ("Think step by step about which option is correct. Do not state the final "
                "answer yet.")
ANSWER_PROMPT = "Answer with the letter of the correct option only."

DEFAULT_MAX_RESPONSE_BYTES = 8 << 20
"""A chat completion is kilobytes; a body past this cap is abandoned (INFRA)."""
ERROR_BODY_BYTES = 64 << 10
"""An error body is read up to this size for its message."""
SINGLE_ENDPOINT_CAP = 1 << 16
"""One ``base_url``'s cap when none is given: the gate's slot pool is the limit."""
DEFAULT_MAX_TOKENS = {k: _DEFAULT_MAX_TOKENS[k] for k in ("think", "answer")}
"""Each call kind's reply budget: the think call is bounded so the answer call fits a small
context (llama.cpp's default is 2048 tokens); the answer needs a letter."""

AGENT_VERSION = 4
"""Bumped on every change to the prompts, the grading, the parsing of replies or the shape
of a request: it joins the agent config that keys the BaselineCache, so a base arm graded
the old way is never paired with a candidate graded the new way. 4: an answer in content
parts, in Chinese ("答案是B"), in full-width letters, boxed (``\\boxed{B}``), after a
reasoning model's ``<think>`` block, as an option's text or in tool-call arguments given as
an object is read;
3: the task framing comes from the workspace (no video wording for text-only units); 2:
parse_choice reads real phrasings, per-step max_tokens, context overflow graded wrong (1:
before)."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


def _finite_float(text: str) -> float:
    """A JSON number as a float, refused when it overflows to infinity (``1e999``: it slipped
    past the NaN/Infinity check, was served as invalid JSON and never cached, h16)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"non-finite number {text[:40]}")
    return value


def declared_length(headers: httpx.Headers) -> int | None:
    """A message's Content-Length as a whole number; None when absent or not one ("²" passes
    ``isdigit`` but not ``int``); past 18 digits 10**18, over any cap (``int`` of 4,301
    digits raises)."""
    raw = headers.get("content-length", "")
    return None if not raw.isdecimal() else int(raw) if len(raw) <= 18 else 10**18


def bounded_length(headers: httpx.Headers) -> str:
    """The Content-Length as said, a long one cut (a message never carries 5,000 digits)."""
    raw = headers.get("content-length", "")
    return raw if len(raw) <= 18 else f"{raw[:8]}... ({len(raw):,} digits)"


def parse_body(data: bytes, *, replace_lone_surrogates: bool = True) -> Any:
    """A response body as JSON; ValueError naming the fault (not JSON, NaN/Infinity or a
    number past every float, nested too deeply) instead of a float the cache cannot store or
    a RecursionError. A lone
    surrogate escaped in a string (a gateway that cut an emoji's UTF-16 pair) reads as
    U+FFFD, as a broken UTF-8 byte would: a reply's text reaches files, keys and SQLite
    (``replace_lone_surrogates=False``: kept, for a request keyed as it was sent)."""
    try:
        doc = json.loads(data, parse_constant=_reject_constant, parse_float=_finite_float)
        if replace_lone_surrogates and _SURROGATE_ESCAPE.search(data):
            return _without_lone_surrogates(doc)
        return doc
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _without_lone_surrogates(value: Any) -> Any:
    """``value`` with each lone surrogate in its strings (keys too) replaced by U+FFFD (a
    pair escaped as two ``\\u`` escapes is already one character once parsed)."""
    if isinstance(value, str):
        return as_unicode(value)
    if isinstance(value, list):
        return [_without_lone_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_without_lone_surrogates(k): _without_lone_surrogates(v)
                for k, v in value.items()}
    return value


@dataclass(frozen=True)
class MCQ:
    """A multiple-choice unit: the question, its options (A, B, ...) and the right letter."""

    question: str
    options: tuple[str, ...]
    answer: str
    media: Media | None = None

    def __post_init__(self) -> None:
        opts = tuple(self.options)
        if not 2 <= len(opts) <= len(LETTERS):
            raise ValueError(f"MCQ.options must hold 2 to 26 options, got {len(opts)}")
        object.__setattr__(self, "options", opts)
        ans = str(self.answer).strip().upper()
        if len(ans) != 1 or ans not in LETTERS[:len(opts)]:
            raise ValueError(f"MCQ.answer must be one of {LETTERS[:len(opts)]!r}, "
                             f"got {self.answer!r}")
        object.__setattr__(self, "answer", ans)

    def prompt(self) -> str:
        lines = [self.question.strip(), ""]
        lines += [f"{LETTERS[i]}. {o}" for i, o in enumerate(self.options)]
        return "\n".join(lines)


@dataclass(frozen=True)
class RetryPolicy:
    """Retries on 429/5xx/timeouts: exponential backoff with jitter, ``Retry-After`` honoured,
    at most ``max_attempts`` attempts; ``max_total_s`` is the call's hard deadline (every
    attempt and every wait; a body still arriving when it passes is abandoned)."""

    max_attempts: int = DEFAULT_MAX_RETRIES + 1
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0
    max_total_s: float = DEFAULT_DEADLINE_S
    jitter: float = 0.5
    retry_statuses: frozenset[int] = frozenset({408, 409, 425, 429, 500, 502, 503, 504,
                                                520, 521, 522, 523, 524, 529})
    """Transient statuses: the usual ones, Cloudflare's 520-524 (the origin stalled or
    dropped: 524 is no reply within 100 s) and 529 (overloaded)."""

    def __post_init__(self) -> None:
        plain_fields(self)
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError("RetryPolicy delays must be >= 0")
        if not self.max_total_s > 0:  # also refuses NaN
            raise ValueError(f"RetryPolicy.max_total_s (the call's deadline) must be > 0 "
                             f"seconds, got {self.max_total_s}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"RetryPolicy.jitter must be in [0, 1], got {self.jitter}")

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Delay before retry number ``attempt`` (1-based) when the server gave no hint."""
        d = min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1))
        return d * (1 - self.jitter * rng.random())


_DELAY_SECONDS = re.compile(r"[0-9]+(\.[0-9]+)?")


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds: delta-seconds (RFC 9110's digits; a decimal fraction
    taken too) or an HTTP date still ahead; None (the caller backs off as usual) for
    anything else. A negative number, ``nan`` or a date in the past had meant "retry at
    once", with no backoff (h16)."""
    v = (value or "").strip()
    if _DELAY_SECONDS.fullmatch(v):
        return float(v) if len(v) <= 18 else 1e18  # past any deadline
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # asctime's form carries no zone: HTTP dates are GMT
        when = when.replace(tzinfo=datetime.UTC)
    ahead = when.timestamp() - time.time()
    return ahead if ahead > 0 else None


@dataclass(frozen=True)
class AgentEvent:
    """What the agent is doing: a request, a retry (with its delay), a give-up. A retry
    carries its attempt's HTTP status; a give-up the status of the last reply the call got
    (a 400, a 401, the last 503 before the deadline; None: no reply ever came)."""

    kind: Literal["request", "retry", "give_up"]
    run_id: str
    unit_id: str
    call_kind: str
    """Which of the unit's calls: ``think``, ``answer`` (or the evolver's ``evolve``)."""
    attempt: int
    status: int | None = None
    delay_s: float = 0.0
    error: str | None = None
    t: float = field(default_factory=time.monotonic)

    @property
    def step(self) -> str:
        """Deprecated name of `call_kind` (``step`` means a training step everywhere else)."""
        deprecated("AgentEvent.step", "AgentEvent.call_kind")
        return self.call_kind




@dataclass(frozen=True, slots=True)
class _Call:
    """Which call an attempt belongs to, named in its events."""

    run_id: str
    unit_id: str
    kind: str

    def event(self, what: Literal["request", "retry", "give_up"], attempt: int,
              status: int | None = None, delay_s: float = 0.0,
              error: str | None = None) -> AgentEvent:
        return AgentEvent(what, self.run_id, self.unit_id, self.kind, attempt, status,
                          delay_s, error)


def _renamed_step(given: Mapping[str, str], where: str) -> str:
    """The call kind given by the old keyword ``step`` (deprecated); TypeError for others."""
    extra = sorted(set(given) - {"step"})
    if extra:
        raise TypeError(f"{where}() got an unexpected keyword argument {extra[0]!r}")
    deprecated(f"{where}(step=...)", f"{where}(call_kind=...)", stacklevel=4)
    return given["step"]


class _Retryable(Exception):
    def __init__(self, message: str, status: int | None = None,
                 retry_after: float | None = None):
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


def _max_tokens(value: int | Mapping[str, int] | None) -> dict[str, int]:
    """Per call kind ``max_tokens`` (0 or absent: none sent, the server's default)."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        out = dict(value)
    else:
        out = {"think": value, "answer": value}
    for k, v in out.items():
        if not is_whole(v) or v < 0:
            raise ValueError(f"LLMAgent.max_tokens[{k!r}] must be an integer >= 0, got {v!r}")
    return {k: v for k, v in out.items() if v}


@dataclass(frozen=True)
class AgentSettings:
    """How an `LLMAgent` calls its model, as one validated value: the endpoint and model,
    sampling, each call kind's reply budget, timeouts and retries, adaptive concurrency, and
    the task the prompts name. ``max_tokens`` is an int (think and answer) or one budget per
    call kind (``{"think": 512, "answer": 64}`` by default; 0 or absent: none sent)."""

    base_url: str | None = None
    """The chat endpoint (None with several ``endpoints``: the pool's identity)."""
    model: str = ""
    think: bool = True
    """Two calls per unit (reason, then answer with a letter), or one answering call."""
    temperature: float = 0.0
    max_tokens: int | Mapping[str, int] | None = field(
        default_factory=lambda: dict(DEFAULT_MAX_TOKENS))
    params: Mapping[str, Any] | None = None
    """Further request fields (``top_p``, ``seed``, ...): they key the cache like the rest."""
    timeout: float = DEFAULT_TIMEOUT_S
    """Each attempt's timeout (longer when the endpoint is observed slower)."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    adaptive: bool = False
    max_concurrency: int | None = None
    """One ``base_url``'s cap (several endpoints: their own caps)."""
    task_description: str | None = None

    def __post_init__(self) -> None:
        plain_fields(self)
        for name in ("think", "adaptive"):  # "false" is truthy: refused, never taken as True
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"LLMAgent.{name} must be True or False, got "
                                 f"{shown(getattr(self, name))}")
        if not (is_real(self.timeout) and self.timeout > 0):
            raise ValueError(f"LLMAgent.timeout must be a finite number of seconds > 0, got "
                             f"{shown(self.timeout)}")
        if not (is_real(self.temperature) and self.temperature >= 0):
            raise ValueError(f"LLMAgent.temperature must be a finite number >= 0, got "
                             f"{shown(self.temperature)}")
        cap = self.max_concurrency
        if cap is not None and not (is_whole(cap) and cap >= 1):
            raise ValueError(f"LLMAgent.max_concurrency must be an integer >= 1 or None, got "
                             f"{shown(cap)}")
        n = self.max_response_bytes
        if not is_whole(n) or n < 1:
            raise ValueError(f"LLMAgent.max_response_bytes must be an integer >= 1, got {n!r}")
        object.__setattr__(self, "max_tokens", _max_tokens(self.max_tokens))

    @property
    def budgets(self) -> Mapping[str, int]:
        """Each call kind's ``max_tokens`` sent (normalised: kinds without one are absent)."""
        return self.max_tokens  # type: ignore[return-value]  # a dict after __post_init__

    def request_params(self) -> dict[str, Any]:
        """The sampling fields every request carries: ``temperature``, then ``params``."""
        return {"temperature": self.temperature, **(self.params or {})}


def _settings(settings: AgentSettings | None, fields: Mapping[str, Any]) -> AgentSettings:
    """The agent's settings: ``settings``, or built from its fields given as keywords."""
    if settings is None:
        return AgentSettings(**{k: v for k, v in fields.items()
                                if not (k == "retry" and v is None)})  # None: the default
    if fields:
        raise TypeError(f"LLMAgent takes settings or their fields as keywords, not both "
                        f"(got {', '.join(sorted(fields))})")
    return settings


class LLMAgent:
    """Answers `MCQ` units over an OpenAI-compatible ``/chat/completions`` endpoint.

    The API key defaults to ``OPENAI_API_KEY`` (or ``VTRM_API_KEY``) and is never shown:
    every reply (a 200's too) and error text is scrubbed of it, of ``secrets`` (default: the
    process environment's, `secret_values`) and of any credential header value.
    ``retry.max_total_s`` is each call's deadline, ``max_response_bytes`` its size cap;
    ``timeout`` is each attempt's timeout, longer when the endpoint is observed slower
    (`EndpointPool.attempt_timeout`), always ending before the call's deadline.

    Its settings are one `AgentSettings` (``settings``, or its fields as keywords:
    ``LLMAgent(units, base_url=..., model=...)``). ``think=True``: two calls per unit, their
    kinds ``think`` (reason) then ``answer`` (a letter), each cached, the answer's messages
    extending the think call's; ``think=False``: one answering call. ``max_tokens`` bounds
    each kind's reply (``{"think": 512, "answer": 64}`` by default: a rambling think call
    stays short enough for the answer call to fit the context).

    ``adaptive``: the endpoint's concurrency adapts to its latency (`GradientLimit`); the
    gate reads the current limit from ``infer.admission`` before each dispatch, so calls
    wait in the gate (where a freeze drops them), not here. ``max_concurrency`` caps one
    ``base_url`` (several endpoints: their own caps).
    """

    def __init__(self, units: Mapping[str, MCQ], settings: AgentSettings | None = None, *,
                 api_key: str | None = None, cache: ResponseCache | None = None,
                 on_event: Callable[[AgentEvent], Any] | None = None,
                 rng: random.Random | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 endpoints: EndpointPool | None = None, media: MediaResolver | None = None,
                 secrets: Iterable[str] | None = None,
                 **fields: Any) -> None:
        settings = _settings(settings, fields)
        base_url = settings.base_url
        if endpoints is not None:  # several endpoints: the key holds the pool's identity
            base_url = base_url or endpoints.identity
        if not base_url or not settings.model:
            raise ValueError("LLMAgent needs a base_url and a model")
        self.settings = settings
        self.http_requests = 0
        """HTTP requests sent to an endpoint (every attempt, retries included)."""
        self.http_cancelled = 0
        """Of those, the ones cancelled before their reply came (a call past every stop, a
        frozen type's): no endpoint counts them among its calls."""
        self.units, self.base_url = units, base_url.rstrip("/")
        if api_key is None:
            api_key = _api_key(dict(os.environ)) or None
        self._api_key = api_key and check_api_key(api_key, "LLMAgent(api_key=)")
        self._secrets = (api_key, *(secret_values(dict(os.environ)) if secrets is None
                                    else secrets))
        self.cache = cache
        self.params: dict[str, Any] = settings.request_params()
        """The sampling fields of every request (settings' temperature and params)."""
        self.on_event = on_event
        self._rng = rng or random.Random()
        self._transport = transport
        self.endpoints = endpoints
        cap = settings.max_concurrency
        self.pool = endpoints or EndpointPool(
            [Endpoint(self.base_url, cap or SINGLE_ENDPOINT_CAP)],
            adaptive=settings.adaptive, max_limit=cap)
        """Where calls go: ``endpoints``, or a pool of the one ``base_url``."""
        self.media = media
        self._http: ShardedClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outside: tuple[asyncio.AbstractEventLoop, asyncio.Condition, list[int]] | None \
            = None

    @property
    def model(self) -> str:
        return self.settings.model

    @property
    def think(self) -> bool:
        return self.settings.think

    @property
    def timeout(self) -> float:
        return self.settings.timeout

    @property
    def retry(self) -> RetryPolicy:
        return self.settings.retry

    @property
    def max_tokens(self) -> Mapping[str, int]:
        """Each call kind's reply budget sent (a kind without one: the server's default)."""
        return self.settings.budgets

    @property
    def max_response_bytes(self) -> int:
        return self.settings.max_response_bytes

    @property
    def task_description(self) -> str | None:
        """The task the prompts name (a workspace's ``agent.task_description``); None: see
        `task_framing`."""
        return self.settings.task_description

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Room for a call made outside the gate (the rollout's units, the evolver): it
        waits here, before its deadline starts, until fewer such calls are in flight than
        the endpoints' current limit (the gate admits its own calls through `admission`)."""
        loop = asyncio.get_running_loop()
        if self._outside is None or self._outside[0] is not loop:
            self._outside = (loop, asyncio.Condition(), [0])
        _, cond, n = self._outside
        async with cond:
            await cond.wait_for(lambda: n[0] < self.pool.limit())
            n[0] += 1
        try:
            yield
        finally:
            async with cond:
                n[0] -= 1
                cond.notify_all()

    @property
    def admission(self) -> EndpointPool | None:
        """What the gate consults before each dispatch (`vtrm_gate.gate.Admission`): the
        pool, when its limits adapt; None when they are fixed caps."""
        return self.pool if self.pool.adaptive else None

    @classmethod
    def from_env(cls, units: Mapping[str, MCQ], env: Mapping[str, str] | None = None,
                 **kwargs: Any) -> LLMAgent:
        """Base URL (``VTRM_BASE_URL``/``OPENAI_BASE_URL``), model (``VTRM_MODEL``/
        ``OPENAI_MODEL``) and key (``OPENAI_API_KEY``/``VTRM_API_KEY``) from the environment."""
        e = environment(env)
        kwargs.setdefault("base_url", e.get("VTRM_BASE_URL") or e.get("OPENAI_BASE_URL")
                          or DEFAULT_BASE_URL)
        model = kwargs.pop("model", None) or e.get("VTRM_MODEL") or e.get("OPENAI_MODEL")
        if not model:
            raise ValueError("no model: set VTRM_MODEL (or OPENAI_MODEL) or pass model=")
        kwargs.setdefault("api_key", _api_key(e) or None)
        return cls(units, model=model, **kwargs)

    def __repr__(self) -> str:
        return (f"LLMAgent(base_url={self.base_url!r}, model={self.model!r}, "
                f"think={self.think}, cache={self.cache!r})")

    # -- transport --------------------------------------------------------------------

    def _client(self) -> ShardedClient:
        loop = asyncio.get_running_loop()
        if self._http is None or self._loop is not loop:
            headers = {"Accept-Encoding": ACCEPT_ENCODING,
                       **({"Authorization": f"Bearer {self._api_key}"} if self._api_key else {})}

            def shard(size: int) -> httpx.AsyncClient:
                return httpx.AsyncClient(
                    base_url=self.base_url + "/", headers=headers, timeout=self.timeout,
                    limits=httpx.Limits(max_connections=size, max_keepalive_connections=size),
                    transport=self._transport)

            # Shards of 16 connections, as many as the gate's slot pool needs (it is the only
            # concurrency limit): one big httpcore pool costs O(connections) per call.
            self._http = ShardedClient(shard).warm()
            self._loop = loop
        return self._http

    async def aclose(self) -> None:
        http, self._http = self._http, None
        if http is not None and self._loop is asyncio.get_running_loop():
            await http.aclose()

    def _emit(self, ev: AgentEvent) -> None:
        if ev.kind != "request":  # retries and give-ups show in the gate's event stream
            report_progress("retrying" if ev.kind == "retry" else "giving_up",
                            call_kind=ev.call_kind, attempt=ev.attempt, status=ev.status,
                            delay_s=ev.delay_s, error=ev.error)
        if self.on_event is None:
            return
        try:
            self.on_event(ev)
        except Exception:  # an observer must not break inference
            log.exception("LLMAgent on_event callback failed")

    async def _read_capped(self, r: httpx.Response, cap: int | None = None) -> bytes:
        """The body, streamed; `LLMInfraError` as soon as it passes ``max_response_bytes``."""
        cap = cap or self.max_response_bytes
        declared = declared_length(r.headers)
        if declared is not None and declared > cap:
            raise LLMInfraError(f"HTTP {r.status_code} response larger than "
                                f"max_response_bytes={cap} (Content-Length "
                                f"{bounded_length(r.headers)})")
        try:
            return await read_body(r, cap)  # raw and decoded bytes both capped
        except BodyTooLarge as exc:
            raise LLMInfraError(f"HTTP {r.status_code} response larger than "
                                f"max_response_bytes={cap} ({exc.where()})") from None

    async def _error_text(self, r: httpx.Response, body: Mapping[str, Any]) -> str:
        """``HTTP <status>: <what the server said>`` (bounded), plus a hint when the server
        refused a request carrying content parts."""
        try:
            detail = error_detail(await self._read_capped(r, ERROR_BODY_BYTES))
        except (LLMInfraError, httpx.HTTPError, BodyError):
            detail = ""
        text = f"HTTP {r.status_code}" + (f": {detail}" if detail else "")
        if has_content_parts(body) and r.status_code not in (401, 403, 404, 429):
            text += f" ({CONTENT_PARTS_HINT})"
        return text

    async def _post_once(self, body: Mapping[str, Any], call: _Call,
                         deadline: float) -> dict[str, Any]:
        if self.media is not None:  # frame references -> data: URIs, on the wire only
            body = self.media.resolve(body)
        used: dict[str, Any] = {}  # its "url" once an endpoint took the request
        try:  # leaving the exchange early closes the connection: nothing more is read
            async with self.pool.exchange(self._client(), "POST", "chat/completions",
                                          json=body, headers=run_header(call.run_id),
                                          kind=call.kind, timeout=self.timeout,
                                          deadline=deadline, info=used) as ex:
                used["replied"] = True
                try:
                    return await self._read_reply(ex, body)
                except LLMInfraError as exc:  # the status goes with it to the give-up event
                    exc.status = ex.response.status_code
                    raise
        except httpx.TimeoutException as exc:
            raise _Retryable(f"timeout after {used.get('timeout_s', self.timeout):.3g}s "
                             f"({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            raise _Retryable(described(exc)) from None
        except asyncio.CancelledError:
            self.http_cancelled += "url" in used and "replied" not in used
            raise
        finally:
            self.http_requests += "url" in used

    async def _read_reply(self, ex: Exchange, body: Mapping[str, Any]) -> dict[str, Any]:
        """The chat completion in ``ex``'s response; `_Retryable` / `LLMInfraError` (with
        the server's own words) otherwise, ``ex.outcome`` set for the endpoint's counters."""
        r = ex.response
        if r.status_code in self.retry.retry_statuses:
            text = await self._error_text(r, body)
            if r.status_code == 500 and has_content_parts(body) and "list" in text:
                raise LLMInfraError(text)  # a content-parts refusal never passes by itself
            raise _Retryable(text, r.status_code,
                             parse_retry_after(r.headers.get("retry-after")))
        if r.is_redirect:  # not transient, and never followed (the key would go too)
            raise LLMInfraError(
                f"HTTP {r.status_code} redirect to {mask_url(r.headers['location'])} not "
                f"followed; set the endpoint's base_url to the final address")
        if r.status_code >= 400:
            text = await self._error_text(r, body)
            refused = refusal(r.status_code, text)
            if refused is not None:
                raise refused
            raise LLMInfraError(text.replace(f"HTTP {r.status_code}",
                                             f"HTTP {r.status_code} (not retryable)", 1))
        try:
            data = await self._read_capped(r)
        except BodyError as exc:  # a proxy's mislabelled body: the next attempt may be whole
            ex.outcome = "malformed"
            raise _Retryable(f"HTTP {r.status_code}: {exc}") from None
        not_json = non_json_reply(r.status_code, r.headers.get("content-type", ""), data)
        if not_json is not None:  # a portal's or proxy's page, a forced stream: not transient
            raise LLMInfraError(not_json)
        try:
            doc = parse_body(data)
        except ValueError as exc:  # e.g. cut short by a reset: the next attempt may answer
            ex.outcome = "malformed"
            raise _Retryable(f"HTTP {r.status_code} with a malformed JSON body: {exc}") \
                from None
        # the reply may repeat a credential (a gateway quoting the request): never kept
        doc = scrub_json(doc if isinstance(doc, dict) else {"unexpected": doc}, self.scrub)
        if doc.get("error"):  # a gateway's 200 that is an error (a rate limit): transient
            ex.outcome = "malformed"
            raise _Retryable(f"HTTP {r.status_code} carrying an error: "
                             f"{error_detail(json.dumps(doc).encode())}")
        if protocol_failure(doc) is not None:
            ex.outcome = "malformed"  # a 200 that is no chat completion: the endpoint's fault
        else:
            ex.outcome, ex.tokens = "ok", usage_tokens(doc, "completion_tokens")
        return doc

    def scrub(self, text: str) -> str:
        """``text`` without the API key, the environment's secrets (``secrets``) or any
        credential header value (see `scrub_credentials`): every reply, 200 or error, passes
        here before it is parsed, cached, stored or shown."""
        return scrub_credentials(text, self._secrets)

    async def chat(self, body: Mapping[str, Any], *, run_id: str = "", unit_id: str = "",
                   call_kind: str = "answer", **deprecated_step: str) -> dict[str, Any]:
        """One chat call with retries; raises `LLMInfraError` when they run out or the
        deadline (``retry.max_total_s``, attempts and waits together) passes, and
        `ContextOverflowError` / `PromptFilteredError` when the server refuses the
        conversation itself (too long for the context; its content filter tripped).
        ``call_kind`` (``think``, ``answer``, ``evolve``) names it in events and errors."""
        if deprecated_step:
            call_kind = _renamed_step(deprecated_step, "LLMAgent.chat")
        return await self._attempts(body, _Call(run_id, unit_id, call_kind))

    async def _attempts(self, body: Mapping[str, Any], call: _Call) -> dict[str, Any]:
        t0 = time.monotonic()
        deadline = t0 + self.retry.max_total_s
        attempt, last_status = 0, None  # the last HTTP status any attempt got
        try:
            async with asyncio.timeout(self.retry.max_total_s):
                while True:
                    attempt += 1
                    self._emit(call.event("request", attempt))
                    try:
                        return await self._post_once(body, call, deadline)
                    except _Retryable as exc:
                        last_status = exc.status or last_status
                        delay = self._retry_delay(exc, attempt, t0, call, last_status)
                        await asyncio.sleep(delay)
                    except LLMInfraError as exc:  # a MediaError too: a frame not sendable
                        err = self.scrub(str(exc))
                        self._emit(call.event("give_up", attempt, exc.status, error=err))
                        out = type(exc)(err)
                        out.status = exc.status
                        raise out from None
        except TimeoutError:
            err = (f"deadline of {self.retry.max_total_s:g}s exceeded during attempt "
                   f"{attempt} (retry.max_total_s)")
            self._emit(call.event("give_up", attempt, last_status, error=err))
            raise LLMInfraError(err) from None

    def _retry_delay(self, exc: _Retryable, attempt: int, t0: float, call: _Call,
                     last_status: int | None) -> float:
        """The wait before the next attempt (announced); `LLMInfraError` when retries run
        out or another attempt would not fit the call's deadline."""
        err = self.scrub(str(exc))
        delay = exc.retry_after if exc.retry_after is not None else \
            self.retry.backoff(attempt, self._rng)
        elapsed = time.monotonic() - t0
        # another attempt needs time: not one squeezed into the deadline's last tenth
        late = elapsed + delay > self.retry.max_total_s * 0.9
        if attempt >= self.retry.max_attempts or late:
            why = (f"gave up after {attempt} attempt(s) in {elapsed:.1f}s: {err}")
            if attempt < self.retry.max_attempts and exc.retry_after is not None:
                why += (f" (the server's Retry-After {exc.retry_after:g}s would pass "
                        f"the call's deadline of {self.retry.max_total_s:g}s, "
                        f"retry.max_total_s)")
            elif attempt < self.retry.max_attempts:
                why += (f" (the call's deadline of {self.retry.max_total_s:g}s leaves "
                        f"no time for another attempt, retry.max_total_s)")
            self._emit(call.event("give_up", attempt, last_status, error=err))
            raise LLMInfraError(why) from None
        self._emit(call.event("retry", attempt, exc.status, delay, err))
        return delay

    # -- the agent --------------------------------------------------------------------

    def task_framing(self, shows_media: bool) -> str:
        """The task the prompts name: ``task_description``, else `VIDEO_TASK` when the
        unit's media is sent with the question, else `TEXT_TASK` (no video wording)."""
        if self.task_description:
            return self.task_description
        return VIDEO_TASK if shows_media and self.media is not None else TEXT_TASK

    def messages(self, task: UnitTask, mcq: MCQ) -> list[dict[str, Any]]:
        """The first step's conversation: the skill as system instructions, then the unit
        (a plain string unless the unit shows media)."""
        last = THINK_PROMPT if self.think else ANSWER_PROMPT
        text = f"{mcq.prompt()}\n\n{last}"
        content = text if self.media is None else self.media.user_content(text, mcq.media)
        preamble = system_preamble(self.task_framing(mcq.media is not None))
        return [{"role": "system", "content": preamble + task.skill},
                {"role": "user", "content": content}]

    def body(self, call_kind: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The request of one call: model, messages, sampling, its kind's ``max_tokens``."""
        body = {"model": self.model, "messages": messages, **self.params}
        budgets = self.max_tokens
        if call_kind in budgets:
            body["max_tokens"] = budgets[call_kind]
        return body

    async def _cached_call(self, task: UnitTask, call_kind: str,
                           messages: list[dict[str, Any]],
                           validate: Validator) -> tuple[dict[str, Any], str]:
        """One of the unit's calls through the cache: (the reply, where it came from)."""
        body = self.body(call_kind, messages)

        async def call() -> dict[str, Any]:
            try:
                return await self.chat(body, run_id=task.run_id, unit_id=task.unit_id,
                                       call_kind=call_kind)
            except (ContextOverflowError, PromptFilteredError) as exc:  # the arm's answer
                return refused_reply(self.model, exc)

        if self.cache is None:
            return await call(), "uncached"
        parts = KeyParts.from_request(body, self.base_url, self.cache.salt(task.run_id))
        res = await self.cache.get_or_call(parts, call, validate=validate, run_id=task.run_id)
        return res.response, res.source

    async def infer(self, task: UnitTask) -> UnitResult:
        """Answer ``task``'s unit with ``task.skill``; INFRA when the endpoint fails."""
        mcq = self.units.get(task.unit_id)
        if mcq is None:
            raise KeyError(f"LLMAgent has no unit {task.unit_id!r}")
        t0 = time.perf_counter()
        n = len(mcq.options)
        steps: list[dict[str, Any]] = []  # the trace's calls (its stored key: "steps")
        tokens = 0
        kinds = ["think", "answer"] if self.think else ["answer"]
        prediction: str | None = None
        error: str | None = None
        try:  # frame references hash the files: one deleted since the ladder is INFRA
            messages = self.messages(task, mcq)
        except MediaError as exc:
            return self._result(task, t0, steps, tokens, infra=True,
                                error=f"unit {task.unit_id!r}: {exc}")
        for i, kind in enumerate(kinds):
            if i:
                messages = [*messages, {"role": "assistant", "content": steps[-1]["content"]},
                            {"role": "user", "content": ANSWER_PROMPT}]
            try:  # cached unless INFRA: an unusable answer is replayed like any answer
                resp, source = await self._cached_call(task, kind, messages, protocol_failure)
            except LLMInfraError as exc:
                where = f"unit {task.unit_id!r}: " if isinstance(exc, MediaError) else ""
                return self._result(task, t0, steps, tokens, infra=True,
                                    error=f"{kind} step: {where}{exc}")  # stored text
            used = usage_tokens(resp)
            tokens += used if source in ("miss", "bypass", "uncached") else 0
            steps.append({"step": kind, "source": source, "content": reply_text(resp),
                          "finish_reason": finish_reason(resp), "tokens": used})
            why = _unusable(resp, kind, mcq.options)
            if why in PROTOCOL_FAILURES:
                return self._result(task, t0, steps, tokens, infra=True,
                                    error=f"{kind} step: {why}")
            if why is not None:
                error = f"{kind} step: {why}"  # the model answered, unusably: a wrong answer
                break
        else:
            prediction = parse_choice(steps[-1]["content"], n, options=mcq.options)
        return self._result(task, t0, steps, tokens, prediction=prediction, error=error,
                            correct=prediction == mcq.answer)

    __call__ = infer

    def _result(self, task: UnitTask, t0: float, steps: list[dict[str, Any]], tokens: int, *,
                infra: bool = False, correct: bool = False, prediction: str | None = None,
                error: str | None = None) -> UnitResult:
        cached = bool(steps) and not infra and all(
            s["source"] in ("hit", "coalesced") for s in steps)
        trace = {"run_id": task.run_id, "unit_id": task.unit_id, "model": self.model,
                 "agent_version": AGENT_VERSION, "steps": steps}
        return UnitResult(correct=correct, infra=infra, cached=cached, prediction=prediction,
                          latency_s=time.perf_counter() - t0, tokens=tokens,
                          trace=trace, error=error)


def _unusable(resp: Mapping[str, Any], call_kind: str, options: Sequence[str]) -> str | None:
    """Why a call's reply cannot be used (a protocol failure: INFRA; anything else: the
    model's unusable answer, graded wrong), or None."""
    refused = refusal_text(resp)
    if refused is not None:
        return refused
    why = validate_response(resp)
    if why == "empty message content" and reply_text(resp):
        why = None  # a tool call carries the answer
    if why is None and call_kind == "answer" and parse_choice(
            reply_text(resp), len(options), options=options) is None:
        why = "unparseable answer"
        if finish_reason(resp) == "length":
            why += " (cut at max_tokens: finish_reason length)"
    return why
