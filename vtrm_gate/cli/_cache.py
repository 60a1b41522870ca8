"""``vtrm-gate cache renew|stats|stop``: TTL renewal and key statistics of the LLM response
cache; stopping the workspace's embedded Redis.

Light at import (argparse only): redis and the cache module load when a command runs, so a
one-off ``cache renew`` is not dominated by start-up. Bad input prints one line on stderr
and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .._env import MAX_TTL, mask_url, prefix_problem, scrub
from ..errors import CliError, InputError, bounded, described, shown
from ._args import a_path
from ._progress import status_line

RENEW_METHODS = ("auto", "lua", "pipeline", "gt", "naive")  # mirrors cache.RENEW_METHODS
DEFAULT_TTL = 604800  # the cache's default (not imported: the parser loads nothing heavy)
DEFAULT_PREFIX = "llm_cache"


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``cache`` command (``renew``, ``stats``, ``stop``) to an argparse subparsers
    object."""
    p = subparsers.add_parser(
        "cache", help="LLM response cache: TTL renewal and statistics",
        description="Operate on the Redis LLM response cache (REDIS_URL, or the workspace's "
                    "embedded server).")
    sub = p.add_subparsers(dest="cache_command", metavar="{renew,stats,stop}")
    sub.required = True

    def workspace_json(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--workspace", type=a_path, default=None,
                        help="workspace holding the embedded Redis (default: VTRM_WORKSPACE "
                             "or ./workspace)")
        sp.add_argument("--json", action="store_true", help="print the result as JSON")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--url", default=None,
                        help="Redis URL: redis://, rediss://, unix://, or a cluster's "
                             "redis+cluster:// or rediss+cluster:// (default: REDIS_URL "
                             "from the environment or .env, else the workspace's embedded "
                             "Redis)")
        workspace_json(sp)

    r = sub.add_parser(
        "renew", help="extend TTLs of cache keys: 0 < ttl < target => ttl = target",
        description="Set ttl = TTL on every key matching PATTERN whose ttl is between 0 and "
                    "TTL. Keys without expiry and keys with a longer ttl are untouched. SCAN "
                    "plus one round trip per batch; never KEYS.")
    r.add_argument("--ttl", default=str(DEFAULT_TTL),
                   help=f"target ttl in seconds (default {DEFAULT_TTL} = 7 days)")
    r.add_argument("--pattern", default=f"{DEFAULT_PREFIX}:*",
                   help=f"SCAN MATCH pattern (default '{DEFAULT_PREFIX}:*')")
    r.add_argument("--dry-run", action="store_true", help="count only, change nothing")
    r.add_argument("--batch", default="1000", help="SCAN COUNT and keys per round trip")
    r.add_argument("--method", default="auto", choices=RENEW_METHODS,
                   help="lua (default), pipeline, gt (EXPIRE GT, Redis >= 7), naive")
    common(r)
    s = sub.add_parser("stats", help="key count, memory and TTL histogram of a prefix")
    s.add_argument("--prefix", default=DEFAULT_PREFIX, help="key prefix (default llm_cache)")
    s.add_argument("--batch", default="1000", help="SCAN COUNT per round trip")
    common(s)
    st = sub.add_parser(
        "stop", help="stop the workspace's embedded Redis (refused while a process uses it)",
        description="The embedded Redis is shared by the processes using a workspace and "
                    "stopped by the last one; this stops one left running (e.g. after a "
                    "kill -9), saving its data. Refused while another process uses it.")
    workspace_json(st)
    p.set_defaults(func=run)
    return p


def _workspace_dir(args: argparse.Namespace, env: Any) -> Any:
    from pathlib import Path

    return Path(args.workspace or env.get("VTRM_WORKSPACE") or "workspace")


def _stop(args: argparse.Namespace) -> int:
    """``cache stop``: stop the embedded server if nobody uses it."""
    from ..cache import environment, stop_embedded
    from ..errors import ServerInUseError

    ws = _workspace_dir(args, environment())
    try:
        pid = stop_embedded(ws)
    except ServerInUseError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"cannot stop the embedded Redis in {ws / 'redis'}: {exc}") from None
    note = None if pid else _nothing_to_stop(args, ws)
    if args.json:
        print(json.dumps({"workspace": str(ws), "stopped_pid": pid, "note": note}))
    else:
        from ._table import terminal_width, wrap

        print(wrap(note or f"stopped the embedded Redis in {ws / 'redis'} (pid {pid})",
                   terminal_width()))
    return 0


