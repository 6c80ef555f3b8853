"""The run as the detectors see it: :class:`RunData` and :class:`Series`.

:class:`RunData` is everything read from one folder, :class:`Series` one metric's effective
timeline. Both are re-exported by :mod:`forensics.model`.

The long metrics frame keeps each text column compact (:func:`metrics_frame`): ``run`` is one value held
once, ``metric``/``tag``/``source`` are categoricals (4 bytes a row; they compare equal to their strings),
``wall_time`` is one null held once when no row has a wall time. Numbers stay ``int64`` steps and
``float64`` values (lossless). A metric's rows are found once per run, as slices of the frame when they
lie in few runs of rows (the text reader groups each block by metric), else as row numbers; no second copy
of the table is kept.

Imports only :mod:`forensics.schema` from the project at run time (the result types are annotations only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from forensics.schema import METRICS_SCHEMA, METRICS_TEXT

if TYPE_CHECKING:
    from forensics.model import Skip, SourceInfo

MAX_SLICES = 4096
"""A metric whose rows lie in at most this many runs of rows of the frame is read as zero-copy slices of it;
more (rows interleaved metric by metric) and its rows are gathered by row number (our choice: a slice costs
about a microsecond, a gather copies the rows)."""


PERIOD_SEARCH = 1 << 16
"""Rows searched for the period of a text chunk or of the metric codes (the most metrics a record is taken to log
when telling a wide log's repeating pattern; our choice)."""
TRANSPOSE_BLOCK = 2048
"""Records per block of the transpose that groups a wide log's rows by metric (our choice, measured: 1,024 to
16,384 records cost the same, a whole-column transpose ~8x more)."""


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
        if name in METRICS_TEXT and _one_value(col) is not None:
            lits.append(pl.lit(_one_value(col), dtype=pl.Categorical).alias(name))
            continue
        if name in same:
            cols[name] = cols[same[name]].alias(name)  # the same categorical (no second hashing of every row)
            continue
        if name in METRICS_TEXT:  # chunk by chunk: the frame's columns keep one chunk layout (no realignment copy)
            same.update({other: name for other in METRICS_TEXT if other in t.column_names
                         and _equal_text(col, t.column(other))})
            s = pl.concat([_categorical_chunk(c) for c in col.chunks] or
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
    first = col[0].as_py()
    return first if all(pc.all(pc.equal(c, first)).as_py() for c in col.chunks if len(c)) else None


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
            codes = np.tile(np.arange(p, dtype=np.int32), -(-n // p))[:n]
            return pl.from_arrow(pa.DictionaryArray.from_arrays(pa.array(codes), head)).cast(pl.Categorical)
    return pl.from_arrow(c).cast(pl.Categorical)


def _equal_text(a: pa.ChunkedArray, b: pa.ChunkedArray) -> bool:
    """True when two string columns (same chunks, no nulls) hold the same text in every row."""
    if (a.null_count or b.null_count or a.type != b.type or pa.types.is_dictionary(a.type)
            or [len(c) for c in a.chunks] != [len(c) for c in b.chunks]):
        return False
    return all(pc.all(pc.equal(x, y)).as_py() is not False for x, y in zip(a.chunks, b.chunks, strict=True))


@dataclass(frozen=True)
class _Layout:
    """Where each metric's rows lie in the frame, found once per run (:func:`_layout`).

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

    def group(self, a: np.ndarray) -> np.ndarray:
        """A frame column (shape (n,)) in the grouped order (metric after metric)."""
        if self.period:  # a transpose, block by block (a block fits the cache: ~8x faster than one transpose)
            out = np.empty_like(a)
            grid, rows = out.reshape(self.period, -1), a.reshape(-1, self.period)
            for r in range(0, rows.shape[0], TRANSPOSE_BLOCK):
                grid[:, r:r + TRANSPOSE_BLOCK] = rows[r:r + TRANSPOSE_BLOCK].T
            return out
        return a[self.order]


def _layout(metrics: pl.DataFrame) -> _Layout:
    """Find every metric's rows in one pass over the ``metric`` codes (:class:`_Layout`), no per-metric scan.

    Few runs of rows: slices. Every record the same metrics in the same order (a wide log): a period, so
    grouping is a transpose. Else the codes are sorted once (stable: read order within a metric; a radix
    sort for fewer than 65,536 codes).
    """
    col = _categorical(metrics.get_column("metric"))
    phys = col.to_physical()
    if phys.null_count():
        phys = phys.fill_null(np.iinfo(np.uint32).max)
    codes = phys.to_numpy()
    n = codes.shape[0]
    top = int(codes.max())
    runs = int(np.count_nonzero(codes[1:] != codes[:-1])) + 1
    if runs <= MAX_SLICES * (top + 1):
        starts = np.concatenate([[0], np.flatnonzero(codes[1:] != codes[:-1]) + 1])
        lens = np.diff(np.append(starts, n))
        names = col.gather(starts).cast(pl.String).to_list()
        out: dict[str, list[tuple[int, int]]] = {}
        for name, a, k in zip(names, starts.tolist(), lens.tolist(), strict=True):
            out.setdefault(name, []).append((a, k))
        if runs <= MAX_SLICES * len(out) and max(len(v) for v in out.values()) <= MAX_SLICES:
            return _Layout(n=n, slices=out, span={}, period=0, order=None)
    period = _period(codes)
    if period:
        names = col.gather(np.arange(period)).cast(pl.String).to_list()
        per = n // period
        return _Layout(n=n, slices=None, span={m: (k * per, (k + 1) * per) for k, m in enumerate(names)},
                       period=period, order=None)
    small = codes.astype(np.uint8 if top < 256 else np.uint16) if top < 65536 else codes
    del codes
    order = np.argsort(small, kind="stable")
    counts = np.bincount(small, minlength=top + 1)
    del small
    present = np.flatnonzero(counts)
    stops = np.cumsum(counts[present])
    starts = stops - counts[present]
    names = col.gather(order[starts]).cast(pl.String).to_list()
    span = {m: (int(a), int(b)) for m, a, b in zip(names, starts, stops, strict=True)}
    return _Layout(n=n, slices=None, span=span, period=0, order=order)


def _categorical(col: pl.Series) -> pl.Series:
    """A text column as categorical (:func:`metrics_frame`'s columns already are: no copy)."""
    return col if col.dtype == pl.Categorical else col.cast(pl.String).cast(pl.Categorical)


def _period(codes: np.ndarray) -> int:
    """``P`` when ``codes`` is one run of ``P`` distinct codes repeated (every record the same metrics), else 0."""
    n = codes.shape[0]
    again = np.flatnonzero(codes[1:min(n, PERIOD_SEARCH)] == codes[0])
    period = int(again[0]) + 1 if again.size else 0
    if not period or n % period or np.unique(codes[:period]).shape[0] != period:
        return 0
    return period if bool((codes.reshape(-1, period) == codes[:period]).all()) else 0


@dataclass(frozen=True)
class _Grouped:
    """The frame's step/segment/value rows metric after metric (:meth:`_Layout.group`), built once per run.

    ``nulls``: the value is null (``None`` when none is); ``sources``: each row's source category code and
    ``source_names`` their names (``None`` when the frame has one source, ``one_source``).
    """

    steps: np.ndarray
    segments: np.ndarray
    values: np.ndarray
    nulls: np.ndarray | None
    sources: np.ndarray | None
    source_names: dict[int, str] | None
    one_source: str | None


def _grouped(metrics: pl.DataFrame, layout: _Layout) -> _Grouped:
    """Group the columns a :class:`Series` needs (:class:`_Grouped`), one column at a time."""
    value = metrics.get_column("value")
    nulls = layout.group(value.is_null().to_numpy()) if value.null_count() else None
    src = _categorical(metrics.get_column("source"))
    present = src.unique()
    sources = names = None
    if present.len() > 1 or src.null_count():
        sources = layout.group(src.to_physical().fill_null(np.iinfo(np.uint32).max).to_numpy())
        names = {int(c): str(v) for c, v in zip(present.to_physical().to_list(), present.cast(pl.String).to_list(),
                                                  strict=True) if c is not None and v is not None}
    return _Grouped(steps=layout.group(metrics.get_column("step").to_numpy()),
                    segments=layout.group(metrics.get_column("segment").to_numpy()),
                    values=layout.group(value.cast(pl.Float64).fill_null(float("nan")).to_numpy()),
                    nulls=nulls, sources=sources, source_names=names,
                    one_source=None if sources is not None else str(present.cast(pl.String)[0]))


@dataclass(frozen=True)
class Series:
    """One metric as a time line, ready for detection.

    ``steps``/``values`` are the *effective* timeline: rows superseded by a later segment
    (TensorBoard's purge rule: a record at step s supersedes earlier records with step >= s)
    are dropped, the rest sorted by step. ``segments`` gives each point's segment.

    Attributes:
        metric: Canonical metric name.
        steps: int64 array, strictly increasing.
        values: float64 array (NaN/inf kept as logged, null as NaN).
        segments: int32 array, same length.
        source: The file the values came from (the most precise source for this metric).
    """

    metric: str
    steps: np.ndarray
    values: np.ndarray
    segments: np.ndarray
    source: str

    def __len__(self) -> int:
        return int(self.steps.shape[0])



def _effective(steps: np.ndarray, segs: np.ndarray) -> np.ndarray:
    """Row numbers of the effective timeline of one metric's rows (in read order), in step order.

    A later segment wins for a repeated step (TensorBoard's purge rule), within a segment the last row;
    a step logged in segment k but followed by a lower-numbered start step in a later segment is superseded.
    """
    if bool((np.diff(segs) >= 0).all()):  # segments in read order (one file, or files in time order)
        order = np.argsort(steps, kind="stable")  # the rows of each step in read order: its last row wins
        ordered = steps[order]
        last = np.ones(ordered.shape[0], dtype=bool)
        last[:-1] = ordered[1:] != ordered[:-1]
        rows = order[last]
    else:
        frame = pl.DataFrame({"step": steps, "segment": segs}).with_row_index("_i")
        kept = frame.sort(["step", "segment", "_i"]).unique(subset=["step"], keep="last", maintain_order=True)
        rows = kept.get_column("_i").to_numpy()
    k_steps, k_segs = steps[rows], segs[rows]
    if k_segs.size and k_segs.max() > 0:
        seg_ids, first = np.unique(k_segs, return_inverse=True)
        seg_min = np.full(seg_ids.shape[0], np.iinfo(np.int64).max)
        np.minimum.at(seg_min, first, k_steps)
        # for each segment: the smallest start step among all LATER segments (suffix minimum)
        later_min = np.full(seg_ids.shape[0], np.iinfo(np.int64).max)
        later_min[:-1] = np.minimum.accumulate(seg_min[::-1])[::-1][1:]
        rows = rows[k_steps < later_min[first]]
    return rows


@dataclass
class RunData:
    """Everything read from one run folder. Built by :func:`parsers.discover.load_run`.

    Attributes:
        run: The run folder as given.
        metrics: Long metrics table (polars) with global segments.
        events: Events table (polars) with global segments.
        meta: Merged configuration and facts (``precision``, ``framework``, hyper-parameters).
        sources: Files read.
        skipped: Files or records not read, and why.
        tensors: Per-checkpoint tensor statistics (:data:`forensics.schema.TENSORS_SCHEMA`), may be empty.
        updates: Update ratios between consecutive checkpoints (:data:`forensics.schema.UPDATES_SCHEMA`).
    """

    run: str
    metrics: pl.DataFrame
    events: pl.DataFrame
    meta: dict[str, Any]
    sources: list[SourceInfo]
    skipped: list[Skip]
    tensors: pl.DataFrame = field(default_factory=pl.DataFrame)
    updates: pl.DataFrame = field(default_factory=pl.DataFrame)
    _cache: dict[str, Series | None] = field(default_factory=dict, repr=False)

    @property
    def metric_names(self) -> list[str]:
        """Canonical metric names present, sorted."""
        if self.metrics.height == 0:
            return []
        if "__metric_names__" not in self._cache:  # once per run (cleared with the cache): from the rows' layout
            layout = self._layout()
            names = (layout.slices if layout.slices is not None else layout.span) if layout else {}
            self._cache["__metric_names__"] = sorted(names)  # type: ignore[assignment]
        return list(self._cache["__metric_names__"])  # type: ignore[arg-type]

    def has(self, metric: str) -> bool:
        """True when the metric has at least one row."""
        s = self.series(metric)
        return s is not None and len(s) > 0

    @property
    def n_segments(self) -> int:
        """Number of global segments (1 when the run never restarted)."""
        if self.metrics.height == 0:
            return 1
        return int(self.metrics.get_column("segment").max()) + 1  # type: ignore[arg-type, operator]

    def raw(self, metric: str, columns: list[str] | None = None) -> pl.DataFrame:
        """Every row of one metric, all sources and segments, in read order (only ``columns``, when given).

        The rows of every metric are found in one pass per run (:data:`MAX_SLICES`): slices of the frame
        (no copy) when they lie in few runs of rows, else a gather of the metric's rows.
        """
        frame = self.metrics if columns is None else self.metrics.select(columns)
        layout = self._layout()
        if layout is None:
            return frame.clear()
        if layout.slices is not None:
            where = layout.slices.get(metric)
            if where is None:
                return frame.clear()
            parts = [frame.slice(a, k) for a, k in where]
            return parts[0] if len(parts) == 1 else pl.concat(parts, how="vertical", rechunk=False)
        rows = layout.rows(metric)
        return frame.clear() if rows is None else frame[rows]

    def _layout(self) -> _Layout | None:
        """:func:`_layout` of the frame, once per run (``None``: no rows)."""
        if "__layout__" not in self._cache:  # one pass over the long table per run, not one filter per metric
            self._cache["__layout__"] = _layout(self.metrics) if self.metrics.height else None  # type: ignore[assignment]
        return self._cache["__layout__"]  # type: ignore[return-value]

    def values_after(self, metric: str, onset: int, length: int) -> np.ndarray | None:
        """Values of ``metric``'s effective timeline after an onset, or ``None`` when there are none.

        The window is steps ``onset .. onset + max(length, 1)``, both ends included.
        """
        s = self.series(metric)
        if s is None or len(s) == 0:
            return None
        m = (s.steps >= onset) & (s.steps <= onset + max(length, 1))
        return s.values[m] if m.any() else None

    def series(self, metric: str) -> Series | None:
        """The effective timeline of one metric (see :class:`Series`), or ``None`` if absent.

        When several sources log the metric, the one with the most rows wins (ties: the first
        in the most precise format); rows superseded by a later segment are dropped. Only the
        step, segment and value columns are moved (no copy of the metric's other columns).
        """
        if metric in self._cache:
            return self._cache[metric]
        out = self._series_of(metric) if self.metrics.height else None
        if out is not False:
            self._cache[metric] = out  # type: ignore[assignment]
            return out  # type: ignore[return-value]
        df = self.raw(metric, ["source", "step", "segment", "value"])
        if df.get_column("value").null_count():
            df = df.filter(pl.col("value").is_not_null())  # JSON null = not logged
        if df.height == 0:
            self._cache[metric] = None
            return None
        df, best = self._best_group(df)
        steps = df.get_column("step").to_numpy()
        segs = df.get_column("segment").to_numpy()
        if not (bool((np.diff(steps) > 0).all()) and bool((np.diff(segs) >= 0).all())):
            keep = _effective(steps, segs)  # row numbers of the effective timeline, in step order
            steps, segs = steps[keep], segs[keep]
            df = df.select("value")[keep]
        vals = df.get_column("value").cast(pl.Float64).fill_null(float("nan")).to_numpy()
        out = Series(metric=metric, steps=np.asarray(steps, dtype=np.int64), values=np.asarray(vals, dtype=np.float64),
                     segments=np.asarray(segs, dtype=np.int32), source=str(best))
        self._cache[metric] = out
        return out

    def _series_of(self, metric: str) -> Series | None | bool:
        """:meth:`series` from the rows grouped by metric (:func:`_grouped`), or ``False`` to take the frame's path.

        ``False`` when the frame's rows lie in few runs (slices of the frame are as cheap) or the metric's rows
        come from several sources (then :meth:`series` chooses among them on the frame).
        """
        layout = self._layout()
        if layout is None or layout.slices is not None:
            return False
        if metric not in layout.span:
            return None
        if "__grouped__" not in self._cache:
            self._cache["__grouped__"] = _grouped(self.metrics, layout)  # type: ignore[assignment]
        g: _Grouped = self._cache["__grouped__"]  # type: ignore[assignment]
        a, b = layout.span[metric]
        steps, segs, vals = g.steps[a:b], g.segments[a:b], g.values[a:b]
        keep = ~g.nulls[a:b] if g.nulls is not None and g.nulls[a:b].any() else None
        if keep is not None:
            steps, segs, vals = steps[keep], segs[keep], vals[keep]
        if steps.shape[0] == 0:
            return None
        source = g.one_source
        if g.sources is not None:
            src = g.sources[a:b] if keep is None else g.sources[a:b][keep]
            source = g.source_names.get(int(src[0])) if g.source_names else None
            if source is None or bool((src != src[0]).any()):
                return False
        if not (bool((np.diff(steps) > 0).all()) and bool((np.diff(segs) >= 0).all())):
            keep = _effective(steps, segs)  # row numbers of the effective timeline, in step order
            steps, segs, vals = steps[keep], segs[keep], vals[keep]
        return Series(metric=metric, steps=np.asarray(steps, dtype=np.int64), values=vals,
                      segments=np.asarray(segs, dtype=np.int32), source=str(source))

    def _best_group(self, df: pl.DataFrame) -> tuple[pl.DataFrame, str]:
        """The rows of the source group with the most rows (ties: the first key) and its file with the most rows.

        The files of one source group (:mod:`parsers.discover`: e.g. ``lightning_logs/version_0``,
        ``version_1``) are one timeline.
        """
        present = df.get_column("source").unique().cast(pl.String).to_list()
        if len(present) == 1:
            return df, present[0]
        groups = {s: g for s, g in (self.meta.get("source_groups") or {}).items() if s in present}
        src = pl.col("source").cast(pl.String)
        df = df.with_columns((src.replace(groups) if groups else src).alias("_g"))
        counts = df.group_by("_g").len().sort(["len", "_g"], descending=[True, False])
        df = df.filter(pl.col("_g") == counts.get_column("_g")[0]).drop("_g")
        per_file = (df.group_by(src.alias("source")).len()
                    .sort(["len", "source"], descending=[True, False]))
        return df, str(per_file.get_column("source")[0])

    def view(self, max_segment: int) -> RunData:
        """The run as it stood at the end of segment ``max_segment`` (later segments dropped).

        Used to analyse a failed attempt that a later restart rolled back and superseded.
        """
        keep = pl.col("segment") <= max_segment
        return RunData(
            run=self.run, metrics=self.metrics.filter(keep),
            events=self.events.filter(keep) if self.events.height else self.events,
            meta=self.meta, sources=self.sources, skipped=self.skipped,
            tensors=self.tensors.filter(pl.col("step") <= self.metrics.filter(keep).get_column("step").max())
            if self.tensors.height and self.metrics.height else self.tensors,
            updates=self.updates,
        )

    def rolled_back_segments(self) -> list[int]:
        """Segments that a later restart rolled back: a later segment starts before their last step.

        Such a segment is a failed (or abandoned) attempt whose rows the effective timeline hides.
        """
        if self.metrics.height == 0:
            return []
        span = self.segment_spans()
        lo = span.get_column("lo").to_numpy()
        later_lo = np.full(lo.shape[0], np.iinfo(np.int64).max)  # the lowest start of any later segment
        later_lo[:-1] = np.minimum.accumulate(lo[::-1])[::-1][1:]
        return [int(s) for s in span.get_column("segment").to_numpy()[later_lo < span.get_column("hi").to_numpy()]]

    def segment_starts(self) -> dict[int, int]:
        """First logged step of each global segment."""
        if self.metrics.height == 0:
            return {}
        return {int(s): int(v) for s, v, _ in self.segment_spans().iter_rows()}

    def segment_spans(self) -> pl.DataFrame:
        """``segment``, ``lo``, ``hi``: the first and last logged step of each global segment, sorted by segment.

        One pass over the long table per run (cached); an empty frame when there are no rows.
        """
        if "__segment_spans__" not in self._cache:
            m = self.metrics
            seg = m.get_column("segment")
            if m.height and seg.min() == seg.max():  # one segment: two reductions, no group-by
                step = m.get_column("step")
                span = pl.DataFrame({"segment": [seg[0]], "lo": [step.min()], "hi": [step.max()]},
                                    schema={"segment": seg.dtype, "lo": step.dtype, "hi": step.dtype})
            else:
                span = (m.group_by("segment").agg(pl.col("step").min().alias("lo"), pl.col("step").max().alias("hi"))
                        .sort("segment"))
            self._cache["__segment_spans__"] = span  # type: ignore[assignment]
        return self._cache["__segment_spans__"]  # type: ignore[return-value]
