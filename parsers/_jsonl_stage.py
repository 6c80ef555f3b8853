"""Staging a block for the polars engine of :mod:`parsers.jsonl` (read ahead in worker threads).

:class:`_Stager` finds the lines of a block that are plain JSON objects (:mod:`parsers._jsonl_scan`,
on bytes with numpy; run by the reading thread ahead of the worker), reads them with
``polars.read_ndjson`` in one call per piece (with the schema carried from the blocks before, else
inferred; a refused piece is halved), and keeps only the rows that polars read exactly
(:func:`_exact_rows`: key counts, coerced strings, widened types). It touches no file state.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import polars as pl
import pyarrow as pa
from polars.exceptions import PanicException

from parsers._jsonl_fields import FALLBACK_STEP_KEYS, STEP_KEYS
from parsers._jsonl_scan import _FEW_LINES, _count, _deep_lines, _join, _key_counts, _scan

_SMALLEST_PIECE = 32  # a rejected piece of at most this many lines goes through the per-line path
_EXACT_INT = float(1 << 53)


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
        elif dt == pl.Float64 and (name in STEP_KEYS or name in FALLBACK_STEP_KEYS):
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


def _dense(s: pl.Series) -> np.ndarray:
    """The values of an Int64/Float64/Boolean series as numpy (no copy but for Boolean with nulls).

    A null slot of an Int64/Float64 series holds any value: callers mask by the rows present. The
    values come from the Arrow buffer (no polars compute call, which would wait for polars' thread pool
    while the worker thread reads the next block).
    """
    if s.null_count():
        if s.dtype == pl.Boolean:
            return s.fill_null(False).to_numpy()
        a = s.to_arrow()
        if isinstance(a, pa.ChunkedArray):
            a = a.combine_chunks()
        width = 8  # Int64 and Float64
        return np.frombuffer(a.buffers()[1], np.int64 if s.dtype == pl.Int64 else np.float64, len(a), a.offset * width)
    return s.to_numpy()



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

    It touches no file state: it runs in worker threads, ahead of the conversion. It keeps a work array per
    thread, and the schema of the blocks read so far (a copy taken per read, merged under a lock), which the
    next block is read with first (keys that come late, like eval metrics every 1,000 steps, are then known;
    a type that does not fit makes polars refuse, and inference is used).
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self.scan_scratch = np.zeros(0, bool)
        self.schema: dict[str, pl.DataType] = {}
        self._schema_lock = threading.Lock()

    def work(self, n: int) -> np.ndarray:
        """A bool work array of length ``n`` (one per thread, reused: valid until the thread's next call)."""
        have = getattr(self._local, "scratch", None)
        if have is None or len(have) < n:
            have = self._local.scratch = np.empty(n, bool)
        return have[:n]

    def __call__(self, buf: bytes) -> _Staged:
        """:meth:`read` of :meth:`scan`: both steps in the calling thread."""
        return self.read(buf, self.scan(buf))

    def scan(self, buf: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:func:`_scan` of ``buf`` with a work array of its own (the reading thread runs it ahead of :meth:`read`)."""
        if not buf:
            empty = np.zeros(0, np.int64)
            return empty, empty, np.zeros(0, bool)
        if len(self.scan_scratch) < len(buf):
            self.scan_scratch = np.empty(len(buf), bool)
        return _scan(buf, self.scan_scratch[:len(buf)])

    def read(self, buf: bytes, scanned: tuple[np.ndarray, np.ndarray, np.ndarray]) -> _Staged:
        """Read the plain lines of ``buf`` (``scanned``: :meth:`scan` of it) with polars.

        Returns:
            ``(starts, ends, frames, rest)``: line offsets, the polars frames with the line indices of
            their rows (and their leaves), and the sorted line indices left to the per-line path.
        """
        starts, ends, plain = scanned
        if not len(ends):
            return starts, ends, [], starts
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
        read of their own. Before a read that infers, the lines nested too deep for it are routed
        (:func:`_deep_lines`).
        """
        frames: list[_Frame] = []
        routed: list[np.ndarray] = []
        lazy: dict[str, np.ndarray] = {}  # per line of buf, once needed: '":' counts, too deep to infer

        def colons(part: np.ndarray) -> np.ndarray:
            if "colons" not in lazy:
                lazy["colons"] = _key_counts(buf, ends, self.work(len(buf)))
            return lazy["colons"][part]

        def deep_of(part: np.ndarray) -> np.ndarray:
            if len(part) <= _FEW_LINES and "deep" not in lazy:
                return _deep_lines(buf, starts, ends, part, self.work(len(buf)))
            if "deep" not in lazy:
                lazy["deep"] = _deep_lines(buf, starts, ends, np.arange(len(ends)), self.work(len(buf)))
            return lazy["deep"][part]

        todo = [(idx, False)] if len(idx) else []
        while todo:
            part, again = todo.pop()
            best = self._best_read(buf, starts, ends, part, colons, deep_of)
            if isinstance(best, np.ndarray):  # the deep lines of part: routed, the others read again
                routed.append(part[best])
                todo += [(part[~best], again)] if not best.all() else []
                continue
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

    def _best_read(self, buf: bytes, starts: np.ndarray, ends: np.ndarray, part: np.ndarray,
                   colons: Callable[[np.ndarray], np.ndarray], deep_of: Callable[[np.ndarray], np.ndarray]
                   ) -> tuple[pl.DataFrame, np.ndarray, list, set[str], np.ndarray] | np.ndarray | None:
        """The best polars read of the lines ``part`` (see :meth:`frames`): ``(df, ok, leaves, unsure, null)``.

        None when polars refuses every try; a bool array (the lines of ``part`` too deep for polars to
        infer) when a read that infers was due and some are.
        """
        data = _join(buf, starts, ends, part)
        colon_total = -1
        best: tuple[pl.DataFrame, np.ndarray, list, set[str], np.ndarray] | None = None
        with self._schema_lock:
            carried = dict(self.schema)  # another reader thread may carry its block's types meanwhile
        for how in ("carried" if carried else "sample", "all"):
            if how != "carried" and (deep := deep_of(part)).any():
                return deep
            df = _read_ndjson(data, carried if how == "carried" else None, how == "all")
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
        return best

    def carry(self, df: pl.DataFrame, unsure: set[str]) -> None:
        """Merge the types of ``df`` into the carried schema (columns that do not fit are dropped)."""
        with self._schema_lock:
            self._carry(df, unsure)

    def _carry(self, df: pl.DataFrame, unsure: set[str]) -> None:
        for name, dt in df.schema.items():
            old = self.schema.get(name)
            new = dt if old is None else _merged(old, dt)
            if name in unsure or new is None or not _carriable(new):
                self.schema.pop(name, None)
            else:
                self.schema[name] = new
