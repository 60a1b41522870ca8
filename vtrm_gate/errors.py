"""Every error vtrm_gate raises on purpose, in one tree; callers branch on ``isinstance``.

::

    VtrmError                               base of them all; ``exit_code`` for the CLI
    ├── InputError (ValueError)             bad input, nothing written: exit 2
    │   ├── ConfigError                     a config key or value (file, environment, flag)
    │   │   ├── BackendError                a bring-your-own backend factory is unusable
    │   │   │   └── InvalidResultError      ``infer`` returned an invalid result (TypeError)
    │   │   └── RedisAccessError            Redis answered and refused (password, ACL, db)
    │   ├── WorkspaceError                  a workspace file is missing or malformed
    │   │   └── WorkspaceLockedError        another process holds the writer lock
    │   ├── StepRefusedError                the step may not run as asked (``changes``)
    │   │   └── TrainRefusedError           the training configuration changed
    │   ├── EndpointsError                  an endpoints setting or file
    │   ├── EndpointUnreachableError        no chat endpoint answers at all (ConnectionError)
    │   ├── TargetClashError                two types map to one skill file (RuntimeError)
    │   ├── ServerInUseError                the embedded Redis is in use (RuntimeError)
    │   └── CliError                        a command-line value (``code`` may differ)
    │       └── OutputError                 the command finished, its output could not be
    │                                       written (stdout full or closed)
    ├── InfraError (RuntimeError)           infrastructure failed, nothing decided: exit 3
    │   ├── InfraGuardError                 the INFRA guard aborted the gate (``partial``)
    │   ├── StepUnmeasuredError             nothing in the step could be measured
    │   ├── LLMInfraError                   a chat call failed for good
    │   │   ├── ContextOverflowError        the conversation does not fit the context
    │   │   ├── PromptFilteredError         the server's content filter refused the prompt
    │   │   └── MediaError                  a frame cannot be sent (missing, outside the
    │   │       │                           units directory, over a cap, not an image)
    │   │       └── MediaChangedError       a frame's bytes changed since its reference
    │   ├── EvolveError                     the evolver could not propose a candidate
    │   └── WorkerLostError                 a sweep's worker process ended abruptly
    ├── CandidateRefused                    the evolver's reply is not a skill to gate (a
    │   │                                   signal: the type is skipped for the step)
    │   └── RepeatedCandidate               it kept re-proposing rejected candidates
    └── CasesUnavailable                    a type's rollout could not be measured (a signal
                                            a case source raises; the type is
                                            ``rollout_error``, never ``no_cases``)

The builtin bases stay what they were (a `WorkspaceError` is still a ``ValueError``), so
``except ValueError`` in user code keeps working.
"""

from __future__ import annotations

import dataclasses
import errno
import math
import numbers
import os
from collections.abc import Sequence
from typing import Any, TypeGuard

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_INFRA",
    "USER_TEXT",
    "BackendError",
    "CandidateRefused",
    "CasesUnavailable",
    "CliError",
    "ConfigError",
    "ContextOverflowError",
    "EndpointUnreachableError",
    "EndpointsError",
    "EvolveError",
    "InfraError",
    "InfraGuardError",
    "InputError",
    "InvalidResultError",
    "LLMInfraError",
    "MediaChangedError",
    "MediaError",
    "OutputError",
    "PromptFilteredError",
    "RedisAccessError",
    "RepeatedCandidate",
    "ServerInUseError",
    "StepRefusedError",
    "StepUnmeasuredError",
    "TargetClashError",
    "TrainRefusedError",
    "VtrmError",
    "WorkerLostError",
    "WorkspaceError",
    "WorkspaceLockedError",
    "exit_code",
    "not_utf8",
]

EXIT_BAD_INPUT = 2
EXIT_INFRA = 3

USER_TEXT = "utf-8-sig"
"""How a text file a researcher hands us is decoded: UTF-8, a leading byte order mark skipped
(Windows editors save one: Notepad before 2019, Excel's "CSV UTF-8"). Files we write carry
none, so reading them so changes nothing."""


