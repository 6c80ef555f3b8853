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
import json
import math
import re
from pathlib import Path
from typing import Any

from forensics.errors import ParseError
from forensics.model import ParseResult, Skip
from parsers._io import STEP_KEY, logical_suffix, open_binary, open_text
from parsers.lines import Rows, metric

FORMAT = "csv"
STEP_COLUMNS = ("_step", "step", "Step", "global_step", "trainer/global_step", "iteration", "iter",
                "num_updates", "train/global_step", "global step", "current_steps", "current_step", "it", "steps",
                "train_step", "optimizer_step", "update", "updates", "s", "batch", "iterations")
"""Step columns, in priority order (compared exactly, then ignoring case and padding)."""
EPOCH_COLUMNS = ("epoch", "Epoch", "ep", "epochs")
"""Used as the step only when no step column exists (an epoch-indexed table, YOLOv5 ``results.csv``)."""
SAMPLE_COLUMNS = ("samples", "consumed_samples", "num_samples", "examples")
ROW_INDEX = "(row index)"
"""The step of a table with no step, epoch or sample column but a loss column: its row number (0-based)."""


def step_axis(col: str | None) -> str:
    """The kind of step axis a column names: ``optimizer_step``, ``epoch``, ``samples`` or ``row_index``."""
    if col is None or col == ROW_INDEX:
        return "row_index"
    low = col.lower()
    if low in EPOCH_COLUMNS:
        return "epoch"
    if low in SAMPLE_COLUMNS:
        return "samples"
    if low in ("batch", "micro_step", "micro_batch"):
        return "micro_batch"
    return "optimizer_step"


def _lossy_header(header: list[str]) -> bool:
    from forensics.schema import canonical_metric

    return any(canonical_metric(h).split("/")[0] in ("loss", "eval_loss", "ppl", "eval_ppl") for h in header)
_WALL = ("_timestamp", "timestamp", "wall_time")
_SKIP_COLS = {"_runtime", "_timestamp", "_wandb", "timestamp", "wall_time", "Wall time",
              "Relative Time (Process)"}


def _step_column(header: list[str], *, row_index: bool = True) -> str | None:
    """The step column of a header by rule: a step name, else an epoch or sample count, else the row index.

    The row index (:data:`ROW_INDEX`) is taken only when ``row_index`` and a column is a loss by name. A
    step column the user named (``forensics.toml`` ``step_key``) wins when the header has it.
    """
    user = STEP_KEY.get()
    if user and user in header:
        return user
    for names in (STEP_COLUMNS, EPOCH_COLUMNS, SAMPLE_COLUMNS):
        for name in names:
            if name in header:
                return name
        low = {h.strip().lower(): h for h in header}
        for name in names:
            if name.lower() in low:
                return low[name.lower()]
    if row_index and _lossy_header(header):
        return ROW_INDEX
    return None


_JSON_HEAD = 1 << 16
_ELEMENT = re.compile(r"[\[,]\s*(?=\{)")  # where the next element of an array of objects may start
_JSON_NUM = {"nan": math.nan, "+nan": math.nan, "-nan": math.nan, "inf": math.inf, "+inf": math.inf,
             "-inf": -math.inf, "infinity": math.inf, "+infinity": math.inf, "-infinity": -math.inf}


def _json_array_head(path: Path) -> bool:
    """True for a JSON history export (an array of rows, or pandas' column layout) with a step key.

    Rows: ``[{"_step": 0, ...}, ...]``; columns (pandas' default ``to_json()``):
    ``{"_step": {"0": 0, ...}, "loss": {...}}``.
    """
    with open_binary(path) as fh:
        head = fh.read(_JSON_HEAD).decode("utf-8-sig", errors="replace").lstrip()
    if head.startswith("{"):
        keys = "|".join(map(re.escape, STEP_COLUMNS))
        return re.search(rf'"(?:{keys})"\s*:\s*\{{', head) is not None
    if not head.startswith("["):
        return False
    rest = head[1:].lstrip()
    if not rest.startswith("{"):
        return False
    try:
        first, _ = json.JSONDecoder().raw_decode(rest)
    except ValueError:  # an element longer than the head: look for a step key in the head
        return any(f'"{k}"' in rest for k in STEP_COLUMNS)
    return isinstance(first, dict) and _step_column(list(first)) is not None