def _nothing_to_stop(args: argparse.Namespace, ws: Any) -> str:
    """Why ``cache stop`` found no server, and whether that is fine (it said only "no
    embedded Redis running in workspace/redis", also for a mistyped path); `CliError` for a
    workspace that does not exist."""
    where = "" if args.workspace else " (no --workspace given, VTRM_WORKSPACE unset or empty)"
    if not ws.is_dir():
        raise CliError(f"no such workspace: {ws}{where}; nothing to stop")
    if _simulated_without_redis(args):
        return f"{ws}: nothing to stop: simulated runs use no Redis"
    kept = " (its data is kept in dump.rdb)" if (ws / "redis" / "dump.rdb").exists() else ""
    return (f"no embedded Redis running in {ws / 'redis'}{where}: nothing to stop; the last "
            f"process using it stops it when it exits{kept}")


SIMULATED_NOTE = (
    "simulated runs use no Redis: the simulator answers in-process, and the 'base arm from "
    "BaselineCache' count that step prints is the workspace's own SQLite cache, not Redis. "
    "To see the Redis response cache at work, run notebooks/04_redis_reuse.ipynb (it puts "
    "the simulator behind a real redis-server, crashes a step and re-runs it from Redis); "
    "to inspect a Redis server, pass --url or set REDIS_URL.")


def _simulated_without_redis(args: argparse.Namespace) -> bool:
    """A simulated workspace and no Redis named anywhere (no --config, REDIS_URL or
    embedded server): there is nothing to look at."""
    from ..cache import environment

    env = environment()
    ws = _workspace_dir(args, env)
    if getattr(args, "config", None) or env.get("REDIS_URL") or (ws / "redis").exists():
        return False
    try:
        kind = json.loads((ws / "workspace.json").read_text()).get("kind")
    except (OSError, ValueError, AttributeError):
        return False
    return kind == "simulated"


def _simulated_note(args: argparse.Namespace, cmd: str | None) -> int:
    """Say plainly that a simulated workspace has no Redis, and where to see one (exit 0)."""
    from ..cache import environment
    from ._table import terminal_width, wrap

    ws = str(_workspace_dir(args, environment()))
    if args.json:
        print(json.dumps({"workspace": ws, "kind": "simulated", "redis": None,
                          "command": f"cache {cmd}", "note": SIMULATED_NOTE}))
    else:
        print(wrap(f"{ws}: {SIMULATED_NOTE}", terminal_width()))
    return 0


def _positive_int(name: str, value: str, high: int = 2**63 - 1) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise CliError(f"{name} must be a whole number > 0, got {shown(value)}") from None
    if n <= 0:
        raise CliError(f"{name} must be > 0, got {n}")
    if n > high:
        raise CliError(f"{name} must be at most {high}, got {n}")
    return n


def _resolve_url(args: argparse.Namespace) -> tuple[str, Any]:
    """The URL to use (the one resolver: --url > REDIS_URL > --config) and, for the
    embedded default, the server started for this command."""
    from ..cache import RedisServer, embedded_server, environment
    from ..cache._embedded import _ping
    from ..options import resolve_options

    url = resolve_options({"redis_url": args.url}, config=getattr(args, "config", None),
                          flag_names={"redis_url": "--url"}).redis_url
    if url is not None:
        return url, None
    ws = _workspace_dir(args, environment())
    probe = RedisServer(ws / "redis")
    if not _ping(probe.socket_path) and not (ws / "redis" / "dump.rdb").exists():
        raise CliError(f"no Redis: --url and REDIS_URL are unset and there is no embedded "
                       f"cache in {ws / 'redis'}")
    try:
        server = embedded_server(ws)
    except (OSError, RuntimeError) as exc:
        raise CliError(f"cannot start the embedded Redis in {ws / 'redis'}: {exc}") from None
    return server.url, server


async def _renew(url: str, args: argparse.Namespace, ttl: int, batch: int) -> Any:
    from ..cache import connect, renew_ttl

    client = connect(url, socket_timeout=30.0)
    line, done = status_line()

    def show(p: Any) -> None:
        rate = p.scanned / p.elapsed_s if p.elapsed_s > 0 else 0.0
        line(f"... scanned {p.scanned:,} keys, extended {p.extended:,} ({rate:,.0f} keys/s)")

    try:
        return await renew_ttl(client, ttl, args.pattern, dry_run=args.dry_run, batch=batch,
                               progress=show, method=args.method)
    finally:
        done()
        await client.aclose()


