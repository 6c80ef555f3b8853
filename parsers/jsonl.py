"""Generic JSONL metric logs: one JSON object per line (``formats.md`` section 5.3).

Parsed with the stdlib ``json`` (it accepts ``NaN``/``Infinity``). Nested objects are flattened with
``/``; booleans become 0/1; strings and lists are not metrics. A record that names a module, layer,
name or tensor (``{"step": 1, "module": "enc.wo", "absmax": 4.6e4}``) gets that string as a metric
suffix (``absmax/enc.wo``). A half-written last line is dropped and reported; bad lines in the middle
are skipped and reported by line number. A step that goes back (an appended resume) starts a new
local segment.
"""

from __future__ import annotations

import gzip
import json
import math
from array import array
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from forensics.model import ParseResult, Skip
from forensics.schema import METRICS_SCHEMA, canonical_metric

FORMAT = "jsonl"
STEP_KEYS = ("step", "global_step", "iteration", "iter", "_step", "num_updates", "it")
"""Keys that hold the step, in priority order (the first present in a record wins)."""
TIME_KEYS = ("wall_time", "time", "timestamp", "_timestamp")
"""Keys read as the wall time (s since epoch; ms when > 1e11; ISO-8601 strings accepted)."""
NAME_KEYS = ("module", "layer", "tensor", "param")  # not "name": often the run name
"""String fields that name what a per-module record is about; they become a metric suffix."""
_NOT_METRIC_FILES = {"trainer_state.json", "expected.json"}
_MAX_REPORTED = 20  # bad lines reported one by one; the rest are summarised in one Skip


