"""RS01's per-resume reads by slices (forensics.segment_index, resume_rows) equal plain filters over the rows."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from forensics.resume_rows import _in_order, rows
from forensics.segment_index import SegmentIndex


def _frame(rng: np.random.Generator) -> pl.DataFrame:
    """Rows sorted by (segment, step): segments restart near, before or after the earlier ones, steps repeat."""
    parts = []
    for g in sorted(rng.choice(60, size=int(rng.integers(1, 12)), replace=False).tolist()):
        start = int(rng.integers(0, 40))
        st = np.sort(start + rng.integers(0, 30, size=int(rng.integers(1, 25))))
        parts.append(pl.DataFrame({"segment": np.full(st.size, g * 1000, np.int64), "step": st,
                                   "value": rng.normal(size=st.size)}))
    return pl.concat(parts)


@pytest.mark.parametrize("seed", range(40))
def test_slices_equal_filters(seed: int) -> None:
    """rows/below/before (with and without a row mask)/from_step against polars filters of the sorted rows."""
    rng = np.random.default_rng(seed)
    f = _frame(rng)
    idx = SegmentIndex(f)
    f = f.with_row_index("_i")
    ok = rng.random(f.height) > 0.3
    for k, seg in enumerate(idx.ids.tolist()):
        assert idx.position(seg) == k
        a, b = idx.rows(seg)
        assert f.slice(a, b - a).get_column("_i").to_list() == f.filter(pl.col("segment") == seg)["_i"].to_list()
        assert idx.below(seg) == f.filter(pl.col("segment") < seg).height
        prev = f.filter(pl.col("segment") < seg)
        for s0 in rng.integers(-5, 80, size=6).tolist():
            for n in (1, 2, 5, 30):
                want = prev.filter(pl.col("step") < s0)["_i"].to_numpy()
                assert idx.before(k, s0, n).tolist() == want[-n:].tolist()
                want_ok = want[ok[want]]
                assert idx.before(k, s0, n, ok).tolist() == want_ok[-n:].tolist()
            assert idx.from_step(k, s0).tolist() == prev.filter(pl.col("step") >= s0)["_i"].to_list()
    assert idx.rows(10**6) == (0, 0)


def test_order_check_and_an_empty_index() -> None:
    """The sortedness check (ties, a step or a segment going back) and an index of no rows."""
    assert _in_order(np.array([0, 0, 1, 1]), np.array([1, 2, 0, 5]))
    assert not _in_order(np.array([0, 0, 1, 1]), np.array([2, 1, 0, 5]))
    assert not _in_order(np.array([1, 0]), np.array([0, 1]))
    idx = SegmentIndex(pl.DataFrame())
    assert idx.ids.size == 0 and idx.before(0, 5, 3).size == 0 and idx.from_step(0, 5).size == 0


class _Run:
    """The two things :func:`rows` asks of a run: its frame's rows of a metric and its segment count."""

    def __init__(self, frame: pl.DataFrame) -> None:
        self.frame, self.meta, self.n_segments = frame, {}, int(frame["segment"].max()) + 1

    def series(self, metric: str) -> object:
        return type("S", (), {"source": "a.log"})()

    def raw(self, metric: str, columns: list[str]) -> pl.DataFrame:
        return self.frame.select(columns)


@pytest.mark.parametrize("seed", range(10))
def test_rows_split_at_restarts_like_one_term_per_restart(seed: int) -> None:
    """The virtual segments by binary search equal the former sum of one comparison per restart, sorted alike."""
    rng = np.random.default_rng(seed)
    n = 300
    frame = pl.DataFrame({"source": ["a.log"] * n, "segment": rng.integers(0, 4, n).astype(np.int32),
                          "step": rng.integers(0, 50, n), "value": rng.normal(size=n)})
    restarts = sorted({(int(g), int(s)) for g, s in zip(rng.integers(0, 4, 5), rng.integers(0, 50, 5), strict=True)})
    got = rows(_Run(frame), "loss", restarts)  # type: ignore[arg-type]
    part = pl.lit(0, dtype=pl.Int64)
    for g, s in restarts:
        part = part + ((pl.col("segment") == g) & (pl.col("step") >= s)).cast(pl.Int64)
    want = (frame.with_columns((pl.col("segment").cast(pl.Int64) * 1000 + part).alias("segment"))
            .sort(["segment", "step"], maintain_order=True).select("segment", "step", "value"))
    assert got.with_columns(pl.col("segment").cast(pl.Int64)).equals(want)
