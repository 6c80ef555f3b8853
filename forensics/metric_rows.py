"""How the long metrics frame of :class:`forensics.rundata.RunData` is built, and where each metric's rows lie.

:func:`metrics_frame` turns one file's Arrow table into the compact frame (categorical text, one-valued
columns held once); :func:`layout` finds every metric's rows in one pass over the metric codes (slices, a
period, or one stable sort), :func:`grouped` the step/segment/value columns grouped metric after metric, from
which :meth:`forensics.rundata.RunData.series` takes each metric's part without a scan of the frame.

Imports only :mod:`forensics.schema` from the project.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from forensics.column_scan import empty_buffer, scan_step, slices, transpose_into
from forensics.schema import METRICS_SCHEMA, METRICS_TEXT

MAX_SLICES = 4096
"""A metric whose rows lie in at most this many runs of rows of the frame is read as zero-copy slices of it;
more (rows interleaved metric by metric) and its rows are gathered by row number (our choice: a slice costs
about a microsecond, a gather copies the rows)."""


MIN_SLICE_ROWS = 64
"""Slices only when the runs of rows are this long on average (our choice, measured: a slice and its share of the
concatenation cost ~4 us, a gathered row of 8 columns ~0.1-0.3 us; a record-major log, one row a run, took
~1.5 M slices at 2,000 steps x 500 metrics: 4.5 s, against 0.1 s grouped)."""
THREAD_ROWS = 1 << 21
"""Frame rows (2M) from which :func:`grouped` transposes the values on a second thread (our choice; smaller frames
group in a few ms, below a thread's hand-offs)."""
PERIOD_SEARCH = 1 << 16
"""Rows searched for the period of a text chunk or of the metric codes (the most metrics a record is taken to log
when telling a wide log's repeating pattern; our choice)."""
def metrics_frame(t: pa.Table, run: str, offset: int = 0) -> pl.DataFrame:
    """One file's metrics table (:func:`forensics.schema.conform_metrics`) as the frame of :attr:`RunData.metrics`.

    Column by column, each Arrow column dropped from ``t`` once converted: numbers are shared with Arrow
    (no copy; every column keeps the table's chunks, so no operation has to realign them);
    ``metric``/``tag``/``source`` become ``pl.Categorical`` (held once when the column has one value);
    ``run`` is set to ``run`` and held once (a literal column), ``wall_time`` too when every row lacks
    one; ``offset`` is added to the segments.

    Args:
        t: Table with the columns of :data:`forensics.schema.METRICS_SCHEMA` (string or dictionary text,
            ``wall_time`` float64 or null-typed).
        run: The run's name.
        offset: Added to every ``segment``.

    Returns:
        A polars frame, columns in :data:`~forensics.schema.METRICS_SCHEMA` order.
    """
    n = t.num_rows
    cols: dict[str, pl.Series] = {}
    lits: list[pl.Expr] = [pl.lit(run, dtype=pl.String).alias("run")]
    t = t.drop_columns(["run"])
    same: dict[str, str] = {}  # a text column equal to an earlier one row for row (a log's tag = its metric name)
    for name in METRICS_SCHEMA.names[1:]:
        col = t.column(name)
        t = t.drop_columns([name])
        if name == "wall_time" and col.null_count == n:
            lits.append(pl.lit(None, dtype=pl.Float64).alias(name))
            continue
        if name in METRICS_TEXT and (one := _one_value(col)) is not None:
            lits.append(pl.lit(one, dtype=pl.Categorical).alias(name))
            continue
        if name in same:
            cols[name] = cols[same[name]].alias(name)  # the same categorical (no second hashing of every row)
            continue
        if name in METRICS_TEXT:  # chunk by chunk: the frame's columns keep one chunk layout (no realignment copy)
            same.update({other: name for other in METRICS_TEXT if other in t.column_names
                         and _equal_text(col, t.column(other))})
            s = pl.concat(_categorical_chunks(col.chunks) or
                          [pl.Series([], dtype=pl.Categorical)], rechunk=False).alias(name)
        else:
            s = pl.from_arrow(col, rechunk=False).alias(name)  # numbers: shared with Arrow, no copy
        del col
        if name == "segment" and offset:
            s = (s.cast(pl.Int64) + offset).cast(pl.Int32)
        cols[name] = s
    frame = pl.DataFrame(cols, height=n) if cols else pl.DataFrame(height=n)
    return frame.with_columns(lits).select(METRICS_SCHEMA.names)


def _one_value(col: pa.ChunkedArray) -> str | None:
    """The only value of a text column (a file's ``source``), or ``None`` (also with a null).

    A dictionary column by its dictionaries; a string column by comparing every row with the first (no hashing).
    """
    if col.null_count or len(col) == 0:
        return None
    if pa.types.is_dictionary(col.type):
        values = {v for c in col.chunks for v in c.dictionary.to_pylist()}
        return values.pop() if len(values) == 1 else None
    first = next(c for c in col.chunks if len(c))[0]  # an Arrow scalar (a Python one makes pyarrow import pandas)
    return first.as_py() if all(pc.all(pc.equal(c, first)).as_py() for c in _longest(col.chunks).values()) else None


def _buffers(c: pa.Array) -> tuple[object, ...]:
    """What a string array's values are made of: its type, offset and buffers (addresses and sizes).

    Two arrays that agree on these and differ only in length are one and its prefix (a reader's blocks sliced from
    one shared array). Any other array is its own key.
    """
    if not (pa.types.is_string(c.type) or pa.types.is_large_string(c.type)):
        return ("own", id(c))
    return (str(c.type), c.offset, *((b.address, b.size) if b is not None else None for b in c.buffers()))


def _longest(chunks: list[pa.Array]) -> dict[tuple[object, ...], pa.Array]:
    """The longest non-empty chunk per :func:`_buffers` key: every other chunk of its key is a prefix of it."""
    out: dict[tuple[object, ...], pa.Array] = {}
    for c in chunks:
        k = _buffers(c)
        if len(c) and (k not in out or len(c) > len(out[k])):
            out[k] = c
    return out


def _categorical_chunks(chunks: list[pa.Array]) -> list[pl.Series]:
    """:func:`_categorical_chunk` of each chunk; chunks that are prefixes of one array share its conversion (a slice).

    A reader that slices every block's text from one tiled array (:mod:`parsers._jsonl_text`) hands out 155 chunks
    of one array at 1M records x 50 metrics: one conversion instead of 155 (0.45 -> ~0.01 s a column).
    """
    done = {k: _categorical_chunk(c) for k, c in _longest(chunks).items()}
    return [done[_buffers(c)].slice(0, len(c)) if len(c) else _categorical_chunk(c) for c in chunks]


def _categorical_chunk(c: pa.Array) -> pl.Series:
    """One text chunk as a polars categorical, without hashing every row when it repeats a pattern.

    A chunk that repeats ``P`` distinct names (a wide log's records: every record the same keys in the same
    order; found by comparing the chunk with itself shifted by ``P``) is its first ``P`` rows and their positions.
    """
    n = len(c)
    if n > 1 and not c.null_count and not pa.types.is_dictionary(c.type):
        again = np.flatnonzero(pc.equal(c.slice(1, PERIOD_SEARCH), c[0]).to_numpy(zero_copy_only=False))
        p = int(again[0]) + 1 if again.size else n
        head = c.slice(0, p)
        if p < n and pc.count_distinct(head).as_py() == p and pc.all(pc.equal(c.slice(p), c.slice(0, n - p))).as_py():
            codes = pl.select(pl.int_range(0, n, dtype=pl.UInt32) % p).to_series()  # (no numpy: it imports numpy.ma)
            return pl.from_arrow(head).cast(pl.Categorical).gather(codes)
    return pl.from_arrow(c).cast(pl.Categorical)


def _equal_text(a: pa.ChunkedArray, b: pa.ChunkedArray) -> bool:
    """True when two string columns (same chunks, no nulls) hold the same text in every row."""
    if (a.null_count or b.null_count or a.type != b.type or pa.types.is_dictionary(a.type)
            or [len(c) for c in a.chunks] != [len(c) for c in b.chunks]):
        return False
    return all(pc.all(pc.equal(x, y)).as_py() is not False for x, y in zip(a.chunks, b.chunks, strict=True))


@dataclass(frozen=True)
class Layout:
    """Where each metric's rows lie in the frame, found once per run (:func:`layout`).

    ``slices``: ``{metric: [(offset, length), ...]}`` when every metric's rows lie in at most
    :data:`MAX_SLICES` runs of rows (the text reader groups each block by metric); else ``None`` and the rows
    are grouped metric after metric: ``span[metric] = (start, stop)`` in that grouping, whose ``i``-th row is
    frame row ``order[i]``, or, when ``period`` is set (every record logs the same ``period`` metrics in the
    same order: frame rows ``k, k + period, ...`` are metric ``k``), ``start // (n // period) + j * period``.
    """

    n: int
    slices: dict[str, list[tuple[int, int]]] | None
    span: dict[str, tuple[int, int]]
    period: int
    order: np.ndarray | None

    def rows(self, metric: str) -> np.ndarray | None:
        """Frame row numbers of ``metric`` in read order (``None``: absent); only when ``slices`` is ``None``."""
        if metric not in self.span:
            return None
        a, b = self.span[metric]
        if self.period:
            k = a // (self.n // self.period)
            return np.arange(k, self.n, self.period, dtype=np.int64)
        return self.order[a:b]  # type: ignore[index]

    def group_column(self, col: pl.Series, fill: float | None = None) -> np.ndarray:
        """A frame column (polars, shape (n,)) as numpy in the grouped order; ``fill``: as float64, nulls as it.

        A wide log's column is transposed slice by slice (:data:`SCAN_ROWS` rows), with no whole-column copy first.
        """
        def part(c: pl.Series) -> np.ndarray:
            return (c.cast(pl.Float64).fill_null(fill) if fill is not None else c).to_numpy()

        if not self.period:
            return part(col)[self.order]
        out: np.ndarray | None = None
        step = scan_step(self.period)
        for a in range(0, self.n, step):
            rows = part(col.slice(a, step))
            out = empty_buffer(self.n, rows.dtype) if out is None else out
            transpose_into(out.reshape(self.period, -1), a // self.period, rows.reshape(-1, self.period))
        return out  # type: ignore[return-value]


def layout(metrics: pl.DataFrame, max_slices: int = MAX_SLICES) -> Layout:
    """Find every metric's rows in one pass over the ``metric`` codes (:class:`Layout`), no per-metric scan.

    Few, long runs of rows (at most ``max_slices`` per metric, :data:`MAX_SLICES`; :data:`MIN_SLICE_ROWS` rows a
    run on average): slices. Every record the same metrics in the same order (a wide log): a period, so grouping
    is a transpose. Else the codes are sorted once (stable: read order within a metric; a radix sort for fewer
    than 65,536 codes).
    """
    col = _categorical(metrics.get_column("metric"))
    phys = col.to_physical()
    if phys.null_count():
        phys = phys.fill_null(np.iinfo(np.uint32).max)
    n = phys.len()
    top, runs, starts = _runs(phys, n // MIN_SLICE_ROWS)  # slice by slice: no whole-column copy of the codes
    if starts is not None and runs <= max_slices * (top + 1) and n >= MIN_SLICE_ROWS * runs:
        lens = np.diff(np.append(starts, n))
        names = col.gather(starts.tolist()).cast(pl.String).to_list()  # a list: a numpy index imports numpy.ma
        out: dict[str, list[tuple[int, int]]] = {}
        for name, a, k in zip(names, starts.tolist(), lens.tolist(), strict=True):
            out.setdefault(name, []).append((a, k))
        if runs <= max_slices * len(out) and max(len(v) for v in out.values()) <= max_slices:
            return Layout(n=n, slices=out, span={}, period=0, order=None)
    del starts
    period = _period(phys)
    if period:
        names = col.head(period).cast(pl.String).to_list()
        per = n // period
        return Layout(n=n, slices=None, span={m: (k * per, (k + 1) * per) for k, m in enumerate(names)},
                       period=period, order=None)
    codes = phys.to_numpy()
    small = codes.astype(np.uint8 if top < 256 else np.uint16) if top < 65536 else codes
    del codes
    order = np.argsort(small, kind="stable")
    counts = np.bincount(small, minlength=top + 1)
    del small
    present = np.flatnonzero(counts)
    stops = np.cumsum(counts[present])
    starts = stops - counts[present]
    names = col.gather(order[starts].tolist()).cast(pl.String).to_list()
    span = {m: (int(a), int(b)) for m, a, b in zip(names, starts, stops, strict=True)}
    return Layout(n=n, slices=None, span=span, period=0, order=order)


def _runs(phys: pl.Series, cap: int) -> tuple[int, int, np.ndarray | None]:
    """(largest code, number of runs of equal codes, first row of each run) of the metric codes.

    :data:`SCAN_ROWS` rows at a time; the starts are ``None`` once there are more than ``cap`` runs (then only
    their number matters).
    """
    top, prev, parts, count = 0, None, [], 0
    for a, c in slices(phys):
        top = max(top, int(c.max()))
        first = prev is None or c[0] != prev
        if count > cap:  # only the number of runs matters now: count them, no index array (a wide log: one a row)
            count += int(first) + int(np.count_nonzero(c[1:] != c[:-1]))
        else:
            new = np.flatnonzero(c[1:] != c[:-1]) + (a + 1)
            count += int(first) + new.shape[0]
            if count <= cap:
                parts += [np.array([a] if first else [], np.int64), new]
        prev = c[-1]
    return top, count, (np.concatenate(parts) if parts else np.zeros(0, np.int64)) if count <= cap else None


def _categorical(col: pl.Series) -> pl.Series:
    """A text column as categorical (:func:`metrics_frame`'s columns already are: no copy)."""
    return col if col.dtype == pl.Categorical else col.cast(pl.String).cast(pl.Categorical)


def _distinct(a: np.ndarray) -> bool:
    """True when no value of ``a`` repeats (a sort: ``np.unique`` imports numpy.ma, ~0.1 s, in an ingest too)."""
    s = np.sort(a)
    return bool((s[1:] != s[:-1]).all())


def _period(phys: pl.Series) -> int:
    """``P`` when the codes are one run of ``P`` distinct codes repeated (every record the same metrics), else 0.

    Compared :data:`SCAN_ROWS` rows at a time (a whole number of records), no whole-column copy.
    """
    n = phys.len()
    head = phys.head(PERIOD_SEARCH).to_numpy()
    again = np.flatnonzero(head[1:] == head[0])
    period = int(again[0]) + 1 if again.size else 0
    if not period or n % period or not _distinct(head[:period]):
        return 0
    pattern = head[:period]
    for _, c in slices(phys, scan_step(period)):
        if not bool((c.reshape(-1, period) == pattern).all()):
            return 0
    return period


def distinct_pairs(metrics: pl.DataFrame) -> pl.DataFrame:
    """The frame's distinct ``(tag, metric)`` rows (the frame's types), in no set order.

    A wide log whose ``metric`` and ``tag`` columns both repeat one record's pattern of ``P`` rows
    (:func:`_period`, :data:`SCAN_ROWS` rows at a time): its first ``P`` rows; else one group-by over every row.
    """
    tag, met = metrics.get_column("tag"), metrics.get_column("metric")
    if (tag.dtype == pl.Categorical and met.dtype == pl.Categorical and not tag.null_count()
            and not met.null_count() and metrics.height):
        p = _period(met.to_physical())
        if p and _period(tag.to_physical()) == p:
            return metrics.head(p).select("tag", "metric").unique()
    return metrics.group_by("tag", "metric").len().select("tag", "metric")


@dataclass(frozen=True)
class Grouped:
    """The frame's step/segment/value rows metric after metric (:meth:`Layout.group`), built once per run.

    ``nulls``: the value is null (``None`` when none is); ``sources``: each row's source category code and
    ``source_names`` their names (``None`` when the frame has one source, ``one_source``). ``per_record``: in
    a wide log whose records hold one step and segment for all their metrics, ``steps``/``segments`` are held
    once per record (shape (n // period,), read-only), shared by every metric, not once per row.
    """

    steps: np.ndarray
    segments: np.ndarray
    values: np.ndarray
    per_record: bool

    def part(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(steps, segments, values) of the grouped rows ``a:b`` (one metric's ``span``)."""
        if self.per_record:
            return self.steps, self.segments, self.values[a:b]
        return self.steps[a:b], self.segments[a:b], self.values[a:b]
    nulls: np.ndarray | None
    sources: np.ndarray | None
    source_names: dict[int, str] | None
    one_source: str | None


def grouped(metrics: pl.DataFrame, lay: Layout) -> Grouped:
    """Group the columns a :class:`~forensics.rundata.Series` needs (:class:`Grouped`), one column at a time.

    From :data:`THREAD_ROWS` rows on, the values are transposed on a second thread while this one groups the
    steps, segments, nulls and sources (about half the work each; numpy's copies and compares release the GIL).
    """
    value = metrics.get_column("value")
    with ThreadPoolExecutor(1, thread_name_prefix="grouped") if lay.n >= THREAD_ROWS else nullcontext() as pool:
        later = pool.submit(lay.group_column, value, float("nan")) if pool is not None else None
        nulls = lay.group_column(value.is_null()) if value.null_count() else None
        src = _categorical(metrics.get_column("source"))
        present = src.unique()
        sources = names = None
        if present.len() > 1 or src.null_count():
            sources = lay.group_column(src.to_physical().fill_null(np.iinfo(np.uint32).max))
            names = {int(c): str(v) for c, v in zip(present.to_physical().to_list(),
                                                      present.cast(pl.String).to_list(), strict=True)
                     if c is not None and v is not None}
        step, seg = metrics.get_column("step"), metrics.get_column("segment")
        steps = _per_record(step, lay)
        segs = _per_record(seg, lay) if steps is not None else None
        per_record = steps is not None and segs is not None
        if not per_record:
            steps, segs = lay.group_column(step), lay.group_column(seg)
        values = later.result() if later is not None else lay.group_column(value, float("nan"))
    return Grouped(steps=steps, segments=segs, per_record=per_record,  # type: ignore[arg-type]
                   values=values, nulls=nulls, sources=sources, source_names=names,
                   one_source=None if sources is not None else str(present.cast(pl.String)[0]))


def _per_record(col: pl.Series, lay: Layout) -> np.ndarray | None:
    """A wide log's column held once per record (read-only), when every metric of each record shares its value.

    Checked :data:`SCAN_ROWS` rows (whole records) at a time: no whole-column copy.
    """
    if not lay.period or lay.period == 1:
        return None
    parts = []
    for _, c in slices(col, scan_step(lay.period)):
        rows = c.reshape(-1, lay.period)
        if not bool((rows == rows[:, :1]).all()):
            return None
        parts.append(rows[:, 0])
    one = np.concatenate(parts)  # a new array (a slice's numpy may be a view of the frame's buffer)
    one.flags.writeable = False
    return one