def not_utf8(exc: UnicodeDecodeError) -> str:
    """What a file that is not UTF-8 is told: where decoding stopped and, when its bytes read
    as one, the encoding it was probably saved in (Windows' UTF-16 "Unicode", or GB18030 /
    GBK, Chinese Windows' default, which Notepad and Excel write), then what to do."""
    data = bytes(exc.object)
    guess = ""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        guess = "; it is UTF-16 (Windows' \"Unicode\")"
    else:
        try:
            data.decode("gb18030")
            guess = "; it reads as GB18030 / GBK (Chinese Windows' default)"
        except UnicodeDecodeError:
            pass
    return f"not UTF-8 text ({exc.reason} at byte {exc.start}){guess}: save it as UTF-8"


class VtrmError(Exception):
    """Base of every error vtrm_gate raises on purpose."""

    exit_code = 1


class InputError(VtrmError, ValueError):
    """Bad input (a value, a file, a flag): the message names it; nothing was written."""

    exit_code = EXIT_BAD_INPUT


class ConfigError(InputError):
    """A configuration value or key is invalid; the message names it."""


class BackendError(ConfigError):
    """A backend factory cannot be used; the message names the factory and the fault."""


class InvalidResultError(BackendError, TypeError):
    """``infer`` returned something that is not a valid `UnitResult` (``correct`` not a bool,
    ``tokens`` not a non-negative integer...): a programming error of the backend, so it
    fails the gate at once (it is a TypeError) and never hides as INFRA; the message names
    unit, arm, field and value."""


class RedisAccessError(ConfigError):
    """Redis answered but refused the response cache (a wrong password, an ACL without the
    rights it needs, a database number out of range): a setting to fix, not an outage."""


class WorkspaceError(InputError):
    """A workspace file is missing or malformed; the message names the file and the fault."""


class WorkspaceLockedError(WorkspaceError):
    """Another writer (a process, or another task of this one) holds the workspace's writer
    lock; the message names the holder."""

    def __init__(self, root: Any, holder: Any = None):
        self.root = root
        self.holder = holder
        if holder is not None and holder.pid == os.getpid():  # a notebook's background task
            who = f"another task of this process ({holder.command} since {holder.since})"
            then = "await it or cancel it first"
        else:
            who = holder.describe() if holder else "another process"
            then = "wait for it to finish"
        super().__init__(f"{root}: workspace is locked by {who}; {then} (readers such as "
                         f"replay and cache stats need no lock)")


class StepRefusedError(InputError):
    """The step may not run as asked (changed manifest, out of order, already settled)."""

    def __init__(self, message: str, changes: Sequence[str] = ()):
        super().__init__(message)
        self.changes = tuple(changes)


class TrainRefusedError(StepRefusedError):
    """The run may not go on as asked (its configuration changed since the last run)."""


class EndpointsError(InputError):
    """An endpoints setting (``base_url`` list, endpoints file) is malformed."""


class EndpointUnreachableError(InputError, ConnectionError):
    """The chat endpoint did not answer at all (connection refused, DNS, timeout)."""


class TargetClashError(InputError, RuntimeError):
    """Two types of one step map to the same target skill file (refused before inference)."""


class ServerInUseError(InputError, RuntimeError):
    """The embedded Redis is used by another live process; it is not stopped."""


class CliError(InputError):
    """A user-facing command-line failure: one line, exit ``code`` (default 2)."""

    def __init__(self, message: str, code: int = EXIT_BAD_INPUT):
        super().__init__(message)
        self.exit_code = code

    @property
    def code(self) -> int:
        return self.exit_code


class OutputError(CliError):
    """The command finished, and writing its output (stdout) failed: reported on stderr,
    since stdout is what failed."""


class InfraError(VtrmError, RuntimeError):
    """Infrastructure failed (endpoints, the network): nothing was decided or applied."""

    exit_code = EXIT_INFRA


