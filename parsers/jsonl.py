"""Generic JSONL metric logs: one JSON object per line (``docs/formats.md#jsonl``).

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
  The polars side lives in :mod:`parsers._jsonl_frames`; the per-line path here is the reference.

Row order (both engines): by line, then, within a line, by the order in which each key first gave a
row in the file (ties by its position in that line). Step, wall time, suffix and segment rules are
applied once, on arrays, to the records of both engines.
"""

from __future__ import annotations

import hashlib
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
import pyarrow as pa
import pyarrow.compute as pc

from forensics.model import ParseResult, Skip
from forensics.schema import METRICS_SCHEMA, canonical_metric
from parsers._io import open_binary
from parsers.file_policy import no_surrogates

FORMAT = "jsonl"
STEP_KEYS = ("step", "global_step", "iteration", "iter", "_step", "num_updates", "it", "current_steps", "current_step",
             "trainer/global_step", "train/global_step", "global step", "train_step", "optimizer_step", "steps",
             "update", "updates", "iters", "s")
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
MAX_LINE_BYTES = 64 << 20
"""A line longer than this is not read (listed; its bytes are dropped as they arrive, so a gzip file
holding one 1 GB line costs one buffer, not the line): real JSONL records are kilobytes."""
CHUNK_BYTES = 16 << 20
"""Bytes of whole lines read and parsed at a time by the ``"auto"`` engine (memory stays bounded)."""
_NOT_METRIC_FILES = {"trainer_state.json", "expected.json"}
_MAX_REPORTED = 20  # bad lines reported one by one; the rest are summarised in one Skip


MAX_TAG_CHARS = 1000
"""A key longer than this is kept shortened (its start, ``...#`` and a hash: still one name per key)."""


def _safe_tag(tag: str) -> str:
    r"""A key as a metric name: lone surrogates (``"acc\ud800"`` in valid JSON) escaped, overlong keys shortened."""
    tag = no_surrogates(tag)
    if len(tag) > MAX_TAG_CHARS:
        digest = hashlib.sha1(tag.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        tag = f"{tag[:MAX_TAG_CHARS - 14]}...#{digest}"
    return tag


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
    # a step key holding a dict or list is a column-oriented export (pandas ``to_json()``), not a record
    return isinstance(obj, dict) and any(k in obj and not isinstance(obj[k], dict | list) for k in STEP_KEYS)


def _flatten(obj: dict, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
    """Nested objects flattened into ``out`` with ``/``-joined keys, in key order (no recursion: any depth)."""
    stack = [(prefix, iter(obj.items()))]
    while stack:
        pre, items = stack[-1]
        for k, v in items:
            if isinstance(v, dict):
                stack.append((f"{pre}{k}/", iter(v.items())))
                break
            out[f"{pre}{k}"] = v
        else:
            stack.pop()
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
            self.tags.append(_safe_tag(tag))
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
    except RecursionError:
        st.skip(line_no, "JSON nested too deeply to decode; line skipped")
        return None
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


# -- blocks of lines ----------------------------------------------------------------------------------


def _skip_line(fh: IO[bytes], buf: bytearray) -> tuple[int, int, bool, str | None]:
    """Read on to the end of an overlong line, reusing ``buf``; its bytes are dropped as they arrive.

    Returns:
        ``(bytes dropped, bytes after the newline now at the start of buf, eof, read error)``.
    """
    dropped = 0
    while True:
        try:
            with memoryview(buf) as view:
                got = fh.readinto1(view)  # type: ignore[attr-defined]
        except (EOFError, OSError, zlib.error) as exc:
            return dropped, 0, True, str(exc) or type(exc).__name__
        if not got:
            return dropped, 0, True, None
        nl = buf.find(b"\n", 0, got)
        if nl < 0:
            dropped += got
            continue
        buf[:got - nl - 1] = buf[nl + 1:got]
        return dropped + nl + 1, got - nl - 1, False, None


def _blocks(fh: IO[bytes], size: int, long_lines: list[tuple[int, int]] | None = None,
            max_line: int | None = None) -> Iterator[tuple[bytes, bytes, str | None]]:
    r"""Read ``fh`` in blocks of whole lines (into one reused buffer; one copy per block).

    The buffer starts at 64 KiB and doubles up to ``size`` (small files stay cheap), and beyond it only
    for a line longer than ``size``, up to ``max_line`` (:data:`MAX_LINE_BYTES`): a longer line is read
    on and dropped as its bytes arrive (before a gzip stream expands it in memory), yielded as an empty
    line (line numbers stay right) and listed in ``long_lines`` as ``(line number, bytes)``.

    Yields:
        ``(lines, tail, error)``: ``lines`` ends with ``b"\n"`` (or is empty); ``tail`` is non-empty only
        in the last block: the bytes after the last newline (a last line without one); ``error`` is the
        message of a read error (a gzip stream cut short) in the last block, else None.
    """
    buf = bytearray(min(size, 1 << 16))
    limit = size
    max_line = MAX_LINE_BYTES if max_line is None else max_line
    n = 0  # bytes held in buf (the first ones: the cut line of the last block)
    seen = 0  # newlines yielded so far
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
        if not eof and not cut and n >= max_line:
            dropped, rest, eof, error = _skip_line(fh, buf)
            if long_lines is not None:
                long_lines.append((seen + 1, n + dropped))
            if eof:
                yield b"", b"", error
                return
            yield b"\n", b"", None
            seen, n, limit = seen + 1, rest, size
            continue
        with memoryview(buf) as view:
            if eof:
                yield bytes(view[:cut]), bytes(view[cut:n]), error
                return
            if cut:
                block = bytes(view[:cut])
                seen += block.count(b"\n")
                yield block, b"", None
                buf[:n - cut] = view[cut:n]
        n -= cut
        limit = size if cut else 2 * limit  # a line longer than the block: read on until it ends




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


def _read_blocks(st: _State, fh: IO[bytes], engine: str, chunk_bytes: int,
                 long_lines: list[tuple[int, int]] | None = None) -> tuple[int, str] | None:
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
        for buf, tail, err in _blocks(fh, chunk_bytes, long_lines):
            finish(buf, tail, err, lambda first, cut, b=buf: _python_block(st, b, first, cut))
        return error
    from parsers._jsonl_frames import _auto_block, _Stager  # imports this module: import at call time

    stage = _Stager()
    blocks = _blocks(fh, chunk_bytes, long_lines)
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
        fh = open_binary(path, bounded=False)  # its own line budget (MAX_LINE_BYTES), listed
    except OSError as exc:
        fh = None
        skipped.append(Skip(f"{rel}:0", f"file ends abruptly ({exc}); earlier lines kept"))
    long_lines: list[tuple[int, int]] = []
    if fh is not None:
        with fh:
            error = _read_blocks(st, fh, engine, chunk_bytes, long_lines)
        for line, nbytes in long_lines[:_MAX_REPORTED]:
            skipped.append(Skip(f"{rel}:{line}", f"line of {nbytes} bytes (more than {MAX_LINE_BYTES}): not read"))
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
    meta["step_axis"] = {"column": st.step_key or "(line index)",
                         "kind": "row_index" if st.step_key is None else "optimizer_step"}
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
