"""The ``vtrm-gate`` command: one module per command group, one error boundary (`main`).

Bad input and expected failures (the library's own errors, `vtrm_gate.errors`; an I/O error
on a file such as a full disk or a read-only workspace; a damaged or locked SQLite file) print
one line and exit 2, with no traceback (``VTRM_DEBUG=1`` shows it); anything else is a bug:
its traceback, a line asking for a report, exit 1. INFRA (the guard tripped, nothing
measured) exits 3; SIGINT and SIGTERM exit 130 after marking the step aborted. Exit codes
follow the error families of `vtrm_gate.errors` (``isinstance``, never a class name or
message text). Heavy modules (numpy, polars, matplotlib) load inside the commands that need
them.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import errno
import io
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from ..errors import (
    CliError,
    InfraGuardError,
    OutputError,
    StepRefusedError,
    bounded,
    exit_code,
    shown,
)
from . import _cache, _compare, _export, _fit, _init, _lab, _options, _status, _step, _train
from ._args import APPLYING, drop_stdout
from ._table import terminal_width


class _OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (``vtrm-gate step: argument --epoch: ...``,
    exit 2) instead of the whole usage block before it; ``--help`` shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, usage_line(self.prog, message, terminal_width(sys.stderr)) + "\n")


def _usage_error(message: str) -> str:
    """argparse's message, shorter: ``--dispatch: invalid choice: 'fastest' (choose from
    round_robin, need_aware, expected_need)`` (no "argument ", no quotes in the list)."""
    import re

    text = " ".join(message.split()).removeprefix("argument ")
    return re.sub(r"\(choose from ([^)]*)\)", lambda m: f"(choose from "
                  f"{m.group(1).replace(chr(39), '')})", text)


def usage_line(prog: str, message: str, width: int) -> str:
    """``prog: <message>`` on one line of at most ``width`` characters: a list of choices
    too long for it becomes "(see --help)", and only then is the end cut ("…")."""
    import re

    line = f"{prog}: {_usage_error(message)}"
    if len(line) > width:
        line = re.sub(r"\(choose from [^)]*\)", "(see --help)", line)
    if len(line) > width:
        line = line[:width - len("… (see --help)")].rstrip() + "… (see --help)"
    return line


class _RaisingParser(argparse.ArgumentParser):
    """argparse that raises `CliError` on a usage error instead of printing and exiting,
    so that under ``--json`` `main` reports it as one JSON object like any other error."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{self.prog}: {_usage_error(message)}")


def build_parser(*, raise_on_error: bool = False) -> argparse.ArgumentParser:
    cls = _RaisingParser if raise_on_error else _OneLineParser
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
    _escape_what_cannot_be_encoded()
    as_json = "--json" in argv
    try:
        _check_utf8(argv)
        args = build_parser(raise_on_error=as_json).parse_args(argv)
    except CliError as exc:
        return report_error(str(exc), exc.exit_code, as_json)
    with _sigterm_as_sigint():
        return _run(args, as_json)


def _check_utf8(argv: list[str]) -> None:
    """Refuse an argument holding bytes that are not UTF-8 (the OS hands them over as lone
    surrogates): a path or name written into the workspace, SQLite, Redis or a polars frame
    cannot hold them, and each failed deep inside, some after writing."""
    for i, arg in enumerate(argv):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            flag = argv[i - 1] if i and argv[i - 1].startswith("-") else f"argument {i + 1}"
            cp = ord(arg[exc.start])  # surrogateescape: byte b arrives as U+DC00 + b
            what = f"byte {cp - 0xDC00:#04x}" if 0xDC80 <= cp <= 0xDCFF else f"U+{cp:04X}"
            raise CliError(f"{flag} {shown(arg)}: not valid UTF-8 ({what}); names and paths "
                           f"given to vtrm-gate must be UTF-8") from None


def _escape_what_cannot_be_encoded() -> None:
    """Output in a locale that cannot encode a character ("→", a CJK type name) writes it as
    an escape (\\u2192), so a step whose work is saved does not end in UnicodeEncodeError
    and "this is a bug" (``PYTHONIOENCODING=ascii``, a latin-1 terminal)."""
    for stream in (sys.stdout, sys.stderr):
        if (isinstance(stream, io.TextIOWrapper) and stream.errors == "strict"
                and codecs.lookup(stream.encoding).name != "utf-8"):
            stream.reconfigure(errors="backslashreplace")


def debugging() -> bool:
    """``VTRM_DEBUG`` set to anything but "", 0, false, no or off: tracebacks, not one line."""
    return os.environ.get("VTRM_DEBUG", "").strip().lower() not in ("", "0", "false", "no",
                                                                     "off")


