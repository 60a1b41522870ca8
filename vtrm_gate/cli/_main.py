"""The ``vtrm-gate`` command: one module per command group, one error boundary (`main`).

Bad input and expected failures (a bad value, an OSError such as a full disk or a read-only
workspace, an SQLite error, a locked workspace) print one line and exit 2, with no traceback
(``VTRM_DEBUG=1`` shows it); INFRA (the guard tripped, nothing measured) exits 3; SIGINT and
SIGTERM exit 130 after marking the step aborted. Exit codes follow the error families of
`vtrm_gate.errors` (``isinstance``, never a class name or message text). Heavy modules
(numpy, polars, matplotlib) load inside the commands that need them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import NoReturn

from ..errors import CliError, InfraGuardError, StepRefusedError, exit_code
from . import _cache, _compare, _export, _fit, _init, _lab, _options, _status, _step, _train


class _RaisingParser(argparse.ArgumentParser):
    """argparse that raises `CliError` on a usage error instead of printing and exiting,
    so that under ``--json`` `main` reports it as one JSON object like any other error."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{self.prog}: {message}")


def build_parser(*, raise_on_error: bool = False) -> argparse.ArgumentParser:
    cls = _RaisingParser if raise_on_error else argparse.ArgumentParser
    p = cls(prog="vtrm-gate",
            description="Continuous concurrent e-process gate for skill evolution.")
    sub = p.add_subparsers(dest="command", required=True)
    for group in (_init, _step, _train, _fit, _status, _export, _compare, _cache, _options,
                  _lab):
        group.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """The CLI's one error boundary: an expected failure is exit 2 (3: INFRA) and one line;
    under ``--json`` that line is one JSON object ``{"error": ..., "exit": code}`` on
    stdout (usage errors included)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    as_json = "--json" in argv
    try:
        args = build_parser(raise_on_error=as_json).parse_args(argv)
    except CliError as exc:
        return report_error(str(exc), exc.exit_code, as_json)
    _sigterm_as_sigint()
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `vtrm-gate ... | head`: the reader left; not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        return report_error("interrupted; run the same command again to resume (finished "
                            "work is kept)", 130, as_json)
    except Exception as exc:  # map known user-facing errors to exit codes, re-raise bugs
        code = exit_code(exc)
        if code is None or os.environ.get("VTRM_DEBUG"):
            raise
        return report_error(f"error: {_one_line(exc)}", code, as_json)


def report_error(text: str, code: int, as_json: bool) -> int:
    """Print an error the CLI's way and return its exit code: ``vtrm-gate: <text>`` on
    stderr, or under ``--json`` one object ``{"error": <text>, "exit": <code>}`` on stdout."""
    if as_json:
        text = text.removeprefix("error: ").removeprefix("vtrm-gate: ")
        print(json.dumps({"error": text, "exit": code}), flush=True)
    else:
        print(f"vtrm-gate: {text}", file=sys.stderr)
    return code


def _sigterm_as_sigint() -> None:
    """SIGTERM behaves like Ctrl-C: the running step is cancelled, its rows marked aborted,
    leases (the embedded Redis) given up at exit, exit code 130."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        # A background job of a script inherits SIGINT ignored; re-raised SIGTERMs would be
        # lost, and asyncio only cancels a step cleanly from the default SIGINT handler.
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, lambda signum, frame: signal.raise_signal(signal.SIGINT))


def _one_line(exc: BaseException) -> str:
    """The error's message on one line (an OSError as ``path: reason``)."""
    import sqlite3

    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        text = f"{where}{exc.strerror}"
    elif isinstance(exc, sqlite3.Error):
        text = f"SQLite: {exc}"
    else:
        text = str(exc) or type(exc).__name__
    if isinstance(exc, StepRefusedError):  # its changed inputs, one per line
        return text.replace("force=True", "--force")  # the CLI's spelling of the override
    if isinstance(exc, InfraGuardError):
        text += ("; once the backend is healthy, run the same command again: finished work "
                 "is kept and only the failed calls are asked again")
    return " ".join(text.split())


if __name__ == "__main__":
    raise SystemExit(main())
