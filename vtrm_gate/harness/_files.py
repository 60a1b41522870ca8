"""Small file helpers of the workspace: atomic writes, JSON and skill files read with errors
that name the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

from .._env import read_settings_text
from .._ids import readable_json, strict_json
from ..errors import USER_TEXT, InputError, WorkspaceError, is_whole, not_utf8


def temp_sibling(path: Path) -> Path:
    """A hidden temporary name beside ``path``, unique to this writer (process and call):
    two writers of one file (two exports into one directory) never share it."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` all-or-nothing: temp file in the same dir, fsync, replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:  # a full disk, an interrupt: no half-written temp file stays
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError) and exc.filename is None:  # a write names no file
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def link_file(src: Path, dst: Path) -> None:
    """``dst`` a hard link to ``src`` (replacing any file there), atomically; a copy where
    the file system has no hard links. No fsync: the caller syncs ``dst``'s directory."""
    tmp = temp_sibling(dst)
    try:
        os.link(src, tmp)
    except OSError:  # no hard links here (some network or FAT file systems)
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


_TEMP_NAME = re.compile(r"^\..+\.tmp-(\d+)(-[0-9a-f]{8})?$")
"""`temp_sibling`'s names (``.NAME.tmp-PID-XXXXXXXX``) and the older ``.NAME.tmp-PID``."""


def clean_temp_files(root: Path) -> list[Path]:
    """Remove ``.<name>.tmp-PID`` files `atomic_write` left behind (a writer killed mid-write).

    Called by a writer that holds the workspace lock, so no other writer is mid-write; files
    of this process are kept. Returns the files removed.
    """
    removed = []
    for p in root.rglob(".*.tmp-*"):
        m = _TEMP_NAME.match(p.name)
        if m and int(m.group(1)) != os.getpid() and p.is_file() and not p.is_symlink():
            try:
                p.unlink()
            except FileNotFoundError:
                continue
            removed.append(p)
    return removed


def write_json(path: Path, value: Any) -> None:
    """``value`` as readable JSON, written atomically; text holding a lone surrogate (no
    UTF-8 form) is written escaped, so it reads back as it was instead of failing."""
    atomic_write(path, readable_json(value, indent=2, sort_keys=True) + "\n")


def _rel(root: Path, path: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


MAX_JSON_DEPTH = 64
"""A workspace file nests a few levels (a manifest's agent config is the deepest, ~5); past
this a file was not written by vtrm_gate and is refused before anything walks it."""


def _no_constant(name: str) -> Any:
    raise InputError(f"{name} is not a JSON number")


def json_depth(value: Any) -> int:
    """How deeply ``value`` nests lists and objects (iterative: any depth is measured)."""
    depth, level = 0, [value]
    while level:
        depth += 1
        level = [x for v in level if isinstance(v, dict | list)
                 for x in (v.values() if isinstance(v, dict) else v)]
    return depth - 1


def read_json(path: Path, root: Path | None = None) -> Any:
    """Parse a JSON file, or raise WorkspaceError naming it: missing, not UTF-8, malformed,
    ``NaN``/``Infinity`` (not JSON), or nested deeper than `MAX_JSON_DEPTH`."""
    name = _rel(root, path) if root else str(path)
    if not path.exists():
        raise WorkspaceError(f"{name}: missing (expected a file at {path})")
    try:
        value = strict_json(read_settings_text(path), parse_constant=_no_constant)
    except OSError as exc:  # a FIFO, a device, a directory: named, never read
        raise WorkspaceError(f"{name}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise WorkspaceError(f"{name}: {not_utf8(exc)}") from None
    except json.JSONDecodeError as exc:
        raise WorkspaceError(f"{name}: malformed JSON at line {exc.lineno} column "
                             f"{exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise WorkspaceError(f"{name}: nested too deeply (more than {MAX_JSON_DEPTH} levels); "
                             f"not a file vtrm_gate wrote") from None
    except ValueError as exc:  # NaN / Infinity
        raise WorkspaceError(f"{name}: {exc} (NaN and Infinity are not allowed)") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise WorkspaceError(f"{name}: nested too deeply (more than {MAX_JSON_DEPTH} levels); "
                             f"not a file vtrm_gate wrote")
    return value


def read_text(path: Path, root: Path | None = None) -> str:
    """A skill file's text, or WorkspaceError naming it (missing, not UTF-8, empty)."""
    name = _rel(root, path) if root else str(path)
    if not path.is_file():
        raise WorkspaceError(f"{name}: missing skill file")
    try:
        text = path.read_text(encoding=USER_TEXT)
    except UnicodeDecodeError as exc:
        raise WorkspaceError(f"{name}: {not_utf8(exc)}") from None
    if not text.strip():
        raise WorkspaceError(f"{name}: empty skill file")
    return text


def join_notes(*notes: str | None) -> str | None:
    """Report notes joined with "; " (None when there is none)."""
    kept = [n for n in notes if n]
    return "; ".join(kept) if kept else None


SQLITE_INT_MAX = 2**63 - 1


def _whole(x: object) -> bool:
    """An integer (not a bool) that an SQLite INTEGER column can hold."""
    return is_whole(x) and -SQLITE_INT_MAX - 1 <= x \
        <= SQLITE_INT_MAX