async def _stats(url: str, args: argparse.Namespace, batch: int) -> Any:
    from ..cache import cache_stats, connect

    client = connect(url, socket_timeout=30.0)
    try:
        return await cache_stats(client, args.prefix, batch=batch)
    finally:
        await client.aclose()


def _error(args: argparse.Namespace, prog: str, text: str, code: int) -> int:
    """One line on stderr, or under ``--json`` one JSON object on stdout; the exit code."""
    text = bounded(text)
    if getattr(args, "json", False):
        print(json.dumps({"error": text, "exit": code}), flush=True)
    else:
        print(f"{prog}: error: {text}", file=sys.stderr)
    return code


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n / 1024:,.1f} KiB"


def _against_redis(url: str, args: argparse.Namespace, cmd: str | None, ttl: int,
                   batch: int) -> Any:
    """``renew`` or ``stats`` against the Redis at ``url``, its failures as one-line
    `CliError`s: cannot reach it, it refuses, or the peer is no Redis."""
    from redis.exceptions import (
        AuthenticationError,
        RedisClusterException,
        RedisError,
        ResponseError,
    )
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from .._sync import run_sync

    try:
        if cmd == "renew":
            return run_sync(_renew(url, args, ttl, batch))
        if cmd == "stats":
            return run_sync(_stats(url, args, batch))
        raise CliError("choose a cache command: renew or stats")
    except (RedisConnectionError, RedisTimeoutError, AuthenticationError, OSError,
            RedisClusterException) as exc:  # the last: no cluster node answers
        raise CliError(f"cannot reach Redis at {mask_url(url)}: "
                       f"{scrub(str(exc), url)}") from None
    except InputError as exc:  # a bad value: its message may quote the URL
        raise CliError(scrub(str(exc), url)) from None
    except ResponseError as exc:  # NOPERM, a cluster's refusal: the server's setting
        raise CliError(f"Redis at {mask_url(url)} refused: {scrub(str(exc), url)}") from None
    except RedisError as exc:  # a peer that is no Redis (an HTTP server, a proxy)
        raise CliError(f"{mask_url(url)} does not answer as Redis does: "
                       f"{scrub(described(exc), url)}") from None


def run(args: argparse.Namespace) -> int:
    """Run ``cache renew`` / ``stats`` / ``stop``; returns the exit code (2 on bad input)."""
    cmd = getattr(args, "cache_command", None)
    prog = f"vtrm-gate cache {cmd}"
    try:
        if cmd == "stop":
            return _stop(args)
        if cmd == "renew":
            ttl = _positive_int("--ttl", args.ttl, MAX_TTL)
        batch = _positive_int("--batch", args.batch)
        if cmd == "stats" and (bad := prefix_problem(args.prefix)):
            raise CliError(f"--prefix {bad}")
        if args.url is None and _simulated_without_redis(args):
            return _simulated_note(args, cmd)
        url, _server = _resolve_url(args)
        out = _against_redis(url, args, cmd, ttl if cmd == "renew" else 0, batch)
    except InputError as exc:  # CliError, and a bad --url or REDIS_URL (ConfigError)
        return _error(args, prog, str(exc), exc.exit_code)
    except KeyboardInterrupt:
        return _error(args, prog, "interrupted", 130)
    if args.json:
        print(json.dumps({"url": mask_url(url), **out.as_dict()}, sort_keys=True))
        return 0
    if cmd == "renew":
        print(f"scanned   {out.scanned}\nextended  {out.extended}\nuntouched {out.untouched}")
        note = " (dry run: nothing changed)" if out.dry_run else ""
        print(f"pattern {out.pattern!r} on {mask_url(url)}, target ttl {out.ttl} s, "
              f"method {out.method}, {out.elapsed_s:.2f} s{note}", file=sys.stderr)
    else:
        print(f"prefix     {out.prefix}\nkeys       {out.keys}\n"
              f"memory     {_mib(out.memory_bytes)} (server used {_mib(out.server_used_memory)})"
              f"\nno expiry  {out.no_expiry}")
        for label, n in out.ttl_histogram:
            print(f"ttl {label:<10} {n}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry: ``python -m vtrm_gate.cli.cache cache renew ...``."""
    parser = argparse.ArgumentParser(prog="python -m vtrm_gate.cli.cache")
    sub = parser.add_subparsers(dest="command", metavar="{cache}")
    sub.required = True
    register(sub)
    args = parser.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
