"""Several inference endpoints behind one agent: per-endpoint concurrency limits (fixed caps,
or adaptive: `GradientLimit`), least-loaded routing among the healthy ones, down after
consecutive failures, probed back.

`EndpointPool.exchange(client, method, path, json=...)` sends one request to the endpoint
with the lowest load (in flight / limit) that is up and below its limit, waiting when every
endpoint is at its limit; a connection error, a timeout or a 200 whose body is not a chat
completion counts against that endpoint, and ``fail_after`` of them in a row mark it down
until a probe (one real call, after ``probe_after_s``) gets an answer. HTTP statuses, even
5xx, prove the server is there: they count as errors but never mark it down; a timeout, a
429, a 503 or a 529 also halves an adaptive limit. `EndpointPool.limit` is what the gate may have
in flight right now (the sum of the up endpoints' limits): the gate consults it before each
dispatch (`vtrm_gate.gate.Admission`), so an unstarted call waits in the gate, where a
freeze can still drop it, never inside the agent. Counters per endpoint: calls, errors,
latency p50/p95, the current limit (`stats`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import httpx

from .._env import DEFAULT_CONCURRENCY, mask_url, read_settings_text, user_path
from .._ids import strict_json
from ..errors import EndpointsError, is_whole, not_utf8, shown
from ._limit import PREFILL_TOKENS, GradientLimit, LimitParams

DEFAULT_CAP = DEFAULT_CONCURRENCY
OVERLOAD_STATUSES = frozenset({429, 503, 529})
"""Statuses that say "fewer at once" (529: overloaded, Anthropic's and some gateways')."""
MIN_SAMPLES_FOR_TIMEOUT = 10
TIMEOUT_MULTIPLE = 3.0
"""An attempt may take this multiple of the endpoint's recent p95 latency (of its kind)."""


