"""The frame's layout, grouping, segment spans and (tag, metric) pairs read slice by slice equal whole-column results.

A wide log (every record the same metrics in the same order) whose text chunks are prefixes of one shared array,
as the JSONL reader hands them out, and a log that is not wide, each with tiny slices (every boundary inside a
record, a chunk, a segment) and with one slice: the same layout, the same grouped arrays, the same spans and pairs
as the reference computed from whole numpy columns.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from forensics import column_scan, metric_rows, rundata
from forensics.metric_rows import distinct_pairs, grouped, layout, metrics_frame

NAMES = ["loss", "lr", "grad_norm", "weight_norm/q", "weight_norm/k"]


def _table(records: int, *, wide: bool, segments: int = 1, nulls: bool = False) -> pa.Table:
    """A long metrics table in chunks of uneven length; text chunks are prefixes of one tiled array when wide."""
    rng = np.random.default_rng(records + segments)
    p = len(NAMES)
    if wide:
        per = np.full(records, p)
        metric = np.tile(np.arange(p), records)
    else:  # a record logs a random subset of the metrics
        subsets = [np.sort(rng.choice(p, rng.integers(1, p + 1), replace=False)) for _ in range(records)]
        per, metric = np.array([len(x) for x in subsets]), np.concatenate(subsets)
    rec = np.repeat(np.arange(records), per)
    seg = (rec * segments // records).astype(np.int32)
    step = rec - (seg * (records // segments)) // 2  # later segments go back: a resume
    value = rng.lognormal(0, 0.3, metric.size)
    mask = rng.random(metric.size) < 0.01 if nulls else None
    names = pa.array([NAMES[k] for k in metric], pa.string())
    tags = pa.array([f"train/{NAMES[k]}" for k in metric], pa.string())
    cuts = sorted({0, metric.size, *rng.integers(0, metric.size, 6).tolist()}) if not wide else \
        sorted({0, metric.size, *(p * rng.integers(0, records, 6)).tolist()})
    cols: dict[str, list[pa.Array]] = {k: [] for k in ("run", "segment", "step", "metric", "value", "wall_time",
                                                        "tag", "source")}
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        if a == b:
            continue
        cols["run"].append(pa.array(["r"] * (b - a), pa.string()))
        cols["segment"].append(pa.array(seg[a:b], pa.int32()))
        cols["step"].append(pa.array(step[a:b], pa.int64()))
        cols["metric"].append(names.slice(0, b - a) if wide else names.slice(a, b - a))  # wide: prefixes of one array
        cols["tag"].append(tags.slice(0, b - a) if wide else tags.slice(a, b - a))
        cols["value"].append(pa.array(value[a:b], pa.float64(), mask=None if mask is None else mask[a:b]))
        cols["wall_time"].append(pa.nulls(b - a, pa.float64()))
        cols["source"].append(pa.array(["metrics.jsonl"] * (b - a), pa.string()))
    return pa.table({k: pa.chunked_array(v) for k, v in cols.items()})


def _reference_rows(frame: pl.DataFrame) -> dict[str, np.ndarray]:
    """Each metric's frame row numbers in read order, from whole columns."""
    names = frame.get_column("metric").cast(pl.String).to_numpy()
    return {m: np.flatnonzero(names == m) for m in sorted(set(names.tolist()))}


@pytest.mark.parametrize("wide", [True, False])
@pytest.mark.parametrize("scan", [7, 1 << 20])
@pytest.mark.parametrize("nulls", [False, True])
@pytest.mark.parametrize("threaded", [False, True])
def test_layout_and_grouping_slice_by_slice(monkeypatch: pytest.MonkeyPatch, wide: bool, scan: int,
                                            nulls: bool, threaded: bool) -> None:
    """Layout and grouped arrays equal whole-column references for any slice size, values on a thread or not."""
    monkeypatch.setattr(column_scan, "SCAN_ROWS", scan)
    monkeypatch.setattr(metric_rows, "THREAD_ROWS", 0 if threaded else 1 << 62)
    frame = metrics_frame(_table(997, wide=wide, segments=2, nulls=nulls), "r")
    lay = layout(frame, max_slices=0)  # no slices: the grouped path
    assert (lay.period == len(NAMES)) == wide
    g = grouped(frame, lay)
    ref = _reference_rows(frame)
    steps = frame.get_column("step").to_numpy()
    segs = frame.get_column("segment").to_numpy()
    vals = frame.get_column("value").fill_null(float("nan")).to_numpy()
    assert sorted(lay.span) == sorted(ref)
    for m, rows in ref.items():
        a, b = lay.span[m]
        st, sg, v = g.part(a, b)
        assert np.array_equal(lay.rows(m), rows)
        assert np.array_equal(st, steps[rows]) and np.array_equal(sg, segs[rows])
        assert np.array_equal(v, vals[rows], equal_nan=True)
        if nulls:
            assert g.nulls is not None and np.array_equal(g.nulls[a:b], np.isnan(vals[rows]))


@pytest.mark.parametrize("span_rows", [5, 1 << 20])
def test_segment_spans_slice_by_slice(monkeypatch: pytest.MonkeyPatch, span_rows: int) -> None:
    """Segment spans (one segment or several per slice) equal a group-by."""
    monkeypatch.setattr(rundata, "SPAN_ROWS", span_rows)
    frame = metrics_frame(_table(600, wide=True, segments=3), "r")
    want = (frame.group_by("segment").agg(pl.col("step").min().alias("lo"), pl.col("step").max().alias("hi"))
            .sort("segment").cast({"segment": pl.Int32, "lo": pl.Int64, "hi": pl.Int64}))
    assert rundata._spans(frame).equals(want)


@pytest.mark.parametrize("wide", [True, False])
def test_distinct_pairs(wide: bool) -> None:
    """The (tag, metric) pairs of a wide log (from its first record) and of any log equal a group-by's."""
    frame = metrics_frame(_table(400, wide=wide), "r")
    want = frame.group_by("tag", "metric").len().select("tag", "metric")
    got = distinct_pairs(frame)
    assert got.schema == want.schema
    key = lambda d: sorted(d.with_columns(pl.all().cast(pl.String)).rows())  # noqa: E731
    assert key(got) == key(want)


def test_shared_text_chunks_convert_once_and_equal() -> None:
    """Text chunks that are prefixes of one array give the same frame as chunk-by-chunk conversion."""
    t = _table(500, wide=True)
    assert len({c.buffers()[2].address for c in t.column("metric").chunks}) == 1  # one shared array
    frame = metrics_frame(t, "r")
    for name in ("metric", "tag", "source"):
        want = pa.chunked_array([c.cast(pa.string()) for c in t.column(name).chunks]).to_pylist()
        assert frame.get_column(name).cast(pl.String).to_list() == want
        assert frame.get_column(name).dtype == pl.Categorical
