"""The polars block engine of :mod:`parsers.jsonl` (engine ``"auto"``): the lines polars can read exactly.

:mod:`parsers.jsonl` streams a file in blocks of whole lines. Each block is staged one block ahead in a
worker thread by :class:`parsers._jsonl_stage._Stager` (the plain lines read with
``polars.read_ndjson``, only the rows polars read exactly kept). :func:`_auto_block` turns the frames
into :class:`_FrameRecords` (columns, no Python object per row) and sends every other line to the
per-line path (:mod:`parsers._jsonl_lines`).

Why a separate engine: polars reads a block of plain metric lines faster than ``json.loads`` line by line,
but it rejects ``NaN``/``Infinity``, cannot tell ``null`` from a missing key, and coerces or widens
some values. The per-line stdlib decoder in :mod:`parsers.jsonl` stays the reference: this module only
takes the lines polars reads exactly, and both engines give the same table.
"""


from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import polars as pl

from forensics.schema import boolean_is_a_count
from parsers._jsonl_fields import NAME_KEYS, RUNTIME_KEYS, TIME_KEYS, _as_time
from parsers._jsonl_lines import _PyRecords
from parsers._jsonl_stage import _dense, _leaves, _Staged
from parsers._jsonl_table import _Records, _State, add_block
from parsers._table_header import SPLIT_KEYS, split_suffix


def _map_unique(s: pl.Series, fn: Callable[[str], Any], missing: float | int, dtype: type) -> np.ndarray:
    """``fn`` of each string of ``s``, called once per distinct value; ``missing`` for null/None."""
    uniq = s.drop_nulls().unique().to_list()
    new = [fn(v) for v in uniq]
    out = s.replace_strict(uniq, new, default=None, return_dtype=pl.Float64 if dtype is np.float64 else pl.Int32)
    return out.fill_null(missing).to_numpy().astype(dtype)


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
        self.step, self.has_step, self.step_key, step_of = _steps(by_name, n, st.step_keys, st.fallback_from)
        self.wall, time_of = _walls(by_name, n)
        self.runtime = np.full(n, np.nan)
        for k in RUNTIME_KEYS:
            for s, present in by_name.get(k, []):
                if s.dtype in (pl.Int64, pl.Float64):
                    self.runtime = np.where(np.isnan(self.runtime) & present, _numeric(s), self.runtime)
        self.suffix = np.full(n, -1, np.int32)
        for k in NAME_KEYS:
            for s, _ in by_name.get(k, []):
                if s.dtype == pl.String:
                    ids = _map_unique(s, lambda v: st.suffix_id(v) if v else -1, -1, np.int32)
                    self.suffix = np.where(self.suffix < 0, ids, self.suffix)
        for k in SPLIT_KEYS:  # a val/eval/test split: its keys get the split's prefix
            for s, _ in by_name.get(k, []):
                if s.dtype == pl.String:
                    ids = _map_unique(s, lambda v: st.suffix_id(p) if (p := split_suffix(v)) else -1, -1, np.int32)
                    self.suffix = np.where(self.suffix < 0, ids, self.suffix)
        self._leaves: list[tuple[int, np.ndarray, np.ndarray]] = []  # (key id, float64[n], row mask[n])
        for name, group in by_name.items():
            if name not in RUNTIME_KEYS:
                for s, present in group:
                    self._leaf(st, name, s, present, step_of.get(name), time_of.get(name))

    def _leaf(self, st: _State, name: str, s: pl.Series, present: np.ndarray, step_of: np.ndarray | None,
              time_of: np.ndarray | None) -> None:
        """Keep one leaf column as metric rows: numbers and bools, less the step key and the wall-time keys."""
        mask = present
        if step_of is not None:
            mask = mask & ~step_of
        if time_of is not None:
            mask = mask & ~(time_of == self.wall)
        if s.dtype == pl.String and name not in NAME_KEYS:  # text that is not a number
            for hs in (True, False):
                c = int((mask & (self.has_step == hs)).sum())
                if c:
                    self.non_numeric[(hs, name)] = self.non_numeric.get((hs, name), 0) + c
        if s.dtype == pl.Boolean and not boolean_is_a_count(name):  # a boolean is no measurement: listed
            if mask.any():
                st.booleans[name] = st.booleans.get(name, 0) + int(mask.sum())
            return
        if s.dtype not in (pl.Int64, pl.Float64, pl.Boolean) or not mask.any():
            return
        ki = st.key_id(name)
        if st.rank[ki] < 0:
            first = int(self.line[int(np.argmax(mask))])
            if ki not in self.first or self.first[ki][0] > first:
                self.first[ki] = (first, -1)  # the position in the line is looked up if needed
        self._leaves.append((ki, _numeric(s), mask))

    def rows(self, rank: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        n = len(self.line)
        if not self._leaves:
            return np.zeros(n, np.int64), np.zeros(0, np.int32), np.zeros(0), None
        leaves = sorted(self._leaves, key=lambda t: rank[t[0]])
        cols = ids[np.array([k for k, _, _ in leaves], np.int64)]
        vals = np.stack([v for _, v, _ in leaves], axis=1)
        if all(m.all() for _, _, m in leaves):  # every key on every line (the trainer log): no mask matrix
            return np.full(n, len(leaves), np.int64), np.tile(cols, n), vals.ravel(), None
        mask = np.stack([m for _, _, m in leaves], axis=1)
        return (mask.sum(axis=1, dtype=np.int64), np.broadcast_to(cols, mask.shape)[mask], vals[mask], None)


def _steps(by_name: dict[str, list[tuple[pl.Series, np.ndarray]]], n: int, keys: tuple[str, ...],
           fallback_from: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Step per row: the first of ``keys`` holding an integer step (text steps that are numbers were routed).

    Returns int64 step, bool has_step, int8 step key index (-1: none), and key -> rows it gave the step of.
    """
    step, has_step = np.zeros(n, np.int64), np.zeros(n, bool)
    step_key = np.full(n, -1, np.int8)
    step_of: dict[str, np.ndarray] = {}
    for i, k in enumerate(keys):
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
            if i < fallback_from:  # an epoch or sample count that gives the step stays a metric too
                step_of[k] = valid
    return step, has_step, step_key, step_of


def _walls(by_name: dict[str, list[tuple[pl.Series, np.ndarray]]], n: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Wall time per row (s since epoch, NaN: none): the first of TIME_KEYS that reads as a time; and per key."""
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
    return wall, time_of


def _auto_block(st: _State, buf: bytes, staged: _Staged, first_line: int,
                tail: tuple[int, bytes, bool] | None) -> int:
    """Convert one staged block (polars frames, and the other lines line by line); returns its lines."""
    starts, ends, frames, rest = staged
    pieces: list[_Records] = [_FrameRecords(st, df, first_line + part, leaves) for df, part, leaves in frames]
    items = [(first_line + i, buf[starts[i]:ends[i]], False) for i in rest.tolist()]
    if tail is not None:
        items.append(tail)
    pieces.append(_PyRecords(st, items))
    add_block(st, pieces, lambda ln: buf[starts[ln - first_line]:ends[ln - first_line]])
    return len(ends)