class InfraGuardError(InfraError):
    """The INFRA guard aborted the gate; ``partial`` holds what was done."""

    def __init__(self, task_type: str, infra_units: int, calls: int, guard: Any,
                 last_errors: Sequence[str] = (), infra_calls: int | None = None):
        self.task_type, self.infra_units, self.calls, self.guard = (
            task_type, infra_units, calls, guard)
        self.infra_calls = infra_calls
        self.last_errors = tuple(last_errors)
        self.partial: Any = None
        """The `GateResult` so far (set by the gate before it raises)."""
        errors = "; ".join(repr(e) for e in self.last_errors) or "none recorded"
        why = (guard.explain(infra_units, calls, infra_calls) if hasattr(guard, "explain")
               else f"{infra_units} INFRA units out of {calls} completed calls")
        super().__init__(
            f"INFRA guard tripped for type {task_type!r}: {why}; in-flight calls were "
            f"cancelled and every finished result was persisted; last errors: {errors}")


class StepUnmeasuredError(InfraError):
    """Nothing in the step could be measured: no type reached the gate and some failed
    (``rollout_error`` / ``evolve_error``). step_report says why per type; the training
    state is untouched (the step is not applied) and the step can be re-run as new."""


class LLMInfraError(InfraError):
    """A chat call failed for good (retries exhausted, or a non-retryable status)."""

    status: int | None = None
    """The HTTP status of the reply that ended the call, when one came (a 400, a 401...)."""


class ContextOverflowError(LLMInfraError):
    """The server refused the conversation as longer than the model's context: the agent
    grades that arm's answer wrong (its own conversation caused it) instead of INFRA."""


class PromptFilteredError(LLMInfraError):
    """The server's content filter refused the prompt (Azure's content management policy):
    the agent grades that arm's answer wrong (its own prompt, the skill included, caused
    it) instead of INFRA."""


class EvolveError(InfraError):
    """The evolver's call failed (INFRA) or returned no usable skill text."""


class WorkerLostError(InfraError):
    """A worker process of a sweep ended abruptly (killed by a signal, or by the
    out-of-memory killer) before its run returned; the sweep returned nothing."""


class MediaError(LLMInfraError):
    """A frame cannot be sent: missing, outside the units directory, over the size or pixel
    cap, or not an image. At ``init`` a `WorkspaceError`; in a step its unit is left out of
    the ladder; at call time (deleted mid-gate) the call is INFRA with this message."""


class MediaChangedError(MediaError):
    """A frame file's bytes differ from the hash its reference (and cache key) holds."""


class CandidateRefused(VtrmError):
    """Every sample the evolver gave (the first and its bounded retries) failed the candidate
    check (cut at ``max_tokens``, or `vtrm_gate.harness.candidate_problem`: empty,
    unchanged, a rejected one, a chat reply, far too short, over the size cap): the type is
    ``skipped`` for the step with this message as its note, nothing is gated and no cooldown
    is charged."""


class RepeatedCandidate(CandidateRefused):
    """Every sample the evolver gave (the first and its bounded retries) repeats a rejected
    candidate: not a failure of the backend, so the type is ``skipped`` for the step (with
    this message as its note) and the training run goes on."""


class CasesUnavailable(VtrmError):
    """A type's rollout could not be measured (its calls were INFRA): a case source raises
    it (or a ``cases`` mapping holds it) and the type is reported ``rollout_error``, never
    ``no_cases``."""


QUOTE_MAX = 80
"""How many characters of an offending value an error message quotes."""


def safe_str(exc: BaseException) -> str:
    """``str(exc)``, or a note when its own ``__str__`` raises (an SDK error that reads a
    field never set): the text of an error must never be a second error."""
    try:
        return str(exc)
    except Exception as err:
        return f"<its str() raised {type(err).__name__}>"


def described(exc: BaseException) -> str:
    """``Type: message`` of an exception (`safe_str`); ``Type`` alone when it has none."""
    text = safe_str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def shown(value: object, limit: int = QUOTE_MAX) -> str:
    """``repr(value)`` for an error message, at most ~``limit`` characters: a longer one is
    cut and says how long it was (a 3 MB value never makes a 3 MB error line); a value whose
    repr raises is named by its type."""
    try:
        text = repr(value)
    except Exception as err:
        return f"<{type(value).__name__} whose repr raised {type(err).__name__}>"
    if len(text) <= limit:
        return text
    size = (f"{len(value):,} characters" if isinstance(value, str)
            else f"{len(value):,} bytes" if isinstance(value, bytes | bytearray)
            else f"{len(text):,} characters as text")
    return f"{text[:limit - 3]}... ({size})"


