"""The embedded Redis belongs to the workspace: started by its first user, adopted (never
duplicated) by later ones, kept while anyone uses it, stopped by the last user or by
``vtrm-gate cache stop``. Real processes and the real redis-server throughout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

from tests.llm.test_backends import SECRET, write_units
from vtrm_gate.cache import RedisServer, embedded_server
from vtrm_gate.cache._embedded import _ping
from vtrm_gate.llm import init_llm
from vtrm_gate.testing import ChatServer
from vtrm_gate.testing.chat import HELPFUL_MARKER

ROOT = Path(__file__).resolve().parents[2]

USER = textwrap.dedent("""
    import sys
    from vtrm_gate.cache import embedded_server
    lease = embedded_server(sys.argv[1])
    print(lease.pid, flush=True)
    sys.stdin.read()  # hold the lease until the test closes stdin
""")


def running(pid: int) -> bool:
    """True if ``pid`` runs (a zombie nobody reaped yet does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def user(ws: Path) -> tuple[subprocess.Popen[str], int]:
    """A process holding a lease on the workspace's embedded Redis; (process, server pid)."""
    p = subprocess.Popen([sys.executable, "-c", USER, str(ws)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert p.stdout is not None
    return p, int(p.stdout.readline())


def leave(p: subprocess.Popen[str]) -> None:
    """Let a user exit normally (its lease is given up at exit)."""
    assert p.stdin is not None
    p.stdin.close()
    assert p.wait(timeout=60) == 0


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    return subprocess.run([sys.executable, "-m", "vtrm_gate", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=240, env={**base, **(env or {})})


def socket_of(ws: Path) -> str:
    return RedisServer(ws / "redis").socket_path


def test_the_starter_exiting_leaves_the_server_to_the_other_user(tmp_path: Path) -> None:
    a, pid = user(tmp_path)
    b, pid_b = user(tmp_path)
    assert pid_b == pid  # adopted, not a second server
    leave(a)  # the starter exits normally while b still uses the server
    assert running(pid) and _ping(socket_of(tmp_path))
    leave(b)  # the last user out stops it, saving the data
    assert not running(pid) and not _ping(socket_of(tmp_path))
    assert (tmp_path / "redis" / "dump.rdb").exists()


def test_an_orphan_of_a_killed_starter_is_adopted_then_stopped_by_its_last_user(
        tmp_path: Path) -> None:
    a, pid = user(tmp_path)
    a.kill()  # kill -9: no exit handler runs
    a.wait()
    assert running(pid)
    b, pid_b = user(tmp_path)
    assert pid_b == pid
    leave(b)
    assert not running(pid)


def test_cache_stop_stops_an_orphan_and_refuses_while_the_server_is_in_use(
        tmp_path: Path) -> None:
    a, pid = user(tmp_path)
    a.kill()
    a.wait()
    b, _ = user(tmp_path)
    r = cli("cache", "stop", "--workspace", str(tmp_path))
    assert r.returncode == 2 and "is in use by another process" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and running(pid)
    b.kill()  # b dies too: an orphan nobody uses
    b.wait()
    r = cli("cache", "stop", "--workspace", str(tmp_path))
    assert r.returncode == 0 and f"(pid {pid})" in r.stdout, r.stderr
    assert not running(pid) and not _ping(socket_of(tmp_path))
    r = cli("cache", "stop", "--workspace", str(tmp_path))
    assert r.returncode == 0 and "no embedded Redis running" in r.stdout


def test_a_lease_in_this_process_is_shared_and_the_last_close_stops(tmp_path: Path) -> None:
    first = embedded_server(tmp_path)
    second = embedded_server(tmp_path)
    pid = first.pid
    assert pid is not None and second.pid == pid and second.url == first.url
    first.close()
    first.close()  # idempotent: one lease given up once
    assert running(pid)
    second.close()
    assert not running(pid)


def test_a_step_keeps_its_cache_when_the_process_that_started_redis_exits(
        tmp_path: Path, chat_server: ChatServer) -> None:
    ws = init_llm(tmp_path / "ws", write_units(tmp_path / "units.jsonl"),
                            base_url=chat_server.url, model="m", seed=1).root
    starter, pid = user(ws)
    in_evolve, go_on = threading.Event(), threading.Event()

    def evolve(task_type: str, skill: str, body: dict[str, Any]) -> str:
        in_evolve.set()  # the step is running: rollout done through the cache
        go_on.wait(120)
        return f"{skill.rstrip()}\n- {HELPFUL_MARKER}\n"

    chat_server.evolve_reply = evolve
    step = subprocess.Popen(
        [sys.executable, "-m", "vtrm_gate", "step", "--workspace", str(ws), "--epoch", "1",
         "--step", "1", "--json"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**{k: v for k, v in os.environ.items() if k != "REDIS_URL"},
             "OPENAI_API_KEY": SECRET})
    try:
        assert in_evolve.wait(120)
        leave(starter)  # the starter exits in the middle of the other process's step
        assert running(pid)
    finally:
        go_on.set()
    out, err = step.communicate(timeout=240)
    assert step.returncode == 0, err
    runs = json.loads(out)["llm_cache"]["runs"]
    gate_runs = [r for r in runs if "_gate_" in r]
    assert gate_runs and sum(runs[r]["misses"] for r in gate_runs) > 0
    assert all(st["errors"] == 0 and st["bypassed"] == 0 for st in runs.values()), runs
    assert not running(pid)  # the step was the last user: it stopped the server at exit


def test_sigterm_of_a_step_gives_up_its_lease_and_the_last_user_stops_the_server(
        tmp_path: Path, chat_server: ChatServer) -> None:
    ws = init_llm(tmp_path / "ws", write_units(tmp_path / "units.jsonl"),
                            base_url=chat_server.url, model="m", seed=1).root
    in_evolve, go_on = threading.Event(), threading.Event()

    def evolve(task_type: str, skill: str, body: dict[str, Any]) -> str:
        in_evolve.set()  # the step started the embedded server and used it for the rollout
        go_on.wait(120)
        return f"{skill.rstrip()}\n- {HELPFUL_MARKER}\n"

    chat_server.evolve_reply = evolve
    step = subprocess.Popen(
        [sys.executable, "-m", "vtrm_gate", "step", "--workspace", str(ws), "--epoch", "1",
         "--step", "1"], cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**{k: v for k, v in os.environ.items() if k != "REDIS_URL"},
             "OPENAI_API_KEY": SECRET})
    try:
        assert in_evolve.wait(120)
        pid = int((ws / "redis" / "redis.pid").read_text())
        assert running(pid)
        step.send_signal(signal.SIGTERM)
        _, err = step.communicate(timeout=120)
    finally:
        go_on.set()
        if step.poll() is None:
            step.kill()
    assert step.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert not running(pid) and not _ping(socket_of(ws))  # its only user left: stopped
    assert SECRET not in err


def test_a_damaged_snapshot_is_set_aside_and_the_server_starts_empty(
        tmp_path: Path, caplog: Any) -> None:
    """Hostile pass (h22): a dump.rdb cut short (a full disk, a partial copy) stopped every
    start of the workspace's Redis: 26 failed starts a step, a warning that was mostly
    Redis's overcommit notice, and the workspace uncached for good."""
    import logging

    import redis

    server = RedisServer(tmp_path, persist=True).start()
    r = redis.Redis(unix_socket_path=server.socket_path)
    r.mset({f"k{i}": "x" * 100 for i in range(20_000)})
    r.close()
    server.stop()
    dump = tmp_path / "dump.rdb"
    whole = dump.read_bytes()
    dump.write_bytes(whole[:len(whole) // 2])
    with caplog.at_level(logging.WARNING, "vtrm_gate.cache"):
        again = RedisServer(tmp_path, persist=True).start()
    try:
        assert _ping(again.socket_path)
        [aside] = tmp_path.glob("dump.rdb.damaged-*")
        assert aside.read_bytes() == whole[:len(whole) // 2]  # kept, not deleted
        assert "could not load its snapshot" in caplog.text and aside.name in caplog.text
    finally:
        again.stop()
