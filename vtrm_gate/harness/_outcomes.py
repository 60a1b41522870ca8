"""Ladder outcomes as a table (docs/worlds.md): read a CSV / Parquet / JSONL file of them
(validated: a bad row names file, row and column), write a workspace's in the same schema,
and replay every gate of a table the prefix (v3) and the block (old) way.

One row per ladder unit of a gate; a gate is one (epoch, step, task_type). Columns:
``epoch, step, task_type, unit_id, ladder_rank, base_correct, cand_correct, infra``, and
optionally ``latency_s, tokens, block_idx, n_ladder`` (``n_ladder``: the ladder's length
when the table holds only the measured prefix of a longer ladder, as a workspace's does).
"""

from __future__ import annotations

import codecs
import io
import itertools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._env import user_path
from .._ids import slugify
from ..errors import InputError, shown
from ..stats import (
    ACTION_CODES,
    BatchOutcome,
    GateParams,
    as_params,
    check_block,
    replay_blocks_batch,
    replay_prefix_batch,
)
from ._access import for_reading
from ._files import temp_sibling
from ._manifest import recorded_manifests
from ._replay import _columns, _replay_columns, _replay_known, ladder_units
from ._status import StepStatus
from ._workspace import Workspace

if TYPE_CHECKING:
    import polars as pl

GATE_KEY: tuple[str, ...] = ("epoch", "step", "task_type")
OUTCOME_COLUMNS: tuple[str, ...] = ("epoch", "step", "task_type", "unit_id", "ladder_rank",
                                    "base_correct", "cand_correct", "infra")
OPTIONAL_COLUMNS: tuple[str, ...] = ("latency_s", "tokens", "block_idx", "n_ladder")
_SCHEMA = (*OUTCOME_COLUMNS, *OPTIONAL_COLUMNS)  # every column a table may name
MAX_OUTCOME_ROWS = 2_000_000
"""Rows one outcomes file may hold (50,000 gates of 40 units); more is refused, read lazily
so a larger file costs no more than this many rows."""
FORMATS = {".csv": "csv", ".parquet": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}
_TRUE, _FALSE = ("1", "true"), ("0", "false")
_INTS = ("epoch", "step", "ladder_rank", "tokens", "block_idx", "n_ladder")
_DIGITS = 18
"""Counts are read up to this many digits (int64; a step numbered by Unix time has 10)."""
_LARGEST = "9" * _DIGITS


class OutcomesError(InputError):
    """An outcomes table is malformed; the message names the file, the row and the column."""


def _format(path: Path) -> str:
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise OutcomesError(f"{path}: unknown outcomes format {path.suffix!r}; use one of "
                            f"{sorted(FORMATS)}")
    return fmt


def _scan(path: Path) -> pl.DataFrame:
    """At most ``MAX_OUTCOME_ROWS + 1`` rows of the file, every column as text."""
    import polars as pl

    fmt = _format(path)
    if not path.is_file():
        raise OutcomesError(f"{path}: no such outcomes file")
    if fmt != "parquet":
        with path.open("rb") as f:
            if f.read(2) in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):  # polars reads noise
                raise OutcomesError(f"{path}: UTF-16 (save it as UTF-8: Excel's \"CSV UTF-8\")")
    _no_column_twice(path, fmt)
    try:
        if fmt == "csv":
            lazy = pl.scan_csv(path, infer_schema=False)
        elif fmt == "parquet":
            lazy = pl.scan_parquet(path)
        else:
            lazy = pl.scan_ndjson(_ndjson_source(path), infer_schema_length=10_000)
        df = lazy.head(MAX_OUTCOME_ROWS + 1).collect()
        nested = [(c, t) for c, t in df.schema.items()  # an extra column may hold anything
                  if c in _SCHEMA and (t.is_nested() or t == pl.Object)]
        if not nested:
            return _without_blank_tail(df.select(pl.all().cast(pl.String).name.map(str.strip)))
    except (pl.exceptions.PolarsError, OSError, ValueError) as exc:
        if fmt == "csv":
            _ragged_row(path)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if "invalid utf-8" in first.lower():  # a spreadsheet's locale encoding (cp1252...)
            first = ("not UTF-8 (save it as UTF-8: Excel's \"CSV UTF-8\"; polars says: "
                     f"{first})")
        raise OutcomesError(f"{path}: cannot read as {fmt.upper()}: {first}") from None
    c, t = nested[0]  # cast to text, {"a": 1} became the type "{1}"
    raise OutcomesError(f"{path}: column {c!r} holds {t} values (objects or lists); every "
                        f"outcomes column is a text, number or true/false value")