_RESUMABLE = APPLYING - {"init"}
"""Commands whose finished work is kept when interrupted, so running them again resumes."""


def _run(args: argparse.Namespace, as_json: bool) -> int:
    """Run the parsed command inside the error boundary."""
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `vtrm-gate ... | head`: the reader left; not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        return _interrupted(args, as_json)
    except Exception as exc:  # our error families and I/O errors: one line; else a bug
        if _caused_by_interrupt(exc):  # a SIGTERM inside an import: "__set_name__" failed
            return _interrupted(args, as_json)
        code = exit_code(exc)
        if debugging():
            raise
        if code is None:
            return report_bug(exc, as_json)
        return report_error(f"error: {_one_line(exc, getattr(args, 'workspace', None))}",
                            code, as_json and not isinstance(exc, OutputError))


def _interrupted(args: argparse.Namespace, as_json: bool) -> int:
    """Ctrl-C, SIGTERM or SIGHUP: exit 130, saying whether running again resumes."""
    resume = ("; run the same command again to resume (finished work is kept)"
              if args.command in _RESUMABLE else "")
    return report_error(f"interrupted{resume}", 130, as_json)


def _caused_by_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by a KeyboardInterrupt (in its cause or context chain)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def report_error(text: str, code: int, as_json: bool) -> int:
    """Print an error the CLI's way and return its exit code: ``vtrm-gate: <text>`` on
    stderr, or under ``--json`` one object ``{"error": <text>, "exit": <code>}`` on stdout."""
    text = bounded(text)
    if as_json:
        try:
            print(json.dumps({"error": text.removeprefix("error: ").removeprefix("vtrm-gate: "),
                              "exit": code}), flush=True)
            return code
        except BrokenPipeError:
            return code
        except OSError:  # stdout itself fails (a full disk): the error goes to stderr
            drop_stdout()
    print(f"vtrm-gate: {text}", file=sys.stderr)
    return code


BUG_NOTE = ("this is a bug in vtrm_gate, not bad input: please report it with the traceback "
            "above and the command you ran")


def report_bug(exc: BaseException, as_json: bool) -> int:
    """A failure outside the error families: the traceback on stderr, then a line asking
    for a report; exit 1 (never 2, which says the input was bad)."""
    import traceback

    traceback.print_exception(exc, file=sys.stderr)
    return report_error(f"{BUG_NOTE} ({type(exc).__name__}: {_one_line(exc)})", 1, as_json)


@contextlib.contextmanager
def _sigterm_as_sigint() -> Iterator[None]:
    """SIGTERM (and SIGHUP, unless ignored as under nohup) behaves like Ctrl-C: the running
    step is cancelled, its rows marked aborted, leases (the embedded Redis) given up at exit,
    exit code 130. The handlers it replaces are put back on the way out (`main` called from
    Python leaves no trace)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hup = getattr(signal, "SIGHUP", None)  # not on Windows
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, hup)
             if sig is not None}
    try:
        # A background job of a script inherits SIGINT ignored; re-raised SIGTERMs would be
        # lost, and asyncio only cancels a step cleanly from the default SIGINT handler.
        if saved[signal.SIGINT] is signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        as_sigint = lambda signum, frame: signal.raise_signal(signal.SIGINT)  # noqa: E731
        signal.signal(signal.SIGTERM, as_sigint)
        if hup is not None and saved[hup] is signal.SIG_DFL:  # a dropped ssh session; not
            signal.signal(hup, as_sigint)                     # under nohup (SIG_IGN)
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


_NO_ROOM_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
# SQLite says "disk I/O error" when a write fails for want of room (it keeps no errno)
_NO_ROOM_SQLITE = ("SQLITE_FULL", "SQLITE_IOERR_WRITE", "SQLITE_IOERR_SHMSIZE",
                   "SQLITE_IOERR_FSYNC", "SQLITE_IOERR_TRUNCATE")
_NO_ROOM = ("; the disk may be full (or a quota or file size limit reached): make room and "
            "run the same command again")


def _one_line(exc: BaseException, workspace: str | None = None) -> str:
    """The error's message on one line (an OSError as ``path: reason``; an SQLite error
    as the command's workspace log, when it has one: ``ws/harness.sqlite: reason (code)``)."""
    import sqlite3

    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        text = f"{where}{exc.strerror}"
        if exc.errno in _NO_ROOM_ERRNOS:
            text += _NO_ROOM
    elif isinstance(exc, sqlite3.Error):
        from ..harness import LOG_FILE

        code = getattr(exc, "sqlite_errorname", None)
        log = f"{Path(workspace) / LOG_FILE}" if workspace else "SQLite"
        text = f"{log}: {exc}" + (f" ({code})" if code else "")
        if code in _NO_ROOM_SQLITE:
            text += _NO_ROOM
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
