"""OV01's and LR01's whole-column tests equal their one-item-at-a-time definitions (issue 17: no per-step loop).

Each vectorised helper is compared, on random inputs, with the loop it replaced, written here as the definition:

- ``overflow_loss_scale_collapse._reaches``: ``any(values[lo:hi] >= level)`` per range;
- ``LossScaleCollapse._calibration``: the start-up run of back-offs of each segment, walked back-off by back-off;
- ``lr_schedule_reset._smooth_rise``: a jump within 3x the median log change of the 9 points before it;
- ``lr_rows.pairs_repeat`` / ``by_segment``: against polars' group-by and a per-segment filter and sort.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from test_detectors import table_run

from forensics.detectors.lr_schedule_reset import _smooth_rise
from forensics.detectors.overflow_loss_scale_collapse import LossScaleCollapse, _Backoffs, _reaches
from forensics.lr_rows import by_segment, pairs_repeat

SEEDS = range(40)


@pytest.mark.parametrize("seed", SEEDS)
def test_reaches_is_any_over_each_range(seed: int) -> None:
    """Ranges in any order, empty or reversed ones included, a NaN among the values."""
    rng = np.random.default_rng(seed)
    values = rng.normal(size=int(rng.integers(1, 60)))
    values[rng.integers(0, values.size)] = np.nan
    lo = rng.integers(0, values.size + 1, 30)
    hi = rng.integers(0, values.size + 1, 30)
    level = rng.normal(size=30)
    want = [bool(np.any(values[a:b] >= t)) for a, b, t in zip(lo, hi, level, strict=True)]
    assert _reaches(values, lo, hi, level).tolist() == want


def _calibration_by_loop(det: LossScaleCollapse, run, backoffs: list[tuple[int, float, int]],  # noqa: ANN001
                         scales: tuple[np.ndarray, np.ndarray]) -> set[int]:
    """The definition: per segment, back-offs from its start, each close to the last, the scale never held."""
    s = run.series("loss_scale")
    segs, first = np.unique(s.segments, return_index=True)
    seg_start = dict(zip(segs.tolist(), s.steps[first].tolist(), strict=True))
    by_seg: dict[int, list[tuple[int, float, int]]] = {}
    for b in backoffs:
        by_seg.setdefault(b[2], []).append(b)
    sc_st, sc_v = scales
    interval = max(1, int(np.median(np.diff(sc_st)))) if sc_st.size > 2 else 1
    out: set[int] = set()
    for g, bs in by_seg.items():
        if bs[0][0] - seg_start.get(g, bs[0][0]) > det.calibration_start_intervals * interval:
            continue
        out.add(bs[0][0])
        for (prev_step, prev_scale, _), (st, _v, _g) in zip(bs, bs[1:], strict=False):
            lo, hi = np.searchsorted(sc_st, prev_step, side="right"), np.searchsorted(sc_st, st, side="left")
            if st - prev_step > det.burst_gap_intervals * interval or bool(np.any(sc_v[lo:hi] >= prev_scale)):
                break
            out.add(st)
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_calibration_equals_the_walk(seed: int) -> None:
    """Random fp16 scales over up to three segments (restarts that rewind), start-up halvings, gaps, growth."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(10, 300))
    seg = np.sort(rng.integers(0, 3, n))
    steps = np.concatenate([np.arange((seg == g).sum()) * int(rng.integers(1, 4)) + 5 * g for g in range(3)])
    x, scale = 2.0 ** 16, np.empty(n)
    for i in range(n):
        r = rng.random()
        x = x / 2 if r < (0.5 if i % 100 < 8 else 0.05) else x * 2 if r > 0.97 else x
        scale[i] = x
    run = table_run({"loss_scale": scale}, steps, seg)
    det = LossScaleCollapse()
    bo, _interval, scales = det._backoffs(run)
    as_tuples = list(zip(bo.steps.tolist(), bo.scales.tolist(), bo.segments.tolist(), strict=True))
    want = _calibration_by_loop(det, run, as_tuples, scales) if as_tuples else set()
    assert set(det._calibration(run, _Backoffs(*bo), scales).tolist()) == want


@pytest.mark.parametrize("seed", SEEDS)
def test_smooth_rise_equals_the_window_median(seed: int) -> None:
    """Noisy, flat (zero), negative and NaN lrs; candidates at the very start (short windows) included."""
    rng = np.random.default_rng(seed)
    v = 1e-3 * np.exp(rng.normal(0, 0.3, 80))
    v[rng.integers(0, 80, 3)] = np.nan
    v[rng.integers(0, 80, 2)] = 0.0
    idx = np.unique(rng.integers(1, 80, 25))
    want = []
    with np.errstate(all="ignore"):
        for i in idx.tolist():
            rd = np.abs(np.diff(np.log(np.clip(v[max(0, i - 9):i], 1e-30, None))))
            want.append(bool(rd.size >= 4 and np.log(v[i] / v[i - 1]) <= 3.0 * float(np.median(rd))))
    assert _smooth_rise(v, idx, 3.0).tolist() == want


@pytest.mark.parametrize("seed", SEEDS)
def test_lr_rows_by_segment_and_repeats(seed: int) -> None:
    """Segments out of order or split into runs, steps repeated or falling: the same frames as filter + sort."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 40))
    seg = np.sort(rng.integers(0, 3, n)) if rng.random() < 0.6 else rng.integers(0, 3, n)
    step = np.arange(n) if rng.random() < 0.5 else rng.integers(0, n, n)
    rows = pl.DataFrame({"segment": seg.astype(np.int32), "step": step.astype(np.int64),
                         "value": rng.integers(0, 3, n).astype(np.float64)})
    repeats = rows.group_by("segment", "step").len().get_column("len").max() > 1
    assert pairs_repeat(rows) or not repeats  # False only where no pair repeats
    if np.all(np.diff(step) > 0) and np.all(np.diff(seg) >= 0):
        assert not pairs_repeat(rows)
    got = by_segment(rows)
    assert list(got) == sorted(set(seg.tolist()))
    for g, df in got.items():
        want = rows.filter(pl.col("segment") == g).sort("step", maintain_order=True)
        assert df.get_column("step").to_list() == want.get_column("step").to_list()
        if not np.any(np.diff(want.get_column("step").to_numpy()) == 0):  # ties: any order is a sort
            assert df.equals(want)
