"""A Redis that answers but refuses us (a wrong password, an ACL without the rights the cache
needs, a database number out of range) is a configuration error: the step stops with exit 2,
one line naming the problem (password masked), before any call is made and before anything
is written. Only a Redis that cannot be reached fails open (calls go uncached)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.cache.test_cache import fail_snapshot
from tests.llm.test_backends import cli, files_of, make_ws
from vtrm_gate.cache import RedisServer, check_redis_access
from vtrm_gate.errors import RedisAccessError
from vtrm_gate.testing import ChatServer

PASSWORD = "pw-correct-horse-42"

pytestmark = pytest.mark.redis


@pytest.fixture
def locked_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A private server with a password and a read-only ACL user ``ro``."""
    server = RedisServer(tmp_path / "redis-pw", persist=False, password=PASSWORD)
    server.start()
    r = redis.Redis(unix_socket_path=server.socket_path, password=PASSWORD)
    r.execute_command("ACL", "SETUSER", "ro", "on", ">ro-pass-1234", "~*", "+@read", "+ping",
                      "+hello", "+client")
    r.close()
    try:
        yield server
    finally:
        server.close()


def urls(server: RedisServer) -> dict[str, tuple[str, str]]:
    s = server.socket_path
    return {
        "wrong password": (f"unix://:pw-wrong-horse-41@{s}", "password"),
        "no password": (f"unix://{s}", "password"),
        "read-only user": (f"unix://ro:ro-pass-1234@{s}", "no permissions"),
        "database out of range": (f"unix://:{PASSWORD}@{s}?db=99", "database"),
    }


@pytest.mark.parametrize("case", ["wrong password", "no password", "read-only user",
                                  "database out of range"])
def test_a_refusing_redis_stops_the_step_before_any_call(
        tmp_path: Path, chat_server: ChatServer, locked_redis: RedisServer, case: str) -> None:
    make_ws(tmp_path, chat_server).close()
    before = files_of(tmp_path / "ws")
    url, named = urls(locked_redis)[case]
    r = cli("step", "--workspace", "ws", "--epoch", "1", "--step", "1", cwd=tmp_path,
            env={"REDIS_URL": url, "OPENAI_API_KEY": "x"})
    assert r.returncode == 2, (r.returncode, r.stderr[-500:])
    line = r.stderr.strip()
    assert line.count("\n") == 0 and "Traceback" not in r.stderr
    assert "Redis" in line and named in line.lower() and "REDIS_URL" in line
    for secret in (PASSWORD, "pw-wrong-horse-41", "ro-pass-1234"):
        assert secret not in r.stderr + r.stdout
    assert chat_server.requests == []  # no call was made
    assert files_of(tmp_path / "ws") == before  # nothing written


def test_an_unreachable_redis_still_fails_open(tmp_path: Path,
                                               chat_server: ChatServer) -> None:
    make_ws(tmp_path, chat_server).close()
    r = cli("step", "--workspace", "ws", "--epoch", "1", "--step", "1", cwd=tmp_path,
            env={"REDIS_URL": f"unix://{tmp_path}/no-redis.sock", "OPENAI_API_KEY": "x"})
    assert r.returncode == 0, r.stderr[-500:]
    assert "unavailable" in r.stderr and chat_server.requests


def test_check_redis_access_names_the_refusal_and_passes_a_good_url(
        locked_redis: RedisServer) -> None:
    good = f"unix://:{PASSWORD}@{locked_redis.socket_path}"
    assert asyncio.run(check_redis_access(good, "tp")) is None
    with pytest.raises(RedisAccessError, match="refused") as err:
        asyncio.run(check_redis_access(urls(locked_redis)["wrong password"][0], "tp"))
    assert "pw-wrong" not in str(err.value) and "***" in str(err.value)
    why = asyncio.run(check_redis_access("redis://127.0.0.1:1/0", "tp"))
    assert why is not None and "refused" not in why  # unreachable: the reason, no raise
    # a cluster none of whose nodes answers: the same (it raised RedisClusterException, h13)
    why = asyncio.run(check_redis_access("redis+cluster://127.0.0.1:1", "tp"))
    assert why is not None and "Redis Cluster cannot be connected" in why


def test_a_redis_over_its_maxmemory_is_reported_as_full(locked_redis: RedisServer) -> None:
    # Issue 27 #15: "refused ... check the URL" for a server that is only full
    r = redis.Redis(unix_socket_path=locked_redis.socket_path, password=PASSWORD)
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", 1)  # one byte: every write is over it
    r.close()
    url = f"unix://:{PASSWORD}@{locked_redis.socket_path}"
    with pytest.raises(RedisAccessError) as err:
        asyncio.run(check_redis_access(url, "tp"))
    text = str(err.value)
    assert "is full" in text and "maxmemory" in text and "volatile-lru" in text, text
    assert "check the URL" not in text and PASSWORD not in text


def test_a_redis_whose_snapshot_failed_is_named_not_check_the_url(
        locked_redis: RedisServer, tmp_path: Path) -> None:
    """A failed background save (a full disk) makes Redis refuse writes with MISCONF: the
    pre-step check said "refused ...; check the URL"."""
    r = redis.Redis(unix_socket_path=locked_redis.socket_path, password=PASSWORD)
    fail_snapshot(r, tmp_path)
    r.close()
    with pytest.raises(RedisAccessError) as err:
        asyncio.run(check_redis_access(f"unix://:{PASSWORD}@{locked_redis.socket_path}", "tp"))
    text = str(err.value)
    assert "cannot save its snapshot" in text and "stop-writes-on-bgsave-error no" in text
    assert "check the URL" not in text and PASSWORD not in text


@pytest.mark.parametrize("query, named", [
    ("socket_timeout=inf", "socket_timeout"),
    ("socket_connect_timeout=60", "socket_connect_timeout"),
    ("ssl=true", "'ssl'"), ("ssl_cert_reqs=none", "'ssl_cert_reqs'"), ("protocol=9", "protocol"),
])
def test_a_redis_url_option_that_would_hang_or_crash_the_step_is_refused_first(
        tmp_path: Path, chat_server: ChatServer, locked_redis: RedisServer, query: str,
        named: str) -> None:
    """Hostile pass (h22): ``?socket_timeout=inf`` in REDIS_URL overrode the cache's own
    timeout (redis-py lets the URL win), so a stalled Redis hung the step for good;
    ``?ssl=true`` (copied from a hosted Redis's URL) crashed it as "a bug in vtrm_gate";
    ``?protocol=9`` ran the whole step uncached. Each exits 2 naming the option."""
    make_ws(tmp_path, chat_server).close()
    before = files_of(tmp_path / "ws")
    url = f"unix://:{PASSWORD}@{locked_redis.socket_path}?{query}"
    r = cli("step", "--workspace", "ws", "--epoch", "1", "--step", "1", cwd=tmp_path,
            env={"REDIS_URL": url, "OPENAI_API_KEY": "x"})
    assert r.returncode == 2, (r.returncode, r.stderr[-800:])
    assert "Traceback" not in r.stderr and named in r.stderr and PASSWORD not in r.stderr
    assert chat_server.requests == [] and files_of(tmp_path / "ws") == before
