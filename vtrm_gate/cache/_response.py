"""LLM response cache on Redis (SPEC §5): content-addressed keys, single flight, never a SPOF.

Only responses that pass the caller's validator are written (``SET ... EX ttl``, atomic; the
agent's accepts any chat completion, an unusable answer included, so a re-run replays it),
never one the encoder cannot store. Every value carries the digest of its key material and
is checked on read: a malformed value, a key of another Redis type, or a value recorded for
other key material (copied onto this key) is a counted miss for that key and is
overwritten. If Redis
is down, calls go uncached and counted, with one warning when the outage begins and one when
it ends, and caching resumes by itself when Redis is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from redis.exceptions import OutOfMemoryError, ReadOnlyError, RedisError, ResponseError

from .._env import (
    DEFAULT_TTL,
    MAX_TTL,
    REDIS_SOCKET_TIMEOUT_S,
    check_redis_url,
    environment,
    mask_url,
    scrub,
)
from .._ids import CANONICAL, readable_json
from ..errors import ConfigError, described, is_real, is_whole, shown
from . import _cluster as cluster
from ._connect import FULL_POLICY, MISCONF_ADVICE, REDIS_FAILURES, connect, is_misconf
from ._keys import cache_namespace

if TYPE_CHECKING:
    from ..options import RunOptions
from ._embedded import embedded_server
from ._keys import (
    DEFAULT_PREFIX,
    SCHEMA_VERSION,
    KeyParts,
    MissExplanation,
    Response,
    Validator,
    _explain,
    explain_miss,
    salt_for_run,
    validate_response,
)

RECOVERY_OPS = 3
"""Redis operations in a row that must succeed before an outage is declared over."""

OPS_IN_FLIGHT = 32
"""Redis commands one cache sends at once; the rest wait on a plain semaphore. Each command
takes tens of microseconds, so more connections add no throughput, only connects and the
redis-py pool's condition-variable hand-offs (which grew with the calls waiting)."""

MIN_BULK_LIMIT = 1 << 20
"""The lowest ``proto-max-bulk-len`` Redis takes (1 MB): a write of a value no larger that
fails is a failure of Redis, never of the value's size."""

log = logging.getLogger("vtrm_gate.cache")


