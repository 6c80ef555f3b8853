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
new local segment. Parquet files with such a step column are read with polars (pandas' ``to_parquet``
writes NaN as null: no row, counted in ``meta["null_values"]``; polars keeps NaN). A Parquet file cut
short has no footer and no row can be located without it: it is claimed and raises ``ParseError``.

JSON history exports, ``.json`` files holding one array of row objects: ``json.dump(list(run.scan_history()),
f)``, ``run.history().to_json(orient="records")`` (pandas writes NaN as ``null``) and the like, e.g.
``[{"_step": 0, "_runtime": 1.2, "_timestamp": 1.7e9, "loss": 2.3}, ...]``, with the same columns as
the CSV export. A value is a number, the ``NaN``/``Infinity``/``-Infinity`` token, or the same as a
string (``"NaN"``, ``"inf"``; W&B's ``value_json`` spelling); ``null``, an absent key, a string or a
nested object (media, histograms) is no row (``null`` is counted in ``meta["null_values"]``: pandas'
NaN and "not logged in this row" cannot be told apart). ``_runtime`` and ``_timestamp`` are wall time,
never metrics. Elements are decoded one by one: a damaged or cut element is listed with its line
and the reader resumes at the next element, so every complete row is kept.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from forensics.errors import ParseError
from forensics.model import ParseResult, Skip
from parsers import file_policy
from parsers._io import logical_suffix, open_text, read_table_bytes
from parsers._table_header import (
    EPOCH_COLUMNS,
    ROW_INDEX,
    SAMPLE_COLUMNS,
    SPLIT_KEYS,
    STEP_COLUMNS,
    WALL_COLUMNS,
    metric_tag,
    split_suffix,
    step_axis,
    step_column,
    to_float,
)
from parsers._text_damage import UTF16_BOMS
from parsers.json_table import json_array_head, read_json
from parsers.lines import Rows, metric

__all__ = ["EPOCH_COLUMNS", "FORMAT", "ROW_INDEX", "SAMPLE_COLUMNS", "STEP_COLUMNS", "read", "sniff", "step_axis"]

FORMAT = "csv"


def sniff(path: Path) -> bool:
    """True for a ``.csv`` whose header has a step-like column, such a ``.parquet``, or a JSON array export.

    A ``.json`` file is claimed when it is an array whose first element is an object with a step key
    (``_step``, ``step``, ...). Never raises.
    """
    try:
        suffix = logical_suffix(path)
        if suffix == ".json" and path.is_file():
            return path.name != "trainer_state.json" and json_array_head(path)
        if suffix in (".log", ".txt", ".out") and path.is_file():
            return _table_in_text(path)
        if suffix in (".csv", ".tsv") and path.is_file():
            with open_text(path) as fh:
                first = next((ln for ln in (fh.readline() for _ in range(_MAX_COMMENTS)) if not _comment(ln)), "")
            header = next(csv.reader(io.StringIO(first), delimiter=_delimiter(first, suffix)), [])
            return step_column([h.strip() for h in header]) is not None
        if suffix == ".parquet" and path.is_file():
            import pyarrow.parquet as pq

            try:
                return step_column(pq.read_schema(path).names) is not None
            except (ValueError, OSError):  # no readable footer: claimed when it starts like Parquet, to list it
                with open(path, "rb") as fh:
                    return fh.read(4) == b"PAR1"
    except (OSError, ValueError, StopIteration, ImportError, RuntimeError, EOFError):
        return False
    return False


def _table_in_text(path: Path) -> bool:
    """True for a text log that is a table (a script that prints a header, then its rows).

    The first line is a tab- or comma-separated header with a step (or loss) column; the second a row of as
    many numbers.
    """
    with open_text(path) as fh:
        first, second = fh.readline(), fh.readline()
    if not first.strip() or ("\t" not in first and "," not in first):
        return False
    delim = _delimiter(first, ".txt")
    header = [h.strip() for h in first.rstrip("\r\n").split(delim)]
    cells = [c.strip() for c in second.rstrip("\r\n").split(delim)]
    if len(header) < 2 or len(cells) != len(header) or any(to_float(h) is not None for h in header):
        return False
    return all(to_float(c) is not None for c in cells) and step_column(header) is not None


_MAX_COMMENTS = 64
"""Lines read past ``#`` comment lines (an exporter's banner) to find a CSV's header (our choice)."""
_DELIMITERS = (",", "\t", ";", "|")
"""The delimiters a header is sniffed for, the first winning a tie (European-locale exports use ``;``)."""


def _comment(line: str) -> bool:
    """True for a ``#`` comment line or a blank line before the header (pandas/polars ``comment_prefix``)."""
    return not line.strip() or line.lstrip().startswith("#")


def _delimiter(first_line: str, suffix: str) -> str:
    """A tab for a TSV by suffix, else the delimiter of :data:`_DELIMITERS` the header holds most of (a comma)."""
    if suffix == ".tsv":
        return "\t"
    counts = [(first_line.count(d), -i, d) for i, d in enumerate(_DELIMITERS)]
    best = max(counts)
    return best[2] if best[0] else ","


def _columns(header: list[str], step_col: str, meta: dict[str, Any]) -> list[tuple[int, str] | None]:
    """For each column, ``(index, tag)`` when it holds a metric, else ``None``."""
    runs = set()
    out: list[tuple[int, str] | None] = []
    for i, h in enumerate(header):
        if metric_tag(h, step_col) is None:
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
    si = header.index(step_col) if step_col in header else None
    wi = next((header.index(w) for w in WALL_COLUMNS if w in header), None)
    names = {c[1]: metric(c[1], None)[0] for c in cols if c}
    xi = next((i for i, h in enumerate(header) if h.strip().lower() in SPLIT_KEYS), None)  # a train/val split
    segment, last = 0, None
    for row_no, (lineno, cells) in enumerate(table):
        step = to_float(cells[si]) if si is not None else float(row_no)
        if step is None or not math.isfinite(step):
            skipped.append(Skip(f"{rel}:{lineno}", f"no numeric {step_col!r} in this row"))
            continue
        s = int(step)
        if last is not None and s < last:
            segment += 1
        last = s
        wall = to_float(cells[wi]) if wi is not None else None
        pre = split_suffix(cells[xi]) if xi is not None else None  # a val row: val/<column>, like a val/ prefix
        for c in cols:
            if c is None:
                continue
            v = to_float(cells[c[0]])
            if v is None:
                continue
            tag = c[1] if pre is None else f"{pre[1:]}/{c[1]}"
            name = names.get(tag) or names.setdefault(tag, metric(tag, None)[0])
            rows.add(segment, s, name, v, tag, wall)
    meta["segments"] = segment + 1


def _read_csv(path: Path, rel: str, rows: Rows, meta: dict[str, Any], skipped: list[Skip]) -> None:
    data, cut = read_table_bytes(path)
    if cut:
        skipped.append(Skip(rel, cut))
    encoding = "utf-16" if data[:2] in UTF16_BOMS else "utf-8-sig"  # Excel's "Unicode text" export is UTF-16
    lines = data.decode(encoding, errors="replace").splitlines(keepends=True)
    del data
    if not lines:
        raise ParseError(rel, "empty CSV file")
    comments = [i for i, ln in enumerate(lines) if ln.lstrip().startswith("#")]
    for i in comments:  # kept as blank lines: the line numbers of the rows stay the file's
        lines[i] = "\n"
    if comments:
        meta["comment_lines"] = len(comments)
    first = next((ln for ln in lines if ln.strip()), "")
    delim = _delimiter(first, logical_suffix(path))
    if delim == ";":  # a semicolon table's numbers may use a decimal comma (``0,5``)
        lines = [ln.replace(",", ".") for ln in lines]
    reader = csv.reader(lines, delimiter=delim)
    header = [h.strip() for h in next((r for r in reader if r and any(c.strip() for c in r)), [])]
    step_col = step_column(header)
    if step_col is None:
        raise ParseError(rel, "no step column in the CSV header")
    table: list[tuple[int, list[str]]] = []
    first_skip = len(skipped)
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
            if torn and len(cells) != len(header):
                skipped.append(Skip(f"{rel}:{lineno}", "torn last line (the writer was killed mid-row)"))
                continue
            table.append((lineno, cells))
    except csv.Error as exc:
        skipped.append(Skip(f"{rel}:{reader.line_num}", f"unreadable CSV from here on: {exc}"))
    table = _aligned(table, len(header), rel, meta, skipped)
    skipped[first_skip:] = sorted(skipped[first_skip:], key=_line_of)
    meta["columns"] = header
    meta["step_column"] = step_col
    meta["step_axis"] = {"column": step_col, "kind": step_axis(step_col)}
    meta["kind"] = "wandb_export" if step_col in ("_step", "Step") else "lightning" if "epoch" in header \
        and step_col == "step" else "generic"
    _emit(rows, table, header, step_col, meta, skipped, rel)


def _line_of(skip: Skip) -> int:
    """The line number of a ``"<rel>:<line>"`` skip (0 when it names none)."""
    tail = skip.what.rpartition(":")[2]
    return int(tail) if tail.isdigit() else 0


def _aligned(table: list[tuple[int, list[str]]], width: int, rel: str, meta: dict[str, Any],
             skipped: list[Skip]) -> list[tuple[int, list[str]]]:
    r"""The rows with a writer's extra empty cells taken out, the other rows of the wrong width listed.

    A writer that joins an empty field (flair's ``loss.tsv`` writes ``TRAIN_LOSS\t\t_`` when it has no
    train metrics) gives every row ``k`` cells more than the header. When most rows have the same
    ``width + k`` cells and ``k`` positions are blank in every one of them, those positions are dropped
    (``meta["dropped_blank_cells"]``); else a row of another width is skipped with its line number.
    """
    widths: dict[int, int] = {}
    for _, cells in table:
        widths[len(cells)] = widths.get(len(cells), 0) + 1
    common = max(widths, key=lambda w: widths[w], default=width)
    blank: list[int] = []
    if common > width and 2 * widths[common] > len(table):
        rows = [cells for _, cells in table if len(cells) == common]
        blank = [i for i in range(common) if all(not c[i].strip() for c in rows)]
        blank = blank[:common - width] if len(blank) >= common - width else []
    out: list[tuple[int, list[str]]] = []
    for lineno, cells in table:
        if blank and len(cells) == common:
            drop = set(blank)
            cells = [c for i, c in enumerate(cells) if i not in drop]
        if len(cells) != width:
            skipped.append(Skip(f"{rel}:{lineno}", f"{len(cells)} cells for {width} columns"))
            continue
        out.append((lineno, cells))
    if blank:
        meta["dropped_blank_cells"] = blank
    return out


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _read_parquet(path: Path, rel: str, rows: Rows, meta: dict[str, Any], skipped: list[Skip]) -> None:
    import polars as pl

    try:
        df = pl.read_parquet(path)
    except (pl.exceptions.PolarsError, ValueError, OSError) as exc:
        raise ParseError(rel, f"damaged Parquet file, nothing read ({_one_line(str(exc))}); a file cut short "
                              "has no footer, and without it no row can be located") from None
    step_col = step_column(df.columns)
    if step_col is None:
        raise ParseError(rel, "no step column in the Parquet schema")
    header = df.columns
    table = []
    for i, rec in enumerate(df.iter_rows()):
        table.append((i + 1, ["" if v is None else repr(v) if isinstance(v, float) else str(v) for v in rec]))
    meta["columns"] = header
    meta["step_column"] = step_col
    meta["container"] = "parquet"
    meta["step_axis"] = {"column": step_col, "kind": step_axis(step_col)}
    meta["kind"] = "wandb_export" if step_col == "_step" else "generic"
    meta["null_values"] = int(sum(df.get_column(c).null_count() for c in header if metric_tag(c, step_col)))
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
    rel = file_policy.rel(path, root)
    rows = Rows(rel)
    meta: dict[str, Any] = {}
    skipped: list[Skip] = []
    try:
        suffix = logical_suffix(path)
        if suffix == ".parquet":
            _read_parquet(path, rel, rows, meta, skipped)
        elif suffix == ".json":
            read_json(path, rel, rows, meta, skipped)
        else:
            _read_csv(path, rel, rows, meta, skipped)
    except (OSError, csv.Error, EOFError) as exc:
        raise ParseError(rel, f"unreadable table: {exc}") from exc
    meta["framework"] = meta.get("kind", "generic")
    return ParseResult(format=FORMAT, path=rel, metrics=rows.metrics_table(), events=rows.events_table(),
                       meta=meta, skipped=tuple(skipped), precision="float64")