def url_problem(label: str, url: object) -> str | None:
    """Why ``url`` cannot be an OpenAI-compatible base URL, as a message naming ``label``
    (its credentials masked), or None: not http(s), not a URL, no host, or a port no
    connection can use (99999 was taken, then failed inside connect())."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        what = shown(mask_url(url)) if isinstance(url, str) else shown(url)
        return f"{label} must be an http(s):// URL, got {what}"
    why = _unusable_url(url)
    return None if why is None else f"{label} {shown(mask_url(url))}: {why}"


CHAT_PATH = "/chat/completions"
"""What the agent appends to a base URL for a chat call."""


def _unusable_url(url: str) -> str | None:
    if (space := re.search(r"[\s\x00-\x1f\x7f\u200b\ufeff]", url)) is not None:
        return (f"character {space.start() + 1} of {len(url)} is U+{ord(space.group()):04X}, "
                f"a space or control character, which no URL holds (pasted with one?)")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        if not str(e).startswith("Port out of range"):
            return f"is not a URL ({e})"
        port = int(parts.netloc.rsplit(":", 1)[-1])
    if not parts.hostname:
        return "has no host"
    try:  # what httpx will do with it at every call ("xn--zz": an IDNAError traceback)
        _ = httpx.URL(url).host  # decoding an A-label happens here
    except (httpx.InvalidURL, UnicodeError, ValueError) as e:
        return f"{shown(parts.hostname)} is not a host name httpx can send to ({e})"
    if port is not None and not 1 <= port <= 65535:
        return f"port {port} is not from 1 to 65535"
    if parts.path.rstrip("/").endswith(CHAT_PATH):
        return (f"is the chat endpoint itself: give its base URL, without {CHAT_PATH} (the "
                f"agent appends it: calls would go to …{CHAT_PATH}{CHAT_PATH})")
    return None


def endpoint_url(base: str, path: str) -> str:
    """``base``/``path`` with any query of ``base`` after the path: an Azure-style
    ``…/openai?api-version=2024-06-01`` asks ``…/openai/chat/completions?api-version=…``
    (appended as text, the path went into the query and every call was a 404)."""
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{path.lstrip('/')}"))


def base_and_query(base: str) -> tuple[str, list[tuple[str, str]]]:
    """``base`` without its query, and the query's pairs: for an `httpx.AsyncClient`, whose
    ``base_url`` joins a relative path after any query it holds (pass the pairs as
    ``params``)."""
    parts = urlsplit(base)
    return urlunsplit(parts._replace(query="")), parse_qsl(parts.query, keep_blank_values=True)


@dataclass(frozen=True)
class Endpoint:
    """One OpenAI-compatible base URL and the most calls it may have in flight."""

    url: str
    max_concurrency: int = DEFAULT_CAP

    def __post_init__(self) -> None:
        problem = url_problem("endpoint url", self.url)
        if problem is not None:
            raise EndpointsError(problem)
        cap = self.max_concurrency
        if not is_whole(cap) or cap < 1:
            raise EndpointsError(f"endpoint {self.url}: max_concurrency must be an integer "
                                 f">= 1, got {cap!r}")
        object.__setattr__(self, "url", self.url.rstrip("/"))


def parse_endpoints(value: Any) -> tuple[Endpoint, ...]:
    """Endpoints from a URL, a list of URLs / ``{"url", "max_concurrency"}`` objects, or the
    lines ``URL [max_concurrency]`` of an endpoints file's text (a comma may stand for the
    space). Duplicates are refused."""
    if isinstance(value, str):
        items: list[Any] = []
        for line in value.splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = [p for p in re.split(r"[\s,]+", line) if p]  # "URL, cap" too
            if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdecimal()):
                raise EndpointsError(f"endpoint line {line!r}: expected 'URL [max_concurrency]'")
            items.append({"url": parts[0], "max_concurrency": int(parts[1])} if len(parts) == 2
                         else parts[0])
    elif isinstance(value, Sequence):
        items = list(value)
    else:
        raise EndpointsError(f"endpoints must be a URL or a list, got {type(value).__name__}")
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(Endpoint(item))
        elif isinstance(item, Mapping) and set(item) <= {"url", "max_concurrency"}:
            out.append(Endpoint(item.get("url"),  # type: ignore[arg-type]  # checked there
                                item.get("max_concurrency", DEFAULT_CAP)))
        else:
            raise EndpointsError(f"endpoint {item!r}: expected a URL or "
                                 f"{{\"url\", \"max_concurrency\"}}")
    if not out:
        raise EndpointsError("no endpoints")
    urls = [e.url for e in out]
    dup = sorted({u for u in urls if urls.count(u) > 1})
    if dup:
        raise EndpointsError(f"duplicate endpoints {dup}")
    return tuple(out)


def read_endpoints_file(path: str | Path) -> tuple[Endpoint, ...]:
    """An endpoints file: JSON (a list, as in `parse_endpoints`) or ``URL [cap]`` lines."""
    p = user_path(path)
    try:
        text = read_settings_text(p)
    except OSError as exc:
        raise EndpointsError(f"{p}: cannot read the endpoints file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise EndpointsError(f"{p}: {not_utf8(exc)}") from None
    try:
        value: Any = strict_json(text) if text.lstrip().startswith("[") else text
        return parse_endpoints(value)
    except json.JSONDecodeError as exc:
        raise EndpointsError(f"{p}: malformed JSON at line {exc.lineno}: {exc.msg}") from None
    except RecursionError:
        raise EndpointsError(f"{p}: nested too deeply to be an endpoints file") from None
    except EndpointsError as exc:
        raise EndpointsError(f"{p}: {exc}") from None


def gate_concurrency(requested: int | None, endpoints: Sequence[Endpoint]) -> int:
    """The gate's slot pool: the sum of the endpoint caps, or ``requested`` if lower."""
    total = sum(e.max_concurrency for e in endpoints)
    return total if requested is None else min(requested, total)


def _percentile(sorted_values: Sequence[float], q: float) -> float | None:
    if not sorted_values:
        return None
    i = max(0, math.ceil(q * len(sorted_values)) - 1)
    return sorted_values[i]