# ---- counters -------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of the cache counters (one run, or all runs).

    ``hits``: served from Redis; ``coalesced``: served by an identical concurrent call;
    ``misses``: looked up, absent (or malformed), called; ``bypassed``: called without a
    lookup (cache off, or Redis down); ``errors``: failed Redis operations;
    ``malformed``: values that are not an entry (bad JSON, another schema, a key of another
    Redis type); ``mismatched``: entries whose recorded key material (digest, salt) is not
    the call's (a value copied onto another key); ``not_cached``: responses not written
    because they failed validation or have no JSON form; ``refused``: responses Redis would
    not store (full at ``maxmemory`` under ``noeviction``, or a read-only replica) while it
    served reads; ``too_large``: responses whose entry is larger than the server takes (its
    ``proto-max-bulk-len``: it closed the connection on the write and answered the next);
    ``raced``: misses and bypasses another process had answered and stored meanwhile, whose
    stored answer was served (the first writer wins, so a re-run replays what was graded).
    """

    hits: int = 0
    misses: int = 0
    coalesced: int = 0
    bypassed: int = 0
    errors: int = 0
    malformed: int = 0
    mismatched: int = 0
    writes: int = 0
    not_cached: int = 0
    refused: int = 0
    too_large: int = 0
    raced: int = 0

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


@dataclass
class _Counters:
    """The mutable per-run counters behind a CacheStats snapshot: its fields, by name."""

    hits: int = 0
    misses: int = 0
    coalesced: int = 0
    bypassed: int = 0
    errors: int = 0
    malformed: int = 0
    mismatched: int = 0
    writes: int = 0
    not_cached: int = 0
    refused: int = 0
    too_large: int = 0
    raced: int = 0


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


_WRONG_TYPE = b"\x00wrong-type"
"""What `_get` returns for a key that holds a hash, list...: not an entry (a miss)."""


async def _get(client: cluster.Client, key: str) -> Any:
    """``GET key``; a key of another Redis type is that key's miss, not an outage."""
    try:
        return await client.get(key)
    except ResponseError as exc:
        if str(exc).startswith("WRONGTYPE"):
            return _WRONG_TYPE
        raise


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
                 socket_timeout: float = REDIS_SOCKET_TIMEOUT_S, retry_interval: float = 1.0,
                 namespace: str = "") -> None:
        if url is not None:
            check_redis_url(url)
        if not is_whole(ttl) or not 0 < ttl <= MAX_TTL:
            raise ConfigError(f"ResponseCache.ttl must be an integer number of seconds from 1 "
                             f"to {MAX_TTL}, got {shown(ttl)}")
        if not prefix or not isinstance(prefix, str) or any(c in prefix for c in "*?[]"):
            raise ConfigError(f"ResponseCache.prefix must be a non-empty string without glob "
                             f"characters, got {shown(prefix)}")
        if not (is_real(socket_timeout) and socket_timeout > 0):
            raise ConfigError(f"ResponseCache.socket_timeout must be a finite number of "
                              f"seconds > 0, got {shown(socket_timeout)}")
        if not (is_real(retry_interval) and retry_interval >= 0):
            raise ConfigError(f"ResponseCache.retry_interval must be a finite number of "
                              f"seconds >= 0, got {shown(retry_interval)}")
        self._url = url
        self.ttl, self.prefix, self.enabled = ttl, prefix, enabled
        self.namespace = namespace
        self.workspace = Path(workspace) if workspace is not None else None
        self.socket_timeout, self.retry_interval = socket_timeout, retry_interval
        self._redis: cluster.Client | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inflight: dict[str, asyncio.Future[Response]] = {}
        self._inflight_loop: asyncio.AbstractEventLoop | None = None
        self._counters: dict[str, _Counters] = {}
        self._down = False
        self._refusing = False  # writes are refused (full, read-only): warned once
        self._write_streak = 0  # writes in a row taken while refusing
        self._warned_bulk = False  # a write too large for the server: warned once
        self._era = 0  # bumped when an outage begins or ends
        self._ok_streak = 0  # operations in a row that succeeded during an outage
        self._next_probe = 0.0
        self._server: Any = None
        self._start_lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self._ops: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    @classmethod
    def from_options(cls, options: RunOptions, *, workspace: str | os.PathLike[str] | None = None,
                     workspace_id: str | None = None, **kwargs: Any) -> ResponseCache:
        """The cache ``options`` name (Redis URL, TTL, prefix, on/off), with the embedded
        server in ``workspace`` when no URL is set; salted with ``workspace_id``'s namespace
        (or the ``cache_share`` name the options opt in to)."""
        settings = {"ttl": options.redis_cache_ttl, "prefix": options.cache_prefix,
                    "enabled": options.cache_enabled, "workspace": workspace, **kwargs}
        cache = cls(options.redis_url, **settings)
        if workspace_id is not None:
            cache.namespace = cache_namespace(workspace_id, options.cache_share)
        return cache

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> ResponseCache:
        """From ``REDIS_URL``, ``REDIS_CACHE_TTL``, ``VTRM_CACHE``, ``VTRM_CACHE_PREFIX`` and
        ``VTRM_WORKSPACE`` (``env`` as given, else ``.env`` in the cwd + the environment),
        through the one resolver (`vtrm_gate.options.resolve_options`)."""
        from ..options import resolve_options  # lazily: the cache face loads no numpy

        e = environment(env)
        kwargs.setdefault("workspace", e.get("VTRM_WORKSPACE") or None)
        return cls.from_options(resolve_options(env=e, dotenv=None), **kwargs)

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

    async def _client(self) -> cluster.Client:
        loop = asyncio.get_running_loop()
        if self._redis is None or self._loop is not loop:
            url = self._url if self._url is not None else await self._start_embedded(loop)
            if cluster.is_cluster_url(url):
                await self._connect_cluster(loop, url)
            elif self._redis is None or self._loop is not loop:  # re-checked after the await
                self._redis = connect(url, socket_timeout=self.socket_timeout)
                self._loop = loop
        assert self._redis is not None  # connected above (by this call or a racing one)
        return self._redis

    async def _connect_cluster(self, loop: asyncio.AbstractEventLoop, url: str) -> None:
        """Load a cluster's topology once, before any command: redis-py's cluster client
        drops connections when many first commands race to initialise it."""
        if self._start_lock is None or self._start_lock[0] is not loop:
            self._start_lock = (loop, asyncio.Lock())
        async with self._start_lock[1]:
            if self._redis is None or self._loop is not loop:
                client = connect(url, socket_timeout=self.socket_timeout)
                try:
                    await client.initialize()
                except BaseException:
                    await client.aclose()
                    raise
                self._redis, self._loop = client, loop

    async def _start_embedded(self, loop: asyncio.AbstractEventLoop) -> str:
        """Start the workspace's embedded server once, however many first calls race;
        its URL."""
        if self._start_lock is None or self._start_lock[0] is not loop:
            self._start_lock = (loop, asyncio.Lock())
        async with self._start_lock[1]:
            if self._url is None:
                ws = self.workspace or Path(os.environ.get("VTRM_WORKSPACE") or "workspace")
                self._server = await asyncio.to_thread(embedded_server, ws)
                self._url = self._server.url
        return self._url

    def _skip(self) -> bool:
        """True while Redis is known down and the next probe is not due yet."""
        return self._down and time.monotonic() < self._next_probe

    async def _op(self, run: str,
                  fn: Callable[[cluster.Client], Awaitable[Any]]) -> tuple[bool, Any]:
        """Run one Redis operation; on failure count it and return False.

        One warning when an outage begins and one when it ends. An outage ends after
        `RECOVERY_OPS` operations in a row succeed (a server flapping up and down is one
        outage), and an operation begun before the latest change of state (slow, in flight
        across it) neither begins nor ends one.
        """
        era = self._era
        try:
            client = await self._client()
            async with self._op_slots():
                out = await fn(client)
        except asyncio.CancelledError:
            raise
        except REDIS_FAILURES as exc:
            self._c(run).errors += 1
            self._next_probe = time.monotonic() + self.retry_interval
            self._ok_streak = 0
            if not self._down and era == self._era:
                self._down, self._era = True, self._era + 1
                log.warning("Redis cache at %s is unavailable (%s); LLM calls go uncached "
                            "until it is back", self.masked_url,
                            scrub(described(exc), self._url))
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

    def _op_slots(self) -> asyncio.Semaphore:
        """This loop's `OPS_IN_FLIGHT` semaphore (a new loop gets its own)."""
        loop = asyncio.get_running_loop()
        if self._ops is None or self._ops[0] is not loop:
            self._ops = (loop, asyncio.Semaphore(OPS_IN_FLIGHT))
        return self._ops[1]

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

    def _decode(self, raw: bytes, validate: Validator, parts: KeyParts,
                c: _Counters) -> Response | None:
        """The response stored in ``raw`` for ``parts``, or None (counted: malformed, or
        recorded for other key material)."""
        try:
            value = None if raw is _WRONG_TYPE else json.loads(raw)
        except (ValueError, RecursionError):
            value = None
        if not isinstance(value, dict) or value.get("schema") != SCHEMA_VERSION:
            c.malformed += 1
            return None
        if not _same_key_material(value, parts):
            c.mismatched += 1
            return None
        resp = value.get("response")
        if validate(resp) is not None:
            c.malformed += 1
            return None
        return resp

    def _encode(self, parts: KeyParts, resp: Response) -> bytes | None:
        """The stored value, or None when ``resp`` has no JSON form (NaN, sets, nesting too
        deep for the encoder): such a response is served but never cached, never raised."""
        try:
            return self._encode_value(parts, resp)
        except (ValueError, TypeError, RecursionError):
            return None

    def _encode_value(self, parts: KeyParts, resp: Response) -> bytes:
        value = {"schema": SCHEMA_VERSION, "response": resp, "digest": parts.digest,
                 "components": parts.component_digests(), "messages": parts.message_digests(),
                 "salt": parts.salt, "written_at": round(time.time(), 3)}
        return readable_json(value, **CANONICAL).encode()  # a lone surrogate: escaped

    async def lookup(self, parts: KeyParts, validate: Validator = validate_response,
                     run_id: str | None = None) -> Response | None:
        """The cached response for ``parts``, or None (absent, malformed, or Redis down)."""
        run = run_id if run_id is not None else parts.salt
        if not self.enabled or self._skip():
            return None
        key = parts.key(self.prefix)
        ok, raw = await self._op(run, lambda r: _get(r, key))
        if not ok or raw is None:
            return None
        return self._decode(raw, validate, parts, self._c(run))

    async def store(self, parts: KeyParts, resp: Response, validate: Validator = validate_response,
                    run_id: str | None = None) -> bool:
        """Write ``resp`` with the TTL in one ``SET ... EX`` if it validates; True if written."""
        return await self._store(parts, resp, validate, run_id) is True

    async def _store(self, parts: KeyParts, resp: Response, validate: Validator,
                     run_id: str | None, only_new: bool = False) -> bool | None:
        """`store`; with ``only_new`` not over an entry another writer stored meanwhile
        (``NX``): None when one stood, False when nothing was written for another reason."""
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
        write = _set if len(value) <= MIN_BULK_LIMIT else _set_large
        ok, out = await self._op(run, lambda r: write(r, key, value, self.ttl, only_new))
        if not ok:
            return False
        if out is False:  # NX: another writer's entry stands
            return None
        if isinstance(out, _TooLarge):
            self._too_large(run, len(value), out.error)
            return False
        if isinstance(out, _WriteRefused):
            self._c(run).refused += 1
            self._write_streak = 0
            if not self._refusing:
                self._refusing = True
                log.warning("Redis cache at %s refuses writes (%s): new answers are not "
                            "stored, stored ones are still served; %s", self.masked_url,
                            scrub(f"{type(out.error).__name__}: {out.error}", self._url),
                            _refusal_advice(out.error))
            return False
        if self._refusing:  # over after RECOVERY_OPS writes in a row (memory near the limit
            self._write_streak += 1  # lets some through: that is no end of it)
            if self._write_streak >= RECOVERY_OPS:
                self._refusing = False
                log.warning("Redis cache at %s accepts writes again", self.masked_url)
        self._c(run).writes += 1
        return True

    def _too_large(self, run: str, size: int, error: BaseException) -> None:
        """Count an entry the server would not take for its size, warned once."""
        self._c(run).too_large += 1
        if not self._warned_bulk:
            self._warned_bulk = True
            log.warning("Redis cache at %s would not store an entry of %d bytes (%s), so "
                        "that reply is served, not cached: its proto-max-bulk-len is smaller "
                        "(raise it to cache such replies)", self.masked_url, size,
                        scrub(described(error), self._url))

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
        ok, raw = (False, None) if self._skip() else await self._op(run, lambda r: _get(r, key))
        if not ok:
            c.bypassed += 1
            # Redis may be back by the time the answer is: a stall shorter than the call
            # (a failover's pause) must not leave it for a re-run to pay again
            resp = await self._first_written(parts, await call(), validate, run, c)
            return CacheResult(resp, "bypass", key)
        stored = None if raw is None else self._decode(raw, validate, parts, c)
        if stored is not None:
            c.hits += 1
            return CacheResult(stored, "hit", key)
        c.misses += 1
        resp = await call()
        if raw is not None:  # a malformed or mismatched entry: removed if still the one read
            await self._op(run, functools.partial(_delete_if, key=key, raw=raw))
        return CacheResult(await self._first_written(parts, resp, validate, run, c), "miss", key)

    async def _first_written(self, parts: KeyParts, resp: Response, validate: Validator,
                             run: str, c: _Counters) -> Response:
        """Store ``resp`` unless another process stored the same call meanwhile (``NX``):
        then its entry stands (the first writer wins) and is served here too, so every
        re-run replays what was graded (the last writer won, h16). A value in the way that is
        not an entry is removed only while it is the one read, so two processes replacing it
        race as two new writers do (a plain SET let the last one win)."""
        key = parts.key(self.prefix)
        for _ in range(2):
            if await self._store(parts, resp, validate, run, only_new=True) is not None:
                return resp
            ok, raw = await self._op(run, lambda r: _get(r, key))
            if not ok:
                return resp
            winner = None if raw is None else self._decode(raw, validate, parts, c)
            if winner == resp:  # our own SET, retried by redis-py after a lost reply
                c.writes += 1
                return resp
            if winner is not None:
                c.raced += 1
                return winner
            if raw is not None:  # not an entry (an old schema's, h19): removed, then NX again
                await self._op(run, functools.partial(_delete_if, key=key, raw=raw))
        return resp  # still in the way: served, not stored

    # -- debug ------------------------------------------------------------------------

    async def explain(self, parts: KeyParts, reference: KeyParts | str) -> MissExplanation:
        """Debug view of a miss: which components of ``parts`` differ from ``reference``.

        ``reference`` is another call's `KeyParts`, or the key of a stored entry (its
        component digests are kept in the value).
        """
        key = parts.key(self.prefix)
        if isinstance(reference, KeyParts):
            return explain_miss(parts, reference, self.prefix)
        ok, raw = await self._op("", lambda r: _get(r, reference))
        if not ok:
            return MissExplanation(key, reference, (), note="Redis unavailable")
        if raw is None:
            return MissExplanation(key, reference, (), note=f"{reference}: no such entry")
        try:
            value = json.loads(raw)  # a key of another Redis type fails here too
            theirs, their_msgs = value["components"], value["messages"]
            if not (isinstance(theirs, dict) and isinstance(their_msgs, list)):
                raise TypeError("components must be an object, messages a list")
        except (ValueError, KeyError, TypeError, RecursionError):
            return MissExplanation(key, reference, (), note=f"{reference}: malformed entry")
        return _explain(key, reference, parts.component_digests(), theirs,
                        parts.message_digests(), [str(m) for m in their_msgs])