def sniff(path: Path) -> bool:
    """True for a ``.csv`` whose header has a step-like column, such a ``.parquet``, or a JSON array export.

    A ``.json`` file is claimed when it is an array whose first element is an object with a step key
    (``_step``, ``step``, ...). Never raises.
    """
    try:
        suffix = logical_suffix(path)
        if suffix == ".json" and path.is_file():
            return path.name != "trainer_state.json" and _json_array_head(path)
        if suffix in (".log", ".txt", ".out") and path.is_file():
            return _table_in_text(path)
        if suffix in (".csv", ".tsv") and path.is_file():
            with open_text(path) as fh:
                first = fh.readline()
            header = next(csv.reader(io.StringIO(first), delimiter=_delimiter(first, suffix)), [])
            return _step_column([h.strip() for h in header]) is not None
        if suffix == ".parquet" and path.is_file():
            import pyarrow.parquet as pq

            try:
                return _step_column(pq.read_schema(path).names) is not None
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
    if len(header) < 2 or len(cells) != len(header) or any(_to_float(h) is not None for h in header):
        return False
    return all(_to_float(c) is not None for c in cells) and _step_column(header) is not None


def _delimiter(first_line: str, suffix: str) -> str:
    """A tab for a TSV (by suffix, or a header with tabs and no commas), else a comma."""
    if suffix == ".tsv" or ("\t" in first_line and "," not in first_line):
        return "\t"
    return ","


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


def _metric_tag(h: str, step_col: str | None) -> str | None:
    """The tag of a column that holds a metric; ``None`` for the step, wall-time and W&B-internal columns."""
    internal = h.startswith("_") and h != "_step"
    if h == step_col or h in _SKIP_COLS or internal or h.endswith(("__MIN", "__MAX")):
        return None
    return h


def _columns(header: list[str], step_col: str, meta: dict[str, Any]) -> list[tuple[int, str] | None]:
    """For each column, ``(index, tag)`` when it holds a metric, else ``None``."""
    runs = set()
    out: list[tuple[int, str] | None] = []
    for i, h in enumerate(header):
        if _metric_tag(h, step_col) is None:
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
    wi = next((header.index(w) for w in _WALL if w in header), None)
    names = {c[1]: metric(c[1], None)[0] for c in cols if c}
    segment, last = 0, None
    for row_no, (lineno, cells) in enumerate(table):
        step = _to_float(cells[si]) if si is not None else float(row_no)
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
    reader = csv.reader(lines, delimiter=_delimiter(lines[0], logical_suffix(path)))
    header = [h.strip() for h in next(reader)]
    step_col = _step_column(header)
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
    meta["step_axis"] = {"column": step_col, "kind": step_axis(step_col)}
    meta["kind"] = "wandb_export" if step_col == "_step" else "generic"
    meta["null_values"] = int(sum(df.get_column(c).null_count() for c in header if _metric_tag(c, step_col)))
    _emit(rows, table, header, step_col, meta, skipped, rel)