@dataclass(frozen=True)
class EndpointStats:
    """Counters of one endpoint (latencies of answered calls, in seconds)."""

    url: str
    max_concurrency: int
    up: bool
    calls: int
    errors: int
    transport_failures: int
    times_down: int
    in_flight: int
    latency_p50_s: float | None
    latency_p95_s: float | None
    limit: int | None = None
    """The current adaptive limit (None: a fixed cap, ``max_concurrency``)."""
    limit_cuts: int = 0
    """Times a timeout or an overload status (429, 503, 529) cut the adaptive limit."""

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class Exchange:
    """One request through the pool; the caller reports how its body read (``outcome``):
    ``ok`` with the reply's completion ``tokens``, or ``malformed`` (a body that is no chat
    completion: counted against the endpoint like a dropped connection)."""

    response: Any
    url: str
    latency_s: float
    outcome: str = "unread"
    tokens: int = 0


@dataclass
class _State:
    endpoint: Endpoint
    limiter: GradientLimit | None = None
    in_flight: int = 0
    up: bool = True
    consecutive_failures: int = 0
    next_probe: float = 0.0
    probing: bool = False
    calls: int = 0
    errors: int = 0
    transport_failures: int = 0
    times_down: int = 0
    generation: int = 0
    """Bumped each time the endpoint goes down or comes back: a call's verdict counts only
    in the generation it started in (a stale answer never revives a dead endpoint)."""
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=100_000))
    by_kind: dict[str, deque[float]] = field(default_factory=dict)
    per_token: deque[float] = field(default_factory=lambda: deque(maxlen=200))

    @property
    def cap(self) -> int:
        """The calls it may have in flight now: its adaptive limit, or its fixed cap."""
        return self.endpoint.max_concurrency if self.limiter is None else self.limiter.limit

    @property
    def load(self) -> float:
        return self.in_flight / self.cap


