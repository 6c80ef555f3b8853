"""The MLflow SQLite store (``mlflow.db``), read under bounds (:mod:`parsers.mlflow_store` claims it).

Table ``metrics(key, value, timestamp, step, is_nan, run_uuid)`` read with the stdlib ``sqlite3``,
read-only (``mode=ro``, no writes, no extensions), only when ``metrics`` is a table (a VIEW over a
recursive CTE is refused), and under a budget of SQLite instructions through a progress handler
(:data:`SQL_STEPS_BASE` + :data:`SQL_STEPS_PER_BYTE` per byte of the file). ``is_nan=1`` is NaN
(stored as value 0) and ``+-1.7976931348623157e308`` is ``+-inf``. Several runs in one database are
not segments of one run: every row stays in segment 0, ``meta["runs"]`` lists the run ids, and with
more than one run the ``tag`` is ``"<key>@<run_uuid[:8]>"`` (one run: the plain key).
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

from forensics.errors import ParseError
from forensics.model import ParseResult, Skip
from parsers.lines import Rows, metric

FORMAT = "mlflow"
SQLITE_MAGIC = b"SQLite format 3\x00"
_DBL_MAX = 1.7976931348623157e308
_INT64 = 1 << 63
_METRIC_COLS = {"key", "value", "timestamp", "step", "run_uuid"}


def param(text: Any) -> Any:
    """An MLflow param (always a string) as a number when it is one."""
    t = str(text).strip()
    try:
        return int(t)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        return t


SQL_STEPS_BASE = 200_000_000
"""SQLite virtual-machine instructions any store may take (about a second or two of CPU)."""
SQL_STEPS_PER_BYTE = 400
"""More instructions per byte of the database file: reading and sorting a real store takes ~50."""
_PROGRESS_EVERY = 100_000


class _Budget:
    """A progress handler that interrupts a query past its instruction budget (a recursive view, blob rows)."""

    def __init__(self, nbytes: int) -> None:
        self.left = (SQL_STEPS_BASE + SQL_STEPS_PER_BYTE * nbytes) // _PROGRESS_EVERY
        self.spent = False

    def __call__(self) -> int:
        self.left -= 1
        if self.left < 0:
            self.spent = True
            return 1  # interrupts the statement: sqlite3.OperationalError("interrupted")
        return 0


def _connect(path: Path) -> sqlite3.Connection:
    """Open read-only (URI ``mode=ro``), untrusted schema, with an instruction budget (``con.budget``)."""
    uri = path.resolve().as_uri()
    try:
        con = sqlite3.connect(f"{uri}?mode=ro", uri=True)
        con.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.Error:
        # a WAL database in a read-only folder cannot be opened with mode=ro alone
        con = sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True)
    try:
        con.execute("PRAGMA query_only = 1")
        con.execute("PRAGMA trusted_schema = OFF")  # functions with side effects never run from a view/trigger
    except sqlite3.Error:
        pass
    budget = _Budget(path.stat().st_size)
    con.set_progress_handler(budget, _PROGRESS_EVERY)
    _BUDGETS[id(con)] = budget
    return con


_BUDGETS: dict[int, _Budget] = {}


def _spent(con: sqlite3.Connection) -> bool:
    b = _BUDGETS.get(id(con))
    return bool(b and b.spent)


def _close(con: sqlite3.Connection) -> None:
    _BUDGETS.pop(id(con), None)
    con.close()


def _is_table(con: sqlite3.Connection, name: str) -> bool:
    """True when ``name`` is a real table (a VIEW can run any query, e.g. an endless recursive CTE)."""
    return con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    if not _is_table(con, table):
        return set()
    return {r[1] for r in con.execute(f"PRAGMA table_info('{table}')").fetchall()}


def sniff_sqlite(path: Path) -> bool:
    """True for a SQLite file with an MLflow ``metrics`` table (or object of that name, listed when read)."""
    if not path.is_file():
        return False
    with open(path, "rb") as fh:
        if fh.read(16) != SQLITE_MAGIC:
            return False
    if path.name.lower() == "mlflow.db":
        return True
    con = _connect(path)
    try:
        return _METRIC_COLS <= _columns(con, "metrics")
    finally:
        _close(con)


def _short(col: str, n: int = 64) -> str:
    """A text column cut to ``n`` characters in SQL (a blob is never handed to Python whole)."""
    return f"CASE WHEN typeof({col}) = 'blob' THEN NULL ELSE substr({col}, 1, {n}) END"


def _num_sql(col: str) -> str:
    """A numeric column as SQL hands it over: numbers as they are, a short text kept, anything else NULL."""
    if col == "0":
        return "0"
    return (f"CASE WHEN typeof({col}) IN ('integer', 'real') THEN {col} "
            f"WHEN typeof({col}) = 'text' AND length({col}) <= 64 THEN {col} END")


def _sql_value(value: Any, is_nan: Any) -> float | None:
    if is_nan:
        return math.nan
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    if v >= _DBL_MAX:
        return math.inf
    if v <= -_DBL_MAX:
        return -math.inf
    return v


def _sql_runs(con: sqlite3.Connection, uuids: list[str]) -> dict[str, dict[str, Any]]:
    info: dict[str, dict[str, Any]] = {u: {} for u in uuids}
    try:
        cols = _columns(con, "runs")
        want = [c for c in ("name", "status", "experiment_id", "start_time", "end_time", "lifecycle_stage")
                if c in cols]
        if "run_uuid" in cols and want:
            for rec in con.execute(f"SELECT run_uuid, {', '.join(want)} FROM runs").fetchall():
                if rec[0] in info:
                    info[rec[0]].update({k: v for k, v in zip(want, rec[1:], strict=True) if v is not None})
        if _columns(con, "params") >= {"key", "value", "run_uuid"}:
            for k, v, u in con.execute("SELECT key, value, run_uuid FROM params").fetchall():
                if u in info:
                    info[u].setdefault("params", {})[str(k)] = v
    except sqlite3.Error:
        pass
    return info


def _read_rows(con: sqlite3.Connection, rows: Rows, nan_col: str, *, several: bool) -> int:
    """Add every readable metrics row to ``rows``; returns how many rows had no numeric value, step or key.

    Blobs and long texts never reach Python: a value is a number or a short text, names are cut.
    """
    cur = con.execute(f"SELECT {_short('run_uuid')}, {_short('key', 1000)}, {_num_sql('value')}, "
                      f"{_num_sql('timestamp')}, {_num_sql('step')}, {_num_sql(nan_col)} FROM metrics "
                      "ORDER BY 1, 2, timestamp, step")
    names: dict[str, str] = {}
    bad = 0
    for run_uuid, key, value, ts, step, is_nan in cur:
        v = _sql_value(value, is_nan)
        try:
            s = int(step) if step is not None else 0
            wall = float(ts) / 1000.0 if ts is not None else None
            if not -_INT64 <= s < _INT64:
                v = None
        except (TypeError, ValueError, OverflowError):
            v = None
        if v is None or key is None:
            bad += 1
            continue
        key = str(key)
        if key not in names:
            names[key] = metric(key, None)[0]
        tag = f"{key}@{str(run_uuid)[:8]}" if several else key
        rows.add(0, s, names[key], v, tag, wall)
    return bad


def read_sqlite(path: Path, rel: str) -> ParseResult:
    """Read the ``metrics`` table of an MLflow SQLite store, read-only and within its instruction budget.

    Raises:
        ParseError: The database cannot be opened, ``metrics`` is no table (a view: never queried) or
            lacks MLflow's columns, or no row could be read before an error or the budget ran out.
    """
    rows = Rows(rel)
    skipped: list[Skip] = []
    try:
        con = _connect(path)
    except sqlite3.Error as exc:
        raise ParseError(rel, f"cannot open the SQLite database: {exc}") from exc
    try:
        if not _is_table(con, "metrics") and con.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'metrics'").fetchone() is not None:
            raise ParseError(rel, "'metrics' is not a table (a view or another object): not read")
        cols = _columns(con, "metrics")
        if not _METRIC_COLS <= cols:
            raise ParseError(rel, "no MLflow 'metrics(key, value, timestamp, step, run_uuid)' table")
        uuids = [r[0] for r in con.execute(
            f"SELECT {_short('run_uuid')}, MIN(timestamp) FROM metrics GROUP BY 1 ORDER BY 2, 1").fetchall()]
        bad = _read_rows(con, rows, "is_nan" if "is_nan" in cols else "0", several=len(uuids) > 1)
        if bad:
            skipped.append(Skip(f"{rel}:metrics", f"{bad} row(s) with no numeric value, step or key"))
        runs = _sql_runs(con, [str(u) for u in uuids])
    except sqlite3.Error as exc:
        if _spent(con):
            exc = f"query stopped past its budget of SQLite instructions ({exc}; a crafted store?)"
        if not len(rows):
            raise ParseError(rel, f"unreadable MLflow SQLite store: {exc}") from None
        skipped.append(Skip(f"{rel}:metrics", f"SQLite error part way through: {exc}"))
        runs = {}
    finally:
        _close(con)
    if not len(rows):
        raise ParseError(rel, "the MLflow metrics table holds no readable row")
    meta: dict[str, Any] = {"store": "sqlite", "framework": "mlflow", "runs": runs, "run_ids": list(runs),
                            "segments": 1}
    if len(runs) == 1:
        (only,) = runs.values()
        meta["run_id"] = next(iter(runs))
        if isinstance(only.get("params"), dict):
            meta["hparams"] = {k: param(v) for k, v in only["params"].items()}
    return ParseResult(format=FORMAT, path=rel, metrics=rows.metrics_table(), events=rows.events_table(),
                       meta=meta, skipped=tuple(skipped), precision="float64")
