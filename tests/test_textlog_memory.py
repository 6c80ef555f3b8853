"""The compact long table (issue 16, the 10M-line text log): what a row costs, and that nothing read changes.

The text reader's bulk rows are dictionary-encoded (``metric``/``tag`` 4 bytes a row, ``run``/``source`` 1 byte,
``wall_time`` null-typed without a time), :attr:`RunData.metrics` holds categoricals and ``run`` once, and
:meth:`RunData.raw` / :meth:`RunData.series` give the same rows and timelines as a filter and the former
sort-based timeline. The 10M-line figures: ``benchmarks/bench_textlog_memory.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from forensics import rundata
from forensics.rundata import RunData, metrics_frame
from forensics.schema import METRICS_SCHEMA, METRICS_TEXT, conform_metrics
from parsers import discover, textlog


def _log(path: Path, n: int, restart_every: int = 0, timed: bool = False) -> None:
    with path.open("w") as fh:
        for i in range(n):
            s = i % restart_every if restart_every else i
            stamp = f"2024-01-01 10:{i // 3600 % 60:02d}:{i % 60:02d} " if timed else ""
            fh.write(f"{stamp}step {s} loss {3 - i * 1e-6:.6f} lr 0.001 grad_norm {1 + i % 7 / 10:.2f}\n")


def test_bulk_rows_are_compact_and_equal_to_the_string_table(tmp_path: Path) -> None:
    """30 bytes a row without wall times (was 56): the same values as the string table, each metric's rows together."""
    _log(tmp_path / "train.log", 150_000, restart_every=40_000)
    t = textlog.read(tmp_path / "train.log", tmp_path).metrics
    assert t.num_rows == 450_000
    assert all(pa.types.is_dictionary(t.schema.field(c).type) for c in METRICS_TEXT)
    assert pa.types.is_null(t.schema.field("wall_time").type)
    assert t.nbytes / t.num_rows <= 30.5
    plain = conform_metrics(t).cast(METRICS_SCHEMA.set(5, METRICS_SCHEMA.field("wall_time").with_type(pa.null())))
    df = pl.from_arrow(plain)
    assert df.get_column("source").unique().to_list() == ["train.log"]
    loss = df.filter(pl.col("metric") == "loss")
    assert loss.height == 150_000 and loss.get_column("segment").max() == 3
    assert loss.get_column("step").to_list()[39_999:40_001] == [39_999, 0]
    runs = pl.Series(t.column("metric").to_pylist()).rle_id().max()
    assert runs < 3 * (150_000 // 65_536 + 2)  # grouped by metric within each block


def test_timed_lines_keep_their_wall_times(tmp_path: Path) -> None:
    """Lines with a timestamp: ``wall_time`` stays float64 with every value."""
    _log(tmp_path / "train.log", 5_000, timed=True)
    t = textlog.read(tmp_path / "train.log", tmp_path).metrics
    assert t.schema.field("wall_time").type == pa.float64() and t.column("wall_time").null_count == 0


def test_run_frame_is_categorical_and_filters_by_string(tmp_path: Path) -> None:
    """A run of two readers: categorical text, filters by string, one timeline per metric."""
    run = tmp_path / "run"
    run.mkdir()
    _log(run / "train.log", 5_000, restart_every=2_000)
    (run / "metrics.jsonl").write_text("".join(f'{{"step": {s}, "eval_loss": {2 - s / 1e4}}}\n' for s in range(50)))
    data = discover.load_run(run)
    schema = data.metrics.schema
    assert schema["metric"] == pl.Categorical and schema["source"] == pl.Categorical and schema["run"] == pl.String
    assert data.metrics.filter(pl.col("metric") == "eval_loss").height == 50
    assert data.metrics.filter(pl.col("run") == "run").height == data.metrics.height
    assert sorted(data.metrics.get_column("source").unique().to_list()) == ["metrics.jsonl", "train.log"]
    assert data.series("loss") is not None and len(data.series("loss")) == 1_000  # the last launch (0..999) wins


def _frame(rng: np.random.Generator, n: int, interleave: bool, ordered: bool) -> pl.DataFrame:
    metric = rng.choice(["loss", "lr", "grad_norm"], n) if interleave else np.repeat(["loss", "lr"], n // 2)
    segment = rng.integers(0, 4, n)
    return pl.DataFrame({
        "run": ["r"] * n, "segment": (np.sort(segment) if ordered else segment).astype(np.int32),
        "step": rng.integers(0, 60, n), "metric": metric, "value": rng.normal(size=n),
        "wall_time": [None] * n, "tag": metric, "source": rng.choice(["a.log", "b.log"], n)},
        schema_overrides={"wall_time": pl.Float64})


def _old_series(df: pl.DataFrame, meta: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """The timeline as ``RunData.series`` computed it before the compact table (sort, unique, suffix minimum)."""
    df = df.filter(pl.col("value").is_not_null())
    present = set(df.get_column("source").unique().to_list())
    groups = {s: g for s, g in (meta.get("source_groups") or {}).items() if s in present}
    df = df.with_columns((pl.col("source").replace(groups) if groups else pl.col("source")).alias("_g"))
    counts = df.group_by("_g").len().sort(["len", "_g"], descending=[True, False])
    df = df.filter(pl.col("_g") == counts.get_column("_g")[0]).with_row_index("_i")
    best = df.group_by("source").len().sort(["len", "source"], descending=[True, False]).get_column("source")[0]
    df = df.sort(["step", "segment", "_i"]).unique(subset=["step"], keep="last", maintain_order=True)
    segs, steps = df.get_column("segment").to_numpy(), df.get_column("step").to_numpy()
    if segs.size and segs.max() > 0:
        starts = df.group_by("segment").agg(pl.col("step").min()).sort("segment")
        ids, lo = starts.get_column("segment").to_numpy(), starts.get_column("step").to_numpy()
        later = np.full(ids.shape[0], np.iinfo(np.int64).max)
        for k in range(ids.shape[0] - 2, -1, -1):
            later[k] = min(later[k + 1], lo[k + 1])
        df = df.filter(pl.Series(steps < later[np.searchsorted(ids, segs)]))
    return (df.get_column("step").to_numpy(), df.get_column("value").to_numpy(), df.get_column("segment").to_numpy(),
            str(best))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("interleave", [False, True])
def test_raw_and_series_are_those_of_a_filter_and_the_old_timeline(seed: int, interleave: bool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Random rows (restarts, two sources, groups): slices and gathers give a filter's rows, the old timeline."""
    rng = np.random.default_rng(seed)
    df = _frame(rng, 2_000, interleave, ordered=seed < 4)  # segments in read order, or not
    meta = {"source_groups": {"a.log": "g1", "b.log": "g1" if seed % 2 else "g2"}}
    if seed % 3 == 0:
        monkeypatch.setattr(rundata, "MAX_SLICES", 1)  # the gather path on a frame of few runs too
    compact = metrics_frame(df.to_arrow(), "r")
    for frame in (df, compact):
        run = RunData(run="r", metrics=frame, events=pl.DataFrame(), meta=meta, sources=[], skipped=[])
        for m in ("loss", "lr", "grad_norm", "absent"):
            want = frame.filter(pl.col("metric") == m)
            assert run.raw(m).equals(want)
            assert run.raw(m, ["step", "value"]).equals(want.select("step", "value"))
            got = run.series(m)
            if want.height == 0:
                assert got is None
                continue
            steps, values, segs, best = _old_series(want.with_columns(pl.col("source").cast(pl.String)), meta)
            assert (got.steps.tolist(), got.values.tolist(), got.segments.tolist(), got.source) == (
                steps.tolist(), values.tolist(), segs.tolist(), best)


def test_rolled_back_segments_and_conform() -> None:
    """Rolled-back segments (a later start below their last step); conform casts, keeps compact columns."""
    df = pl.DataFrame({"segment": np.array([0, 0, 1, 1, 2, 2, 3], np.int32), "step": [0, 10, 5, 20, 30, 40, 35]})
    run = RunData(run="r", metrics=df, events=pl.DataFrame(), meta={}, sources=[], skipped=[])
    assert run.rolled_back_segments() == [0, 2]
    t = METRICS_SCHEMA.empty_table()
    assert conform_metrics(t).schema.equals(METRICS_SCHEMA)
    loose = pa.table({**{f.name: pa.array([], f.type) for f in METRICS_SCHEMA}, "segment": pa.array([], pa.int64())})
    assert conform_metrics(loose).schema.field("segment").type == pa.int32()
    assert metrics_frame(t, "r").schema["metric"] == pl.Categorical