def _json_value(v: Any) -> float | None:
    """A JSON cell as float: numbers, NaN/Infinity tokens and their string spellings; else ``None``."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        try:
            return float(v)
        except OverflowError:
            return math.inf if v > 0 else -math.inf
    if isinstance(v, str) and len(v) <= 40:
        t = v.strip().lower()
        if t in _JSON_NUM:
            return _JSON_NUM[t]
        try:
            return float(t)
        except ValueError:
            return None
    return None


def _json_elements(text: str, rel: str, skipped: list[Skip]) -> list[tuple[int, Any]]:
    """The elements of a JSON array, decoded one by one; damage is listed and skipped.

    Args:
        text: The whole file, starting (after white space) with ``[``.
        rel: The file's path for ``Skip.what`` (``"<rel>:<line>"``).
        skipped: Damage is appended here.

    Returns:
        ``(line number, element)`` of every element that decodes.
    """
    dec = json.JSONDecoder()
    out: list[tuple[int, Any]] = []
    n, i = len(text), text.index("[") + 1
    line, at = 1, 0

    def lineno(j: int) -> int:
        nonlocal line, at
        line += text.count("\n", at, j)
        at = j
        return line

    while True:
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i >= n:
            skipped.append(Skip(f"{rel}:{lineno(n)}", "the array is not closed (file cut short?); the rows "
                                                      "before are kept"))
            return out
        if text[i] == "]":
            if text[i + 1:].strip():
                skipped.append(Skip(f"{rel}:{lineno(i)}", "text after the end of the array ignored"))
            return out
        start = i
        try:
            obj, i = dec.raw_decode(text, i)
        except (ValueError, RecursionError) as exc:
            why = f"undecodable element ({getattr(exc, 'msg', exc)})"
        else:
            out.append((lineno(start), obj))
            while i < n and text[i] in " \t\r\n":
                i += 1
            if i < n and text[i] == ",":
                i += 1
                continue
            if i >= n or text[i] == "]":
                continue
            start, why = i, "no ',' between two elements"
            if text[i] == "{":
                skipped.append(Skip(f"{rel}:{lineno(i)}", f"{why}; read on"))
                continue
        m = _ELEMENT.search(text, start + 1)
        if m is None:
            skipped.append(Skip(f"{rel}:{lineno(start)}", f"{why}; the file ends inside it (cut short?): "
                                                          "dropped"))
            return out
        where = lineno(start)
        skipped.append(Skip(f"{rel}:{where}", f"{why}; skipped to the next element at line {lineno(m.end())}"))
        i = m.end()


def _json_columns(text: str, rel: str) -> list[tuple[int, Any]]:
    """Rows of pandas' column-oriented JSON (``{column: {row label: value}}``), in row-label order.

    Raises:
        ParseError: The object does not decode (a cut file: its columns follow one another, so no row
            is complete before the end) or is not column-oriented.
    """
    try:
        cols = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ParseError(rel, f"damaged column-oriented JSON export ({getattr(exc, 'msg', exc)}): no complete "
                              "row can be recovered from a cut one") from None
    if not isinstance(cols, dict) or not all(isinstance(v, dict) for v in cols.values()):
        raise ParseError(rel, "a JSON object that is not a column-oriented table")
    labels = list(dict.fromkeys(k for v in cols.values() for k in v))
    order = sorted(labels, key=lambda k: (0, int(k)) if k.lstrip("-").isdigit() else (1, k))
    return [(1, {c: v[k] for c, v in cols.items() if k in v}) for k in order]


def _read_json(path: Path, rel: str, rows: Rows, meta: dict[str, Any], skipped: list[Skip]) -> None:
    with open_binary(path) as fh:
        text = fh.read().decode("utf-8-sig", errors="replace")
    if text.lstrip().startswith("{"):
        elements = _json_columns(text, rel)
        meta["layout"] = "columns"
    elif not text.lstrip().startswith("["):
        raise ParseError(rel, "not a JSON array of rows")
    else:
        elements = _json_elements(text, rel, skipped)
    keys: dict[str, None] = {}
    records = 0
    nulls = 0
    segment, last = 0, None
    dicts = [o for _, o in elements if isinstance(o, dict)]
    by_row = bool(dicts) and all(_step_column(list(o), row_index=False) is None for o in dicts) and any(
        _step_column(list(o)) == ROW_INDEX for o in dicts)
    row_no = -1
    for lineno, obj in elements:
        if not isinstance(obj, dict):
            skipped.append(Skip(f"{rel}:{lineno}", f"array element is a {type(obj).__name__}, not an object"))
            continue
        row_no += 1
        step_col = ROW_INDEX if by_row else _step_column(list(obj), row_index=False)
        step = float(row_no) if by_row else _json_value(obj.get(step_col)) if step_col else None
        if step is None or not math.isfinite(step) or abs(step) >= 2.0 ** 63:
            skipped.append(Skip(f"{rel}:{lineno}", "row without a numeric step"))
            continue
        s = int(step)
        if last is not None and s < last:
            segment += 1
        last = s
        records += 1
        wall = next((_json_value(obj[w]) for w in _WALL if w in obj), None)
        for key, v in obj.items():
            keys.setdefault(key, None)
            tag = _metric_tag(key, step_col)
            if tag is None:
                continue
            if v is None:
                nulls += 1
                continue
            x = _json_value(v)
            if x is not None:
                rows.add(segment, s, metric(tag, None)[0], x, tag, wall)
    if not records and not skipped:
        raise ParseError(rel, "no rows in the JSON array")
    header = list(keys)
    meta["columns"] = header
    meta["step_column"] = ROW_INDEX if by_row else _step_column(header, row_index=False)
    meta["step_axis"] = {"column": meta["step_column"], "kind": step_axis(meta["step_column"])}
    meta["container"] = "json"
    meta["records"] = records
    meta["null_values"] = nulls
    meta["kind"] = "wandb_export" if "_step" in keys else "generic"
    meta["segments"] = segment + 1


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
        suffix = logical_suffix(path)
        if suffix == ".parquet":
            _read_parquet(path, rel, rows, meta, skipped)
        elif suffix == ".json":
            _read_json(path, rel, rows, meta, skipped)
        else:
            _read_csv(path, rel, rows, meta, skipped)
    except (OSError, csv.Error, EOFError) as exc:
        raise ParseError(rel, f"unreadable table: {exc}") from exc
    meta["framework"] = meta.get("kind", "generic")
    return ParseResult(format=FORMAT, path=rel, metrics=rows.metrics_table(), events=rows.events_table(),
                       meta=meta, skipped=tuple(skipped), precision="float64")
