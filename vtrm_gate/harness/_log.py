"""HarnessLog (SPEC §4): one SQLite file, WAL, one connection guarded by one lock.

Every table has a unique key and every write is an upsert, so a result written twice (a late
result, a re-run after a crash) lands once. `clear_step` makes a step re-runnable: it deletes,
in one transaction, the step's gate rows and every prediction/trace whose run id starts with
the *literal* prefix ``{step_run_id}_gate_`` (``_`` and ``%`` are not wildcards here).

Writes are short and synchronous; the gate awaits them inline (``ResultSink`` contract), so a
threading lock is enough and the event loop never interleaves two transactions.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .._ids import EVAL_STEP, as_unicode, gate_prefix
from ..errors import WorkspaceError, shown
from ..gate import PrefixAdvanced, TypeCounters, UnitResult, UnitTask
from ..stats import TypeOutcome
from ._status import StepStatus

if TYPE_CHECKING:
    import polars as pl

# table -> (columns with declared types, primary key). Declared types drive the polars schema.
SCHEMA: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]] = {
    "predictions": ((
        ("run_id", "TEXT"), ("unit_id", "TEXT"), ("task_type", "TEXT"), ("arm", "TEXT"),
        ("epoch", "INTEGER"), ("step", "INTEGER"), ("ladder_rank", "INTEGER"),
        ("skill_hash", "TEXT"), ("prediction", "TEXT"), ("correct", "INTEGER"),
        ("infra", "INTEGER"), ("cached", "INTEGER"), ("discarded", "INTEGER"),
        ("latency_s", "REAL"), ("tokens", "INTEGER"), ("error", "TEXT"),
    ), ("run_id", "unit_id")),
    "traces": ((
        ("run_id", "TEXT"), ("unit_id", "TEXT"), ("task_type", "TEXT"), ("arm", "TEXT"),
        ("epoch", "INTEGER"), ("step", "INTEGER"), ("trace", "TEXT"),
    ), ("run_id", "unit_id")),
    "gate_evidence": ((
        ("epoch", "INTEGER"), ("step", "INTEGER"), ("task_type", "TEXT"),
        ("ladder_rank", "INTEGER"), ("unit_id", "TEXT"), ("base_correct", "INTEGER"),
        ("cand_correct", "INTEGER"), ("infra", "INTEGER"), ("d", "INTEGER"), ("W", "INTEGER"),
        ("L", "INTEGER"), ("n_used", "INTEGER"), ("e_plus", "REAL"), ("e_minus", "REAL"),
        ("n_remaining", "INTEGER"), ("action", "TEXT"),
    ), ("epoch", "step", "task_type", "ladder_rank")),
    "quadrant_pairs": ((
        ("epoch", "INTEGER"), ("step", "INTEGER"), ("task_type", "TEXT"),
        ("ladder_rank", "INTEGER"), ("unit_id", "TEXT"), ("base_correct", "INTEGER"),
        ("cand_correct", "INTEGER"), ("quadrant", "TEXT"),
    ), ("epoch", "step", "task_type", "ladder_rank")),
    "step_report": ((
        ("epoch", "INTEGER"), ("step", "INTEGER"), ("task_type", "TEXT"), ("status", "TEXT"),
        ("action", "TEXT"), ("W", "INTEGER"), ("L", "INTEGER"), ("n_used", "INTEGER"),
        ("e_plus", "REAL"), ("e_minus", "REAL"), ("stop_rank", "INTEGER"),
        ("n_consumed", "INTEGER"), ("n_ladder", "INTEGER"), ("started", "INTEGER"),
        ("completed", "INTEGER"), ("cache_hits", "INTEGER"),
        ("cancelled_before_start", "INTEGER"), ("cancelled_in_flight", "INTEGER"),
        ("discarded_after_freeze", "INTEGER"), ("discarded_after_infra", "INTEGER"),
        ("infra_units", "INTEGER"), ("infra_calls", "INTEGER"), ("tokens", "INTEGER"),
        ("base_version", "INTEGER"), ("base_hash", "TEXT"), ("cand_hash", "TEXT"),
        ("applied", "TEXT"), ("note", "TEXT"), ("llm_cache", "TEXT"),
    ), ("epoch", "step", "task_type")),
    "candidate_correctness": ((
        ("epoch", "INTEGER"), ("step", "INTEGER"), ("task_type", "TEXT"), ("unit_id", "TEXT"),
        ("cand_hash", "TEXT"), ("ladder_rank", "INTEGER"), ("correct", "INTEGER"),
        ("discarded", "INTEGER"), ("run_id", "TEXT"),
    ), ("epoch", "step", "task_type", "unit_id")),
    "baseline_cache": ((
        ("task_type", "TEXT"), ("unit_id", "TEXT"), ("skill_hash", "TEXT"),
        ("config_hash", "TEXT"), ("correct", "INTEGER"), ("prediction", "TEXT"),
        ("tokens", "INTEGER"), ("latency_s", "REAL"), ("trace", "TEXT"), ("run_id", "TEXT"),
    ), ("task_type", "unit_id", "skill_hash", "config_hash")),
    "evaluation": ((
        ("epoch", "INTEGER"), ("task_type", "TEXT"), ("version", "INTEGER"),
        ("skill_hash", "TEXT"), ("n_units", "INTEGER"), ("n_initial", "INTEGER"),
        ("correct_initial", "INTEGER"), ("n_current", "INTEGER"),
        ("correct_current", "INTEGER"), ("acc_initial", "REAL"), ("acc_current", "REAL"),
        # The paired difference current - initial over units both arms answered (the gain):
        ("n_pairs", "INTEGER"), ("both_correct", "INTEGER"), ("wins", "INTEGER"),
        ("losses", "INTEGER"), ("gain", "REAL"), ("gain_lo", "REAL"), ("gain_hi", "REAL"),
        ("gain_method", "TEXT"), ("same_skill", "INTEGER"),
    ), ("epoch", "task_type")),
    "ground_truth": ((
        ("epoch", "INTEGER"), ("step", "INTEGER"), ("task_type", "TEXT"),
        ("base_hash", "TEXT"), ("cand_hash", "TEXT"), ("base_acc", "REAL"),
        ("cand_acc", "REAL"), ("effect", "REAL"), ("p_win", "REAL"), ("true_class", "TEXT"),
    ), ("epoch", "step", "task_type")),
    "infra_aborts": ((
        ("epoch", "INTEGER"), ("step", "INTEGER"), ("aborts", "INTEGER"), ("last", "TEXT"),
    ), ("epoch", "step")),
    # Loop-clock seconds per phase of a step (step 0: the settlement, -1: the evaluation);
    # serial_s: the phase's calls one after another, where measured (evolution); clock: the
    # loop's, 'virtual' (the simulator's: sleeps cost no wall time) or 'real' (NULL: rows
    # written before the column existed).
    "timings": ((
        ("epoch", "INTEGER"), ("step", "INTEGER"), ("phase", "TEXT"), ("seconds", "REAL"),
        ("serial_s", "REAL"), ("clock", "TEXT"),
    ), ("epoch", "step", "phase")),
    # What each earlier run of a step cost before a later run replaced its rows (`clear_step`):
    # a finished run re-run to check the cache, or a killed one resumed. ``seconds``: its
    # recorded phases' (NULL: it never finished). Never cleared: the run's whole cost is this
    # plus the step's current rows.
    "replaced_runs": ((
        ("epoch", "INTEGER"), ("step", "INTEGER"), ("replaced", "INTEGER"),
        ("calls", "INTEGER"), ("fresh_calls", "INTEGER"), ("tokens", "INTEGER"),
        ("latency_s", "REAL"), ("seconds", "REAL"),
    ), ("epoch", "step", "replaced")),
}

TABLES: tuple[str, ...] = tuple(SCHEMA)
STEP_TABLES: tuple[str, ...] = ("gate_evidence", "quadrant_pairs", "step_report",
                                "candidate_correctness", "timings")
"""Tables keyed by (epoch, step): `clear_step` deletes their rows for the step."""

REPORT_STATUSES: tuple[str, ...] = tuple(StepStatus)
"""step_report.status (`StepStatus`): gated through the gate, or why a type was not (or did
not finish); ``probation`` rows (step 0) record the epoch-end probation settlement."""


def _ddl(table: str) -> str:
    cols, pk = SCHEMA[table]
    body = ", ".join(f"{name} {typ}" for name, typ in cols)
    return f"CREATE TABLE IF NOT EXISTS {table} ({body}, PRIMARY KEY ({', '.join(pk)}))"


def _upsert_sql(table: str) -> str:
    cols, pk = SCHEMA[table]
    names = [c for c, _ in cols]
    updates = ", ".join(f"{c} = excluded.{c}" for c in names if c not in pk)
    return (f"INSERT INTO {table} ({', '.join(names)}) VALUES "
            f"({', '.join('?' * len(names))}) ON CONFLICT ({', '.join(pk)}) DO UPDATE SET "
            f"{updates}")


Clock = Literal["virtual", "real"]


def loop_clock() -> Clock:
    """The running loop's clock: ``virtual`` on the simulator's looptime loop (its time jumps
    over sleeps), else ``real`` (no running loop included)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return "real"
    return "virtual" if getattr(loop, "looptime_on", False) is True else "real"