def _first_line(path: Path, limit: int = 1 << 16) -> str | None:
    """The first non-empty line (at most ``limit`` bytes read), or None."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as fh:
        head = fh.read(limit)
    for line in head.splitlines():
        if line.strip():
            return line.decode("utf-8", "replace")
    return None


def sniff(path: Path) -> bool:
    """True for a JSON-lines metric log (by name and first line; never raises).

    ``*.jsonl``, ``*.jsonl.gz`` and ``*.ndjson`` always; a ``.json`` or ``.log`` file when its first
    non-empty line is a JSON object with a step key; never ``trainer_state.json`` or ``expected.json``.
    """
    name = path.name.lower()
    if name in _NOT_METRIC_FILES:
        return False
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        return True
    if not name.endswith((".json", ".log")):
        return False
    try:
        line = _first_line(path)
        line = (line or "").lstrip("\ufeff \t")
        obj = json.loads(line) if line.startswith("{") else None
    except (OSError, ValueError, EOFError):
        return False
    return isinstance(obj, dict) and any(k in obj for k in STEP_KEYS)


def _flatten(obj: dict, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            _flatten(v, f"{key}/", out)
        else:
            out[key] = v
    return out


def _as_step(v: Any) -> int | None:
    """An integer step (int, integral float, digit string) within int64, else None."""
    if isinstance(v, float) and math.isfinite(v) and v == int(v):
        v = int(v)
    elif isinstance(v, str) and v.strip().lstrip("-").isdigit():
        v = int(v)
    if isinstance(v, int) and not isinstance(v, bool) and -(1 << 63) <= v < 1 << 63:
        return v
    return None


_NUM_TEXT = {"nan": math.nan, "+nan": math.nan, "-nan": math.nan, "inf": math.inf, "+inf": math.inf,
             "-inf": -math.inf, "infinity": math.inf, "+infinity": math.inf, "-infinity": -math.inf}


def _number_text(v: str) -> float | None:
    """A float from a numeric string ("4.3", "1e-5", "NaN", "-Infinity"), else None."""
    t = v.strip()
    if not t or len(t) > 40:
        return None
    low = t.lower()
    if low in _NUM_TEXT:
        return _NUM_TEXT[low]
    try:
        return float(t.replace("_", "x"))  # "1_000" is not a logged number
    except ValueError:
        return None


def _float(v: int | float) -> float:
    try:
        return float(v)
    except OverflowError:  # an integer beyond float range
        return math.inf if v > 0 else -math.inf


def _as_time(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 1e8:
        return v / 1000.0 if v > 1e11 else float(v)
    if isinstance(v, str):
        try:
            dt = datetime.fromisoformat(v.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
        return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()
    return None


class _Reader:
    """Streaming state: columns, segment bookkeeping and damage for one file."""

    def __init__(self, rel: str) -> None:
        self.rel = rel
        self.tags: list[str] = []
        self.tag_index: dict[str, int] = {}
        self.col_tag, self.col_step = array("i"), array("q")
        self.col_val, self.col_wall = array("d"), array("d")  # NaN wall time = none logged
        self.nulls: list[int] = []  # row indices whose value is JSON null
        self.records = 0
        self.non_numeric: dict[str, int] = {}  # key -> values that were text but not a number
        self.step_key: str | None = None
        self.seg_starts = [0]  # row index at which each local segment starts
        self.seg_max: int | None = None  # highest step in the current segment
        self.at_max: set[int] = set()  # tag ids logged at ``seg_max`` in the current segment
        self.indexed: _Reader | None = None  # records numbered 0, 1, ... while no step key has been seen
        self.bad: list[Skip] = []
        self.n_bad = 0
        self.no_step = 0

    def tag_id(self, tag: str) -> int:
        ti = self.tag_index.get(tag)
        if ti is None:
            ti = self.tag_index[tag] = len(self.tags)
            self.tags.append(tag)
        return ti

    def skip(self, line_no: int, reason: str) -> None:
        self.n_bad += 1
        if len(self.bad) < _MAX_REPORTED:
            self.bad.append(Skip(f"{self.rel}:{line_no}", reason))

    def record(self, obj: dict[str, Any], line_no: int) -> None:
        """Add one parsed JSON object (``line_no`` is 1-based, for messages)."""
        step_key = next((k for k in STEP_KEYS if k in obj and _as_step(obj[k]) is not None), None)
        if step_key is None:
            self.no_step += 1
            if self.step_key is None:  # kept only if the whole file turns out to have no step key
                self.indexed = self.indexed or _Reader(self.rel)
                self.indexed.emit(obj, self.indexed.records, None)
            return
        if self.step_key is None:
            self.step_key, self.indexed = step_key, None
        self.emit(obj, _as_step(obj[step_key]), step_key)

    def emit(self, obj: dict[str, Any], step: int, step_key: str | None) -> None:
        flat = _flatten(obj, "", {})
        wall = next((w for k in TIME_KEYS if k in flat and (w := _as_time(flat[k])) is not None), None)
        suffix = next((v for k in NAME_KEYS if isinstance(v := flat.get(k), str) and v), None)
        rows: list[tuple[int, float | None]] = []
        for key, v in flat.items():
            if key == step_key or (key in TIME_KEYS and wall is not None and _as_time(v) == wall):
                continue
            if isinstance(v, bool):
                v = float(v)
            elif isinstance(v, str) and key not in NAME_KEYS:
                num = _number_text(v)
                if num is None:
                    self.non_numeric[key] = self.non_numeric.get(key, 0) + 1
                    continue
                v = num  # numbers logged as text ("4.3", "NaN"), e.g. metaseq/fairseq json logs
            elif v is not None and not isinstance(v, (int, float)):
                continue
            rows.append((self.tag_id(f"{key}/{suffix}" if suffix else key), None if v is None else _float(v)))
        self.records += 1
        if not rows:
            return
        # a step that goes back, or repeats a metric already logged at the highest step, is a resume
        if self.seg_max is not None and (step < self.seg_max or (
                step == self.seg_max and any(ti in self.at_max for ti, _ in rows))):
            self.seg_starts.append(len(self.col_step))
            self.seg_max, self.at_max = None, set()
        if self.seg_max is None or step > self.seg_max:
            self.seg_max, self.at_max = step, set()
        for ti, v in rows:
            if step == self.seg_max:
                self.at_max.add(ti)
            if v is None:
                self.nulls.append(len(self.col_step))
            self.col_tag.append(ti)
            self.col_step.append(step)
            self.col_val.append(math.nan if v is None else v)
            self.col_wall.append(math.nan if wall is None else wall)

    def table(self) -> pa.Table:
        n = len(self.col_step)
        idx = pa.array(self.col_tag, pa.int32())
        zeros = pa.array(np.zeros(n, np.int32))
        seg_of_row = np.searchsorted(np.asarray(self.seg_starts[1:], np.int64), np.arange(n), side="right")
        vals, walls = np.array(self.col_val, np.float64), np.array(self.col_wall, np.float64)
        null_mask = np.zeros(n, bool)
        null_mask[self.nulls] = True
        return pa.Table.from_arrays(
            [pc.take(pa.array([""]), zeros), pa.array(seg_of_row.astype(np.int32), pa.int32()),
             pa.array(self.col_step, pa.int64()),
             pc.take(pa.array([canonical_metric(t) for t in self.tags], pa.string()), idx),
             pa.array(vals, pa.float64(), mask=null_mask),
             pa.array(walls, pa.float64(), mask=np.isnan(walls)),
             pc.take(pa.array(self.tags, pa.string()), idx), pc.take(pa.array([self.rel]), zeros)],
            schema=METRICS_SCHEMA)


def read(path: Path, root: Path) -> ParseResult:
    """Read every numeric field of a JSONL metric log.

    Args:
        path: The ``.jsonl`` (``.jsonl.gz``, ``.ndjson``, or JSON-lines ``.json``/``.log``) file.
        root: The run folder; ``source`` columns and ``Skip.what`` are relative to it.

    Returns:
        One metrics row per (line, numeric field): ``value`` float64 as logged (NaN/inf kept, JSON
        ``null`` -> null), ``wall_time`` s since epoch when the record has one (else null), ``tag`` the
        flattened key (``a/b`` for nested; ``key/<module>`` for per-module records), local ``segment``
        (a new one when the step goes back, or repeats a metric already logged at the highest step).
        ``meta``: ``step_key``, ``records``, ``bad_lines``, ``lines_without_step``, and
        ``step_source = "line index"`` when the file has no step key at all (steps are then 0, 1, ...).
        ``skipped``: ``"<rel>:<line>"`` per bad line (the first 20, then a summary).
    """
    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
    rd = _Reader(rel)
    skipped: list[Skip] = []
    opener = gzip.open if path.name.endswith(".gz") else open
    line_no, last = 0, None
    try:
        with opener(path, "rb") as fh:
            for line_no, raw in enumerate(fh, 1):
                if not raw.strip():
                    continue
                if last is not None:
                    _parse(rd, *last)
                last = (line_no, raw, raw.endswith(b"\n"))
    except (EOFError, OSError) as exc:  # a gzip stream cut short, or unreadable mid-way
        skipped.append(Skip(f"{rel}:{line_no}", f"file ends abruptly ({exc}); earlier lines kept"))
    if last is not None:
        _parse(rd, *last, final=True)
    meta: dict[str, Any] = {"records": rd.records, "bad_lines": rd.n_bad, "lines_without_step": 0}
    table = rd.table()
    if rd.step_key is None and rd.indexed is not None:
        table = rd.indexed.table()
        meta.update(records=rd.indexed.records, step_source="line index (the file has no step key)")
    elif rd.no_step:
        meta["lines_without_step"] = rd.no_step
        keys = ", ".join(STEP_KEYS)
        skipped.append(Skip(rel, f"{rd.no_step} record(s) without a step key ({keys}) ignored"))
    meta["step_key"] = rd.step_key
    # text in a key that is numeric elsewhere is a lost value; text-only keys are labels (run names...)
    lost = {k: n for k, n in rd.non_numeric.items() if k in rd.tag_index}
    if lost:
        meta["non_numeric_values"] = dict(lost)
        worst = ", ".join(f"{k} ({n})" for k, n in sorted(lost.items(), key=lambda kv: -kv[1])[:5])
        skipped.append(Skip(rel, f"text values that are not numbers were not read as metrics: {worst}"))
    if rd.n_bad > len(rd.bad):
        rd.bad.append(Skip(rel, f"{rd.n_bad - len(rd.bad)} more bad line(s) not listed"))
    return ParseResult(format=FORMAT, path=rel, metrics=table, meta=meta,
                       skipped=tuple(rd.bad + skipped), precision="float64")


def _parse(rd: _Reader, line_no: int, raw: bytes, has_newline: bool, final: bool = False) -> None:
    text = raw.strip()
    if not text:
        return
    try:
        obj = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        if final and not has_newline:
            rd.bad.append(Skip(f"{rd.rel}:{line_no}", "half-written last line dropped (killed job?)"))
        else:
            rd.skip(line_no, f"not valid JSON ({str(exc).split(':')[0]}); line skipped")
        return
    if not isinstance(obj, dict):
        rd.skip(line_no, f"a JSON {type(obj).__name__}, not an object; line skipped")
        return
    rd.record(obj, line_no)
