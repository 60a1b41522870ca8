"""Plain-text tables that fit the terminal: ``COLUMNS`` wide (100 when not a terminal),
dropping the least needed columns first, then shortening type names to unique
abbreviations, and never losing a row's reason (``applied`` / ``note``): it goes on its own
wrapped line under the row. Light at import (stdlib only)."""

from __future__ import annotations

import functools
import os
import re
import shutil
import sys
import textwrap
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

DEFAULT_WIDTH = 100
MIN_WIDTH = 40


def terminal_width(stream: object = None) -> int:
    """``COLUMNS`` when set (a whole number; at least 40), else the terminal's width, else
    100 (not a terminal)."""
    raw = os.environ.get("COLUMNS", "").strip()
    if raw.isdecimal() and int(raw) > 0:  # "²" is isdigit() but not int()
        return max(int(raw), MIN_WIDTH)
    out = stream or sys.stdout
    if hasattr(out, "isatty") and out.isatty():
        return max(shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns, MIN_WIDTH)
    return DEFAULT_WIDTH


def text_width(text: str) -> int:
    """The terminal columns ``text`` fills: a wide or full-width character (CJK) two, a
    combining mark or zero-width format character none, any other one."""
    return sum(0 if unicodedata.combining(c) or unicodedata.category(c) == "Cf" else
               2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def pad(text: str, width: int, right: bool = False) -> str:
    """``text`` filled with spaces to ``width`` terminal columns (on the left if ``right``)."""
    fill = " " * max(width - text_width(text), 0)
    return fill + text if right else text + fill


def clip(text: str, width: int) -> str:
    """The longest start of ``text`` that fits in ``width`` terminal columns."""
    out, used = [], 0
    for c in text:
        used += text_width(c)
        if used > width:
            break
        out.append(c)
    return "".join(out)


def short_names(names: Iterable[str], max_len: int | None = None) -> dict[str, str]:
    """Unique abbreviations: each word cut to its first k letters, for the smallest k (>= 3)
    that keeps every name distinct (and, when possible, within ``max_len``)."""
    names = list(dict.fromkeys(names))
    longest = max((len(w) for n in names for w in n.split()), default=1)
    best: dict[str, str] | None = None
    for k in range(3, longest + 1):
        short = {n: " ".join(w[:k] for w in n.split()) or n for n in names}
        if len(set(short.values())) < len(names):
            continue
        best = best or short
        if max_len is None or max(map(text_width, short.values()), default=0) <= max_len:
            return short
    if best is not None:
        return best
    return {n: f"{clip(n, max(1, (max_len or 8) - 3))}#{i}" for i, n in enumerate(names, 1)}


@dataclass(frozen=True)
class Column:
    """One column: header, cells, right-aligned or not, its rank when space is short
    (0 = always kept; higher ranks are dropped first), whether its cells are names the
    user types (``whole``: a first column never abbreviated; the last one wraps instead),
    and whether a middle column of long text may wrap within its share of a table too wide
    (``wraps``: a long value, where the last column alone cannot make room)."""

    header: str
    cells: tuple[str, ...]
    right: bool = False
    drop_rank: int = 0
    whole: bool = False
    wraps: bool = False
    more: tuple[tuple[str, ...], ...] = ()
    """A wrapped column's further lines, per cell (the cells hold the first)."""

    @functools.cached_property
    def width(self) -> int:
        """The widest cell's width, measured once (every row's line asks it)."""
        return max([text_width(self.header), *(text_width(c) for c in self.cells),
                    *(text_width(t) for lines in self.more for t in lines)])

    def wrapped(self, width: int) -> Column:
        """This column's cells wrapped to ``width`` (a word wider is cut at the edge)."""
        lines = [fill(c, width, cut=True) or [""] for c in self.cells]
        return replace(self, header=textwrap.shorten(self.header, width, placeholder="…"),
                       cells=tuple(ls[0] for ls in lines),
                       more=tuple(tuple(ls[1:]) for ls in lines))

    def line(self, row: int, k: int) -> str:
        """Line ``k`` of the cell in ``row`` (0: the cell's first), or "" past its end."""
        if k == 0:
            return self.cells[row]
        more = self.more[row] if self.more else ()
        return more[k - 1] if k <= len(more) else ""

    def height(self, row: int) -> int:
        """The lines the cell in ``row`` takes."""
        return 1 + (len(self.more[row]) if self.more else 0)


def _fits(cols: Sequence[Column], width: int, gap: int) -> bool:
    return sum(c.width for c in cols) + gap * (len(cols) - 1) <= width


def _shrink_names(first: Column, cols: list[Column], width: int, gap: int) -> Column:
    """The name column with unique abbreviations short enough for the rest to fit."""
    rest = sum(c.width for c in cols[1:]) + gap * (len(cols) - 1)
    room = max(width - rest, 6)
    short = short_names(first.cells, room)
    return replace(first, header=clip(first.header, room),
                   cells=tuple(short[c] for c in first.cells))


def fit_columns(cols: Sequence[Column], width: int, gap: int = 2) -> list[Column]:
    """Drop the highest ``drop_rank`` columns until the table fits ``width``, then shorten
    the first (name) column to unique abbreviations, unless it is ``whole``."""
    kept = list(cols)
    while not _fits(kept, width, gap) and any(c.drop_rank for c in kept):
        worst = max(kept, key=lambda c: c.drop_rank)
        kept.remove(worst)
    if not _fits(kept, width, gap) and kept and not kept[0].whole:
        kept[0] = _shrink_names(kept[0], kept, width, gap)
    return kept


def render(cols: Sequence[Column], width: int, notes: Mapping[int, str] | None = None,
           gap: int = 2) -> str:
    """The table (header, rule, rows), each row followed by its note wrapped to ``width``."""
    fitted = fit_columns(cols, width, gap)
    if not _fits(fitted, width, gap) and gap > 1:  # very narrow: one space between columns
        gap = 1
        fitted = fit_columns(cols, width, gap)
    cols, tails = _wrap_last(_wrap_middle(fitted, width, gap), width, gap)
    sep = " " * gap

    def line(cells: Sequence[str]) -> str:
        return sep.join(pad(c, col.width, col.right)
                        for c, col in zip(cells, cols, strict=True)).rstrip()

    out = [line([c.header for c in cols]), line(["-" * c.width for c in cols])]
    n = len(cols[0].cells) if cols else 0
    for i in range(n):
        for k in range(max(c.height(i) for c in cols)):
            out.append(line([c.line(i, k) for c in cols]))
        out += tails.get(i, [])
        if notes and notes.get(i):
            out += _note(notes[i], width)
    return "\n".join(out)


def _note(text: str, width: int) -> list[str]:
    """A row's note under it: `textwrap`'s lines where each character is one column (long
    words and hyphenated ones broken, as ever), else filled by terminal columns."""
    if text_width(text) == len(text):
        return textwrap.wrap(text, width, initial_indent="    → ", subsequent_indent="      ")
    return fill(text, width, "      ", first="    → ", cut=True)


def _wrap_middle(cols: list[Column], width: int, gap: int) -> list[Column]:
    """When the fitted table is too wide, its widest ``wraps`` middle column wrapped to its
    share of the room left by the others: half, or what the last column does not need, and at
    least 16 columns (a short value, a word such as ``paired_betting``, is never cut)."""
    middle = [i for i, c in enumerate(cols[1:-1], 1) if c.wraps and not c.right]
    if _fits(cols, width, gap) or not middle:
        return cols
    i = max(middle, key=lambda j: cols[j].width)
    last = cols[-1]
    others = sum(c.width for j, c in enumerate(cols[:-1]) if j != i)
    room = width - others - gap * (len(cols) - 1)
    need = last.width if last.right else min(last.width, max(12, room // 2))
    share = max(16, room - need)
    if cols[i].width <= share:
        return cols
    return [*cols[:i], cols[i].wrapped(share), *cols[i + 1:]]


def _wrap_last(cols: list[Column], width: int, gap: int
               ) -> tuple[list[Column], dict[int, list[str]]]:
    """When the fitted table is still too wide and its last column is text (left-aligned),
    that column wrapped into the room left. With less than 12 columns of room it goes
    under its row instead, indented 4 (the rows' notes: the tails returned)."""
    if _fits(cols, width, gap) or not cols or cols[-1].right:
        return cols, {}
    last = cols[-1]
    start = sum(c.width for c in cols[:-1]) + gap * (len(cols) - 1)
    if width - start < 12:
        if len(cols) < 2:
            return cols, {}
        return cols[:-1], {i: fill(c, width, " " * 4, first=" " * 4, cut=True)
                           for i, c in enumerate(last.cells) if c}
    return [*cols[:-1], last.wrapped(width - start)], {}


def wrap(text: str, width: int, indent: str = "  ") -> str:
    """``text`` wrapped to ``width`` terminal columns (a CJK character is two), continuation
    lines indented; each line of ``text`` wrapped on its own."""
    return "\n".join("\n".join(fill(p, width, indent)) for p in text.split("\n"))


_SPACES = re.compile(r"([\t\n\x0b\x0c\r ]+)")
_TO_SPACE = {ord(c): " " for c in "\t\n\x0b\x0c\r"}


def fill(text: str, width: int, indent: str = "", first: str = "", cut: bool = False
         ) -> list[str]:
    """``text``'s lines within ``width`` terminal columns, the first led by ``first``, the
    others by ``indent``: `textwrap`'s greedy fill (whitespace dropped at the breaks) with
    widths measured as a terminal shows them. A word wider than a line is kept whole on a
    line of its own (paths and flags stay whole, as a user copies them), or with ``cut`` (a
    table cell) cut where it reaches the edge, its runs of whitespace one space."""
    text = " ".join(text.split()) if cut else text.expandtabs().translate(_TO_SPACE)
    chunks = [c for c in _SPACES.split(text) if c][::-1]
    lines: list[str] = []
    while chunks:
        lead = indent if lines else first
        room = width - text_width(lead)
        if lines and chunks[-1].isspace():
            chunks.pop()
        line: list[str] = []
        used = 0
        while chunks and used + text_width(chunks[-1]) <= room:
            used += text_width(chunks[-1])
            line.append(chunks.pop())
        if chunks and not line and text_width(chunks[-1]) > room:
            word = chunks.pop()
            head = (clip(word, room) or word[0]) if cut else word
            line.append(head)
            if head != word:
                chunks.append(word[len(head):])
        if line and line[-1].isspace():
            line.pop()
        if line:
            lines.append(lead + "".join(line))
    return lines