def encode_trace(trace: Any) -> str | None:
    """A trace as JSON text (anything not JSON-native is stringified)."""
    return None if trace is None else json.dumps(trace, default=str, sort_keys=True)


def _insert(cur: sqlite3.Cursor, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """``executemany``; text that is no Unicode (a lone surrogate: a server's error message,
    an infer of the researcher's own) is stored with U+FFFD in its place, not refused (the
    statement replaces rows, so those written before the refusal are written again)."""
    try:
        cur.executemany(sql, rows)
    except UnicodeEncodeError:
        cur.executemany(sql, [tuple(as_unicode(v) if isinstance(v, str) else v for v in row)
                              for row in rows])


def _b(x: bool | None) -> int | None:
    return None if x is None else int(bool(x))


def quadrant(base: bool | None, cand: bool | None, infra: bool) -> str:
    """The correctness quadrant of one consumed unit."""
    if infra or base is None or cand is None:
        return "infra"
    return {(True, True): "both_correct", (True, False): "base_only",
            (False, True): "cand_only", (False, False): "both_wrong"}[(bool(base), bool(cand))]


def _connect_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection. On a read-only directory SQLite cannot create the WAL's
    shared-memory file, so there the file is opened ``immutable`` (no writer can run there)."""
    if not path.is_file():
        raise WorkspaceError(f"{path}: no such database file")
    uri = path.resolve().as_uri() + "?mode=ro"
    if not os.access(path.parent, os.W_OK):
        uri += "&immutable=1"
    con = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False,
                          timeout=30.0)
    try:
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except BaseException:
        con.close()
        raise
    return con


def _bad_cell(cols: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]) -> str:
    """The first cell whose value does not fit its column's declared type."""
    kinds = {"INTEGER": (int,), "REAL": (int, float), "TEXT": (str,)}
    for row in rows:
        for (name, typ), v in zip(cols, row, strict=False):
            ok = v is None or (isinstance(v, kinds[typ]) and not (
                typ == "INTEGER" and isinstance(v, int) and not -2**63 <= v < 2**63))
            if not ok:
                return f"column {name} holds {v!r}, not {typ}"
    return "a value does not fit its column"


def _add_missing_columns(cur: sqlite3.Cursor, table: str) -> None:
    """Columns a newer SCHEMA added to a table of an older log file (NULL in old rows)."""
    have = {row[1] for row in cur.execute(f"PRAGMA table_info({table})")}
    for name, typ in SCHEMA[table][0]:
        if name not in have:
            cur.execute(f"ALTER TABLE {table} ADD COLUMN {name} {typ}")


def _columns(table: str, names: Sequence[str]) -> str:
    """``table`` if it and every column in ``names`` exist (ValueError naming the fault)."""
    if table not in SCHEMA:
        raise ValueError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")
    known = {c for c, _ in SCHEMA[table][0]}
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"table {table!r} has no column(s) {bad}")
    return table


