"""LLM response cache on Redis (SPEC §5): content-addressed keys, single flight, never a SPOF.

Key: ``{prefix}:{sha256(canonical JSON of model, base URL, messages (exactly as sent, media
references included), sampling params, tools, response_format, schema version, salt)}``; only
top-level request bookkeeping (``request_id``, ``user``, ``metadata``...) is left out, never a
field by name at any depth. The salt is the workspace's namespace plus the run id, so a
fresh base-arm run never replays the samples of the run that selected its units. Only
responses that pass the caller's validator are written (``SET ... EX ttl``, atomic; the
agent's accepts any chat completion, an unusable answer included, so a re-run replays it),
never one the encoder cannot store; a malformed value is a miss and is overwritten. If Redis
is down, calls go uncached and counted, with one warning when the outage begins and one when
it ends, and caching resumes by itself when Redis is back.

Also here: TTL renewal (`renew_ttl`, SCAN + one round trip per batch, never KEYS) and
`cache_stats` for the ``vtrm-gate cache`` commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, make_dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from . import cluster
from ._env import DEFAULT_TTL as DEFAULT_TTL
from ._env import REDIS_SCHEMES as REDIS_SCHEMES
from ._env import cache_enabled as cache_enabled
from ._env import check_redis_url as check_redis_url
from ._env import environment as environment
from ._env import mask_url as mask_url
from ._env import parse_ttl as parse_ttl
from ._env import read_dotenv as read_dotenv
from ._env import scrub as scrub
from ._env import scrub_credentials as scrub_credentials

if TYPE_CHECKING:
    from .scheduler import UnitResult, UnitTask

SCHEMA_VERSION = 1
DEFAULT_PREFIX = "llm_cache"

# Top-level request fields that are bookkeeping (ids, end-user tags, delivery options) and do
# not change the response's content. Nothing is ever stripped by name inside the messages: a
# nested "timestamp" or "id" may be what tells two video frames apart.
VOLATILE_REQUEST_FIELDS = frozenset({"request_id", "user", "metadata", "store", "stream",
                                     "stream_options"})
_NOT_IN_KEY = frozenset({"model", "messages", "tools", "response_format"}) \
    | VOLATILE_REQUEST_FIELDS

RECOVERY_OPS = 3
"""Redis operations in a row that must succeed before an outage is declared over."""

log = logging.getLogger("vtrm_gate.cache")

Response = dict[str, Any]
Validator = Callable[[Any], "str | None"]


# ---- connection -----------------------------------------------------------------------


MAX_CONNECTIONS = 256


def connect(url: str, *, socket_timeout: float = 0.5, retries: int = 1) -> aredis.Redis:
    """A `redis.asyncio.Redis` with short timeouts, so a dead server never hangs a call.

    One immediate retry on a fresh connection covers pooled sockets left stale by a restart.
    """
    check_redis_url(url)
    if cluster.is_cluster_url(url):
        return cluster.connect_cluster(url, socket_timeout=socket_timeout, retries=retries)
    # A bounded pool that waits for a free connection: the default pool raises "Too many
    # connections" past 100 concurrent commands, which would turn a busy gate into an outage.
    pool = aredis.BlockingConnectionPool.from_url(
        url, max_connections=MAX_CONNECTIONS, timeout=max(socket_timeout, 5.0),
        socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout,
        retry=Retry(NoBackoff(), retries), health_check_interval=0)
    return aredis.Redis(connection_pool=pool)


# ---- keys -----------------------------------------------------------------------------


def canonical_json(obj: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept: equal values give equal bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _normalise_base_url(url: str) -> str:
    """Lower-case scheme and host, no credentials, no trailing slash."""
    p = urlsplit(url.strip())
    host = (p.hostname or "").lower() + (f":{p.port}" if p.port else "")
    return urlunsplit((p.scheme.lower(), host, p.path.rstrip("/"), p.query, ""))


def salt_for_run(run_id: str, namespace: str = "") -> str:
    """The cache salt of a run: the cache's namespace (see `cache_namespace`), then the run
    id. Arm run ids name the step, so a new step's base arm never reuses the samples of an
    earlier run; a re-run step reuses its own; another workspace never reuses them."""
    return f"{namespace}/{run_id}" if namespace else run_id


def cache_namespace(workspace_id: str, share: str | None = None) -> str:
    """The salt namespace of a workspace: its own id, or ``share`` when the user opted in to
    sharing cached samples with every workspace configured with the same name."""
    return f"share:{share}" if share else f"ws:{workspace_id}"


KEY_COMPONENTS = ("schema", "model", "base_url", "messages", "params", "tools",
                  "response_format", "salt")


@dataclass(frozen=True)
class KeyParts:
    """Everything that identifies one chat call's response; its digest is the cache key."""

    model: str
    base_url: str
    messages: tuple[Any, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    tools: Any = None
    response_format: Any = None
    salt: str = ""
    schema: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "messages", tuple(self.messages))
        object.__setattr__(self, "base_url", _normalise_base_url(self.base_url))
        object.__setattr__(self, "params", dict(self.params))

    @classmethod
    def from_request(cls, body: Mapping[str, Any], base_url: str, salt: str) -> KeyParts:
        """Key parts of a chat-completions request body: every field but the top-level
        bookkeeping (`VOLATILE_REQUEST_FIELDS`) is a parameter."""
        params = {k: v for k, v in body.items() if k not in _NOT_IN_KEY}
        return cls(model=str(body["model"]), base_url=base_url,
                   messages=tuple(body["messages"]), params=params,
                   tools=body.get("tools"), response_format=body.get("response_format"),
                   salt=salt)

    def components(self) -> dict[str, Any]:
        return {"schema": self.schema, "model": self.model, "base_url": self.base_url,
                "messages": list(self.messages), "params": self.params, "tools": self.tools,
                "response_format": self.response_format, "salt": self.salt}

    @cached_property
    def digest(self) -> str:
        return _sha256(canonical_json(self.components()))

    def key(self, prefix: str = DEFAULT_PREFIX) -> str:
        return f"{prefix}:{self.digest}"

    def component_digests(self) -> dict[str, str]:
        """One short digest per key component: what `explain_miss` compares."""
        return {k: _sha256(canonical_json(v))[:16] for k, v in self.components().items()}

    def message_digests(self) -> list[str]:
        return [_sha256(canonical_json(m))[:16] for m in self.messages]


