"""The run as the detectors see it: :class:`RunData` and :class:`Series`.

:class:`RunData` is everything read from one folder, :class:`Series` one metric's effective
timeline. Both are re-exported by :mod:`forensics.model`.

The long metrics frame keeps each text column compact (:func:`metrics_frame`): ``run`` is one value held
once, ``metric``/``tag``/``source`` are categoricals (4 bytes a row; they compare equal to their strings),
``wall_time`` is one null held once when no row has a wall time. Numbers stay ``int64`` steps and
``float64`` values (lossless). A metric's rows are found once per run, as slices of the frame when they
lie in few runs of rows (the text reader groups each block by metric), else as row numbers; no second copy
of the table is kept.

Imports only :mod:`forensics.metric_rows` (and through it :mod:`forensics.schema`) from the project at run
time (the result types are annotations only).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from forensics.metric_rows import MAX_SLICES, Grouped, Layout, grouped, layout, metrics_frame  # noqa: F401 - re-exported

if TYPE_CHECKING:
    from forensics.model import Skip, SourceInfo

_GUARD = threading.Lock()
"""Guards the creation of :class:`RunData`'s per-key cache locks."""

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
        cand = _not_purged(steps, segs)  # the rows no later segment purges (the same rule as below, first)
        order = np.argsort(steps[cand], kind="stable")  # the rows of each step in read order: its last row wins
        ordered = steps[cand][order]
        last = np.ones(ordered.shape[0], dtype=bool)
        last[:-1] = ordered[1:] != ordered[:-1]
        rows = cand[order[last]]
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


