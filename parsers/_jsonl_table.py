"""The long metrics table of one JSONL file as it is built (:mod:`parsers.jsonl`), block by block.

:class:`_State` holds what a file accumulates (key ranks, tag ids, damage, run start); :class:`_Stream`
the rows of one output table (one Arrow record batch per block, local segments by
:class:`parsers._jsonl_segments._Segmenter`).
:func:`add_block` merges the records of one block, read by either engine (:class:`_Records`: the
per-line path of :mod:`parsers._jsonl_lines`, the polars frames of :mod:`parsers._jsonl_frames`), in
line order, and appends their rows. Step, wall time, suffix and segment rules are applied here once,
on arrays, to the records of both engines.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from forensics.model import Skip
from forensics.schema import METRICS_SCHEMA, canonical_metric
from parsers._io import STEP_KEY
from parsers._jsonl_fields import _flatten, _safe_tag, step_keys
from parsers._jsonl_segments import _Segmenter
from parsers._jsonl_text import constant, text_runs
from parsers._table_header import PREFIX_MARK

MAX_REPORTED = 20  # bad lines reported one by one; the rest are summarised in one Skip


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
        for key, c in non_numeric.items():
            self.non_numeric[key] = self.non_numeric.get(key, 0) + c
        rec_step, counts, tag, val, null, rec_wall = cols
        n = len(tag)
        if not n:
            return
        has_rows = counts > 0
        if not has_rows.all():
            rec_step, counts, rec_wall = rec_step[has_rows], counts[has_rows], rec_wall[has_rows]
        k = int(counts[0])
        uniform = bool((counts == k).all())  # every record logs k rows (then mostly one pattern repeated)
        used = np.bincount(tag[:k] if uniform and (tag.reshape(-1, k) == tag[:k]).all() else tag) > 0
        if len(used) > len(self.used_tags):
            self.used_tags = np.concatenate([self.used_tags, np.zeros(len(used) - len(self.used_tags), bool)])
        self.used_tags[:len(used)] |= used
        seg = self.segments(rec_step, counts, tag)
        reps = k if uniform else counts
        step, wall = np.repeat(rec_step, reps), np.repeat(rec_wall, reps)
        missing = np.isnan(wall) if np.isnan(rec_wall).any() else None  # per record first: most have a time
        cols = [pa.array(seg, pa.int32()), pa.array(step, pa.int64()), pa.array(val, pa.float64(), mask=null),
                pa.array(wall, pa.float64(), mask=missing)]
        for lo, hi, metric_col, tag_col in st.text_runs(tag, counts):  # one batch per run of one key pattern
            seg_a, step_a, val_a, wall_a = (c.slice(lo, hi - lo) for c in cols)
            self.batches.append(pa.RecordBatch.from_arrays(
                [st.constant(hi - lo, ""), seg_a, step_a, metric_col, val_a, wall_a, tag_col,
                 st.constant(hi - lo, st.rel)], schema=METRICS_SCHEMA))

    def table(self) -> pa.Table:
        """The long metrics table (METRICS_SCHEMA), one chunk per block."""
        batches, self.batches = self.batches, []
        return pa.Table.from_batches(batches, schema=METRICS_SCHEMA)


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
        self._constants: dict[str, pa.Array] = {}
        self._tiles: dict[bytes, tuple[pa.Array, pa.Array]] = {}
        self.main = _Stream()
        self.indexed: _Stream | None = None  # records numbered 0, 1, ... while no step key has been seen
        self.step_key: str | None = None
        self.step_keys, self.fallback_from = step_keys(STEP_KEY.get())
        self.fallback: _Stream | None = None  # records stepped by an epoch or sample count, while no step key
        self.fallback_key: str | None = None
        self.no_step = 0
        self.start: float | None = None  # run start (s since epoch) from _timestamp - _runtime
        self.runtime_seen = False
        self.bad: list[Skip] = []
        self.n_bad = 0
        self.python_lines = 0
        self.booleans: dict[str, int] = {}  # key -> JSON booleans not read (not a number unless a per-step flag)
        self.big_steps: dict[str, int] = {}  # step key -> integer values beyond int64 (not read as steps)

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

    def constant(self, n: int, text: str) -> pa.Array:
        """``n`` copies of ``text``: a slice of one array kept per text (blocks share its buffers)."""
        have = self._constants.get(text)
        if have is None or len(have) < n:
            have = self._constants[text] = constant(max(n, 2 * len(have) if have is not None else n), text)
        return have.slice(0, n)

    def text_runs(self, tag: np.ndarray, counts: np.ndarray) -> list[tuple[int, int, pa.Array, pa.Array]]:
        """(row start, row end, canonical metric, tag) string arrays of the rows ``tag`` (int32 tag ids).

        Grouped by ``counts``: see :func:`parsers._jsonl_text.text_runs` (tiles shared by the blocks).
        """
        names, metrics = self.tag_arrays()
        return text_runs(self._tiles, names, metrics, tag, counts)

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
        if len(self.bad) < MAX_REPORTED:
            self.bad.append(Skip(f"{self.rel}:{line_no}", reason))


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


def _cat(arrays: list[np.ndarray]) -> np.ndarray:
    """``np.concatenate`` of ``arrays``; the array itself when there is one (most blocks: one polars frame)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def add_block(st: _State, pieces: list[_Records], raw_line: Callable[[int], bytes]) -> None:
    """Rank new keys, merge the pieces of one block in line order, and append their rows to the streams."""
    pieces = [p for p in pieces if len(p.line)]
    if not pieces:
        return
    _rank_new_keys(st, pieces, raw_line)
    rank = np.asarray(st.rank, np.int64)
    line, step, has_step, step_key, wall, runtime, suffix = (
        _cat([getattr(p, a) for p in pieces])
        for a in ("line", "step", "has_step", "step_key", "wall", "runtime", "suffix"))
    named = bool((suffix >= 0).any())  # per-module records: tags depend on the record, not only the key
    ids = np.arange(len(st.keys), dtype=np.int32) if named else np.asarray(st.key_tag, np.int32)
    rows = [p.rows(rank, ids) for p in pieces]
    counts = _cat([r[0] for r in rows])
    tag = _cat([r[1] for r in rows])
    val = _cat([r[2] for r in rows])
    null = None
    if any(r[3] is not None for r in rows):
        null = _cat([r[3] if r[3] is not None else np.zeros(len(r[1]), bool) for r in rows])
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
    wall = _runtime_wall(st, wall, runtime)
    _append(st, (line, step, has_step, step_key), (counts, tag, val, null), wall, non_numeric)


