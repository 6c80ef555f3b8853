"""Generic JSONL metric logs: one JSON object per line (``formats.md`` section 5.3).

Nested objects are flattened with ``/``; booleans become 0/1; strings and lists are not metrics. A record
that names a module, layer, name or tensor (``{"step": 1, "module": "enc.wo", "absmax": 4.6e4}``) gets
that string as a metric suffix (``absmax/enc.wo``). A half-written last line is dropped and reported;
bad lines in the middle are skipped and reported by line number. A step that goes back (an appended
resume) starts a new local segment. W&B-style ``_runtime`` (seconds since the run started) is wall
time, not a metric: it never becomes a row, and gives ``wall_time`` (run start + ``_runtime``) to
records that have no ``_timestamp`` once one record has shown both.

Two engines give the same table:

- ``"python"``: each line through the stdlib ``json`` (it accepts ``NaN``/``Infinity``).
- ``"auto"`` (the default): the file is streamed in blocks of whole lines (:data:`CHUNK_BYTES`). The
  lines that are plain JSON objects go to ``polars.read_ndjson`` in one call per block (with the schema
  of the blocks before, else inferred); a worker thread reads block i + 1 while block i is converted.
  The lines polars cannot read exactly go through the per-line path: ``NaN``/``Infinity`` tokens
  (polars rejects them), ``null`` (polars cannot tell it from a missing key), lone-surrogate escapes,
  invalid UTF-8, anything that does not start with ``{`` and end with ``}`` (garbage, a BOM, the cut
  last line), a row with fewer keys than its line (duplicate keys, keys polars did not expect: checked
  by counting ``:``), a string that may be a value polars coerced to text, and types polars widens
  (integers beyond int64). A block that polars refuses is read again with all rows as schema sample,
  then halved until the pieces read; pieces of at most 32 lines go through the per-line path.

Row order (both engines): by line, then, within a line, by the order in which each key first gave a
row in the file (ties by its position in that line). Step, wall time, suffix and segment rules are
applied once, on arrays, to the records of both engines.
"""

from __future__ import annotations

import itertools
import json
import math
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from polars.exceptions import PanicException

from forensics.model import ParseResult, Skip
from forensics.schema import METRICS_SCHEMA, canonical_metric
from parsers._io import open_binary

FORMAT = "jsonl"
STEP_KEYS = ("step", "global_step", "iteration", "iter", "_step", "num_updates", "it")
"""Keys that hold the step, in priority order (the first present in a record wins)."""
TIME_KEYS = ("wall_time", "time", "timestamp", "_timestamp")
"""Keys read as the wall time (s since epoch; ms when > 1e11; ISO-8601 strings accepted)."""
RUNTIME_KEYS = ("_runtime", "_wandb/runtime")
"""Seconds since the run started (W&B): never metric rows; run start + runtime is a fallback wall time."""
NAME_KEYS = ("module", "layer", "tensor", "param")  # not "name": often the run name
"""String fields that name what a per-module record is about; they become a metric suffix."""
_RUNTIME_SET = frozenset(RUNTIME_KEYS)
_SPECIAL_KEYS = frozenset(TIME_KEYS) | _RUNTIME_SET
ENGINES = ("auto", "python")
CHUNK_BYTES = 16 << 20
"""Bytes of whole lines read and parsed at a time by the ``"auto"`` engine (memory stays bounded)."""
_NOT_METRIC_FILES = {"trainer_state.json", "expected.json"}
_MAX_REPORTED = 20  # bad lines reported one by one; the rest are summarised in one Skip
# lines polars cannot read exactly, by their first byte: NaN/Infinity (refused), lone surrogates (misread);
# a null polars reads as a missing key, which the key count then finds
_PER_LINE = ((b"N", (b"NaN",)), (b"I", (b"Infinity",)), (b"\\", (b"\\ud", b"\\uD")))
_SMALLEST_PIECE = 32  # a rejected piece of at most this many lines goes through the per-line path
_EXACT_INT = float(1 << 53)


def _first_line(path: Path, limit: int = 1 << 16) -> str | None:
    """The first non-empty line (at most ``limit`` bytes read), or None."""
    with open_binary(path) as fh:
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
        try:
            v = int(v)
        except ValueError:  # "²" is a digit to str.isdigit, "--5" strips to digits
            return None
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


