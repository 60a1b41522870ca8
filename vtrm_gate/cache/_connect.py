"""A Redis client with short timeouts and a bounded pool (or a cluster client)."""

from __future__ import annotations

import re
import uuid

import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    OutOfMemoryError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from .._env import (
    REDIS_SOCKET_TIMEOUT_S,
    check_redis_url,
    mask_url,
    scrub,
)
from ..errors import ConfigError, RedisAccessError, described
from . import _cluster as cluster

# ---- connection -----------------------------------------------------------------------


FULL_POLICY = ("finds nothing to evict (noeviction, or a volatile-* policy while keys "
               "without a TTL hold the memory)")
"""Why a full server refuses a write, whichever policy it has (not read: an ACL may not
allow CONFIG GET)."""

MISCONF_ADVICE = ("it cannot save its snapshot (MISCONF: a full disk, or its dir gone) and "
                  "stops writes until a save succeeds: free disk space (or fix its dir), or "
                  "set stop-writes-on-bgsave-error no")


def is_misconf(exc: BaseException) -> bool:
    """A server whose last background save failed: it serves reads and refuses writes."""
    return isinstance(exc, ResponseError) and str(exc).startswith("MISCONF")


MAX_CONNECTIONS = 256

REDIS_FAILURES: tuple[type[BaseException], ...] = (
    RedisError, RedisClusterException, OSError, TimeoutError, RuntimeError, AttributeError,
    TypeError)
"""What a Redis operation may raise when the server fails us. Beyond redis-py's own errors
(`RedisClusterException` is not one of them: no node of a cluster answers, for instance):
a peer that answers its ``HELLO`` unlike Redis makes redis-py fail inside its own code
(``'list' object has no attribute 'get'``); the cache fails open on it all the same."""


def connect(url: str, *, socket_timeout: float = REDIS_SOCKET_TIMEOUT_S,
            retries: int = 1) -> cluster.Client:
    """A `redis.asyncio.Redis` with short timeouts, so a dead server never hangs a call.

    One immediate retry on a fresh connection covers pooled sockets left stale by a restart.
    """
    check_redis_url(url)
    if cluster.is_cluster_url(url):
        return cluster.connect_cluster(url, socket_timeout=socket_timeout, retries=retries)
    # A bounded pool that waits for a free connection: the default pool raises "Too many
    # connections" past 100 concurrent commands, which would turn a busy gate into an outage.
    try:
        pool = aredis.BlockingConnectionPool.from_url(
            url, max_connections=MAX_CONNECTIONS, timeout=max(socket_timeout, 5.0),
            socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout,
            retry=Retry(NoBackoff(), retries), health_check_interval=0,
            # No CLIENT SETINFO per new connection: building it reads redis-py's package
            # metadata from disk each time (~1 ms per connection, 256 of them at 256 in
            # flight).
            driver_info=None)
    except ValueError as exc:  # redis-py refuses a query value of the URL (socket_timeout=x)
        raise ConfigError(f"invalid Redis URL {mask_url(url)!r}: {scrub(str(exc), url)}") \
            from None
    _check_options(url, pool)
    return aredis.Redis(connection_pool=pool)


def _check_options(url: str, pool: aredis.BlockingConnectionPool) -> None:
    """Build one connection (no I/O) now: an option no connection takes (``?ssl=true``,
    ``?ssl_cert_reqs=none`` on redis://) failed only at the first command, as a TypeError
    out of the cache."""
    try:
        pool.connection_class(**pool.connection_kwargs)
    except (TypeError, ValueError) as exc:
        said = re.search(r"keyword argument '(\w+)'", str(exc))
        what = (f"option {said[1]!r} is no connection option here (TLS: use rediss://)"
                if said else scrub(str(exc), url))
        raise ConfigError(f"invalid Redis URL {mask_url(url)!r}: {what}") from None





def _refusal(exc: BaseException) -> BaseException | None:
    """The server's own refusal inside ``exc`` (redis-py wraps an AUTH or SELECT failure
    during the handshake in a ConnectionError), or None for a socket-level failure."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, AuthenticationError | ResponseError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


_HINTS = (("password", "check the password (and user) in the URL"),
          ("authenticat", "the server needs a password: put it in the URL"),
          ("permission", "the ACL user needs GET and SET on the cache's keys"),
          ("db index", "the database number in the URL is out of range"))


async def check_redis_access(url: str, prefix: str, *, socket_timeout: float = 2.0,
                             where: str = "REDIS_URL") -> str | None:
    """Before a run: can the response cache at ``url`` read and write its keys?

    Raises `RedisAccessError` (password masked, the fix named) when Redis answers and
    refuses: a wrong or missing password, an ACL user without GET/SET, a database number
    out of range, a server full past its ``maxmemory`` that evicts nothing. Returns None
    when it works, or the reason when Redis cannot be reached at all (the cache then fails
    open: calls go uncached with a warning). It writes one probe key under ``prefix`` that
    expires within a minute.
    """
    client = connect(url, socket_timeout=socket_timeout)
    key = f"{prefix}:access-check:{uuid.uuid4().hex}"
    try:
        await client.set(key, b"1", ex=60)
        await client.get(key)
    except REDIS_FAILURES as exc:
        refused = _refusal(exc)
        text = scrub(described(exc), url)
        if refused is None:
            return text
        reason = scrub(str(refused), url)
        if isinstance(refused, OutOfMemoryError) or "maxmemory" in reason:
            raise RedisAccessError(
                f"Redis at {mask_url(url)} ({where}) is full: {reason} (its maxmemory-policy "
                f"{FULL_POLICY}); raise maxmemory, or set maxmemory-policy volatile-lru (or "
                f"allkeys-lru): every cached reply has a TTL, so old ones go first") from None
        if is_misconf(refused):
            raise RedisAccessError(f"Redis at {mask_url(url)} ({where}) refuses writes: "
                                   f"{MISCONF_ADVICE}") from None
        hint = next((h for k, h in _HINTS if k in reason.lower()), "check the URL")
        raise RedisAccessError(f"Redis at {mask_url(url)} ({where}) refused the response "
                               f"cache: {reason}; {hint}") from None
    finally:
        await client.aclose()
    return None
