"""JSON history exports: a ``.json`` file holding one array of row objects (or pandas' column layout).

``json.dump(list(run.scan_history()), f)``, ``run.history().to_json(orient="records")`` (pandas writes
NaN as ``null``) and the like, e.g. ``[{"_step": 0, "_runtime": 1.2, "_timestamp": 1.7e9, "loss": 2.3},
...]``, with the same columns as the CSV export (:mod:`parsers._table_header` rules). Elements are
decoded one by one: a damaged or cut element is listed with its line and the reader resumes at the
next element, so every complete row is kept. Read through :mod:`parsers.csv_metrics`.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from forensics.errors import ParseError
from forensics.model import Skip
from parsers._io import open_binary, read_table_bytes
from parsers._table_header import ROW_INDEX, STEP_COLUMNS, WALL_COLUMNS, metric_tag, step_axis, step_column
from parsers.lines import Rows, metric

_JSON_HEAD = 1 << 16
_ELEMENT = re.compile(r"[\[,]\s*(?=\{)")  # where the next element of an array of objects may start
_JSON_NUM = {"nan": math.nan, "+nan": math.nan, "-nan": math.nan, "inf": math.inf, "+inf": math.inf,
             "-inf": -math.inf, "infinity": math.inf, "+infinity": math.inf, "-infinity": -math.inf}


def json_array_head(path: Path) -> bool:
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
    return isinstance(first, dict) and step_column(list(first)) is not None


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


def _elements(path: Path, rel: str, meta: dict[str, Any], skipped: list[Skip]) -> list[tuple[int, Any]]:
    """``(line, element)`` of the rows of the export (pandas' column layout turned into rows).

    Raises:
        ParseError: Neither an array nor the column layout.
    """
    data, cut = read_table_bytes(path)
    if cut:
        skipped.append(Skip(rel, cut))
    text = data.decode("utf-8-sig", errors="replace")
    del data
    if text.lstrip().startswith("{"):
        meta["layout"] = "columns"
        return _json_columns(text, rel)
    if not text.lstrip().startswith("["):
        raise ParseError(rel, "not a JSON array of rows")
    return _json_elements(text, rel, skipped)


def read_json(path: Path, rel: str, rows: Rows, meta: dict[str, Any], skipped: list[Skip]) -> None:
    """Read the rows of a JSON history export into ``rows``; damaged elements go to ``skipped``.

    Raises:
        ParseError: Not a JSON array of rows (nor the column layout), or an array without a row.
    """
    elements = _elements(path, rel, meta, skipped)
    keys: dict[str, None] = {}
    records = 0
    nulls = 0
    segment, last = 0, None
    dicts = [o for _, o in elements if isinstance(o, dict)]
    by_row = bool(dicts) and all(step_column(list(o), row_index=False) is None for o in dicts) and any(
        step_column(list(o)) == ROW_INDEX for o in dicts)
    row_no = -1
    for lineno, obj in elements:
        if not isinstance(obj, dict):
            skipped.append(Skip(f"{rel}:{lineno}", f"array element is a {type(obj).__name__}, not an object"))
            continue
        row_no += 1
        step_col = ROW_INDEX if by_row else step_column(list(obj), row_index=False)
        step = float(row_no) if by_row else _json_value(obj.get(step_col)) if step_col else None
        if step is None or not math.isfinite(step) or abs(step) >= 2.0 ** 63:
            skipped.append(Skip(f"{rel}:{lineno}", "row without a numeric step"))
            continue
        s = int(step)
        if last is not None and s < last:
            segment += 1
        last = s
        records += 1
        wall = next((_json_value(obj[w]) for w in WALL_COLUMNS if w in obj), None)
        for key, v in obj.items():
            keys.setdefault(key, None)
            tag = metric_tag(key, step_col)
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
    meta["step_column"] = ROW_INDEX if by_row else step_column(header, row_index=False)
    meta["step_axis"] = {"column": meta["step_column"], "kind": step_axis(meta["step_column"])}
    meta["container"] = "json"
    meta["records"] = records
    meta["null_values"] = nulls
    meta["kind"] = "wandb_export" if "_step" in keys else "generic"
    meta["segments"] = segment + 1