def _as_runtime(v: Any) -> float:
    """Seconds since the run started, or NaN when ``v`` is not a finite number."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        f = _float(v)
        return f if math.isfinite(f) else math.nan
    return math.nan


# -- file state and output streams --------------------------------------------------------------------


class _Stream:
    """The rows of one output table: one Arrow record batch per block, segments carried across blocks."""

    def __init__(self) -> None:
        self.batches: list[pa.RecordBatch] = []
        self.records = 0
        self.non_numeric: dict[str, int] = {}
        self.used_tags = np.zeros(0, bool)
        self.segments = _Segmenter()

    def add(self, st: _State, cols: tuple[np.ndarray, ...], non_numeric: dict[str, int]) -> None:
        """Append one block's rows, grouped by record in line order.

        Args:
            st: The file state (tag names).
            cols: Per record: ``step`` int64, ``counts`` int64 (its rows), then per row: ``tag`` int32,
                ``value`` float64, ``null`` bool or None, then per record: ``wall`` float64 (NaN: none).
            non_numeric: key -> text values that were not numbers, in this block.
        """
        for k, c in non_numeric.items():
            self.non_numeric[k] = self.non_numeric.get(k, 0) + c
        rec_step, counts, tag, val, null, rec_wall = cols
        n = len(tag)
        if not n:
            return
        used = np.bincount(tag) > 0
        if len(used) > len(self.used_tags):
            self.used_tags = np.concatenate([self.used_tags, np.zeros(len(used) - len(self.used_tags), bool)])
        self.used_tags[:len(used)] |= used
        has_rows = counts > 0
        if not has_rows.all():
            rec_step, counts, rec_wall = rec_step[has_rows], counts[has_rows], rec_wall[has_rows]
        seg = self.segments(rec_step, counts, tag)
        step, wall = np.repeat(rec_step, counts), np.repeat(rec_wall, counts)
        names, metrics = st.tag_arrays()
        idx = pa.array(tag, pa.int32())
        missing = np.isnan(wall)
        self.batches.append(pa.RecordBatch.from_arrays(
            [_constant(n, ""), pa.array(seg, pa.int32()), pa.array(step, pa.int64()), pc.take(metrics, idx),
             pa.array(val, pa.float64(), mask=null),
             pa.array(wall, pa.float64(), mask=missing if missing.any() else None),
             pc.take(names, idx), _constant(n, st.rel)], schema=METRICS_SCHEMA))

    def table(self) -> pa.Table:
        """The long metrics table (METRICS_SCHEMA), one chunk per block."""
        batches, self.batches = self.batches, []
        return pa.Table.from_batches(batches, schema=METRICS_SCHEMA)


class _Segmenter:
    """Local segments of one stream's records, block by block.

    A record starts a new segment when its step is below the previous record's, or equals it and logs
    a tag already logged at that step since the segment began (an appended resume). Records without
    rows take no part. Vectorised; only runs of equal steps that repeat a tag are walked in Python.
    """

    def __init__(self) -> None:
        self.last: int | None = None  # step of the last record so far
        self.tags: set[int] = set()  # tags logged at that step since the current segment began
        self.seg = 0

    def __call__(self, s: np.ndarray, counts: np.ndarray, tag: np.ndarray) -> np.ndarray:
        """int32 segment per row, from int64 step and row count (> 0) per record and int32 tag per row."""
        first = np.cumsum(counts) - counts
        brk, same = np.zeros(len(s), bool), np.zeros(len(s), bool)
        brk[1:], same[1:] = s[1:] < s[:-1], s[1:] == s[:-1]
        if self.last is not None:
            brk[0], same[0] = s[0] < self.last, s[0] == self.last
        new_run = ~same
        new_run[0] = True
        bounds = np.r_[np.flatnonzero(new_run), len(s)]  # runs of records at one step
        run = np.cumsum(new_run) - 1
        walk = {0} if same[0] else set()  # run 0 continues the last block's run
        multi = same.copy()
        multi[:-1] |= same[1:]
        if multi[1:].any():
            row_rec = np.repeat(np.arange(len(s)), counts)
            sel = multi[row_rec]
            width = int(tag.max()) + 1
            combo = np.sort(run[row_rec[sel]].astype(np.int64) * width + tag[sel])
            walk.update(np.unique(combo[1:][combo[1:] == combo[:-1]] // width).tolist())
        last_run = len(bounds) - 2
        final: set[int] | None = None
        for r in sorted(walk):
            seen = set(self.tags) if r == 0 and same[0] else set()
            for ri in range(int(bounds[r]), int(bounds[r + 1])):
                tags = set(tag[first[ri]:first[ri] + counts[ri]].tolist())
                if seen & tags:
                    brk[ri], seen = True, tags
                else:
                    seen |= tags
            if r == last_run:
                final = seen
        if final is None:
            final = set(tag[first[bounds[last_run]]:].tolist())
        self.last, self.tags = int(s[-1]), final
        seg = self.seg + np.cumsum(brk)
        self.seg = int(seg[-1])
        return np.repeat(seg.astype(np.int32), counts)


def _constant(n: int, text: str) -> pa.Array:
    """``n`` copies of ``text`` as a string array, built from buffers (no Python loop).

    A block holds at most a few million rows, so ``n * len(text)`` stays within int32 offsets.
    """
    raw = text.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(raw)) if raw else np.zeros(n + 1, np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw * n))


class _State:
    """Everything one file accumulates: key ranks, tags, streams, damage, run start."""

    def __init__(self, rel: str) -> None:
        self.rel = rel
        self.key_index: dict[str, int] = {}
        self.keys: list[str] = []
        self.rank: list[int] = []  # per key id: order of first row in the file (-1: none yet)
        self.next_rank = 0
        self.key_tag: list[int] = []  # per key id: the tag id of the bare key
        self.tag_index: dict[str, int] = {}
        self.tags: list[str] = []
        self.suffix_index: dict[str, int] = {}
        self.suffixes: list[str] = []
        self.pair_tag: dict[tuple[int, int], int] = {}
        self._names = self._metrics = pa.array([], pa.string())
        self.main = _Stream()
        self.indexed: _Stream | None = None  # records numbered 0, 1, ... while no step key has been seen
        self.step_key: str | None = None
        self.no_step = 0
        self.start: float | None = None  # run start (s since epoch) from _timestamp - _runtime
        self.runtime_seen = False
        self.bad: list[Skip] = []
        self.n_bad = 0
        self.python_lines = 0

    def key_id(self, key: str) -> int:
        ki = self.key_index.get(key)
        if ki is None:
            ki = self.key_index[key] = len(self.keys)
            self.keys.append(key)
            self.rank.append(-1)
            self.key_tag.append(self.tag_id(key))
        return ki

    def tag_id(self, tag: str) -> int:
        ti = self.tag_index.get(tag)
        if ti is None:
            ti = self.tag_index[tag] = len(self.tags)
            self.tags.append(tag)
        return ti

    def tag_arrays(self) -> tuple[pa.Array, pa.Array]:
        """(tag names, canonical metric names) as string arrays indexed by tag id."""
        if len(self._names) != len(self.tags):
            self._metrics = pa.array([canonical_metric(t) for t in self.tags], pa.string())
            self._names = pa.array(self.tags, pa.string())
        return self._names, self._metrics

    def suffix_id(self, suffix: str) -> int:
        si = self.suffix_index.get(suffix)
        if si is None:
            si = self.suffix_index[suffix] = len(self.suffixes)
            self.suffixes.append(suffix)
        return si

    def skip(self, line_no: int, reason: str) -> None:
        self.n_bad += 1
        if len(self.bad) < _MAX_REPORTED:
            self.bad.append(Skip(f"{self.rel}:{line_no}", reason))


# -- records of a stretch of lines (one engine each) --------------------------------------------------


class _Records:
    """Records (parsed JSON objects) of some lines of one block, and their candidate metric rows.

    Attributes (one entry per record, in line order): ``line`` int64 (1-based line number), ``step``
    int64 (0 when ``has_step`` is False), ``has_step`` bool, ``step_key`` int8 (index into
    :data:`STEP_KEYS`, -1: none), ``wall`` float64 s since epoch (NaN: none),
    ``runtime`` float64 s (NaN: none), ``suffix`` int32 suffix id (-1: none). ``first``: key id ->
    (line, position in the line) of its first row here, for keys without a rank yet. ``non_numeric``:
    (has_step, key) -> count of text values that are not numbers.
    """

    line: np.ndarray
    step: np.ndarray
    has_step: np.ndarray
    step_key: np.ndarray
    wall: np.ndarray
    runtime: np.ndarray
    suffix: np.ndarray
    first: dict[int, tuple[int, int]]
    non_numeric: dict[tuple[bool, str], int]

    def rows(self, rank: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """The rows, grouped by record (records in order), within a record by key rank.

        Args:
            rank: int64 rank per key id.
            ids: int32 per key id: what to return for a key (its tag id, or the key id itself).

        Returns:
            ``(counts int64[records], ids int32[rows], value float64[rows], null bool[rows] or None)``.
        """
        raise NotImplementedError


class _PyRecords(_Records):
    """Records parsed line by line with the stdlib ``json`` (the exact reference path)."""

    def __init__(self, st: _State, items: list[tuple[int, bytes, bool]]) -> None:
        """Parse ``items``: (1-based line number, raw bytes, is the cut last line) in line order."""
        line, step, has_step, step_key_of, wall, runtime, suffix = [], [], [], [], [], [], []
        r_rec, r_key, r_val, r_null = [], [], [], []
        self.first, self.non_numeric = {}, {}
        rank, key_index, first, non_numeric = st.rank, st.key_index, self.first, self.non_numeric
        nan, isnan = math.nan, math.isnan
        for line_no, raw, cut in items:
            obj = _parse_line(st, line_no, raw, cut)
            if obj is None:
                continue
            step_key, stp = None, 0
            for i, k in enumerate(STEP_KEYS):
                if k in obj and (stp := _as_step(obj[k])) is not None:
                    step_key = k
                    step_key_of.append(i)
                    break
            else:
                stp = 0
                step_key_of.append(-1)
            flat = _flatten(obj, "", {})
            w = next((w for k in TIME_KEYS if k in flat and (w := _as_time(flat[k])) is not None), None)
            rt = next((r for k in RUNTIME_KEYS if k in flat and not isnan(r := _as_runtime(flat[k]))), nan)
            sfx = next((v for k in NAME_KEYS if isinstance(v := flat.get(k), str) and v), None)
            rec = len(line)
            line.append(line_no)
            step.append(stp)
            has_step.append(step_key is not None)
            wall.append(nan if w is None else w)
            runtime.append(rt)
            suffix.append(-1 if sfx is None else st.suffix_id(sfx))
            for pos, (key, v) in enumerate(flat.items()):
                tv = type(v)
                if tv is float or tv is int:  # the common case first
                    if key == step_key or key in _SPECIAL_KEYS and (
                            key in _RUNTIME_SET or w is not None and _as_time(v) == w):
                        continue
                    v = v if tv is float else _float(v)
                elif key == step_key or key in _SPECIAL_KEYS and (
                        key in _RUNTIME_SET or w is not None and _as_time(v) == w):
                    continue
                elif tv is bool:
                    v = float(v)
                elif tv is str:
                    if key in NAME_KEYS:
                        continue
                    v = _number_text(v)  # numbers logged as text ("4.3", "NaN"), e.g. metaseq/fairseq json logs
                    if v is None:
                        nk = (step_key is not None, key)
                        non_numeric[nk] = non_numeric.get(nk, 0) + 1
                        continue
                elif v is not None:
                    continue  # lists
                ki = key_index.get(key)
                if ki is None:
                    ki = st.key_id(key)
                if rank[ki] < 0 and ki not in first:
                    first[ki] = (line_no, pos)
                r_rec.append(rec)
                r_key.append(ki)
                if v is None:
                    r_val.append(nan)
                    r_null.append(True)
                else:
                    r_val.append(v)
                    r_null.append(False)
        self.line = np.array(line, np.int64)
        self.step = np.array(step, np.int64)
        self.has_step = np.array(has_step, bool)
        self.step_key = np.array(step_key_of, np.int8)
        self.wall = np.array(wall, np.float64)
        self.runtime = np.array(runtime, np.float64)
        self.suffix = np.array(suffix, np.int32)
        self._rows = (np.array(r_rec, np.int64), np.array(r_key, np.int32), np.array(r_val, np.float64),
                      np.array(r_null, bool))

    def rows(self, rank: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        rec, key, val, null = self._rows
        if len(rec) > 1:
            order = np.lexsort((rank[key], rec))
            rec, key, val, null = rec[order], key[order], val[order], null[order]
        return np.bincount(rec, minlength=len(self.line)), ids[key], val, (null if null.any() else None)


def _parse_line(st: _State, line_no: int, raw: bytes, cut: bool) -> dict | None:
    """The JSON object of one line, or None (blank; bad lines are recorded in ``st``)."""
    text = raw.strip()
    if not text:
        return None
    st.python_lines += 1
    try:
        obj = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        if cut:
            st.bad.append(Skip(f"{st.rel}:{line_no}", "half-written last line dropped (killed job?)"))
        else:
            st.skip(line_no, f"not valid JSON ({str(exc).split(':')[0]}); line skipped")
        return None
    if not isinstance(obj, dict):
        st.skip(line_no, f"a JSON {type(obj).__name__}, not an object; line skipped")
        return None
    return obj


def _leaves(df: pl.DataFrame) -> tuple[list[tuple[str, pl.Series, np.ndarray]], np.ndarray]:
    """Leaf columns of ``df`` with structs unnested (``a/b`` names), and the fields present per row.

    Returns:
        ``[(flat name, series, present bool[n])]`` and int32[n]: how many keys (struct keys included)
        each row holds, to compare with the ``":`` count of its line.
    """
    leaves: list[tuple[str, pl.Series, np.ndarray]] = []
    fields = np.zeros(df.height, np.int32)
    everywhere = np.ones(df.height, bool)

    def walk(columns: list[pl.Series], prefix: str, parent: np.ndarray) -> None:
        for s in columns:
            present = s.is_not_null().to_numpy() & parent if s.null_count() else parent
            fields[:] += present
            if isinstance(s.dtype, pl.Struct):
                walk(s.struct.unnest().get_columns(), f"{prefix}{s.name}/", present)
            else:
                leaves.append((f"{prefix}{s.name}", s, present))

    walk(df.get_columns(), "", everywhere)
    return leaves, fields


# a string polars may have made from a number, bool, list or object of another line, or a number as text
_MAYBE_COERCED = (r"(?i)^([\s\x1c-\x1f]*[+-]?(inf(inity)?|nan|(\d+(\.\d*)?|\.\d+)(e[+-]?\d+)?)[\s\x1c-\x1f]*$"
                  r"|[\[{]|true$|false$)")
_KEPT_TYPES = (pl.Int64, pl.Float64, pl.Boolean, pl.String, pl.Null)


def _exact_rows(df: pl.DataFrame, colon_total: int, colons: Callable[[], np.ndarray]
                ) -> tuple[np.ndarray, list[tuple[str, pl.Series, np.ndarray]], set[str]]:
    """Which rows of ``df`` the per-line path would read to the same records.

    Returns bool[n] (the rows kept), the leaves of ``df``, and the top-level columns whose type is not
    worth reading the next block with.

    Every key is followed by a ``:``, and polars finds at most the keys of a line, so when the frame
    holds as many keys as its text has ``:`` (``colon_total``) no key was dropped or doubled. Else a
    row is left out when its key count differs from its line's (``colons()``, int[n], see
    :func:`_key_counts`: duplicate keys, keys beyond the schema, ``":`` inside strings). A row is also left out
    when a string may be a coerced value or a number logged as text, when a float step is beyond
    2**53 (an integer step may have been rounded), when a type is one polars widens to (Int128, ...),
    or when two leaves flatten to one name.
    """
    leaves, fields = _leaves(df)
    ok = np.ones(df.height, bool) if int(fields.sum()) == colon_total else fields == colons()
    seen: dict[str, list[np.ndarray]] = {}
    unsure: set[str] = set()
    for name, s, present in leaves:
        seen.setdefault(name, []).append(present)
        dt = s.dtype
        left_out = None
        if dt == pl.String:
            left_out = present & s.str.contains(_MAYBE_COERCED).fill_null(False).to_numpy()
        elif dt == pl.Float64 and name in STEP_KEYS:
            left_out = present & (np.abs(_dense(s)) >= _EXACT_INT)
        elif dt not in _KEPT_TYPES and not isinstance(dt, pl.List):
            left_out = present
        if left_out is not None and left_out.any():
            ok &= ~left_out
            unsure.add(name if name in df.columns else name.split("/")[0])
    for group in seen.values():
        if len(group) > 1:  # "a/b": 1 and "a": {"b": 2} in one line: the per-line path keeps the last
            ok &= sum(p.astype(np.int32) for p in group) <= 1
    return ok, leaves, unsure


def _merged(a: pl.DataType, b: pl.DataType) -> pl.DataType | None:
    """A type that reads the values of both (int and float: float; structs: all fields), else None."""
    if a == b:
        return a
    if {a, b} == {pl.Int64, pl.Float64}:
        return pl.Float64
    if isinstance(a, pl.Struct) and isinstance(b, pl.Struct):
        fields = {f.name: f.dtype for f in a.fields}
        for f in b.fields:
            m = _merged(fields[f.name], f.dtype) if f.name in fields else f.dtype
            if m is None:
                return None
            fields[f.name] = m
        return pl.Struct(fields)
    return None


def _carriable(dt: pl.DataType) -> bool:
    """A type polars can be told to read with (no Null parts, no widened integers)."""
    if isinstance(dt, pl.Struct):
        return all(_carriable(f.dtype) for f in dt.fields)
    if isinstance(dt, pl.List):
        return dt.inner is not None and _carriable(dt.inner)
    return dt in (pl.Int64, pl.Float64, pl.Boolean, pl.String)


def _map_unique(s: pl.Series, fn: Callable[[str], Any], missing: float | int, dtype: type) -> np.ndarray:
    """``fn`` of each string of ``s``, called once per distinct value; ``missing`` for null/None."""
    uniq = s.drop_nulls().unique().to_list()
    new = [fn(v) for v in uniq]
    out = s.replace_strict(uniq, new, default=None, return_dtype=pl.Float64 if dtype is np.float64 else pl.Int32)
    return out.fill_null(missing).to_numpy().astype(dtype)


def _dense(s: pl.Series) -> np.ndarray:
    """The values of an Int64/Float64/Boolean series as numpy, null as 0 (no copy when none is null)."""
    if s.null_count():
        s = s.fill_null(False if s.dtype == pl.Boolean else 0)
    return s.to_numpy()


def _numeric(s: pl.Series) -> np.ndarray:
    """float64[n] values of an Int64/Float64/Boolean series (0 where null)."""
    return _dense(s).astype(np.float64, copy=False)


class _FrameRecords(_Records):
    """Records of one ``polars.read_ndjson`` frame, every row of which :func:`_exact_rows` accepted."""

    def __init__(self, st: _State, df: pl.DataFrame, lines: np.ndarray,
                 leaves: list[tuple[str, pl.Series, np.ndarray]] | None = None) -> None:
        """Convert ``df`` (rows in line order); ``lines`` int64[n]: the 1-based line number of each row.

        ``leaves``: ``_leaves(df)[0]`` when already known.
        """
        n = df.height
        self.line = lines
        self.first, self.non_numeric = {}, {}
        by_name: dict[str, list[tuple[pl.Series, np.ndarray]]] = {}
        for name, s, present in leaves if leaves is not None else _leaves(df)[0]:
            by_name.setdefault(name, []).append((s, present))
        # step: the first of STEP_KEYS holding an integer step (text steps that are numbers were routed)
        step, has_step = np.zeros(n, np.int64), np.zeros(n, bool)
        step_key = np.full(n, -1, np.int8)
        step_of: dict[str, np.ndarray] = {}
        for i, k in enumerate(STEP_KEYS):
            for s, present in by_name.get(k, []):
                if s.dtype == pl.Int64:
                    valid, v = present.copy(), _dense(s)
                elif s.dtype == pl.Float64:
                    f = _dense(s)
                    valid = present & (f == np.floor(f))
                    v = np.where(valid, f, 0.0).astype(np.int64)
                else:
                    continue
                valid &= ~has_step
                step[valid], step_key[valid] = v[valid], i
                has_step |= valid
                step_of[k] = valid
        # wall time: the first of TIME_KEYS that reads as a time
        wall = np.full(n, np.nan)
        time_of: dict[str, np.ndarray] = {}
        for k in TIME_KEYS:
            for s, present in by_name.get(k, []):
                if s.dtype in (pl.Int64, pl.Float64):
                    t = _numeric(s)
                    t = np.where(present & (t > 1e8), np.where(t > 1e11, t / 1000.0, t), np.nan)
                elif s.dtype == pl.String:
                    t = _map_unique(s, _as_time, np.nan, np.float64)
                else:
                    continue
                time_of[k] = t
                wall = np.where(np.isnan(wall), t, wall)
        runtime = np.full(n, np.nan)
        for k in RUNTIME_KEYS:
            for s, present in by_name.get(k, []):
                if s.dtype in (pl.Int64, pl.Float64):
                    runtime = np.where(np.isnan(runtime) & present, _numeric(s), runtime)
        suffix = np.full(n, -1, np.int32)
        for k in NAME_KEYS:
            for s, _ in by_name.get(k, []):
                if s.dtype == pl.String:
                    ids = _map_unique(s, lambda v: st.suffix_id(v) if v else -1, -1, np.int32)
                    suffix = np.where(suffix < 0, ids, suffix)
        self.step, self.has_step, self.step_key = step, has_step, step_key
        self.wall, self.runtime, self.suffix = wall, runtime, suffix
        # metric leaves: numbers and bools, less the step key, the wall-time keys and _runtime
        self._leaves: list[tuple[int, np.ndarray, np.ndarray]] = []  # (key id, float64[n], row mask[n])
        for name, group in by_name.items():
            if name in RUNTIME_KEYS:
                continue
            for s, present in group:
                mask = present
                if name in step_of:
                    mask = mask & ~step_of[name]
                if name in time_of:
                    mask = mask & ~(time_of[name] == wall)
                if s.dtype == pl.String and name not in NAME_KEYS:  # text that is not a number
                    for hs in (True, False):
                        c = int((mask & (has_step == hs)).sum())
                        if c:
                            self.non_numeric[(hs, name)] = self.non_numeric.get((hs, name), 0) + c
                if s.dtype not in (pl.Int64, pl.Float64, pl.Boolean) or not mask.any():
                    continue
                ki = st.key_id(name)
                if st.rank[ki] < 0:
                    first = int(lines[int(np.argmax(mask))])
                    if ki not in self.first or self.first[ki][0] > first:
                        self.first[ki] = (first, -1)  # the position in the line is looked up if needed
                self._leaves.append((ki, _numeric(s), mask))

    def rows(self, rank: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        n = len(self.line)
        if not self._leaves:
            return np.zeros(n, np.int64), np.zeros(0, np.int32), np.zeros(0), None
        leaves = sorted(self._leaves, key=lambda t: rank[t[0]])
        cols = ids[np.array([k for k, _, _ in leaves], np.int64)]
        mask = np.column_stack([m for _, _, m in leaves])
        vals = np.column_stack([v for _, v, _ in leaves])
        if mask.all():
            return np.full(n, len(leaves), np.int64), np.tile(cols, n), vals.ravel(), None
        return (mask.sum(axis=1, dtype=np.int64), np.broadcast_to(cols, mask.shape)[mask], vals[mask], None)


# -- blocks of lines ----------------------------------------------------------------------------------


def _blocks(fh: IO[bytes], size: int) -> Iterator[tuple[bytes, bytes, str | None]]:
    r"""Read ``fh`` in blocks of whole lines (into one reused buffer; one copy per block).

    The buffer starts at 64 KiB and doubles up to ``size`` (small files stay cheap), and beyond it only
    for a line longer than ``size``.

    Yields:
        ``(lines, tail, error)``: ``lines`` ends with ``b"\n"`` (or is empty); ``tail`` is non-empty only
        in the last block: the bytes after the last newline (a last line without one); ``error`` is the
        message of a read error (a gzip stream cut short) in the last block, else None.
    """
    buf = bytearray(min(size, 1 << 16))
    limit = size
    n = 0  # bytes held in buf (the first ones: the cut line of the last block)
    while True:
        error, eof = None, False
        try:
            while True:
                if n == len(buf):
                    if len(buf) >= limit:
                        break
                    buf += bytes(min(len(buf), limit - len(buf)))
                with memoryview(buf) as view:
                    got = fh.readinto1(view[n:])  # type: ignore[attr-defined]
                if not got:
                    eof = True
                    break
                n += got
        except (EOFError, OSError, zlib.error) as exc:
            error, eof = str(exc) or type(exc).__name__, True
        cut = buf.rfind(b"\n", 0, n) + 1
        with memoryview(buf) as view:
            if eof:
                yield bytes(view[:cut]), bytes(view[cut:n]), error
                return
            if cut:
                yield bytes(view[:cut]), b"", None
                buf[:n - cut] = view[cut:n]
        n -= cut
        limit = size if cut else 2 * limit  # a line longer than the block: read on until it ends


def _scan(buf: bytes, work: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Find the lines of ``buf`` (which ends with ``b"\n"``) that polars may read.

    Returns:
        int64 ``starts`` and ``ends`` (the newline's offset) per line, bool ``plain`` (valid UTF-8, starts
        with ``{``, ends with ``}`` before an optional ``\r``, holds none of the per-line tokens).
        ``work`` is a bool work array as long as ``buf``.
    """
    arr = np.frombuffer(buf, np.uint8)
    np.equal(arr, 10, out=work)
    ends = np.flatnonzero(work)
    starts = np.empty_like(ends)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    last = arr[ends - 1]  # ends - 1 >= -1 (wraps to the last newline): masked by the length test
    cr = last == 13
    last = np.where(cr, arr[np.maximum(ends - 2, 0)], last)
    plain = (ends - starts - cr >= 2) & (arr[starts] == 0x7B) & (last == 0x7D)
    for lead, tokens in _PER_LINE:  # a byte search (memchr) first: these bytes are rare in metric logs
        if buf.find(lead) < 0:
            continue
        for token in tokens:
            at = buf.find(token)
            while at >= 0:
                li = int(np.searchsorted(ends, at))
                plain[li] = False
                at = buf.find(token, int(ends[li]) + 1)
    if not buf.isascii():
        try:
            buf.decode()
        except UnicodeDecodeError:  # polars refuses a block with invalid UTF-8: find the lines
            for li in np.unique(np.searchsorted(ends, np.flatnonzero(arr >= 0x80))).tolist():
                try:
                    buf[starts[li]:ends[li]].decode()
                except UnicodeDecodeError:
                    plain[li] = False
    return starts, ends, plain