def _where(table: str, where: str, params: Sequence[Any], equal: Mapping[str, Any]
           ) -> tuple[str, tuple[Any, ...]]:
    """`` WHERE ...`` from an SQL condition and column = value pairs, with its parameters."""
    _columns(table, list(equal))
    parts = [f"({where})"] if where else []
    parts += [f"{c} = ?" for c in equal]
    return ((" WHERE " + " AND ".join(parts)) if parts else "",
            (*params, *equal.values()))


def _keep_replaced_cost(cur: sqlite3.Cursor, epoch: int, step: int, prefix: str) -> None:
    """A ``replaced_runs`` row for the step's logged calls and timings, if it has any."""
    calls, fresh, tokens, latency = cur.execute(
        "SELECT COUNT(*), SUM(cached = 0), SUM(tokens), SUM(latency_s) FROM predictions "
        "WHERE substr(run_id, 1, length(?)) = ?", (prefix, prefix)).fetchone()
    if not calls:
        return
    (seconds,) = cur.execute("SELECT SUM(seconds) FROM timings WHERE epoch = ? AND step = ?",
                             (epoch, step)).fetchone()
    (last,) = cur.execute("SELECT MAX(replaced) FROM replaced_runs WHERE epoch = ? AND "
                          "step = ?", (epoch, step)).fetchone()
    cur.execute("INSERT INTO replaced_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (epoch, step, (last or 0) + 1, calls, fresh, tokens, latency, seconds))


class HarnessLog:
    """The step's persistent record: predictions, traces, gate evidence, reports, caches.

    One connection, one lock; opening creates the file and tables if needed (WAL mode).
    ``log.frame("gate_evidence")`` returns a polars DataFrame for analysis.
    """

    def __init__(self, path: str | Path, *, readonly: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        """Opened for reading only (``mode=ro``): no schema, no WAL switch, writes fail."""
        self._lock = threading.Lock()
        if readonly:
            self._con = _connect_readonly(self.path)
            return
        self._con = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                    timeout=30.0)
        with self._lock:
            self._con.execute("PRAGMA journal_mode=WAL")
            # NORMAL is durable against a killed process (not a power cut), which is the
            # crash the step's re-run covers; FULL would fsync every result.
            self._con.execute("PRAGMA synchronous=NORMAL")
            self._con.execute("PRAGMA foreign_keys=ON")
        with self.transaction() as cur:
            for t in TABLES:
                cur.execute(_ddl(t))
                _add_missing_columns(cur, t)

    # ---- plumbing ---------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Cursor]:
        """One atomic write transaction under the lock (rolled back on any exception)."""
        with self._lock:
            cur = self._con.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Read rows (under the lock, so a reader never sees half a transaction)."""
        with self._lock:
            return self._con.execute(sql, tuple(params)).fetchall()

    def close(self) -> None:
        with self._lock:
            self._con.close()

    def __enter__(self) -> HarnessLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def upsert(self, table: str, rows: Sequence[Sequence[Any]],
               cur: sqlite3.Cursor | None = None) -> None:
        """Insert-or-replace ``rows`` (full column tuples in SCHEMA order) into ``table``."""
        if table not in SCHEMA:
            raise ValueError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")
        sql = _upsert_sql(table)
        if cur is not None:
            _insert(cur, sql, rows)
            return
        with self.transaction() as c:
            _insert(c, sql, rows)

    def count(self, table: str, where: str = "", params: Sequence[Any] = (),
              **equal: Any) -> int:
        """Rows of ``table`` (optionally: an SQL condition, and/or columns equal to values);
        0 for a table newer than a file opened read-only."""
        w, p = _where(table, where, params, equal)
        if not self._have(table):
            return 0
        return int(self.query(f"SELECT COUNT(*) FROM {table}{w}", p)[0][0])

    def select(self, table: str, columns: Sequence[str], *, order_by: Sequence[str] = (),
               **equal: Any) -> list[tuple[Any, ...]]:
        """``columns`` of the rows of ``table`` whose ``equal`` columns hold the given values
        (every name checked against the schema), ordered by ``order_by``."""
        _columns(table, [*columns, *order_by])
        w, p = _where(table, "", (), equal)
        order = f" ORDER BY {', '.join(order_by)}" if order_by else ""
        return self.query(f"SELECT {', '.join(columns)} FROM {table}{w}{order}", p)

    # ---- readers ----------------------------------------------------------------------

    def frame(self, table: str, where: str = "", params: Sequence[Any] = (),
              **equal: Any) -> pl.DataFrame:
        """The rows of ``table`` as a polars DataFrame, typed by the declared schema.

        ``where`` is an optional SQL condition with ``?`` placeholders for ``params``;
        ``equal`` keeps the rows whose columns hold the given values.
        """
        import polars as pl

        cols, pk = SCHEMA[_columns(table, ())]
        dtype = {"INTEGER": pl.Int64, "REAL": pl.Float64, "TEXT": pl.Utf8}
        w, p = _where(table, where, params, equal)
        have = self._have(table)  # a read-only old file may lack newer columns: NULL
        schema = {c: dtype[t] for c, t in cols}
        if not have:  # ... or a newer table: empty, with its columns
            return pl.DataFrame(schema=schema)
        sql = (f"SELECT {', '.join(c if c in have else f'NULL AS {c}' for c, _ in cols)} "
               f"FROM {table}{w}")
        sql += f" ORDER BY {', '.join(pk)}"
        rows = self.query(sql, p)
        try:
            return pl.DataFrame(rows, schema=schema, orient="row")
        except (pl.exceptions.PolarsError, TypeError, ValueError, OverflowError):
            raise WorkspaceError(f"{self.path.name}: table {table}: {_bad_cell(cols, rows)}; "
                                 f"the database was edited or damaged") from None

    def _have(self, table: str) -> set[str]:
        if not self.readonly:
            return {c for c, _ in SCHEMA[table][0]}
        return {row[1] for row in self.query(f"PRAGMA table_info({table})")}

    def step_frame(self, table: str, epoch: int, step: int) -> pl.DataFrame:
        """Rows of a step table for one (epoch, step)."""
        return self.frame(table, "epoch = ? AND step = ?", (epoch, step))

    def quick_check(self) -> None:
        """``PRAGMA quick_check``: `WorkspaceError` naming the file when the database is
        damaged (a page overwritten, an index out of step), before anything trusts it. Reads
        every page once: ~1 s per GB (docs/performance.md)."""
        try:
            rows = self.query("PRAGMA quick_check")
        except sqlite3.DatabaseError as exc:
            rows = [(str(exc),)]
        problems = [str(r[0]) for r in rows if r and r[0] != "ok"]
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            raise WorkspaceError(f"{self.path.name}: the database is damaged (PRAGMA "
                                 f"quick_check: {problems[0][:200]}{more}); restore it from a "
                                 f"copy, or start a new workspace")

    # ---- the idempotent re-run --------------------------------------------------------

    def infra_aborts(self, epoch: int, step: int) -> int:
        """How many times the INFRA guard aborted this (epoch, step)'s gate: the next
        attempt's `UnitTask.attempt`. Kept by `clear_step` (it counts past attempts)."""
        try:
            rows = self.query("SELECT aborts FROM infra_aborts WHERE epoch = ? AND step = ?",
                              (epoch, step))
        except sqlite3.OperationalError:  # a read-only log from before the table existed
            return 0
        return int(rows[0][0]) if rows else 0

    def record_infra_abort(self, epoch: int, step: int, message: str) -> int:
        """Count one more INFRA-guard abort of (epoch, step); returns the new count."""
        with self.transaction() as cur:
            cur.execute("INSERT INTO infra_aborts (epoch, step, aborts, last) VALUES "
                        "(?, ?, 1, ?) ON CONFLICT (epoch, step) DO UPDATE SET "
                        "aborts = aborts + 1, last = excluded.last", (epoch, step, message))
            return int(cur.execute("SELECT aborts FROM infra_aborts WHERE epoch = ? AND "
                                   "step = ?", (epoch, step)).fetchone()[0])

    def record_timings(self, epoch: int, step: int,
                       seconds: Mapping[str, float | tuple[float, float | None]]) -> None:
        """Upsert the loop-clock seconds of phases of (epoch, step): ``{phase: seconds}`` or
        ``{phase: (seconds, serial_s)}`` (a re-run's time replaces the earlier one), with
        the clock they were measured on (`loop_clock`)."""
        clock = loop_clock()
        rows = [(epoch, step, phase, *(v if isinstance(v, tuple) else (v, None)), clock)
                for phase, v in seconds.items()]
        self.upsert("timings", rows)

    def clear_step(self, epoch: int, step: int, step_run_id: str) -> dict[str, int]:
        """Delete the step's gate rows in one transaction; returns rows deleted per table.

        predictions/traces: every run id starting with the literal ``{step_run_id}_gate_``
        (compared with ``substr``, so ``_``/``%`` in ids match only themselves);
        gate_evidence/quadrant_pairs/step_report/candidate_correctness/timings: the (epoch,
        step) rows. What the replaced run cost is kept in ``replaced_runs`` first. BaselineCache
        entries are kept: they are content-addressed measurements, reusable.
        """
        if not isinstance(step_run_id, str) or not step_run_id:
            raise ValueError(f"step_run_id must be a non-empty string, got {shown(step_run_id)}")
        prefix = gate_prefix(step_run_id)
        deleted: dict[str, int] = {}
        with self.transaction() as cur:
            _keep_replaced_cost(cur, epoch, step, prefix)
            for t in ("predictions", "traces"):
                cur.execute(f"DELETE FROM {t} WHERE substr(run_id, 1, length(?)) = ?",
                            (prefix, prefix))
                deleted[t] = cur.rowcount
            for t in STEP_TABLES:
                cur.execute(f"DELETE FROM {t} WHERE epoch = ? AND step = ?", (epoch, step))
                deleted[t] = cur.rowcount
        return deleted

    # ---- typed writers ----------------------------------------------------------------

    def write_result(self, epoch: int, step: int, task: UnitTask, result: UnitResult,
                     discarded: bool) -> None:
        """One finished inference: its prediction, trace and (cand arm) correctness row."""
        with self.transaction() as cur:
            self.upsert("predictions", [(
                task.run_id, task.unit_id, task.task_type, task.arm, epoch, step,
                task.ladder_rank, task.skill_hash, result.prediction, _b(result.correct),
                _b(result.infra), _b(result.cached), _b(discarded), float(result.latency_s),
                int(result.tokens), result.error)], cur)
            self.upsert("traces", [(task.run_id, task.unit_id, task.task_type, task.arm, epoch,
                                    step, encode_trace(result.trace))], cur)
            if task.arm == "cand" and not result.infra:
                self.upsert("candidate_correctness", [(
                    epoch, step, task.task_type, task.unit_id, task.skill_hash,
                    task.ladder_rank, _b(result.correct), _b(discarded), task.run_id)], cur)

    def write_consumed(self, epoch: int, step: int, ev: PrefixAdvanced) -> None:
        """One consumed unit: its gate_evidence row and its quadrant_pairs row, atomically."""
        infra = ev.d is None
        # An INFRA unit is no pair: both arms NULL, whichever came back first (the other
        # arm's answer, if any, is in predictions); so the row is the same on every run.
        base = None if infra or ev.base is None else ev.base.correct
        cand = None if infra or ev.cand is None else ev.cand.correct
        with self.transaction() as cur:
            self.upsert("gate_evidence", [(
                epoch, step, ev.task_type, ev.ladder_rank, ev.unit_id, _b(base), _b(cand),
                int(infra), ev.d, ev.W, ev.L, ev.n_used, ev.e_plus, ev.e_minus,
                ev.n_remaining, str(ev.action))], cur)
            self.upsert("quadrant_pairs", [(
                epoch, step, ev.task_type, ev.ladder_rank, ev.unit_id, _b(base), _b(cand),
                quadrant(base, cand, infra))], cur)

    def write_report(self, epoch: int, step: int, task_type: str, status: StepStatus, *,
                     outcome: TypeOutcome | None = None, counters: TypeCounters | None = None,
                     base_version: int | None = None, base_hash: str | None = None,
                     cand_hash: str | None = None, applied: str | None = None,
                     note: str | None = None,
                     llm_cache: Mapping[str, Any] | None = None) -> None:
        """Upsert the one step_report row of (epoch, step, type).

        ``llm_cache`` holds the LLM response-cache counters of the type's arm runs
        (``{"base": {...}, "cand": {...}}``), stored as JSON.
        """
        if status not in REPORT_STATUSES:
            raise ValueError(f"step_report status must be one of {REPORT_STATUSES}, "
                             f"got {shown(status)}")
        o, c = outcome, counters
        stats = (None,) * 9 if o is None else (
            str(o.action), o.W, o.L, o.n_used, o.e_plus, o.e_minus, o.stop_rank,
            o.n_consumed, o.n_ladder)
        work = (None,) * 10 if c is None else (
            c.started, c.completed, c.cache_hits, c.cancelled_before_start,
            c.cancelled_in_flight, c.discarded_after_freeze, c.discarded_after_infra,
            c.infra_units, c.infra_calls, c.tokens)
        cache = None if llm_cache is None else json.dumps(llm_cache, sort_keys=True)
        row = (epoch, step, task_type, status, *stats, *work, base_version, base_hash,
               cand_hash, applied, note, cache)
        self.upsert("step_report", [row])

    def set_applied(self, epoch: int, step: int, applied: Mapping[str, str]) -> None:
        """Record what Phase D did per type (after the state checkpoint is written)."""
        with self.transaction() as cur:
            for t, what in applied.items():
                cur.execute("UPDATE step_report SET applied = ? WHERE epoch = ? AND step = ? "
                            "AND task_type = ?", (what, epoch, step, t))


    # ---- named readers and updates (every SQL statement of the harness lives here) -----

    def set_action(self, epoch: int, step: int, task_type: str, action: str) -> None:
        """Overwrite one step_report row's action (a settlement's PASSED / FAILED)."""
        with self.transaction() as cur:
            cur.execute("UPDATE step_report SET action = ? WHERE epoch = ? AND step = ? AND "
                        "task_type = ?", (action, epoch, step, task_type))

    def unapplied(self, epoch: int, step: int) -> int:
        """Gated step_report rows of (epoch, step) whose Phase D result is not recorded."""
        return self.count("step_report", "applied IS NULL", epoch=epoch, step=step,
                          status=StepStatus.GATED)

    def consumed_units(self, epoch: int, step: int, task_type: str) -> set[str]:
        """The units a type's gate consumed in (epoch, step) (gate_evidence)."""
        return {u for (u,) in self.select("gate_evidence", ["unit_id"], epoch=epoch,
                                          step=step, task_type=task_type)}

    def run_units(self, run_id: str) -> list[str]:
        """The units one run logged, in ladder order."""
        return [u for (u,) in self.select("predictions", ["unit_id"], order_by=["ladder_rank"],
                                          run_id=run_id)]

    def run_results(self, run_id: str) -> dict[str, tuple[Any, Any, Any]]:
        """``{unit: (correct, infra, tokens)}`` of one run's logged predictions."""
        return {u: (c, i, t) for u, c, i, t in self.select(
            "predictions", ["unit_id", "correct", "infra", "tokens"], run_id=run_id)}

    def run_skill_hash(self, run_id: str) -> str | None:
        """The skill hash one run's predictions were made with (None: no rows)."""
        rows = self.select("predictions", ["skill_hash"], run_id=run_id)
        return rows[0][0] if rows else None

    def baseline_row(self, task_type: str, unit_id: str, skill_hash: str,
                     config_hash: str) -> tuple[Any, ...] | None:
        """(correct, prediction, trace) of one BaselineCache entry, or None."""
        rows = self.select("baseline_cache", ["correct", "prediction", "trace"],
                           task_type=task_type, unit_id=unit_id, skill_hash=skill_hash,
                           config_hash=config_hash)
        return rows[0] if rows else None

    def eval_measurements(self, before_epoch: int) -> dict[tuple[str, str, str], tuple[Any, ...]]:
        """``{(type, unit, skill hash): (correct, prediction, trace)}`` of every counted,
        non-INFRA evaluation answer of an epoch before ``before_epoch`` (the first one
        recorded for each key): a skill measured once is reused, never measured again."""
        rows = self.query(
            "SELECT p.task_type, p.unit_id, p.skill_hash, p.correct, p.prediction, t.trace "
            "FROM predictions p LEFT JOIN traces t ON t.run_id = p.run_id AND "
            "t.unit_id = p.unit_id WHERE p.step = ? AND p.epoch < ? AND p.infra = 0 AND "
            "p.discarded = 0 ORDER BY p.epoch, p.run_id", (EVAL_STEP, before_epoch))
        out: dict[tuple[str, str, str], tuple[Any, ...]] = {}
        for t, u, h, c, pred, trace in rows:
            out.setdefault((t, u, h), (c, pred, trace))
        return out

    def baseline_count(self, config_hash: str) -> int:
        """BaselineCache entries of one agent config (its unit-keyed entries included)."""
        return self.count("baseline_cache", "config_hash = ? OR config_hash LIKE ?",
                          (config_hash, f"{config_hash}:%"))


class GateSink:
    """The scheduler's `ResultSink` for one step: every finished call and consumed unit lands.

    Every finished inference is written (discarded ones after a freeze or an abort flagged
    ``discarded=1``); every consumed unit writes gate_evidence + quadrant_pairs; every decision
    writes the type's step_report row (work counters are added when the gate returns).
    """

    def __init__(self, log: HarnessLog, epoch: int, step: int,
                 report_extra: Mapping[str, Mapping[str, Any]] | None = None):
        self.log, self.epoch, self.step = log, epoch, step
        self.report_extra = dict(report_extra or {})
        self.outcomes: dict[str, TypeOutcome] = {}
        self.results = 0
        self.consumed = 0

    async def on_result(self, task: UnitTask, result: UnitResult, counted: bool) -> None:
        self.log.write_result(self.epoch, self.step, task, result, discarded=not counted)
        self.results += 1

    async def on_consumed(self, event: PrefixAdvanced) -> None:
        self.log.write_consumed(self.epoch, self.step, event)
        self.consumed += 1

    async def on_decided(self, task_type: str, outcome: TypeOutcome) -> None:
        self.outcomes[task_type] = outcome
        self.log.write_report(self.epoch, self.step, task_type, StepStatus.GATED, outcome=outcome,
                              **self.report_extra.get(task_type, {}))