def _runtime_wall(st: _State, wall: np.ndarray, runtime: np.ndarray) -> np.ndarray:
    """Wall time per record: run start + ``_runtime`` where a record has no wall time of its own.

    The run start is ``_timestamp - _runtime`` of the first record with both (kept in ``st``).
    """
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
    return wall


def _append(st: _State, records: tuple[np.ndarray, ...], rows: tuple[np.ndarray | None, ...], wall: np.ndarray,
            non_numeric: dict[tuple[bool, str], int]) -> None:
    """Append one block's records: those with a step to the main stream, all to the line-index one.

    The line-index stream is kept only while no step key has been seen (records numbered 0, 1, ...).

    Args:
        st: The file state.
        records: Per record, in line order: ``line``, ``step`` int64, ``has_step`` bool, ``step_key`` int8.
        rows: ``counts`` int64 per record, then per row ``tag`` int32, ``val`` float64, ``null`` bool or None.
        wall: float64 per record (NaN: none).
        non_numeric: (has_step, key) -> count of text values that are not numbers.
    """
    line, step, has_step, step_key = records
    counts, tag, val, null = rows
    by_fallback = has_step & (step_key >= st.fallback_from)  # an epoch or sample count, no step key
    has_step = has_step & ~by_fallback
    if st.step_key is None and has_step.any():
        st.step_key = st.step_keys[int(step_key[int(np.argmax(has_step))])]
        st.indexed = st.fallback = None
    if st.step_key is None:  # no step key so far: records are numbered 0, 1, ... (kept if none ever comes)
        st.indexed = st.indexed or _Stream()
        st.indexed.records += len(line)
        st.indexed.add(st, (st.no_step + np.arange(len(line), dtype=np.int64), counts, tag, val, null, wall),
                       {k: c for (hs, k), c in non_numeric.items() if not hs})
        if by_fallback.any():  # and by their epoch or sample count (kept, before the line index, if no step comes)
            st.fallback = st.fallback or _Stream()
            st.fallback_key = st.fallback_key or st.step_keys[int(step_key[int(np.argmax(by_fallback))])]
            _add_selected(st.fallback, st, by_fallback, (step, counts, tag, val, null, wall), non_numeric,
                          drop=step_key)
    n_step = int(has_step.sum())
    st.no_step += len(line) - n_step
    if n_step:
        _add_selected(st.main, st, has_step, (step, counts, tag, val, null, wall), non_numeric)


def _add_selected(stream: _Stream, st: _State, sel: np.ndarray, cols: tuple, non_numeric: dict,
                  drop: np.ndarray | None = None) -> None:
    """Add the records ``sel`` (bool per record) of ``cols`` (see :meth:`_Stream.add`) to ``stream``.

    ``drop``: int8 step key index per record; the row of that key is left out (it is the step here).
    """
    step, counts, tag, val, null, wall = cols
    n = int(sel.sum())
    stream.records += n
    rows = np.repeat(sel, counts)
    if drop is not None:
        key_tag = np.array([st.tag_index.get(k, -1) for k in st.step_keys], np.int64)
        rows &= tag != key_tag[np.repeat(drop, counts)]
        counts = np.bincount(np.repeat(np.arange(len(sel)), counts)[rows], minlength=len(sel))
    if n < len(sel) or drop is not None:
        tag, val = tag[rows], val[rows]
        null = None if null is None else null[rows]
        step, counts, wall = step[sel], counts[sel], wall[sel]
    stream.add(st, (step, counts, tag, val, null, wall), {k: c for (hs, k), c in non_numeric.items() if hs})


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
                sfx = st.suffixes[s]
                name = f"{sfx[1:]}/{st.keys[k]}" if sfx.startswith(PREFIX_MARK) else f"{st.keys[k]}/{sfx}"
                ti = st.pair_tag[(k, s)] = st.tag_id(name)
            ids.append(ti)
        tag[has] = np.asarray(ids, np.int32)[inverse]
    return tag