def _count(data: bytes, byte: int, work: np.ndarray) -> int:
    """How many times ``byte`` occurs in ``data`` (``work``: a bool array as long as ``data``)."""
    np.equal(np.frombuffer(data, np.uint8), byte, out=work)
    return int(np.count_nonzero(work))


def _key_counts(buf: bytes, ends: np.ndarray, work: np.ndarray) -> np.ndarray:
    """int64 per line of ``buf``: how many keys it holds, or -1 where that cannot be told by bytes.

    A key ends with ``":`` unless whitespace comes between, so the count of ``":`` is at least the
    count of keys in a line where no ``"`` is followed by whitespace; such lines get -1 (``work``:
    bool[len(buf)]).
    """
    arr = np.frombuffer(buf, np.uint8)
    hit = work
    np.equal(arr, 0x3A, out=hit)
    colon = np.flatnonzero(hit)
    colon = colon[arr[colon - 1] == 0x22]  # a ':' at offset 0 looks at the last byte, a newline
    counts = np.diff(np.searchsorted(colon, ends), prepend=0)
    np.equal(arr, 0x20, out=hit)
    hit |= arr == 0x09
    hit |= arr == 0x0D
    space = np.flatnonzero(hit)
    space = space[arr[space - 1] == 0x22]
    counts[np.searchsorted(ends, space)] = -1
    return counts


