"""The run as the detectors see it: :class:`RunData` and :class:`Series`.

:class:`RunData` is everything read from one folder, :class:`Series` one metric's effective
timeline. Both are re-exported by :mod:`forensics.model`.

Imports nothing from the project at run time (the result types are annotations only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

if TYPE_CHECKING:
    from forensics.model import Skip, SourceInfo


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



def _in_order(metric: str, df: pl.DataFrame, source: str | None) -> Series | None:
    """The timeline of rows that need no sort and no superseding, else ``None`` (``df``: no null value).

    That is one source whose steps strictly rise and whose segments never go back in read order (the
    common log): the rows are then the effective timeline as they are. ``source``: the run's only
    source (``df`` then has no ``source`` column), or None.
    """
    if source is None:
        if df.get_column("source").n_unique() != 1:
            return None
        source = str(df.get_column("source")[0])
    steps = df.get_column("step").to_numpy()
    segs = df.get_column("segment").to_numpy()
    if not (bool((np.diff(steps) > 0).all()) and bool((np.diff(segs) >= 0).all())):
        return None
    values = df.get_column("value").cast(pl.Float64).to_numpy().astype(np.float64)
    return Series(metric=metric, steps=steps.astype(np.int64), values=values, segments=segs.astype(np.int32),
                  source=source)


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
        if "__metric_names__" not in self._cache:  # one pass over the long table per run (cleared with the cache)
            self._cache["__metric_names__"] = sorted(self.metrics.get_column("metric").unique().to_list())  # type: ignore[assignment]
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

    def raw(self, metric: str) -> pl.DataFrame:
        """Every row of one metric, all sources and segments, in read order.

        The row numbers of every metric are found in one pass over the long table (kept: 4 bytes a row);
        each call gathers only its metric's rows, so no second copy of the table is held.
        """
        return self._rows(metric, self.metrics.columns)

    def _only_source(self) -> str | None:
        """The one source of every row, or None when the rows come from several (found once)."""
        if "__only_source__" not in self._cache:
            names = self.metrics.get_column("source").unique()
            self._cache["__only_source__"] = str(names[0]) if len(names) == 1 else None  # type: ignore[assignment]
        return self._cache["__only_source__"]  # type: ignore[return-value]

    def _rows(self, metric: str, columns: list[str]) -> pl.DataFrame:
        """The ``columns`` of :meth:`raw` (only those are gathered)."""
        if "__rows_by_metric__" not in self._cache:  # one pass per run, not one filter per metric
            groups = self.metrics.select("metric").with_row_index("_i").group_by("metric").agg("_i")
            self._cache["__rows_by_metric__"] = dict(zip(  # type: ignore[assignment]
                groups.get_column("metric").to_list(), groups.get_column("_i"), strict=True))
        rows = self._cache["__rows_by_metric__"].get(metric)  # type: ignore[union-attr]
        frame = self.metrics.select(columns)
        return frame[rows] if rows is not None else frame.clear()

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
        in the most precise format); rows superseded by a later segment are dropped.
        """
        if metric in self._cache:
            return self._cache[metric]
        only = self._only_source()
        df = self._rows(metric, ["step", "segment", "value"] + ([] if only is not None else ["source"]))
        if df.get_column("value").null_count():
            df = df.filter(pl.col("value").is_not_null())  # JSON null = not logged
        if df.height == 0:
            self._cache[metric] = None
            return None
        simple = _in_order(metric, df, only)
        if simple is not None:
            self._cache[metric] = simple
            return simple
        if only is not None:
            df = df.with_columns(pl.lit(only).alias("source"))
        # the files of one source group (parsers.discover: e.g. lightning_logs/version_0, version_1) are
        # one timeline; the group with the most rows wins
        present = set(df.get_column("source").unique().to_list())
        groups = {s: g for s, g in (self.meta.get("source_groups") or {}).items() if s in present}
        df = df.with_columns((pl.col("source").replace(groups) if groups else pl.col("source")).alias("_g"))
        counts = df.group_by("_g").len().sort(["len", "_g"], descending=[True, False])
        df = df.filter(pl.col("_g") == counts.get_column("_g")[0]).with_row_index("_i")
        per_file = df.group_by("source").len().sort(["len", "source"], descending=[True, False])
        best = per_file.get_column("source")[0]
        # later segment wins for a repeated step (TensorBoard purge rule); within a segment the last row wins
        df = df.sort(["step", "segment", "_i"]).unique(subset=["step"], keep="last", maintain_order=True)
        # a step logged in segment k but followed by a lower-numbered step in segment k+1 is superseded
        segs = df.get_column("segment").to_numpy()
        steps = df.get_column("step").to_numpy()
        if segs.size and segs.max() > 0:
            starts = df.group_by("segment").agg(pl.col("step").min()).sort("segment")
            seg_ids = starts.get_column("segment").to_numpy()
            seg_min = starts.get_column("step").to_numpy()
            # for each segment: the smallest start step among all LATER segments (suffix minimum)
            later_min = np.full(seg_ids.shape[0], np.iinfo(np.int64).max)
            for k in range(seg_ids.shape[0] - 2, -1, -1):
                later_min[k] = min(later_min[k + 1], seg_min[k + 1])
            limit = later_min[np.searchsorted(seg_ids, segs)]
            df = df.filter(pl.Series(steps < limit))
        vals = df.get_column("value").cast(pl.Float64).fill_null(float("nan")).to_numpy()
        out = Series(
            metric=metric,
            steps=df.get_column("step").to_numpy().astype(np.int64),
            values=np.asarray(vals, dtype=np.float64),
            segments=df.get_column("segment").to_numpy().astype(np.int32),
            source=str(best),
        )
        self._cache[metric] = out
        return out

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
        span = self.metrics.group_by("segment").agg(pl.col("step").min().alias("lo"), pl.col("step").max().alias("hi"))
        rows = sorted(span.iter_rows())
        out = []
        for i, (seg, _lo, hi) in enumerate(rows):
            if any(lo2 < hi for _s2, lo2, _h2 in rows[i + 1:]):
                out.append(int(seg))
        return out

    def segment_starts(self) -> dict[int, int]:
        """First logged step of each global segment."""
        if self.metrics.height == 0:
            return {}
        return {
            int(s): int(v)
            for s, v in self.metrics.group_by("segment").agg(pl.col("step").min()).sort("segment").iter_rows()
        }