@dataclass(frozen=True)
class MissExplanation:
    """Why a call's key differs from a reference call's key: the components that differ."""

    key: str
    reference_key: str | None
    differing: tuple[str, ...]
    first_differing_message: int | None = None
    note: str = ""

    @property
    def same(self) -> bool:
        return not self.differing

    def __str__(self) -> str:
        if self.note:
            return self.note
        if self.same:
            return f"{self.key}: every key component matches the reference"
        msg = f"{self.key}: differs from the reference in {', '.join(self.differing)}"
        if self.first_differing_message is not None:
            msg += f" (messages differ from index {self.first_differing_message})"
        return msg


def _first_difference(a: Sequence[str], b: Sequence[str]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _explain(key: str, ref_key: str | None, mine: Mapping[str, str], theirs: Mapping[str, str],
             my_msgs: Sequence[str], their_msgs: Sequence[str]) -> MissExplanation:
    differing = tuple(c for c in KEY_COMPONENTS if mine.get(c) != theirs.get(c))
    first = _first_difference(my_msgs, their_msgs) if "messages" in differing else None
    return MissExplanation(key, ref_key, differing, first)


def explain_miss(parts: KeyParts, reference: KeyParts,
                 prefix: str = DEFAULT_PREFIX) -> MissExplanation:
    """Which key components of ``parts`` differ from ``reference`` (and the first message)."""
    return _explain(parts.key(prefix), reference.key(prefix), parts.component_digests(),
                    reference.component_digests(), parts.message_digests(),
                    reference.message_digests())


def validate_response(resp: Any) -> str | None:
    """Why a chat-completions response must not be cached, or None if it is fine."""
    if not isinstance(resp, Mapping):
        return "response is not a JSON object"
    if resp.get("error"):
        return "response carries an error"
    choices = resp.get("choices")
    if not isinstance(choices, list) or not choices:
        return "empty choices"
    first = choices[0]
    if not isinstance(first, Mapping):
        return "malformed choice"
    if first.get("finish_reason") == "content_filter":
        return "content filtered"
    msg = first.get("message")
    if not isinstance(msg, Mapping):
        return "choice has no message"
    content = msg.get("content")
    if not (isinstance(content, str) and content.strip()) and not msg.get("tool_calls"):
        return "empty message content"
    return None


# Validation failures that mean the endpoint misbehaved (INFRA), not that the model answered.
PROTOCOL_FAILURES = frozenset({"response is not a JSON object", "response carries an error",
                               "empty choices", "malformed choice", "choice has no message"})


def protocol_failure(resp: Any) -> str | None:
    """Why ``resp`` is not a chat completion at all (INFRA, never cached), or None: the
    model answered, maybe unusably (filtered, empty, unparseable), and that answer is cached
    like any other so a re-run replays the same outcome."""
    why = validate_response(resp)
    return why if why in PROTOCOL_FAILURES else None


# ---- counters -------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of the cache counters (one run, or all runs).

    ``hits``: served from Redis; ``coalesced``: served by an identical concurrent call;
    ``misses``: looked up, absent (or malformed), called; ``bypassed``: called without a
    lookup (cache off, or Redis down); ``errors``: failed Redis operations;
    ``not_cached``: responses not written because they failed validation.
    """

    hits: int = 0
    misses: int = 0
    coalesced: int = 0
    bypassed: int = 0
    errors: int = 0
    malformed: int = 0
    writes: int = 0
    not_cached: int = 0

    @property
    def calls(self) -> int:
        return self.hits + self.misses + self.coalesced + self.bypassed

    @property
    def requests(self) -> int:
        """Calls that went to the backend: misses, and calls made uncached (cache off or
        Redis down). A call's retries are not counted here (see `LLMAgent.http_requests`)."""
        return self.misses + self.bypassed

    @property
    def hit_rate(self) -> float:
        """Share of all calls served without a request (0.0 when there were none)."""
        return (self.hits + self.coalesced) / self.calls if self.calls else 0.0

    def as_dict(self) -> dict[str, float]:
        d: dict[str, float] = {f.name: getattr(self, f.name) for f in fields(self)}
        d["calls"] = self.calls
        d["requests"] = self.requests
        d["hit_rate"] = self.hit_rate
        return d


# The mutable per-run counters behind a CacheStats snapshot: the same fields, one list.
_Counters = make_dataclass("_Counters", [(f.name, int, 0) for f in fields(CacheStats)])


@dataclass(frozen=True)
class CacheResult:
    """A response and where it came from."""

    response: Response
    source: Literal["hit", "miss", "coalesced", "bypass"]
    key: str | None = None

    @property
    def cached(self) -> bool:
        return self.source in ("hit", "coalesced")


class _LeaderCancelled(Exception):
    """The call a follower waited on was cancelled: the follower makes its own."""


# ---- the cache ------------------------------------------------------------------------


class ResponseCache:
    """The LLM response cache. ``url=None`` starts the workspace's embedded Redis on first use.

    One instance serves any number of runs; counters are kept per run id. ``namespace``
    (the workspace's, see `cache_namespace`) goes into every salt made by `salt`. Bound
    lazily to the running event loop: a new loop (a new ``asyncio.run``) gets a new client.
    """

    def __init__(self, url: str | None = None, *, ttl: int = DEFAULT_TTL,
                 prefix: str = DEFAULT_PREFIX, enabled: bool = True,
                 workspace: str | os.PathLike[str] | None = None,
                 socket_timeout: float = 0.5, retry_interval: float = 1.0,
                 namespace: str = "") -> None:
        if url is not None:
            check_redis_url(url)
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0:
            raise ValueError(f"ResponseCache.ttl must be an integer number of seconds > 0, "
                             f"got {ttl!r}")
        if not prefix or not isinstance(prefix, str) or any(c in prefix for c in "*?[]"):
            raise ValueError(f"ResponseCache.prefix must be a non-empty string without glob "
                             f"characters, got {prefix!r}")
        if retry_interval < 0 or socket_timeout <= 0:
            raise ValueError("ResponseCache: socket_timeout must be > 0 and "
                             "retry_interval >= 0")
        self._url = url
        self.ttl, self.prefix, self.enabled = ttl, prefix, enabled
        self.namespace = namespace
        self.workspace = Path(workspace) if workspace is not None else None
        self.socket_timeout, self.retry_interval = socket_timeout, retry_interval
        self._redis: aredis.Redis | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inflight: dict[str, asyncio.Future[Response]] = {}
        self._inflight_loop: asyncio.AbstractEventLoop | None = None
        self._counters: dict[str, _Counters] = {}
        self._down = False
        self._era = 0  # bumped when an outage begins or ends
        self._ok_streak = 0  # operations in a row that succeeded during an outage
        self._next_probe = 0.0
        self._server: Any = None
        self._start_lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> ResponseCache:
        """From ``REDIS_URL``, ``REDIS_CACHE_TTL``, ``VTRM_CACHE``, ``VTRM_CACHE_PREFIX`` and
        ``VTRM_WORKSPACE`` (``env`` as given, else ``.env`` in the cwd + the environment)."""
        e = environment(env)
        kwargs.setdefault("workspace", e.get("VTRM_WORKSPACE") or None)
        kwargs.setdefault("prefix", e.get("VTRM_CACHE_PREFIX") or DEFAULT_PREFIX)
        return cls(e.get("REDIS_URL") or None, ttl=parse_ttl(e.get("REDIS_CACHE_TTL")),
                   enabled=cache_enabled(e.get("VTRM_CACHE")), **kwargs)

    def salt(self, run_id: str) -> str:
        """The key salt of a run in this cache's namespace."""
        return salt_for_run(run_id, self.namespace)

    @property
    def url(self) -> str | None:
        """The server URL (None until the embedded server has started). May hold a password:
        print `masked_url` instead."""
        return self._url

    @property
    def masked_url(self) -> str:
        return mask_url(self._url) if self._url else "<embedded, not started>"

    @property
    def available(self) -> bool:
        """False while an outage is being waited out."""
        return not self._down

    def __repr__(self) -> str:
        return (f"ResponseCache(url={self.masked_url!r}, prefix={self.prefix!r}, "
                f"ttl={self.ttl}, enabled={self.enabled})")

    # -- counters ---------------------------------------------------------------------

    def _c(self, run: str) -> _Counters:
        c = self._counters.get(run)
        if c is None:
            c = self._counters[run] = _Counters()
        return c

    def stats(self, run_id: str | None = None) -> CacheStats:
        """Counters of one run (by run id) or, with no argument, of every run."""
        if run_id is not None:
            c = self._counters.get(run_id, _Counters())
            return CacheStats(**vars(c))
        total = {f.name: 0 for f in fields(_Counters)}
        for c in self._counters.values():
            for k, v in vars(c).items():
                total[k] += v
        return CacheStats(**total)

    def runs(self) -> tuple[str, ...]:
        """The run ids (salts) seen so far."""
        return tuple(r for r in self._counters if r)

    # -- connection -------------------------------------------------------------------

    async def _client(self) -> aredis.Redis:
        loop = asyncio.get_running_loop()
        if self._redis is None or self._loop is not loop:
            if self._url is None:
                await self._start_embedded(loop)
            if cluster.is_cluster_url(self._url):
                await self._connect_cluster(loop)
            elif self._redis is None or self._loop is not loop:  # re-checked after the await
                self._redis = connect(self._url, socket_timeout=self.socket_timeout)
                self._loop = loop
        return self._redis

    async def _connect_cluster(self, loop: asyncio.AbstractEventLoop) -> None:
        """Load a cluster's topology once, before any command: redis-py's cluster client
        drops connections when many first commands race to initialise it."""
        if self._start_lock is None or self._start_lock[0] is not loop:
            self._start_lock = (loop, asyncio.Lock())
        async with self._start_lock[1]:
            if self._redis is None or self._loop is not loop:
                client = connect(self._url, socket_timeout=self.socket_timeout)
                try:
                    await client.initialize()
                except BaseException:
                    await client.aclose()
                    raise
                self._redis, self._loop = client, loop

    async def _start_embedded(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the workspace's embedded server once, however many first calls race."""
        if self._start_lock is None or self._start_lock[0] is not loop:
            self._start_lock = (loop, asyncio.Lock())
        async with self._start_lock[1]:
            if self._url is None:
                from .redis_server import embedded_server

                ws = self.workspace or Path(os.environ.get("VTRM_WORKSPACE") or "workspace")
                self._server = await asyncio.to_thread(embedded_server, ws)
                self._url = self._server.url

    def _skip(self) -> bool:
        """True while Redis is known down and the next probe is not due yet."""
        return self._down and time.monotonic() < self._next_probe

    async def _op(self, run: str, fn: Callable[[aredis.Redis], Awaitable[Any]]) -> tuple[bool, Any]:
        """Run one Redis operation; on failure count it and return False.

        One warning when an outage begins and one when it ends. An outage ends after
        `RECOVERY_OPS` operations in a row succeed (a server flapping up and down is one
        outage), and an operation begun before the latest change of state (slow, in flight
        across it) neither begins nor ends one.
        """
        era = self._era
        try:
            client = await self._client()
            out = await fn(client)
        except asyncio.CancelledError:
            raise
        except (TimeoutError, RedisError, OSError, RuntimeError) as exc:
            self._c(run).errors += 1
            self._next_probe = time.monotonic() + self.retry_interval
            self._ok_streak = 0
            if not self._down and era == self._era:
                self._down, self._era = True, self._era + 1
                log.warning("Redis cache at %s is unavailable (%s); LLM calls go uncached "
                            "until it is back", self.masked_url,
                            scrub(f"{type(exc).__name__}: {exc}", self._url))
            return False, None
        if self._down and era == self._era and cluster.is_cluster(client) and \
                not await cluster.all_primaries_up(client):
            return True, out  # one primary still down: the outage goes on
        if self._down and era == self._era:
            self._ok_streak += 1
            if self._ok_streak >= RECOVERY_OPS:
                self._down, self._era, self._ok_streak = False, self._era + 1, 0
                log.warning("Redis cache at %s is reachable again; caching resumed",
                            self.masked_url)
        return True, out

    async def ping(self) -> bool:
        """True if Redis answers (also ends an outage early)."""
        ok, _ = await self._op("", lambda r: r.ping())
        return ok

    async def aclose(self) -> None:
        """Close the client of the current loop (the embedded server stops at exit)."""
        r, self._redis = self._redis, None
        if r is not None and self._loop is asyncio.get_running_loop():
            with contextlib.suppress(Exception):
                await r.aclose()

    # -- get / put --------------------------------------------------------------------

    def _decode(self, raw: bytes, validate: Validator) -> Response | None:
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):
            return None
        if not isinstance(value, dict) or value.get("schema") != SCHEMA_VERSION:
            return None
        resp = value.get("response")
        return resp if validate(resp) is None else None

    def _encode(self, parts: KeyParts, resp: Response) -> bytes | None:
        """The stored value, or None when ``resp`` has no JSON form (NaN, sets, nesting too
        deep for the encoder): such a response is served but never cached, never raised."""
        try:
            return self._encode_value(parts, resp)
        except (ValueError, TypeError, RecursionError):
            return None

    def _encode_value(self, parts: KeyParts, resp: Response) -> bytes:
        return canonical_json({"schema": SCHEMA_VERSION, "response": resp,
                               "components": parts.component_digests(),
                               "messages": parts.message_digests(),
                               "salt": parts.salt, "written_at": round(time.time(), 3)}).encode()

    async def lookup(self, parts: KeyParts, validate: Validator = validate_response,
                     run_id: str | None = None) -> Response | None:
        """The cached response for ``parts``, or None (absent, malformed, or Redis down)."""
        run = run_id if run_id is not None else parts.salt
        if not self.enabled or self._skip():
            return None
        key = parts.key(self.prefix)
        ok, raw = await self._op(run, lambda r: r.get(key))
        if not ok or raw is None:
            return None
        resp = self._decode(raw, validate)
        if resp is None:
            self._c(run).malformed += 1
        return resp

    async def store(self, parts: KeyParts, resp: Response, validate: Validator = validate_response,
                    run_id: str | None = None) -> bool:
        """Write ``resp`` with the TTL in one ``SET ... EX`` if it validates; True if written."""
        run = run_id if run_id is not None else parts.salt
        if validate(resp) is not None:
            self._c(run).not_cached += 1
            return False
        key, value = parts.key(self.prefix), self._encode(parts, resp)
        if value is None:
            self._c(run).not_cached += 1
            return False
        if not self.enabled or self._skip():
            return False
        ok, _ = await self._op(run, lambda r: r.set(key, value, ex=self.ttl))
        if ok:
            self._c(run).writes += 1
        return ok

    async def get_or_call(self, parts: KeyParts, call: Callable[[], Awaitable[Response]], *,
                          validate: Validator = validate_response,
                          run_id: str | None = None) -> CacheResult:
        """The cached response, else ``await call()`` (written only if it validates).

        Concurrent identical calls share one ``call()`` (single flight). An exception from
        ``call`` propagates and nothing is written.
        """
        run = run_id if run_id is not None else parts.salt
        c = self._c(run)
        if not self.enabled:
            c.bypassed += 1
            return CacheResult(await call(), "bypass")
        key = parts.key(self.prefix)
        loop = asyncio.get_running_loop()
        if self._inflight_loop is not loop:
            self._inflight, self._inflight_loop = {}, loop
        while True:
            leader = self._inflight.get(key)
            if leader is None:
                break
            try:
                resp = await asyncio.shield(leader)
            except _LeaderCancelled:
                continue
            c.coalesced += 1
            return CacheResult(resp, "coalesced", key)
        fut: asyncio.Future[Response] = loop.create_future()
        self._inflight[key] = fut
        try:
            result = await self._lead(parts, key, call, validate, run, c)
            fut.set_result(result.response)
            return result
        except asyncio.CancelledError:
            fut.set_exception(_LeaderCancelled())
            raise
        except BaseException as exc:
            fut.set_exception(exc)
            raise
        finally:
            if fut.done() and not fut.cancelled():
                fut.exception()  # mark retrieved: no "never retrieved" noise without followers
            if self._inflight.get(key) is fut:
                del self._inflight[key]

    async def _lead(self, parts: KeyParts, key: str, call: Callable[[], Awaitable[Response]],
                    validate: Validator, run: str, c: _Counters) -> CacheResult:
        if self._skip():
            c.bypassed += 1
            return CacheResult(await call(), "bypass", key)
        ok, raw = await self._op(run, lambda r: r.get(key))
        if not ok:
            c.bypassed += 1
            return CacheResult(await call(), "bypass", key)
        if raw is not None:
            resp = self._decode(raw, validate)
            if resp is not None:
                c.hits += 1
                return CacheResult(resp, "hit", key)
            c.malformed += 1
        c.misses += 1
        resp = await call()
        await self.store(parts, resp, validate, run)
        return CacheResult(resp, "miss", key)

    # -- debug ------------------------------------------------------------------------

    async def explain(self, parts: KeyParts, reference: KeyParts | str) -> MissExplanation:
        """Debug view of a miss: which components of ``parts`` differ from ``reference``.

        ``reference`` is another call's `KeyParts`, or the key of a stored entry (its
        component digests are kept in the value).
        """
        key = parts.key(self.prefix)
        if isinstance(reference, KeyParts):
            return explain_miss(parts, reference, self.prefix)
        ok, raw = await self._op("", lambda r: r.get(reference))
        if not ok:
            return MissExplanation(key, reference, (), note="Redis unavailable")
        if raw is None:
            return MissExplanation(key, reference, (), note=f"{reference}: no such entry")
        try:
            value = json.loads(raw)
            theirs, their_msgs = value["components"], value["messages"]
        except (ValueError, KeyError, TypeError):
            return MissExplanation(key, reference, (), note=f"{reference}: malformed entry")
        return _explain(key, reference, parts.component_digests(), theirs,
                        parts.message_digests(), their_msgs)


# ---- any infer behind the cache -------------------------------------------------------


class _InfraResult(Exception):
    """Carries an INFRA result out of a cached call, so it is never written."""

    def __init__(self, result: UnitResult):
        super().__init__(result.error or "INFRA")
        self.result = result


@dataclass
class CachedInfer:
    """An ``infer`` whose answers go through the response cache, keyed like an LLM call.

    The key is (model, base URL, ``prompt(task)`` messages, salt = the cache's namespace and
    ``task.run_id``), so a re-run of the same arm run replays its answers and a new run never
    reuses them. A hit costs no call and no tokens and is graded with ``grade(task, answer)``
    (no answer is a wrong answer, cached and replayed like any other); INFRA results are
    never cached.
    ``calls`` and ``tokens`` count the fresh (paid) calls.
    """

    cache: ResponseCache
    infer: Callable[[UnitTask], Awaitable[UnitResult]]
    model: str
    prompt: Callable[[UnitTask], Sequence[Mapping[str, Any]]]
    grade: Callable[[UnitTask, str], bool]
    base_url: str = "local://infer"
    calls: int = 0
    tokens: int = 0

    async def __call__(self, task: UnitTask) -> UnitResult:
        parts = KeyParts(self.model, self.base_url, tuple(self.prompt(task)),
                         salt=self.cache.salt(task.run_id))
        fresh: list[UnitResult] = []

        async def call() -> Response:
            res = await self.infer(task)
            fresh.append(res)
            self.calls += 1
            self.tokens += res.tokens
            if res.infra:
                raise _InfraResult(res)
            return {"choices": [{"message": {"role": "assistant",
                                             "content": res.prediction or ""},
                                 "finish_reason": "stop"}],
                    "usage": {"total_tokens": res.tokens}}

        try:  # "no valid answer" is cached too: a re-run replays it as a wrong answer
            got = await self.cache.get_or_call(parts, call, validate=protocol_failure,
                                               run_id=task.run_id)
        except _InfraResult as exc:
            return exc.result
        if fresh:
            return fresh[0]
        from .scheduler import UnitResult  # lazily: `vtrm-gate cache` must not load numpy

        answer = got.response["choices"][0]["message"].get("content") or None
        return UnitResult(correct=answer is not None and self.grade(task, answer),
                          cached=True, prediction=answer)


def cached_infer(cache: ResponseCache, infer: Callable[[UnitTask], Awaitable[UnitResult]], *,
                 model: str, prompt: Callable[[UnitTask], Sequence[Mapping[str, Any]]],
                 grade: Callable[[UnitTask, str], bool],
                 base_url: str = "local://infer") -> CachedInfer:
    """Put any ``infer`` (the simulator, a local model) behind the Redis response cache."""
    return CachedInfer(cache, infer, model, prompt, grade, base_url)


# ---- TTL renewal ----------------------------------------------------------------------

RenewMethod = Literal["auto", "lua", "pipeline", "gt", "naive"]
RENEW_METHODS: tuple[str, ...] = ("auto", "lua", "pipeline", "gt", "naive")
# Measured by benchmarks/bench_cache.py (200,000 keys, batch 1000, unix socket, 2-core box,
# Redis 6.2 and 7.0): lua ~390k keys/s; TTL-then-EXPIRE pipelines ~75k; EXPIRE GT pipelined
# ~95k (7.0 only); the naive per-key loop ~10-15k. The pipelines are bound by the client's
# per-command cost, the script does the work server-side.
DEFAULT_RENEW_METHOD = "lua"

# For each key: 0 < TTL < target => EXPIRE target (unless dry run). Returns the count.
_RENEW_LUA = """
local target = tonumber(ARGV[1])
local apply = ARGV[2] == '1'
local n = 0
for _, k in ipairs(KEYS) do
  local t = redis.call('TTL', k)
  if t > 0 and t < target then
    if apply then redis.call('EXPIRE', k, target) end
    n = n + 1
  end
end
return n
"""


@dataclass(frozen=True)
class RenewProgress:
    """Progress of a renewal, reported after every batch."""

    scanned: int
    extended: int
    elapsed_s: float


@dataclass(frozen=True)
class RenewReport:
    """What a renewal did: keys scanned, extended (0 < ttl < target), untouched (the rest)."""

    scanned: int
    extended: int
    untouched: int
    ttl: int
    pattern: str
    dry_run: bool
    method: str
    elapsed_s: float

    @property
    def keys_per_s(self) -> float:
        return self.scanned / self.elapsed_s if self.elapsed_s > 0 else float("inf")

    def as_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["keys_per_s"] = round(self.keys_per_s, 1)
        return d


async def server_version(client: aredis.Redis) -> tuple[int, ...]:
    """The server's ``redis_version`` as a tuple, e.g. (6, 2, 14) (a cluster: its lowest)."""
    if cluster.is_cluster(client):
        return await cluster.cluster_version(client)
    info = await client.info("server")
    return tuple(int(x) for x in str(info.get("redis_version", "0")).split(".")[:3]
                 if x.isdigit())


async def _scan_batches(client: aredis.Redis, pattern: str, batch: int):  # type: ignore[no-untyped-def]
    if cluster.is_cluster(client):  # every primary in turn
        async for keys in cluster.scan_batches(client, pattern, batch):
            yield keys
        return
    cursor: int | bytes = 0
    while True:
        cursor, keys = await client.scan(cursor, match=pattern, count=batch)
        if keys:
            yield keys
        if int(cursor) == 0:
            return


async def renew_ttl(client: aredis.Redis, ttl: int, pattern: str = f"{DEFAULT_PREFIX}:*",
                    dry_run: bool = False, batch: int = 1000,
                    progress: Callable[[RenewProgress], Any] | None = None,
                    method: RenewMethod = "auto") -> RenewReport:
    """Set TTL = ``ttl`` on the keys matching ``pattern`` whose TTL is in (0, ttl).

    Keys without expiry (TTL -1) and keys with a TTL >= ``ttl`` are untouched. SCAN with
    ``batch`` as the COUNT hint, then one round trip per batch: a Lua script (``lua``,
    default), a TTL pipeline then an EXPIRE pipeline (``pipeline``), or ``EXPIRE key ttl
    GT`` pipelined (``gt``, Redis >= 7). ``naive`` is the seed note's per-key loop, kept
    for the benchmark. Never KEYS. A key SCAN returns twice (rehashing) is counted twice.
    """
    if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0:
        raise ValueError(f"ttl must be an integer number of seconds > 0, got {ttl!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    if method not in RENEW_METHODS:
        raise ValueError(f"method must be one of {', '.join(RENEW_METHODS)}, got {method!r}")
    if method == "auto":
        method = DEFAULT_RENEW_METHOD
    if method == "gt":
        version = await server_version(client)
        if version < (7,):
            raise ValueError(f"EXPIRE ... GT needs Redis >= 7; the server is "
                             f"{'.'.join(map(str, version))}")
    t0 = time.perf_counter()
    scanned = extended = 0
    if method == "naive":
        async for k in client.scan_iter(match=pattern, count=batch):
            scanned += 1
            t = await client.ttl(k)
            if 0 < t < ttl:
                if not dry_run:
                    await client.expire(k, ttl)
                extended += 1
            if progress is not None and scanned % batch == 0:
                progress(RenewProgress(scanned, extended, time.perf_counter() - t0))
    else:
        script = client.register_script(_RENEW_LUA) if method == "lua" else None
        async for keys in _scan_batches(client, pattern, batch):
            scanned += len(keys)
            if script is not None and cluster.is_cluster(client):  # one slot per script
                extended += await cluster.renew_lua_batch(client, _RENEW_LUA, keys,
                                                          [ttl, 0 if dry_run else 1])
            elif script is not None:
                extended += int(await script(keys=keys, args=[ttl, 0 if dry_run else 1]))
            elif method == "gt" and not dry_run:
                pipe = client.pipeline(transaction=False)
                for k in keys:
                    pipe.expire(k, ttl, gt=True)
                extended += sum(bool(x) for x in await pipe.execute())
            else:
                pipe = client.pipeline(transaction=False)
                for k in keys:
                    pipe.ttl(k)
                due = [k for k, t in zip(keys, await pipe.execute(), strict=True)
                       if 0 < t < ttl]
                if due and not dry_run:
                    pipe = client.pipeline(transaction=False)
                    for k in due:
                        pipe.expire(k, ttl)
                    extended += sum(bool(x) for x in await pipe.execute())
                else:
                    extended += len(due)
            if progress is not None:
                progress(RenewProgress(scanned, extended, time.perf_counter() - t0))
    return RenewReport(scanned, extended, scanned - extended, ttl, pattern, dry_run, method,
                       time.perf_counter() - t0)


# ---- key statistics -------------------------------------------------------------------

TTL_BUCKETS: tuple[tuple[str, float], ...] = (
    ("< 1 h", 3600), ("1 h - 1 d", 86400), ("1 d - 7 d", 604800), ("> 7 d", float("inf")))


@dataclass(frozen=True)
class KeyStats:
    """The keys under one prefix: count, memory, TTL histogram (and the server's memory)."""

    prefix: str
    keys: int
    memory_bytes: int
    no_expiry: int
    ttl_histogram: tuple[tuple[str, int], ...]
    server_used_memory: int
    server_version: str

    def as_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["ttl_histogram"] = dict(self.ttl_histogram)
        return d


async def cache_stats(client: aredis.Redis, prefix: str = DEFAULT_PREFIX,
                      batch: int = 1000) -> KeyStats:
    """Count, memory (MEMORY USAGE, summed) and TTL histogram of ``{prefix}:*`` via SCAN."""
    counts = dict.fromkeys((b for b, _ in TTL_BUCKETS), 0)
    keys = memory = no_expiry = 0
    async for batch_keys in _scan_batches(client, f"{prefix}:*", batch):
        pipe = client.pipeline(transaction=False)
        for k in batch_keys:
            pipe.ttl(k)
            pipe.memory_usage(k)
        out = await pipe.execute()
        for t, mem in zip(out[::2], out[1::2], strict=True):
            if t == -2:
                continue  # expired between SCAN and TTL
            keys += 1
            memory += int(mem or 0)
            if t == -1:
                no_expiry += 1
                continue
            for label, upper in TTL_BUCKETS:
                if t < upper or (upper == 604800 and t == upper):
                    counts[label] += 1
                    break
    if cluster.is_cluster(client):
        used = await cluster.cluster_memory(client)
        version = ".".join(map(str, await cluster.cluster_version(client))) + " (cluster)"
    else:
        used = int((await client.info("memory")).get("used_memory", 0))
        version = str((await client.info("server")).get("redis_version", "?"))
    return KeyStats(prefix, keys, memory, no_expiry, tuple(counts.items()), used, version)