def _join(buf: bytes, starts: np.ndarray, ends: np.ndarray, idx: np.ndarray) -> bytes:
    """The lines ``idx`` (sorted 0-based line indices) of ``buf``, each with its newline."""
    if len(idx) == len(ends):
        return buf
    cuts = np.flatnonzero(np.diff(idx) != 1)
    first, last = idx[np.r_[0, cuts + 1]], idx[np.r_[cuts, len(idx) - 1]]
    view = memoryview(buf)
    return b"".join([view[a:b] for a, b in zip(starts[first].tolist(), (ends[last] + 1).tolist(), strict=True)])


def _read_ndjson(data: bytes, schema: dict[str, pl.DataType] | None, full: bool) -> pl.DataFrame | None:
    """``polars.read_ndjson`` of ``data`` with ``schema``, or inferred from 100 (``full``: all) rows.

    Returns None when polars refuses the data.
    """
    try:
        if schema:
            df = pl.read_ndjson(data, schema=schema)
        else:
            df = pl.read_ndjson(data, infer_schema_length=None if full else 100)
        return df.rechunk()  # one chunk per column: the numpy views below need no copy
    except (Exception, PanicException):  # noqa: BLE001 - any refusal sends the lines to the per-line path
        return None


_Frame = tuple[pl.DataFrame, np.ndarray, list[tuple[str, pl.Series, np.ndarray]] | None]
_Staged = tuple[np.ndarray, np.ndarray, list[_Frame], np.ndarray]