@dataclass(frozen=True)
class _WriteRefused:
    """A SET the server refused while it serves reads: full, a read-only replica, or one
    whose last snapshot failed (MISCONF)."""

    error: RedisError


def _refusal_advice(exc: RedisError) -> str:
    """What to change on a server that refuses writes."""
    if isinstance(exc, OutOfMemoryError):
        return (f"it is at maxmemory and its maxmemory-policy {FULL_POLICY}: raise maxmemory, "
                f"or set maxmemory-policy volatile-lru (every cached reply has a TTL)")
    if is_misconf(exc):
        return MISCONF_ADVICE
    return "it is a read-only replica: point REDIS_URL at the primary"


# Delete KEYS[1] while it is the value read (ARGV[2]), or, when that was a key of another
# Redis type (ARGV[1] == '1'), while it still is one. Returns 1 if deleted.
_DELETE_IF_LUA = """
local t = redis.call('TYPE', KEYS[1])['ok']
if ARGV[1] == '1' then
  if t ~= 'string' and t ~= 'none' then return redis.call('DEL', KEYS[1]) end
elseif t == 'string' and redis.call('GET', KEYS[1]) == ARGV[2] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


async def _delete_if(r: cluster.Client, key: str, raw: bytes) -> int:
    """Delete ``key`` if it still holds ``raw`` (`_WRONG_TYPE`: another Redis type), in one
    script; where scripts are refused (ACL, a managed Redis), delete it as before."""
    wrong = raw is _WRONG_TYPE
    try:
        return int(await r.eval(_DELETE_IF_LUA, 1, key, "1" if wrong else "0",
                                b"" if wrong else raw))
    except ResponseError as exc:
        if is_misconf(exc) or "OOM" in str(exc) or "READONLY" in str(exc):
            return 0
        return int(await r.delete(key))


async def _set(r: cluster.Client, key: str, value: bytes, ttl: int,
               only_new: bool = False) -> bool | _WriteRefused:
    """``SET key value EX ttl`` (``NX`` when ``only_new``: False if the key exists), or the
    refusal of a server that is up but takes no writes (it serves reads: no outage)."""
    try:
        return bool(await r.set(key, value, ex=ttl, nx=only_new))
    except (OutOfMemoryError, ReadOnlyError) as exc:
        return _WriteRefused(exc)
    except ResponseError as exc:
        if is_misconf(exc):
            return _WriteRefused(exc)
        raise


@dataclass(frozen=True)
class _TooLarge:
    """A SET of a value over 1 MB that failed while the server still answers: larger than
    its ``proto-max-bulk-len`` (Redis closes the connection on such a write)."""

    error: BaseException


async def _set_large(r: cluster.Client, key: str, value: bytes, ttl: int,
                     only_new: bool = False) -> bool | _WriteRefused | _TooLarge:
    """`_set` of a value over `MIN_BULK_LIMIT`: a failure the server answers a PING after is
    the value's size, not an outage (asking ``CONFIG GET proto-max-bulk-len`` first fails
    where CONFIG is not allowed, and goes stale when the limit changes)."""
    try:
        return await _set(r, key, value, ttl, only_new)
    except REDIS_FAILURES as exc:
        try:
            await r.ping()
        except REDIS_FAILURES:
            raise exc from None
        return _TooLarge(exc)


def _same_key_material(value: Mapping[str, Any], parts: KeyParts) -> bool:
    """True when a stored entry was written for ``parts``: its full key digest (entries of
    0.2.0 and before: its salt and component digests) is the call's."""
    if "digest" in value:
        return value["digest"] == parts.digest
    return (value.get("salt") == parts.salt
            and value.get("components") == parts.component_digests())
