"""Metric tables in CSV (W&B history exports, Lightning ``metrics.csv``, generic) and Parquet.

- W&B ``run.history()`` / ``scan_history()`` exports: a ``_step`` column, ``_runtime`` and
  ``_timestamp`` (seconds since epoch, the ``wall_time``); other ``_``-prefixed columns are skipped.
- W&B UI panel exports: ``Step, <run> - <key>, <run> - <key>__MIN, <run> - <key>__MAX``: the key is
  the part after `` - `` and the ``__MIN``/``__MAX`` envelopes are skipped (``meta["runs"]``).
- Lightning ``CSVLogger``: ``step`` and ``epoch`` columns, sparse rows (a blank cell is no sample).
- Any table with a step-like column (``step``, ``global_step``, ``iteration``, ``iter``,
  ``num_updates``, ``trainer/global_step``).

Cells are read as strings and converted to float: a blank cell is no row; ``nan``/``inf`` are kept;
a cell that is not a number is skipped. A row with the wrong number of cells is skipped and
reported with its line number (a torn last line of a killed writer). The step going back starts a
new local segment. Parquet files with such a step column are read with polars.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from forensics.errors import ParseError
from forensics.model import ParseResult, Skip
from parsers._io import logical_suffix, open_binary, open_text
from parsers.lines import Rows, metric

FORMAT = "csv"
STEP_COLUMNS = ("_step", "step", "Step", "global_step", "trainer/global_step", "iteration", "iter",
                "num_updates", "train/global_step")
_WALL = ("_timestamp", "timestamp", "wall_time")
_SKIP_COLS = {"_runtime", "_timestamp", "_wandb", "timestamp", "wall_time", "Wall time",
              "Relative Time (Process)"}


def _step_column(header: list[str]) -> str | None:
    for name in STEP_COLUMNS:
        if name in header:
            return name
    low = {h.lower(): h for h in header}
    for name in STEP_COLUMNS:
        if name.lower() in low:
            return low[name.lower()]
    return None


def sniff(path: Path) -> bool:
    """True for a ``.csv`` whose header has a step-like column, or such a ``.parquet`` (never raises)."""
    try:
        suffix = logical_suffix(path)
        if suffix == ".csv" and path.is_file():
            with open_text(path) as fh:
                header = next(csv.reader(io.StringIO(fh.readline())), [])
            return _step_column([h.strip() for h in header]) is not None
        if suffix == ".parquet" and path.is_file():
            import pyarrow.parquet as pq

            return _step_column(pq.read_schema(path).names) is not None
    except (OSError, ValueError, StopIteration, ImportError, RuntimeError, EOFError):
        return False
    return False


def _to_float(cell: str) -> float | None:
    t = cell.strip()
    if not t:
        return None
    try:
        return float(t)
    except ValueError:
        low = t.lower()
        if low in ("nan", "-nan"):
            return math.nan
        if low in ("inf", "+inf", "infinity", "+infinity"):
            return math.inf
        if low in ("-inf", "-infinity"):
            return -math.inf
        return None


def _columns(header: list[str], step_col: str, meta: dict[str, Any]) -> list[tuple[int, str] | None]:
    """For each column, ``(index, tag)`` when it holds a metric, else ``None``."""
    runs = set()
    out: list[tuple[int, str] | None] = []
    for i, h in enumerate(header):
        internal = h.startswith("_") and h != "_step"
        if h == step_col or h in _SKIP_COLS or internal or h.endswith(("__MIN", "__MAX")):
            out.append(None)
            continue
        tag = h
        if " - " in h and step_col == "Step":
            run, _, tag = h.partition(" - ")
            runs.add(run)
        out.append((i, tag))
    if runs:
        meta["runs"] = sorted(runs)
    return out


def _emit(rows: Rows, table: list[tuple[int, list[str]]], header: list[str], step_col: str,
          meta: dict[str, Any], skipped: list[Skip], rel: str) -> None:
    cols = _columns(header, step_col, meta)
    si = header.index(step_col)
    wi = next((header.index(w) for w in _WALL if w in header), None)
    names = {c[1]: metric(c[1], None)[0] for c in cols if c}
    segment, last = 0, None
    for lineno, cells in table:
        step = _to_float(cells[si])
        if step is None or not math.isfinite(step):
            skipped.append(Skip(f"{rel}:{lineno}", f"no numeric {step_col!r} in this row"))
            continue
        s = int(step)
        if last is not None and s < last:
            segment += 1
        last = s
        wall = _to_float(cells[wi]) if wi is not None else None
        for c in cols:
            if c is None:
                continue
            v = _to_float(cells[c[0]])
            if v is None:
                continue
            rows.add(segment, s, names[c[1]], v, c[1], wall)
    meta["segments"] = segment + 1


def _read_csv(path: Path, rel: str, rows: Rows, meta: dict[str, Any], skipped: list[Skip]) -> None:
    with open_binary(path) as fh:
        text = fh.read().decode("utf-8-sig", errors="replace")
    lines = text.splitlines(keepends=True)
    if not lines:
        raise ParseError(rel, "empty CSV file")
    reader = csv.reader(lines)
    header = [h.strip() for h in next(reader)]
    step_col = _step_column(header)
    if step_col is None:
        raise ParseError(rel, "no step column in the CSV header")
    table: list[tuple[int, list[str]]] = []
    try:
        for cells in reader:
            lineno = reader.line_num
            if not cells or all(not c.strip() for c in cells):
                continue
            torn = lineno == len(lines) and not lines[-1].endswith(("\n", "\r"))
            if torn and len(cells) == len(header):
                # csv writers end every row with a newline: a last row without one may be cut inside its
                # last number ("0.1" -> "0."), so it is not trusted
                skipped.append(Skip(f"{rel}:{lineno}", "last line has no newline (the writer was killed "
                                    "mid-row?); dropped because its last cell may be cut short"))
                continue
            if len(cells) != len(header):
                why = "torn last line (the writer was killed mid-row)" if torn else \
                    f"{len(cells)} cells for {len(header)} columns"
                skipped.append(Skip(f"{rel}:{lineno}", why))
                continue
            table.append((lineno, cells))
    except csv.Error as exc:
        skipped.append(Skip(f"{rel}:{reader.line_num}", f"unreadable CSV from here on: {exc}"))
    meta["columns"] = header
    meta["step_column"] = step_col
    meta["kind"] = "wandb_export" if step_col in ("_step", "Step") else "lightning" if "epoch" in header \
        and step_col == "step" else "generic"
    _emit(rows, table, header, step_col, meta, skipped, rel)


def _read_parquet(path: Path, rel: str, rows: Rows, meta: dict[str, Any], skipped: list[Skip]) -> None:
    import polars as pl

    df = pl.read_parquet(path)
    step_col = _step_column(df.columns)
    if step_col is None:
        raise ParseError(rel, "no step column in the Parquet schema")
    header = df.columns
    table = []
    for i, rec in enumerate(df.iter_rows()):
        table.append((i + 1, ["" if v is None else repr(v) if isinstance(v, float) else str(v) for v in rec]))
    meta["columns"] = header
    meta["step_column"] = step_col
    meta["container"] = "parquet"
    _emit(rows, table, header, step_col, meta, skipped, rel)


def read(path: Path, root: Path) -> ParseResult:
    """Read one metric table.

    Args:
        path: A ``.csv`` (or ``.parquet``) file with a step column.
        root: The run folder; ``source`` is relative to it.

    Returns:
        A :class:`ParseResult` with one row per non-blank numeric cell (canonical metric name,
        the column name as ``tag``, ``wall_time`` from ``_timestamp`` when present); malformed
        rows are listed in ``skipped``.

    Raises:
        ParseError: No step column, or an empty file.
    """
    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
    rows = Rows(rel)
    meta: dict[str, Any] = {}
    skipped: list[Skip] = []
    try:
        if path.suffix.lower() == ".parquet":
            _read_parquet(path, rel, rows, meta, skipped)
        else:
            _read_csv(path, rel, rows, meta, skipped)
    except (OSError, csv.Error) as exc:
        raise ParseError(rel, f"unreadable table: {exc}") from exc
    meta["framework"] = meta.get("kind", "generic")
    return ParseResult(format=FORMAT, path=rel, metrics=rows.metrics_table(), events=rows.events_table(),
                       meta=meta, skipped=tuple(skipped), precision="float64")
