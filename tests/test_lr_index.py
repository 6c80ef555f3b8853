"""RS01's lr lookups at a resume (forensics.resume_rows.LrIndex) equal a plain filter over the earlier rows."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from forensics.resume_rows import LrIndex


def _naive_before(lr: pl.DataFrame, seg: int, step: int) -> tuple[float, bool] | None:
    prev = lr.filter(pl.col("segment") < seg)
    same = prev.filter(pl.col("step") == step)
    if same.height:
        return float(same.sort("segment", maintain_order=True).get_column("value")[-1]), True
    before = prev.filter(pl.col("step") < step)
    if before.height == 0:
        return None
    top = before.filter(pl.col("step") == before.get_column("step").max())
    return float(top.sort("segment", maintain_order=True).get_column("value")[-1]), False


@pytest.mark.parametrize("seed", range(20))
def test_lookups_equal_a_filter(seed: int) -> None:
    """Random segments with steps that go back and repeat: first row and earlier lr as a filter gives them."""
    rng = np.random.default_rng(seed)
    rows = []
    for seg in range(int(rng.integers(1, 8))):
        start = int(rng.integers(0, 50))
        for st in sorted(rng.choice(np.arange(start, start + 60), size=int(rng.integers(1, 30)), replace=False)):
            vseg = seg * 1000 + int(rng.integers(0, 2))
            rows.append({"segment": vseg, "step": int(st), "value": float(rng.random())})
    lr = pl.DataFrame(rows).sort(["segment", "step"], maintain_order=True)
    index = LrIndex(lr)
    for seg in lr.get_column("segment").unique().to_list():
        cur = lr.filter(pl.col("segment") == seg)
        assert index.first(seg) == (int(cur.get_column("step")[0]), float(cur.get_column("value")[0]))
        for step in (int(cur.get_column("step")[0]), 0, 30, 200):
            assert index.before(seg, step) == _naive_before(lr, seg, step)
    assert index.first(10**6) is None and LrIndex(lr.clear()).before(5, 3) is None