def _ndjson_source(path: Path) -> Path | io.BytesIO:
    """What polars reads of a JSON-lines file: the file, or, when it opens with a byte order
    mark (which polars' JSON reader refuses, its CSV reader skips), its first
    ``MAX_OUTCOME_ROWS + 1`` non-blank lines after the mark."""
    with path.open("rb") as f:
        if f.read(len(codecs.BOM_UTF8)) != codecs.BOM_UTF8:
            return path
        rows = (line for line in f if line.strip())
        return io.BytesIO(b"".join(itertools.islice(rows, MAX_OUTCOME_ROWS + 1)))


def _without_blank_tail(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` without the rows after its last one holding any text: blank lines an editor
    (or ``echo >>``) left at the end of a file are no rows. One between rows is still a row,
    named by the check that finds it empty."""
    import polars as pl

    if not df.width:
        return df
    filled = df.select(pl.any_horizontal(pl.all().str.strip_chars().fill_null("") != ""))
    rows = filled.to_series().arg_true()
    return df.head(int(rows[-1]) + 1 if rows.len() else 0)


def _no_column_twice(path: Path, fmt: str) -> None:
    """Refuse a schema column named twice (a CSV header, or one JSONL object's keys): which
    of the two holds, say, the candidate's outcome cannot be guessed, and the readers differ
    (polars keeps the first, Python's json the last)."""
    if fmt == "csv":
        _csv_column_twice(path)
    elif fmt == "jsonl":
        _jsonl_key_twice(path)


def _csv_column_twice(path: Path) -> None:
    import csv

    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            header = next(csv.reader(f), [])
    except (UnicodeDecodeError, csv.Error, OSError):
        return  # the reader names what is wrong with such a file
    for c in _SCHEMA:
        at = [i + 1 for i, name in enumerate(header) if name.strip() == c]
        if len(at) > 1:
            raise OutcomesError(f"{path}: column {c!r} twice in the header (fields {at[0]} "
                                f"and {at[1]}): which one is meant cannot be guessed")


def _jsonl_key_twice(path: Path) -> None:
    """Find rows whose text names a schema key twice (vectorised), then confirm on each with
    a real parse: a nested object of an extra column may reuse a name."""
    import polars as pl

    try:
        lines = (pl.scan_csv(path, has_header=False, separator="\x00", quote_char=None,
                             new_columns=["line"], infer_schema=False)
                 .filter(pl.col("line").str.strip_chars() != "")
                 .head(MAX_OUTCOME_ROWS + 1).collect())
    except (pl.exceptions.PolarsError, OSError, ValueError):
        return  # the reader names what is wrong with such a file
    suspects = lines.select(
        pl.int_range(pl.len()).alias("_i"), pl.col("line"),
        pl.any_horizontal([pl.col("line").str.count_matches(f'"{c}"\\s*:') > 1
                           for c in _SCHEMA]).alias("_twice")).filter(pl.col("_twice"))
    for i, line in suspects.select("_i", "line").iter_rows():
        keys = _top_level_keys(line)
        for c in _SCHEMA:
            if keys.count(c) > 1:
                raise OutcomesError(f"{path}: row {i + 1}, column {c!r}: the key twice in "
                                    f"one object: which one is meant cannot be guessed")


def _top_level_keys(line: str) -> list[str]:
    """The keys of a JSON object's own pairs, repeats kept ([] if the line is not one)."""
    import json

    pairs: list[list[str]] = []  # one list per object parsed: the outermost comes last

    def keep(kv: list[tuple[str, Any]]) -> dict[str, Any]:
        pairs.append([k for k, _ in kv])
        return dict(kv)

    try:
        top = json.loads(line, object_pairs_hook=keep)
    except ValueError:
        return []  # the reader names the row that is not JSON
    return pairs[-1] if isinstance(top, dict) and pairs else []


def _ragged_row(path: Path) -> None:
    """Name the first CSV row whose field count differs from the header's, if there is one."""
    import csv

    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            width = len(next(reader, []))
            for i, fields in enumerate(reader, start=1):
                if len(fields) != width and fields:
                    raise OutcomesError(f"{path}: row {i}, all columns: {len(fields)} "
                                        f"fields, the header has {width}")
                if i > MAX_OUTCOME_ROWS:
                    return
    except (UnicodeDecodeError, csv.Error):
        return


Check = tuple["pl.Expr", str, str]
"""A cell check: the expression true where a row is good, its column, what it requires."""


def _bad(path: str | Path, df: pl.DataFrame, checks: Sequence[Check]) -> None:
    """Raise naming the first failed check, in order, at its first row (1-based). All are
    evaluated in one pass; a row is located only for a check that failed."""
    import polars as pl

    failed = _first_failed(df, checks)
    if failed is not None:
        ok, column, what = failed
        hit = df.select(pl.int_range(pl.len()).alias("_i"), pl.col(column).alias("_v"),
                        ok.fill_null(False).alias("_ok")).filter(~pl.col("_ok")).head(1)
        row, value = hit.row(0)[:2]
        raise OutcomesError(f"{path}: row {row + 1}, column {column!r}: {what}, got "
                            f"{'empty' if value in (None, '') else repr(value)}")


def _first_failed(df: pl.DataFrame, checks: Sequence[Check]) -> Check | None:
    """The first of ``checks`` (in order) that some row of ``df`` fails; all evaluated in one
    pass, so a good table costs one scan however many checks it has."""
    if not checks:
        return None
    passed = df.select(ok.fill_null(False).all().alias(f"_{i}")
                       for i, (ok, _, _) in enumerate(checks)).row(0)
    return next((c for c, good in zip(checks, passed, strict=True) if not good), None)


_OTHER_SEPARATORS = (";", "\t", "|")
"""What a spreadsheet may have separated a CSV's fields with instead of commas."""


def _check_header(path: str | Path, raw: pl.DataFrame) -> None:
    """The columns a table names (and its size): an outcomes table, not another one."""
    missing = [c for c in OUTCOME_COLUMNS if c not in raw.columns]
    seps = [c for c in _OTHER_SEPARATORS if raw.width == 1 and c in raw.columns[0]]
    if missing and seps:
        raise OutcomesError(f"{path}: the header reads as one column, separated by "
                            f"{seps[0]!r}: an outcomes CSV is comma-separated (save it "
                            f"again with ',' as the separator)")
    if missing:
        raise OutcomesError(f"{path}: missing column {missing[0]!r}; an outcomes table has "
                            f"{list(OUTCOME_COLUMNS)}")
    if "n_remaining" in raw.columns and "n_ladder" not in raw.columns:
        suffix = Path(str(path)).suffix or ".parquet"
        raise OutcomesError(
            f"{path}: a gate_evidence table (it has n_remaining, no n_ladder): it holds each "
            f"gate's consumed prefix only, so every gate would read as a complete ladder; "
            f"read outcomes{suffix}, which export writes beside it (or "
            f"vtrm_gate.write_outcomes(workspace, path))")
    if raw.height > MAX_OUTCOME_ROWS:
        raise OutcomesError(f"{path}: row {MAX_OUTCOME_ROWS + 1}: more than "
                            f"{MAX_OUTCOME_ROWS:,} rows (split the file)")
    if raw.height == 0:
        raise OutcomesError(f"{path}: no rows")


def _typed(path: str | Path, raw: pl.DataFrame) -> pl.DataFrame:
    """Check every cell and convert the columns to their types."""
    import polars as pl

    _check_header(path, raw)
    df = raw.select([c for c in _SCHEMA if c in raw.columns])
    txt = {c: pl.col(c).str.strip_chars() for c in df.columns}
    for c in (*_INTS, "base_correct", "cand_correct", "infra"):
        if c in txt:  # pandas writes an integer column with a missing value as floats: 1.0
            txt[c] = txt[c].str.replace(rf"^(\d{{1,{_DIGITS}}})\.0+$", "${1}")
    low = {c: e.str.to_lowercase() for c, e in txt.items()}
    empty = {c: e.is_null() | (e == "") for c, e in txt.items()}
    checks: list[Check] = [(~empty[c], c, "must not be empty") for c in ("task_type", "unit_id")]
    checks.append((low["infra"].is_in([*_TRUE, *_FALSE]), "infra", "must be 0/1 or true/false"))
    infra = low["infra"].is_in(_TRUE)
    checks += [(low[c].is_in([*_TRUE, *_FALSE]) | (infra & empty[c]), c,
                "must be 0/1 or true/false (empty only on an INFRA row)")
               for c in ("base_correct", "cand_correct")]
    for c in _INTS:
        if c in df.columns:
            whole = txt[c].str.contains(rf"^\d{{1,{_DIGITS}}}$")
            checks.append((whole, c, f"must be a whole number from 0 to {_LARGEST}")
                          if c in OUTCOME_COLUMNS else
                          (whole | empty[c], c,
                           f"must be a whole number from 0 to {_LARGEST} or empty"))
    if "latency_s" in df.columns:
        secs = txt["latency_s"].cast(pl.Float64, strict=False)
        checks.append((empty["latency_s"] | (secs.is_finite() & (secs >= 0)), "latency_s",
                       "must be a number >= 0 or empty"))
    _bad(path, df, checks)
    bool_of = {c: pl.when(empty[c]).then(None).otherwise(low[c].is_in(_TRUE)).alias(c)
               for c in ("base_correct", "cand_correct")}
    return df.with_columns(
        *[txt[c].cast(pl.Int64, strict=False).alias(c) for c in _INTS if c in df.columns],
        txt["task_type"].alias("task_type"), txt["unit_id"].alias("unit_id"),
        infra.alias("infra"), *bool_of.values(),
        *([txt["latency_s"].cast(pl.Float64, strict=False).alias("latency_s")]
          if "latency_s" in df.columns else []),
    ).with_columns(  # an INFRA row's outcomes mean nothing: drop them
        *[pl.when(pl.col("infra")).then(None).otherwise(pl.col(c)).alias(c)
          for c in ("base_correct", "cand_correct")])


def _slug_or_problem(task_type: str) -> tuple[str, str | None]:
    """The type's slug, or "" and why no file can carry its name."""
    try:
        return slugify(task_type), None
    except InputError as exc:
        return "", str(exc).removeprefix(f"task type {shown(task_type)} ")


def _check_gates(path: str | Path, df: pl.DataFrame, params: GateParams,
                 task_types: Sequence[str] | None) -> pl.DataFrame:
    """Types known, ranks 0..n-1 once each per gate, units once each, within n_max."""
    import polars as pl

    df = df.with_row_index("_row")
    types = df["task_type"].unique(maintain_order=True).to_list()
    by_slug: dict[str, str] = {}
    for t in types:
        s, why = _slug_or_problem(t)
        why = (why if not s else
               f"is not one of {list(task_types)}" if task_types is not None
               and t not in task_types else
               f"has the slug of {by_slug[s]!r} (one type, two spellings)" if s in by_slug
               else None)
        if why:
            _bad(path, df, [(pl.col("task_type") != t, "task_type",
                             f"unknown type: {t!r} {why}")])
        by_slug[s] = t
    df = df.sort([*GATE_KEY, "ladder_rank", "_row"])
    gate = list(GATE_KEY)
    pos = pl.int_range(pl.len()).over(gate)
    checks = [
        (pl.col("ladder_rank") >= pos, "ladder_rank", "duplicate rank in its gate"),
        (pl.col("ladder_rank").min().over(gate) == 0, "ladder_rank",
         "its gate has no rank 0: ladder_rank is 0-based (a log that counts from 1 needs 1 "
         "subtracted)"),
        (pl.col("ladder_rank") <= pos, "ladder_rank",
         "gap in its gate's ranks (each gate's ranks are 0, 1, 2, ... with none missing)"),
        (pl.col("ladder_rank") < params.n_max, "ladder_rank",
         f"beyond the ladder cap GateParams.n_max = {params.n_max}"),
        (pl.int_range(pl.len()).over([*gate, "unit_id"]) == 0, "unit_id",
         "unit twice in its gate"),
    ]
    if "n_ladder" in df.columns:
        most = pl.col("n_ladder").mode().sort().first().over(gate)  # the odd row is named
        checks += [(pl.col("n_ladder").eq_missing(most), "n_ladder",
                    "differs from most rows of its gate (every row of a gate holds the same "
                    "n_ladder)"),
                   (pl.col("n_ladder").is_null() | (pl.col("n_ladder") >= pl.len().over(gate))
                    & (pl.col("n_ladder") <= params.n_max), "n_ladder",
                    f"must cover the gate's rows and be <= n_max = {params.n_max}")]
    failed = _first_failed(df, checks)
    if failed is not None:
        ok, column, what = failed
        bad = df.with_columns(ok.alias("_ok")).filter(~pl.col("_ok").fill_null(False))
        row = bad.sort("_row").row(0, named=True)
        raise OutcomesError(f"{path}: row {row['_row'] + 1}, column {column!r}: {what} "
                            f"(gate e{row['epoch']} s{row['step']} {row['task_type']!r}), "
                            f"got {row[column]!r}")
    return df.drop("_row")


def read_outcomes(path: str | Path, *, task_types: Sequence[str] | None = None,
                  params: GateParams | None = None) -> pl.DataFrame:
    """An outcomes table (CSV, Parquet or JSONL by extension) as a polars frame in gate and
    ladder order, validated: a bad cell, a missing column, a duplicate or missing rank, an
    unknown type (``task_types`` given, or a name without letters) raise `OutcomesError`
    naming file, row (1-based, data rows) and column."""
    p = user_path(path)
    return _check_gates(p, _typed(p, _scan(p)), as_params(params), task_types)


FRAME = "outcomes frame (rows from 1)"
"""How messages name a frame handed to `check_outcomes` (a file is named by its path)."""


def check_outcomes(frame: pl.DataFrame, *, task_types: Sequence[str] | None = None,
                   params: GateParams | None = None) -> pl.DataFrame:
    """An outcomes frame (a notebook's, in any row order) as `read_outcomes` returns a file:
    each cell read as a file's is (True/False, 1/0, "true"/"false"; a fraction or other text
    refused), the same checks, the schema's columns in gate and ladder order. A replay must
    follow ``ladder_rank``, never the frame's row order."""
    import polars as pl

    if not isinstance(frame, pl.DataFrame):
        raise OutcomesError(f"{FRAME}: expected a polars DataFrame, got "
                            f"{type(frame).__name__}")
    try:
        text = frame.select(pl.col(c).cast(pl.String) for c in _SCHEMA if c in frame.columns)
    except pl.exceptions.PolarsError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise OutcomesError(f"{FRAME}: a column cannot be read as text: {first}") from None
    return _check_gates(FRAME, _typed(FRAME, text), as_params(params), task_types)


def as_outcomes(source: pl.DataFrame | str | Path, *, task_types: Sequence[str] | None = None,
                params: GateParams | None = None) -> pl.DataFrame:
    """An outcomes frame or file, checked (`check_outcomes` / `read_outcomes`)."""
    import polars as pl

    if isinstance(source, pl.DataFrame):
        return check_outcomes(source, task_types=task_types, params=params)
    return read_outcomes(source, task_types=task_types, params=params)


def workspace_outcomes(workspace: Workspace | str | Path) -> pl.DataFrame:
    """A workspace's recorded gates in the outcomes schema: each gated type's ladder from
    rank 0 up to its first unit without a known outcome, with ``n_ladder`` (so a replay needs
    no unrun unit without saying so) and ``tokens`` (both arms)."""
    import polars as pl

    ws = for_reading(workspace)
    try:
        rows: list[dict[str, Any]] = []
        for m in recorded_manifests(ws):
            for t, c in sorted(m["candidates"].items()):
                if c.get("status") != StepStatus.GATED:
                    continue
                ladder = m["inputs"]["ladders"][t]
                for rank, u in enumerate(ladder_units(ws, m["step_run_id"], t, ladder)):
                    if not u.known:
                        break
                    rows.append({"epoch": m["epoch"], "step": m["step"], "task_type": t,
                                 "unit_id": u.unit_id, "ladder_rank": rank,
                                 "base_correct": u.pair and u.pair[0],
                                 "cand_correct": u.pair and u.pair[1], "infra": u.infra,
                                 "tokens": u.tokens, "n_ladder": len(ladder)})
    finally:
        if ws is not workspace:
            ws.close()
    schema = {"epoch": pl.Int64, "step": pl.Int64, "task_type": pl.String,
              "unit_id": pl.String, "ladder_rank": pl.Int64, "base_correct": pl.Boolean,
              "cand_correct": pl.Boolean, "infra": pl.Boolean, "tokens": pl.Int64,
              "n_ladder": pl.Int64}
    return pl.DataFrame(rows, schema=schema)


def write_outcomes(outcomes: pl.DataFrame | Workspace | str | Path, path: str | Path) -> Path:
    """Write an outcomes frame (or a workspace's, `workspace_outcomes`) to ``path``, its
    format chosen by the extension (.csv, .parquet, .jsonl); booleans as true/false."""
    import polars as pl

    out = user_path(path)
    fmt = _format(out)
    df = (check_outcomes(outcomes) if isinstance(outcomes, pl.DataFrame)
          else workspace_outcomes(outcomes))
    if df.height == 0:  # a header alone is a table no reader takes
        name = outcomes.root if isinstance(outcomes, Workspace) else outcomes
        raise OutcomesError(f"{name}: no gated step to write (nothing was gated yet); "
                            f"{out.name} is left as it was")
    tmp = temp_sibling(out)
    write: dict[str, Callable[[Path], object]] = {
        "csv": df.write_csv, "parquet": df.write_parquet, "jsonl": df.write_ndjson}
    write[fmt](tmp)
    tmp.replace(out)
    return out


def replay_outcomes(outcomes: pl.DataFrame | str | Path, *, block: int = 8,
                    params: GateParams | None = None) -> pl.DataFrame:
    """Prefix (v3) and block (old gate) replay of every gate of an outcomes table (a frame in
    any row order, or a file: `as_outcomes`), one row per (epoch, step, task_type): exactly
    `replay_prefix` / `replay_blocks` of its rows in ladder order (``n_ladder`` beyond the
    rows: ``UNKNOWN (needs k unrun units)`` where an unrun unit would be needed), and
    ``units_saved``, block units minus prefix units.

    Complete gates replay together, one batch per ladder length (`replay_prefix_batch`,
    equal to the scalar replay field for field), so a 50,000-gate log takes about a second.
    """
    check_block(block)  # before reading a file of 2,000,000 rows
    params = as_params(params)
    return replay_checked(as_outcomes(outcomes, params=params), block, params)


def replay_checked(df: pl.DataFrame, block: int, params: GateParams) -> pl.DataFrame:
    """`replay_outcomes` of a frame `check_outcomes` or `read_outcomes` returned under the
    same ``params``, not checked again (the check is most of a large table's replay time)."""
    import polars as pl

    gates = df.group_by(list(GATE_KEY), maintain_order=True).agg(
        pl.len().alias("n_rows"),
        (pl.col("n_ladder").first() if "n_ladder" in df.columns else pl.lit(None)
         ).fill_null(pl.len()).alias("n"),
        *[pl.col(c).fill_null(False) for c in ("base_correct", "cand_correct")],
        pl.col("infra"),
        (pl.col("tokens").fill_null(0) if "tokens" in df.columns
         else pl.lit(0).repeat_by(pl.len()).explode()).alias("tokens"))
    rows: list[dict[str, Any]] = [{}] * gates.height
    complete, partial = _by_length(gates)
    for n, idx in complete.items():
        for i, row in zip(idx, _replay_complete(gates[idx], n, params, block), strict=True):
            rows[i] = row
    for i in partial:  # only these are read row by row
        rows[i] = _replay_partial(gates.row(i, named=True), params, block)
    return pl.DataFrame([{"epoch": g[0], "step": g[1], "task_type": g[2], **r} for g, r in
                         zip(gates.select(GATE_KEY).iter_rows(), rows, strict=True)],
                        infer_schema_length=None)


def _by_length(gates: pl.DataFrame) -> tuple[dict[int, list[int]], list[int]]:
    """Row indexes of the complete gates (a row for every ladder unit) by ladder length, and
    of the others (fewer rows than ``n_ladder``)."""
    complete: dict[int, list[int]] = {}
    partial: list[int] = []
    for i, (n_rows, n) in enumerate(gates.select("n_rows", "n").iter_rows()):
        if n_rows == n:
            complete.setdefault(n, []).append(i)
        else:
            partial.append(i)
    return complete, partial


def _replay_complete(gates: pl.DataFrame, n: int, params: GateParams,
                     block: int) -> list[dict[str, Any]]:
    """The replay rows of complete gates of one ladder length ``n``, in the frame's order."""
    arrays = {c: gates[c].list.to_array(n).to_numpy()
              for c in ("base_correct", "cand_correct", "infra", "tokens")}
    spent = np.concatenate([np.zeros((gates.height, 1), np.int64),
                            np.cumsum(arrays["tokens"], axis=1)], axis=1)
    arms = (arrays["base_correct"], arrays["cand_correct"])
    prefix = replay_prefix_batch(*arms, params, infra=arrays["infra"])
    blocks = replay_blocks_batch(*arms, params, block, infra=arrays["infra"])
    out = []
    cols = [_batch_columns(name, o, spent) for name, o in (("prefix", prefix), ("block", blocks))]
    for r in range(gates.height):
        p, b = cols[0][r], cols[1][r]
        out.append({"n_ladder": n, "n_rows": n, **p, **b, "block_unrun_needed": 0,
                    "units_saved": b["block_units"] - p["prefix_units"]})
    return out


def _batch_columns(name: str, o: BatchOutcome, spent: np.ndarray) -> list[dict[str, Any]]:
    """One batch replay's columns per gate (`_columns`, as a scalar replay's)."""
    units = np.where(o.stop_rank < 0, 0, o.stop_rank + 1)
    tokens = spent[np.arange(len(units)), units].tolist()
    return [_columns(name, {"action": str(ACTION_CODES[a]), "stop_rank": None if s < 0 else s,
                            "W": w, "L": l, "n_used": u, "e_plus": e, "units": k}, t)
            for a, s, w, l, u, e, k, t in zip(
                o.action.tolist(), o.stop_rank.tolist(), o.W.tolist(), o.L.tolist(),
                o.n_used.tolist(), o.e_plus.tolist(), units.tolist(), tokens, strict=True)]


def _replay_partial(g: Mapping[str, Any], params: GateParams, block: int) -> dict[str, Any]:
    """The replay row of a gate with fewer rows than ``n_ladder``: unit by unit, UNKNOWN
    where an unrun unit would be needed."""
    n, n_rows = g["n"], g["n_rows"]
    pairs: list[tuple[bool, bool] | None] = [
        None if i else (b, c) for b, c, i in
        zip(g["base_correct"], g["cand_correct"], g["infra"], strict=True)]
    pairs += [None] * (n - n_rows)
    known = [True] * n_rows + [False] * (n - n_rows)
    tokens = g["tokens"] + [0] * (n - n_rows)
    prefix = _replay_known(pairs, known, params, None)
    blocks = _replay_known(pairs, known, params, block)
    saved = (None if prefix["units"] is None or blocks["units"] is None
             else blocks["units"] - prefix["units"])
    return {"n_ladder": n, "n_rows": n_rows, **_replay_columns("prefix", prefix, tokens),
            **_replay_columns("block", blocks, tokens),
            "block_unrun_needed": blocks["needs"], "units_saved": saved}