class EndpointPool:
    """Route calls over several endpoints (see the module docstring).

    ``adaptive``: each endpoint's limit adapts to its latency (`GradientLimit`, never above
    its ``max_concurrency`` nor ``max_limit``); otherwise the caps are fixed.
    """

    def __init__(self, endpoints: Sequence[Endpoint] | Any, *, fail_after: int = 3,
                 probe_after_s: float = 1.0, adaptive: bool = False,
                 max_limit: int | None = None, limit_params: LimitParams | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        eps = parse_endpoints(endpoints) if not all(
            isinstance(e, Endpoint) for e in endpoints) else tuple(endpoints)
        if fail_after < 1 or probe_after_s < 0:
            raise ValueError("EndpointPool: fail_after must be >= 1 and probe_after_s >= 0")
        if max_limit is not None and max_limit < 1:
            raise ValueError(f"EndpointPool.max_limit must be >= 1, got {max_limit}")
        self.endpoints: tuple[Endpoint, ...] = eps
        self.fail_after, self.probe_after_s, self._clock = fail_after, probe_after_s, clock
        self.adaptive = adaptive
        params = limit_params or LimitParams()
        self._states = [_State(e, GradientLimit(min(e.max_concurrency, max_limit or
                                                    e.max_concurrency), params, clock)
                               if adaptive else None) for e in eps]
        self._waiters: deque[asyncio.Future[None]] = deque()

    def __repr__(self) -> str:
        return f"EndpointPool({[e.url for e in self.endpoints]!r})"

    @property
    def capacity(self) -> int:
        return sum(e.max_concurrency for e in self.endpoints)

    def limit(self) -> int:
        """The calls the pool serves at once right now: the up endpoints' limits summed (at
        least 1, so a probe of a down endpoint can go). What the gate admits (`Admission`)."""
        return max(1, sum(s.cap for s in self._states if s.up))

    @property
    def identity(self) -> str:
        """What the response-cache key holds instead of one base URL: the pool's sorted URLs
        (replicas of one model share answers, whichever served them)."""
        urls = ",".join(sorted(e.url for e in self.endpoints))
        return f"https://endpoints.invalid/{hashlib.sha256(urls.encode()).hexdigest()[:16]}"

    # -- slots ------------------------------------------------------------------------

    def _pick(self) -> _State | None:
        now = self._clock()
        for s in self._states:  # a down endpoint whose probe is due takes one call first
            if not s.up and not s.probing and now >= s.next_probe:
                s.probing = True
                return s
        best = None
        for s in self._states:
            if s.up and s.in_flight < s.cap and (best is None or s.load < best.load):
                best = s
        return best

    def _wake(self, n: int = 1) -> None:
        while n and self._waiters:
            fut = self._waiters.popleft()
            if not fut.done() and not fut.get_loop().is_closed():
                fut.set_result(None)
                n -= 1

    async def _acquire(self) -> _State:
        while True:
            s = self._pick()
            if s is not None:
                s.in_flight += 1
                return s
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            due = [st.next_probe for st in self._states if not st.up and not st.probing]
            timeout = max(0.0, min(due) - self._clock()) if due else None
            try:
                await asyncio.wait_for(fut, timeout)
            except TimeoutError:
                pass
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._wake()  # pass the wake-up on
                raise

    def _answered(self, s: _State, gen: int, *, error: bool, latency: float) -> None:
        s.calls += 1
        s.errors += error
        s.latencies.append(latency)
        if gen != s.generation:  # sent before it went down (or came back): says nothing now
            return
        s.consecutive_failures = 0
        if not s.up or s.probing:
            s.up, s.probing = True, False
            s.generation += 1
            self._wake(len(self._waiters))

    def _failed(self, s: _State, gen: int) -> None:
        s.calls += 1
        s.errors += 1
        s.transport_failures += 1
        if gen == s.generation:  # a call from before the last change of state counts no more
            s.consecutive_failures += 1
            if s.probing or (s.up and s.consecutive_failures >= self.fail_after):
                if s.up:
                    s.times_down += 1
                    s.generation += 1
                s.up, s.probing = False, False
                s.next_probe = self._clock() + self.probe_after_s
        self._wake(len(self._waiters))  # the work may go elsewhere now

    def _done(self, s: _State, probe: bool) -> None:
        s.in_flight -= 1
        if probe:
            s.probing = False  # a probe that ended without a verdict: the next one may go
        self._wake()

    def attempt_timeout(self, url: str, kind: str, floor: float,
                        max_tokens: int | None = None) -> float:
        """An attempt's timeout on ``url`` for a request of ``kind``: ``floor``, or more when
        the endpoint is slower than that, once `MIN_SAMPLES_FOR_TIMEOUT` answers are in:
        `TIMEOUT_MULTIPLE` x its recent p95 latency of the kind, and for a reply of up to
        ``max_tokens`` tokens 2 x its p95 latency per token (prefill counted as
        `PREFILL_TOKENS`) x that budget. So a slow server is waited for instead of being
        asked again and again, and a long reply (the evolver's) is given its time."""
        s = next((st for st in self._states if st.endpoint.url == url), None)
        if s is None:
            return floor
        out = floor
        seen = sorted(s.by_kind.get(kind, ()))
        if len(seen) >= MIN_SAMPLES_FOR_TIMEOUT:
            out = max(out, TIMEOUT_MULTIPLE * (_percentile(seen, 0.95) or 0.0))
        per_token = sorted(s.per_token)
        if max_tokens and len(per_token) >= MIN_SAMPLES_FOR_TIMEOUT:
            p95 = _percentile(per_token, 0.95) or 0.0
            out = max(out, 2.0 * p95 * (1.0 + max_tokens / PREFILL_TOKENS))
        return out

    def _settle(self, s: _State, gen: int, ex: Exchange, kind: str, sent_in_flight: int,
                sent_at: float) -> None:
        """Account one answered request once its body was read (or abandoned); ``gen`` is
        the endpoint's generation when it was sent."""
        status = ex.response.status_code
        if ex.outcome == "malformed":
            self._failed(s, gen)
            return
        self._answered(s, gen, error=status >= 500 or status == 429, latency=ex.latency_s)
        if s.limiter is not None and status in OVERLOAD_STATUSES:
            s.limiter.on_overload(sent_at)
        elif ex.outcome == "ok" and status < 400:
            s.by_kind.setdefault(kind, deque(maxlen=200)).append(ex.latency_s)
            s.per_token.append(ex.latency_s / (1.0 + ex.tokens / PREFILL_TOKENS))
            if s.limiter is not None:
                before = s.limiter.limit
                s.limiter.on_answer(kind, ex.latency_s, ex.tokens, sent_in_flight,
                                    s.in_flight - 1)
                if s.limiter.limit > before:
                    self._wake(len(self._waiters))

    @contextlib.asynccontextmanager
    async def exchange(self, client: Any, method: str, path: str, *, kind: str = "call",
                       timeout: float | None = None, deadline: float | None = None,
                       info: dict[str, Any] | None = None,
                       **kwargs: Any) -> AsyncIterator[Exchange]:
        """``client.stream(method, <endpoint>/<path>, **kwargs)`` on the chosen endpoint (an
        httpx client or `ShardedClient`), yielding an `Exchange` for the caller to report
        on. A transport error (a timeout included) counts against the endpoint and is
        re-raised for the caller's retries; latency is the time to the response headers.

        ``timeout`` is the attempt's floor (`attempt_timeout` may give more), cut to end
        before ``deadline`` (the call's, on this pool's clock), so an attempt that runs out
        the call's time is the endpoint's timeout, counted against it. ``info`` receives the
        ``url`` and the ``timeout_s`` used."""
        import httpx

        s = await self._acquire()
        probe = not s.up  # a call on a down endpoint is its probe
        sent_in_flight, t0, gen = s.in_flight, self._clock(), s.generation
        if timeout is not None:
            budget = (kwargs.get("json") or {}).get("max_tokens")
            t = self.attempt_timeout(s.endpoint.url, kind, timeout,
                                     budget if isinstance(budget, int) else None)
            if deadline is not None:  # end just before the call's deadline cancels it
                t = max(0.001, min(t, (deadline - t0) * 0.95 - 0.02))
            kwargs["timeout"] = httpx.Timeout(t)
            if info is not None:
                info["timeout_s"] = t
        if info is not None:
            info["url"] = s.endpoint.url
        ex: Exchange | None = None
        try:
            async with client.stream(method, endpoint_url(s.endpoint.url, path),
                                     **kwargs) as r:
                ex = Exchange(r, s.endpoint.url, self._clock() - t0)
                try:
                    yield ex
                except httpx.TransportError:  # the body stopped: the endpoint failed us
                    ex.outcome = "malformed"
                    raise
                finally:
                    self._settle(s, gen, ex, kind, sent_in_flight, t0)
        except httpx.TransportError as exc:
            if ex is None:
                self._failed(s, gen)
                if s.limiter is not None and isinstance(exc, httpx.TimeoutException):
                    s.limiter.on_overload(t0)
            raise
        finally:
            self._done(s, probe)

    @contextlib.asynccontextmanager
    async def stream(self, client: Any, method: str, path: str,
                     **kwargs: Any) -> AsyncIterator[Any]:
        """`exchange` for a caller that only wants the response (its body read = ok)."""
        async with self.exchange(client, method, path, **kwargs) as ex:
            yield ex.response
            ex.outcome = "ok"

    async def post(self, client: Any, path: str, **kwargs: Any) -> Any:
        """``client.post`` through `stream` (the body read in full)."""
        async with self.stream(client, "POST", path, **kwargs) as r:
            await r.aread()
            return r

    # -- counters ---------------------------------------------------------------------

    def stats(self) -> tuple[EndpointStats, ...]:
        out = []
        for s in self._states:
            lat = sorted(s.latencies)
            out.append(EndpointStats(s.endpoint.url, s.endpoint.max_concurrency, s.up,
                                     s.calls, s.errors, s.transport_failures, s.times_down,
                                     s.in_flight, _percentile(lat, 0.50),
                                     _percentile(lat, 0.95),
                                     None if s.limiter is None else s.limiter.limit,
                                     0 if s.limiter is None else s.limiter.decreases))
        return tuple(out)


def endpoint_lines(stats: Sequence[EndpointStats]) -> str:
    """The per-endpoint counters as text lines (for the step report)."""
    lines = ["endpoints:"]
    for s in stats:
        p50 = "-" if s.latency_p50_s is None else f"{s.latency_p50_s * 1000:.0f} ms"
        p95 = "-" if s.latency_p95_s is None else f"{s.latency_p95_s * 1000:.0f} ms"
        limit = "" if s.limit is None else f" (adaptive: now {s.limit}, cut {s.limit_cuts}x)"
        lines.append(f"  {s.url:<40} {'up' if s.up else 'DOWN':<4} cap {s.max_concurrency:>3}"
                     f"{limit}  calls {s.calls:>6}  errors {s.errors:>4}  down "
                     f"{s.times_down}x  p50 {p50}  p95 {p95}")
    return "\n".join(lines)


def check_endpoints_setting(agent: Mapping[str, Any]) -> None:
    """An agent config's endpoints: ``base_url`` as a list, or ``endpoints_file`` (a path,
    read at step time) — not both; ValueError naming the fault."""
    if "endpoints_file" in agent:
        f = agent["endpoints_file"]
        if agent.get("base_url"):
            raise EndpointsError("agent: give base_url or endpoints_file, not both")
        if not isinstance(f, str) or not f.strip():
            raise EndpointsError(f"agent.endpoints_file must be a path, got {f!r}")
        return
    try:
        parse_endpoints(agent.get("base_url"))
    except EndpointsError as exc:
        raise EndpointsError(f"agent.base_url: {exc}") from None


def agent_endpoints(agent: Mapping[str, Any], root: str | Path = ".") -> tuple[Endpoint, ...]:
    """The endpoints an agent config names (``endpoints_file`` relative to ``root``)."""
    if agent.get("endpoints_file"):
        return read_endpoints_file(Path(root) / agent["endpoints_file"])
    return parse_endpoints(agent.get("base_url"))


class ShardedClient:
    """Several ``httpx.AsyncClient`` shards of at most ``per_shard`` connections each, used
    like one client (``post``, ``aclose``).

    Why: httpcore's pool re-scans every connection for every waiting request on each event,
    so one pool of C connections costs O(C) per call and O(C^2) per round of C calls (the
    superlinear overhead `benchmarks/bench_throughput.py` measured). A call goes to a shard
    with fewer than ``per_shard`` calls in flight (a new shard when all are full), so no pool
    ever holds more than ``per_shard`` connections and none queues.
    """

    def __init__(self, factory: Callable[[int], Any], per_shard: int = 16) -> None:
        if per_shard < 1:
            raise ValueError(f"ShardedClient.per_shard must be >= 1, got {per_shard}")
        self._factory, self.per_shard = factory, per_shard
        self._shards: list[_Shard] = []
        self._next = 0

    @property
    def shards(self) -> int:
        return len(self._shards)

    def warm(self) -> ShardedClient:
        """Make the first shard now: building a client (its TLS context) takes a blocking
        ~0.1 s that would otherwise land inside the first call's timeout."""
        if not self._shards:
            self._shards.append(_Shard(self._factory(self.per_shard)))
        return self

    def _pick(self) -> _Shard:
        n = len(self._shards)
        for _ in range(n):
            s = self._shards[self._next]
            self._next = (self._next + 1) % n
            if s.in_flight < self.per_shard:
                return s
        s = _Shard(self._factory(self.per_shard))
        self._shards.append(s)
        return s

    async def post(self, url: str, **kwargs: Any) -> Any:
        s = self._pick()
        s.in_flight += 1
        try:
            return await s.client.post(url, **kwargs)
        finally:
            s.in_flight -= 1

    @contextlib.asynccontextmanager
    async def stream(self, method: str, url: str, **kwargs: Any) -> AsyncIterator[Any]:
        s = self._pick()
        s.in_flight += 1
        try:
            async with s.client.stream(method, url, **kwargs) as r:
                yield r
        finally:
            s.in_flight -= 1

    async def aclose(self) -> None:
        shards, self._shards, self._next = self._shards, [], 0
        for s in shards:
            await s.client.aclose()


@dataclass
class _Shard:
    client: Any
    in_flight: int = 0