class _Stager:
    """The polars part of each block, in file order.

    It touches no file state: it runs in a worker thread, one block ahead of the conversion. It keeps a
    work array, and the schema of the blocks read so far, which the next block is read with first
    (keys that come late, like eval metrics every 1,000 steps, are then known; a type that does not fit
    makes polars refuse, and inference is used).
    """

    def __init__(self) -> None:
        self.scratch = np.zeros(0, bool)
        self.schema: dict[str, pl.DataType] = {}

    def work(self, n: int) -> np.ndarray:
        """A bool work array of length ``n`` (reused: valid until the next call)."""
        if len(self.scratch) < n:
            self.scratch = np.empty(n, bool)
        return self.scratch[:n]

    def __call__(self, buf: bytes) -> _Staged:
        """Scan ``buf`` and read its plain lines with polars.

        Returns:
            ``(starts, ends, frames, rest)``: line offsets, the polars frames with the line indices of
            their rows (and their leaves), and the sorted line indices left to the per-line path.
        """
        if not buf:
            empty = np.zeros(0, np.int64)
            return empty, empty, [], empty
        starts, ends, plain = _scan(buf, self.work(len(buf)))
        frames, routed = self.frames(buf, starts, ends, np.flatnonzero(plain))
        rest = np.sort(np.concatenate([np.flatnonzero(~plain), *routed]))
        return starts, ends, frames, rest

    def frames(self, buf: bytes, starts: np.ndarray, ends: np.ndarray,
               idx: np.ndarray) -> tuple[list[_Frame], list[np.ndarray]]:
        """Read the lines ``idx`` of ``buf`` with polars: (frames, line indices left to the per-line path).

        Each piece is read with the carried schema (else the first 100 rows as sample), then with all rows
        as sample, until at most 1% of its rows are left out for a reason other than a ``null`` (which
        polars reads as a missing key: such lines go to the per-line path at once). A piece polars
        refuses is halved (down to :data:`_SMALLEST_PIECE` lines); the other rows left out get one more
        read of their own.
        """
        frames: list[_Frame] = []
        routed: list[np.ndarray] = []
        per_line: list[np.ndarray] = []  # the '":' count of each line of buf, once needed

        def colons(part: np.ndarray) -> np.ndarray:
            if not per_line:
                per_line.append(_key_counts(buf, ends, self.work(len(buf))))
            return per_line[0][part]

        todo = [(idx, False)] if len(idx) else []
        while todo:
            part, again = todo.pop()
            data = _join(buf, starts, ends, part)
            colon_total = -1
            best: tuple[pl.DataFrame, np.ndarray, list, set[str], np.ndarray] | None = None
            for how in ("carried" if self.schema else "sample", "all"):
                df = _read_ndjson(data, self.schema if how == "carried" else None, how == "all")
                if df is None or df.height != len(part):
                    continue
                if colon_total < 0:
                    colon_total = _count(data, 0x3A, self.work(len(data)))
                ok, leaves, unsure = _exact_rows(df, colon_total, lambda p=part: colons(p))
                null = np.array([b"null" in buf[starts[i]:ends[i]] for i in part[~ok].tolist()], bool)
                unexplained = int(len(null) - null.sum())
                if best is None or unexplained < len(best[4]) - int(best[4].sum()):
                    best = (df, ok, leaves, unsure, null)
                if 100 * unexplained <= len(ok):
                    break
            del data
            if best is None:
                if len(part) <= _SMALLEST_PIECE:
                    routed.append(part)
                else:
                    todo += [(part[len(part) // 2:], again), (part[:len(part) // 2], again)]
                continue
            df, ok, leaves, unsure, null = best
            self.carry(df, unsure)
            if not ok.all():  # the rows left out but for a null get one more polars read of their own
                left = part[~ok]
                routed.append(left[null])
                if again or ok.sum() == 0:
                    routed.append(left[~null])
                elif not null.all():
                    todo.append((left[~null], True))
                keep = pl.Series(ok)
                df, part = df.filter(keep), part[ok]
                leaves = [(name, s.filter(keep), present[ok]) for name, s, present in leaves]
            if df.height:
                frames.append((df, part, leaves))
        return frames, routed

    def carry(self, df: pl.DataFrame, unsure: set[str]) -> None:
        """Merge the types of ``df`` into the carried schema (columns that do not fit are dropped)."""
        for name, dt in df.schema.items():
            old = self.schema.get(name)
            new = dt if old is None else _merged(old, dt)
            if name in unsure or new is None or not _carriable(new):
                self.schema.pop(name, None)
            else:
                self.schema[name] = new


def _auto_block(st: _State, buf: bytes, staged: _Staged, first_line: int,
                tail: tuple[int, bytes, bool] | None) -> int:
    """Convert one staged block (polars frames, and the other lines line by line); returns its lines."""
    starts, ends, frames, rest = staged
    pieces: list[_Records] = [_FrameRecords(st, df, first_line + part, leaves) for df, part, leaves in frames]
    items = [(first_line + i, buf[starts[i]:ends[i]], False) for i in rest.tolist()]
    if tail is not None:
        items.append(tail)
    pieces.append(_PyRecords(st, items))
    _add_block(st, pieces, lambda ln: buf[starts[ln - first_line]:ends[ln - first_line]])
    return len(ends)


def _python_block(st: _State, buf: bytes, first_line: int, tail: tuple[int, bytes, bool] | None) -> int:
    """Read one block line by line with the stdlib ``json``; returns its lines."""
    items = [(first_line + i, raw, False) for i, raw in enumerate(buf.split(b"\n")[:-1])]
    n = len(items)
    if tail is not None:
        items.append(tail)
    _add_block(st, [_PyRecords(st, items)], lambda ln: items[ln - first_line][1])
    return n


def _add_block(st: _State, pieces: list[_Records], raw_line: Callable[[int], bytes]) -> None:
    """Rank new keys, merge the pieces of one block in line order, and append their rows to the streams."""
    pieces = [p for p in pieces if len(p.line)]
    if not pieces:
        return
    _rank_new_keys(st, pieces, raw_line)
    rank = np.asarray(st.rank, np.int64)
    line, step, has_step, step_key, wall, runtime, suffix = (
        np.concatenate([getattr(p, a) for p in pieces])
        for a in ("line", "step", "has_step", "step_key", "wall", "runtime", "suffix"))
    named = bool((suffix >= 0).any())  # per-module records: tags depend on the record, not only the key
    ids = np.arange(len(st.keys), dtype=np.int32) if named else np.asarray(st.key_tag, np.int32)
    rows = [p.rows(rank, ids) for p in pieces]
    counts = np.concatenate([r[0] for r in rows])
    tag = np.concatenate([r[1] for r in rows])
    val = np.concatenate([r[2] for r in rows])
    null = None
    if any(r[3] is not None for r in rows):
        null = np.concatenate([r[3] if r[3] is not None else np.zeros(len(r[1]), bool) for r in rows])
    del rows
    if len(pieces) > 1:
        order = np.argsort(line, kind="stable")
        if (np.diff(order) < 0).any():
            line, step, has_step, step_key, wall, runtime, suffix = (
                a[order] for a in (line, step, has_step, step_key, wall, runtime, suffix))
            begin = np.cumsum(counts) - counts
            counts = counts[order]
            idx = np.repeat(begin[order] - (np.cumsum(counts) - counts), counts) + np.arange(len(tag))
            tag, val = tag[idx], val[idx]
            null = None if null is None else null[idx]
    if named:
        tag = _tag_ids(st, tag, np.repeat(suffix, counts))
    non_numeric: dict[tuple[bool, str], int] = {}
    for p in pieces:
        for k, c in p.non_numeric.items():
            non_numeric[k] = non_numeric.get(k, 0) + c
    # run start = _timestamp - _runtime of the first record with both; then start + _runtime is a wall time
    has_rt = ~np.isnan(runtime)
    if has_rt.any():
        st.runtime_seen = True
        both = has_rt & ~np.isnan(wall)
        begin_at = 0
        if st.start is None and both.any():
            i0 = int(np.argmax(both))
            st.start, begin_at = float(wall[i0] - runtime[i0]), i0 + 1
        if st.start is not None:
            fill = has_rt & np.isnan(wall)
            fill[:begin_at] = False
            wall = np.where(fill, st.start + runtime, wall)
    if st.step_key is None and has_step.any():
        st.step_key = STEP_KEYS[int(step_key[int(np.argmax(has_step))])]
        st.indexed = None
    if st.step_key is None:  # no step key so far: records are numbered 0, 1, ... (kept if none ever comes)
        st.indexed = st.indexed or _Stream()
        st.indexed.records += len(line)
        st.indexed.add(st, (st.no_step + np.arange(len(line), dtype=np.int64), counts, tag, val, null, wall),
                       {k: c for (hs, k), c in non_numeric.items() if not hs})
    n_step = int(has_step.sum())
    st.no_step += len(line) - n_step
    st.main.records += n_step
    if n_step:
        if n_step < len(line):
            sel = np.repeat(has_step, counts)
            tag, val = tag[sel], val[sel]
            null = None if null is None else null[sel]
            step, counts, wall = step[has_step], counts[has_step], wall[has_step]
        st.main.add(st, (step, counts, tag, val, null, wall), {k: c for (hs, k), c in non_numeric.items() if hs})


def _rank_new_keys(st: _State, pieces: list[_Records], raw_line: Callable[[int], bytes]) -> None:
    """Rank the keys that give their first row in this block: by line, then position in that line."""
    found: dict[int, tuple[int, int]] = {}
    unplaced: dict[int, list[int]] = {}  # line -> keys of a polars frame first seen there
    for p in pieces:
        for ki, (ln, pos) in p.first.items():
            if pos < 0:
                unplaced.setdefault(ln, []).append(ki)
            elif ki not in found or (ln, pos) < found[ki]:
                found[ki] = (ln, pos)
    for ln, keys in unplaced.items():
        order: dict[str, int] = {}
        if len(set(keys)) > 1:
            order = {k: i for i, k in enumerate(_flatten(json.loads(raw_line(ln)), "", {}))}
        for ki in keys:
            where = (ln, order.get(st.keys[ki], 0))
            if ki not in found or where < found[ki]:
                found[ki] = where
    for ki in sorted(found, key=lambda k: (*found[k], k)):
        st.rank[ki] = st.next_rank
        st.next_rank += 1


def _tag_ids(st: _State, key: np.ndarray, suffix: np.ndarray) -> np.ndarray:
    """int32 tag id per row: the key, or ``key/suffix`` where the record names a module."""
    tag = np.asarray(st.key_tag, np.int32)[key]
    has = suffix >= 0
    if has.any():
        width = len(st.suffixes) + 1
        pairs, inverse = np.unique(key[has].astype(np.int64) * width + suffix[has], return_inverse=True)
        ids = []
        for p in pairs.tolist():
            k, s = divmod(p, width)
            ti = st.pair_tag.get((k, s))
            if ti is None:
                ti = st.pair_tag[(k, s)] = st.tag_id(f"{st.keys[k]}/{st.suffixes[s]}")
            ids.append(ti)
        tag[has] = np.asarray(ids, np.int32)[inverse]
    return tag


def _read_blocks(st: _State, fh: IO[bytes], engine: str, chunk_bytes: int) -> tuple[int, str] | None:
    """Read every block of ``fh`` into ``st``; returns (line, message) of a read error, or None.

    With the ``"auto"`` engine a worker thread stages block i + 1 (scan, polars) while this thread
    converts block i, so at most three blocks are held at a time.
    """
    done = 0  # lines before the current block
    error: tuple[int, str] | None = None

    def finish(buf: bytes, tail: bytes, err: str | None, lines: Callable[[int, tuple | None], int]) -> None:
        nonlocal done, error
        cut = (done + buf.count(b"\n") + 1, tail, True) if tail.strip() else None
        done += lines(done + 1, cut)
        if err is not None:
            error = (done + bool(tail), err)

    if engine == "python":
        for buf, tail, err in _blocks(fh, chunk_bytes):
            finish(buf, tail, err, lambda first, cut, b=buf: _python_block(st, b, first, cut))
        return error
    stage = _Stager()
    blocks = _blocks(fh, chunk_bytes)
    first = next(blocks, None)
    second = next(blocks, None)
    if second is None:  # one block (most files): no worker thread
        if first is not None:
            buf, tail, err = first
            finish(buf, tail, err, lambda line, cut: _auto_block(st, buf, stage(buf), line, cut))
        return error
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="jsonl") as pool:
        ahead: tuple[Future, bytes, bytes, str | None] | None = None
        for buf, tail, err in itertools.chain([first, second], blocks):
            staged = pool.submit(stage, buf)
            if ahead is not None:
                fut, b, t, e = ahead
                finish(b, t, e, lambda line, cut, f=fut, b=b: _auto_block(st, b, f.result(), line, cut))
            ahead = (staged, buf, tail, err)
        fut, b, t, e = ahead
        finish(b, t, e, lambda line, cut, f=fut, b=b: _auto_block(st, b, f.result(), line, cut))
    return error


# -- entry point -------------------------------------------------------------------------------------


def read(path: Path, root: Path, *, engine: str = "auto", chunk_bytes: int = CHUNK_BYTES) -> ParseResult:
    """Read every numeric field of a JSONL metric log.

    Args:
        path: The ``.jsonl`` (``.jsonl.gz``, ``.ndjson``, or JSON-lines ``.json``/``.log``) file.
        root: The run folder; ``source`` columns and ``Skip.what`` are relative to it.
        engine: ``"auto"`` (polars for plain lines, the per-line path for the rest) or ``"python"``
            (every line through the stdlib ``json``); both give the same result.
        chunk_bytes: Bytes of whole lines parsed at a time (memory stays bounded by a few blocks).

    Returns:
        One metrics row per (line, numeric field): ``value`` float64 as logged (NaN/inf kept, JSON
        ``null`` -> null, integers beyond float range -> +-inf), ``wall_time`` s since epoch when the
        record has one (``wall_time``/``time``/``timestamp``/``_timestamp``; else run start +
        ``_runtime``; else null), ``tag`` the flattened key (``a/b`` for nested; ``key/<module>`` for
        per-module records), local ``segment`` (a new one when the step goes back, or repeats a metric
        already logged at the highest step). ``_runtime`` is never a row. ``meta``: ``step_key``,
        ``records``, ``bad_lines``, ``lines_without_step``, ``engine``, ``python_lines`` (lines read one
        by one), ``runtime_key``/``run_start`` when ``_runtime`` was logged, and ``step_source = "line
        index"`` when the file has no step key at all (steps are then 0, 1, ...). ``skipped``:
        ``"<rel>:<line>"`` per bad line (the first 20, then a summary).

    Raises:
        ValueError: ``engine`` is not one of :data:`ENGINES`.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, not {engine!r}")
    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
    st = _State(rel)
    skipped: list[Skip] = []
    try:
        fh = open_binary(path)
    except OSError as exc:
        fh = None
        skipped.append(Skip(f"{rel}:0", f"file ends abruptly ({exc}); earlier lines kept"))
    if fh is not None:
        with fh:
            error = _read_blocks(st, fh, engine, chunk_bytes)
        if error is not None:
            skipped.append(Skip(f"{rel}:{error[0]}", f"file ends abruptly ({error[1]}); earlier lines kept"))
    meta: dict[str, Any] = {"records": st.main.records, "bad_lines": st.n_bad, "lines_without_step": 0}
    stream = st.main
    if st.step_key is None and st.indexed is not None:
        stream = st.indexed
        meta.update(records=st.indexed.records, step_source="line index (the file has no step key)")
    elif st.no_step:
        meta["lines_without_step"] = st.no_step
        keys = ", ".join(STEP_KEYS)
        skipped.append(Skip(rel, f"{st.no_step} record(s) without a step key ({keys}) ignored"))
    meta["step_key"] = st.step_key
    meta["engine"], meta["python_lines"] = engine, st.python_lines
    if st.runtime_seen:
        meta["runtime_key"] = "_runtime (s since run start; wall time, not a metric)"
        if st.start is not None:
            meta["run_start"] = st.start
    table = stream.table()
    # text in a key that is numeric elsewhere is a lost value; text-only keys are labels (run names...)
    used = stream.used_tags
    lost = {k: n for k, n in stream.non_numeric.items()
            if (ti := st.tag_index.get(k)) is not None and ti < len(used) and used[ti]}
    if lost:
        meta["non_numeric_values"] = dict(lost)
        worst = ", ".join(f"{k} ({n})" for k, n in sorted(lost.items(), key=lambda kv: -kv[1])[:5])
        skipped.append(Skip(rel, f"text values that are not numbers were not read as metrics: {worst}"))
    if st.n_bad > len(st.bad):
        st.bad.append(Skip(rel, f"{st.n_bad - len(st.bad)} more bad line(s) not listed"))
    return ParseResult(format=FORMAT, path=rel, metrics=table, meta=meta,
                       skipped=tuple(st.bad + skipped), precision="float64")