def is_real(value: object) -> bool:
    """Whether ``value`` is a finite number: an int or a float, not a bool (``True`` is not
    a timeout or a ratio), not NaN (it fails every bound it is checked against) or inf."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past every float (10**400): no number of seconds
        return False


def is_number(value: object) -> TypeGuard[float]:
    """Whether ``value`` is a number of any kind (int, float, numpy's), not a bool: NaN and
    inf included, which the caller's bound decides on."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def plain_number(value: Any) -> Any:
    """A numpy (or other `numbers`) scalar as the Python int or float it stands for, so a
    value from a numpy sweep (``np.arange(20, 121, 20)``) is checked, shown and written as a
    literal is; anything else unchanged (bools, numpy's too, stay what the checks refuse)."""
    if type(value) is int or type(value) is float or isinstance(value, bool):
        return value
    kind = getattr(getattr(value, "dtype", None), "kind", None)  # numpy's, else None
    if kind is not None and kind not in ("i", "u", "f"):  # timedelta64 poses as an Integral
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


def plain_fields(obj: Any) -> None:
    """Every field of the frozen dataclass ``obj`` through `plain_number`: its
    ``__post_init__`` calls this before it checks them."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        plain = plain_number(value)
        if plain is not value:
            object.__setattr__(obj, f.name, plain)


def is_whole(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an int, not a bool (``True`` is not a count of slots or units)."""
    return isinstance(value, int) and not isinstance(value, bool)


LONG_WORD = 200
"""A word of an error line longer than this is a value its message did not cut (`shown`)."""
MAX_LINE = 4000


def bounded(text: str) -> str:
    """The error line with every overlong word (a quoted value) cut to ``QUOTE_MAX`` characters
    and its length, and the line itself capped: a 3 MB value never makes a 3 MB line."""
    text = " ".join(w if len(w) <= LONG_WORD else f"{w[:QUOTE_MAX - 3]}... ({len(w):,} "
                    f"characters)" for w in text.split(" "))
    return text if len(text) <= MAX_LINE else (
        f"{text[:MAX_LINE - 40]}... ({len(text):,} characters in all)")


# I/O failures of the files a command is given (a full or read-only disk, a missing or
# unreadable path): the environment, not a bug. Anything else without a family is a bug.
_IO_ERRNOS = frozenset(getattr(errno, n) for n in (
    "ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "ENOENT", "ENOTDIR", "EISDIR", "EIO",
    "ENAMETOOLONG", "EEXIST", "ELOOP", "EFBIG", "EMFILE", "ENFILE", "ENOTEMPTY", "EXDEV",
    "EBUSY", "ETXTBSY", "ESTALE") if hasattr(errno, n))
# SQLite's result codes for a database file it cannot use (full, read-only, damaged, busy):
# SQLITE_ERROR (a bad statement) and misuse are bugs.
_SQLITE_IO = ("SQLITE_FULL", "SQLITE_READONLY", "SQLITE_IOERR", "SQLITE_CANTOPEN",
              "SQLITE_NOTADB", "SQLITE_CORRUPT", "SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_PERM")


def exit_code(exc: BaseException) -> int | None:
    """The CLI exit code of an expected failure (None: a bug, to be reported as one).

    Our families carry theirs; an I/O error on a file (``OSError`` with an I/O errno: disk
    full, read-only, permissions, missing) or an SQLite error on the database file (full,
    read-only, damaged, locked) is the environment: 2. A builtin ``ValueError``, an
    ``OSError`` without such an errno or an SQLite misuse is a bug: None.
    """
    import sqlite3

    if isinstance(exc, VtrmError):
        return exc.exit_code
    if isinstance(exc, OSError) and exc.errno in _IO_ERRNOS:
        return EXIT_BAD_INPUT
    if isinstance(exc, sqlite3.Error) and str(
            getattr(exc, "sqlite_errorname", "")).startswith(_SQLITE_IO):
        return EXIT_BAD_INPUT
    return None