def _not_purged(steps: np.ndarray, segs: np.ndarray) -> np.ndarray:
    """Row numbers whose step is below the first step of every later segment (``segs`` non-decreasing).

    A later segment that starts at or before a row's step purges it (TensorBoard's rule), so the sort of
    :func:`_effective` needs only these rows: a log of 1,000 restarts at step 0 keeps its last segment's rows.
    """
    heads = np.flatnonzero(np.r_[True, segs[1:] != segs[:-1]])
    if heads.size < 2:
        return np.arange(steps.shape[0])
    first = np.minimum.reduceat(steps, heads)
    later = np.full(heads.size, np.iinfo(np.int64).max)  # the lowest start of any later segment
    later[:-1] = np.minimum.accumulate(first[::-1])[::-1][1:]
    ends = np.r_[heads[1:], steps.shape[0]]
    return np.concatenate([a + np.flatnonzero(steps[a:b] < lim)
                           for a, b, lim in zip(heads.tolist(), ends.tolist(), later.tolist(), strict=True)])


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
        ranks: Each rank's own values of the series compared across ranks (columns ``rank``, ``segment``,
            ``step``, ``metric``, ``value``; :data:`parsers.rank_files.RANK_SCHEMA`), when the run's logs come
            from several ranks (per-rank files, rank-prefixed lines); empty otherwise.
    """

    run: str
    metrics: pl.DataFrame
    events: pl.DataFrame
    meta: dict[str, Any]
    sources: list[SourceInfo]
    skipped: list[Skip]
    tensors: pl.DataFrame = field(default_factory=pl.DataFrame)
    updates: pl.DataFrame = field(default_factory=pl.DataFrame)
    ranks: pl.DataFrame = field(default_factory=pl.DataFrame)
    _cache: dict[str, Series | None] = field(default_factory=dict, repr=False)
    _locks: dict[str, threading.Lock] = field(default_factory=dict, repr=False, compare=False)

    def cached(self, key: str, build: Callable[[], Any]) -> Any:
        """``_cache[key]``, made by ``build()`` once even when several threads ask (the detectors' pool).

        One lock per key: a thread waits only for the entry it needs. Entries are built from entries of lower
        rank only (z-scores from a series, a series from the grouped rows, those from the layout), so no
        two threads wait on each other.
        """
        if key in self._cache:
            return self._cache[key]
        with _GUARD:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._cache:
                self._cache[key] = build()
            return self._cache[key]

    @property
    def metric_names(self) -> list[str]:
        """Canonical metric names present, sorted."""
        if self.metrics.height == 0:
            return []
        def names() -> list[str]:  # once per run (cleared with the cache): from the rows' layout
            lay = self._layout()
            return sorted((lay.slices if lay.slices is not None else lay.span) if lay else {})

        return list(self.cached("__metric_names__", names))

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
        lay = self._layout()
        if lay is None:
            return frame.clear()
        if lay.slices is not None:
            where = lay.slices.get(metric)
            if where is None:
                return frame.clear()
            parts = [frame.slice(a, k) for a, k in where]
            return parts[0] if len(parts) == 1 else pl.concat(parts, how="vertical", rechunk=False)
        if lay.period and metric in lay.span:  # a wide log: every period-th row (polars' strided gather, ~2x a take)
            return frame.gather_every(lay.period, offset=lay.span[metric][0] // (lay.n // lay.period))
        rows = lay.rows(metric)
        return frame.clear() if rows is None else frame[rows]

    def _layout(self) -> Layout | None:
        """:func:`forensics.metric_rows.layout` of the frame, once per run (``None``: no rows)."""
        return self.cached("__layout__",  # one pass over the long table per run, not one filter per metric
                           lambda: layout(self.metrics, MAX_SLICES) if self.metrics.height else None)

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
        return self.cached(metric, lambda: self._build_series(metric))

    def _build_series(self, metric: str) -> Series | None:
        """:meth:`series`, not cached."""
        out = self._series_of(metric) if self.metrics.height else None
        if out is not False:
            return out  # type: ignore[return-value]
        df = self.raw(metric, ["source", "step", "segment", "value"])
        if df.get_column("value").null_count():
            df = df.filter(pl.col("value").is_not_null())  # JSON null = not logged
        if df.height == 0:
            return None
        df, best = self._best_group(df)
        steps = df.get_column("step").to_numpy()
        segs = df.get_column("segment").to_numpy()
        if not (bool((np.diff(steps) > 0).all()) and bool((np.diff(segs) >= 0).all())):
            keep = _effective(steps, segs)  # row numbers of the effective timeline, in step order
            steps, segs = steps[keep], segs[keep]
            df = df.select("value")[keep]
        vals = df.get_column("value").cast(pl.Float64).fill_null(float("nan")).to_numpy()
        return Series(metric=metric, steps=np.asarray(steps, dtype=np.int64), values=np.asarray(vals, dtype=np.float64),
                      segments=np.asarray(segs, dtype=np.int32), source=str(best))

    def _series_of(self, metric: str) -> Series | None | bool:
        """:meth:`series` from the rows grouped by metric (:func:`~forensics.metric_rows.grouped`), or ``False``.

        ``False`` when the frame's rows lie in few runs (slices of the frame are as cheap) or the metric's rows
        come from several sources (then :meth:`series` chooses among them on the frame).
        """
        lay = self._layout()
        if lay is None or lay.slices is not None:
            return False
        if metric not in lay.span:
            return None
        g: Grouped = self.cached("__grouped__", lambda: grouped(self.metrics, lay))
        a, b = lay.span[metric]
        steps, segs, vals = g.part(a, b)
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
            ranks=self.ranks.filter(keep) if self.ranks.height else self.ranks,
        )

    def segment_spans(self) -> pl.DataFrame:
        """First and last logged step of each global segment: columns ``segment``, ``lo``, ``hi``, by segment.

        One pass over the frame in slices of :data:`SPAN_ROWS` rows (cached): a group-by over every row held
        about 600 MB more at 20M rows (the 1,000-segment text log of the hostile suite).
        """
        return self.cached("__segment_spans__", lambda: _spans(self.metrics))

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


SPAN_ROWS = 1 << 20
"""Rows per slice of :meth:`RunData.segment_spans` (our choice: 1M rows, a few MB of numbers at a time)."""
SPAN_MAX_WIDTH = 1 << 22
"""Segment numbers spanning more than this many values are grouped by polars instead (our choice: the
per-segment arrays stay small; readers number segments from 0)."""


def _spans(metrics: pl.DataFrame) -> pl.DataFrame:
    """``segment``, ``lo`` (min step), ``hi`` (max step) of every segment of ``metrics`` (sorted by segment)."""
    schema = {"segment": pl.Int32, "lo": pl.Int64, "hi": pl.Int64}
    if metrics.height == 0:
        return pl.DataFrame(schema=schema)
    seg = metrics.get_column("segment")
    first, last = int(seg.min()), int(seg.max())  # type: ignore[arg-type]
    if last - first >= SPAN_MAX_WIDTH:
        return (metrics.group_by("segment").agg(pl.col("step").min().alias("lo"), pl.col("step").max().alias("hi"))
                .sort("segment").cast(schema))  # type: ignore[arg-type]
    lo = np.full(last - first + 1, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(last - first + 1, np.iinfo(np.int64).min, dtype=np.int64)
    for part in metrics.select("segment", "step").iter_slices(SPAN_ROWS):
        seg_part, st_part = part.get_column("segment"), part.get_column("step")
        if part.null_count().row(0) == (0, 0) and seg_part.min() == seg_part.max():  # one segment: two reductions
            g = int(seg_part[0]) - first
            lo[g], hi[g] = min(lo[g], int(st_part.min())), max(hi[g], int(st_part.max()))  # type: ignore[arg-type]
            continue
        g = seg_part.to_numpy().astype(np.int64) - first
        st = st_part.to_numpy()
        np.minimum.at(lo, g, st)
        np.maximum.at(hi, g, st)
    present = np.flatnonzero(lo <= hi)
    return pl.DataFrame({"segment": (present + first).astype(np.int32), "lo": lo[present], "hi": hi[present]})
