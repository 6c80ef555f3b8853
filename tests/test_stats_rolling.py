"""The spliced rolling median and the trailing z against polars' null-aware medians: equal value for value.

``rolling.rolling_median`` (the plain polars kernel, null-aware only where a window holds a missing point) against
polars' null-aware ``rolling_median`` over the whole series, and ``trailing_robust_z`` against its former all-polars
form (the z-scores every departure is read from must not move).
"""

from __future__ import annotations

import zlib

import numpy as np
import polars as pl
import pytest

from forensics import rolling, signals, stats


def _reference(x: np.ndarray, missing: np.ndarray, window: int, min_points: int) -> np.ndarray:
    ser = pl.Series(np.where(missing, np.nan, x)).fill_nan(None)
    return ser.rolling_median(window_size=window, min_samples=min_points).fill_null(float("nan")).to_numpy()


def _series(rng: np.random.Generator, n: int, kind: str) -> np.ndarray:
    x = np.log(rng.lognormal(0.0, 0.3, n))
    if kind == "ties":
        x = np.round(x, 1)  # many equal values: the middle pair of an even window is often a tie
    elif kind == "steps":
        x = np.repeat(rng.normal(size=n // 50 + 1), 50)[:n]
    return x


MISSING = {
    "none": lambda rng, n: np.zeros(n, bool),
    "one": lambda rng, n: np.isin(np.arange(n), [n // 3]),
    "first": lambda rng, n: np.isin(np.arange(n), [0]),
    "last": lambda rng, n: np.isin(np.arange(n), [n - 1]),
    "leading": lambda rng, n: np.arange(n) < 13,
    "scattered": lambda rng, n: rng.random(n) < 0.002,
    "runs": lambda rng, n: np.isin(np.arange(n) // 40, rng.choice(n // 40, 5, replace=False)),
    "dense": lambda rng, n: rng.random(n) < 0.4,
    "close": lambda rng, n: np.isin(np.arange(n), [500, 560, 700, 701, 702]),
}


@pytest.mark.parametrize("kind", ["noise", "ties", "steps"])
@pytest.mark.parametrize("pattern", sorted(MISSING))
@pytest.mark.parametrize(("window", "min_points"), [(128, 12), (128, 10), (16, 8), (5, 5)])
def test_rolling_median_equals_polars_null_aware(kind: str, pattern: str, window: int, min_points: int) -> None:
    """Every window, any pattern of missing points, several windows and minimum counts: the same medians."""
    rng = np.random.default_rng(zlib.crc32(f"{kind} {pattern} {window}".encode()))
    for n in (3_000, 20_011):
        x = _series(rng, n, kind)
        missing = MISSING[pattern](rng, n)
        x = np.where(missing, np.nan, x)
        got = rolling.rolling_median(x, missing, window, min_points)
        want = _reference(x, missing, window, min_points)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want, equal_nan=True), (kind, pattern, window, n)


def _former_trailing(x: np.ndarray, w: int, need: int, rel_floor: float, abs_floor: float):
    """trailing_robust_z's polars part as it was before rolling_median (session 6)."""
    ser = pl.Series("x", x).fill_nan(None)
    med = ser.rolling_median(window_size=w, min_samples=need).shift(1)
    mad = (ser - med).abs().rolling_median(window_size=w, min_samples=need).shift(1)
    m = med.fill_null(float("nan")).to_numpy().astype(np.float64)
    d = mad.fill_null(float("nan")).to_numpy().astype(np.float64)
    sig = np.maximum(stats.MAD_TO_SIGMA * d, np.maximum(rel_floor * np.abs(m), abs_floor))
    sig[~np.isfinite(m)] = np.nan
    with np.errstate(all="ignore"):
        z = (x - m) / sig
    z[~np.isfinite(m)] = np.nan
    return z, m, sig


@pytest.mark.parametrize("pattern", ["none", "one", "scattered", "runs", "dense", "leading"])
def test_trailing_robust_z_unchanged(pattern: str) -> None:
    """z, median and sigma of a long series with missing points equal the former all-polars computation."""
    rng = np.random.default_rng(7)
    n = 60_000  # beyond EXACT_LIMIT / 128: the rolling path
    assert n * signals.WINDOW > stats.EXACT_LIMIT
    x = _series(rng, n, "noise")
    x[MISSING[pattern](rng, n)] = np.nan
    x[n // 2] += 3.0  # a spike
    got = stats.trailing_robust_z(x, window=signals.WINDOW, min_points=signals.MIN_WINDOW_POINTS,
                                  abs_floor=signals.SIGMA_FLOOR)
    want = _former_trailing(x, signals.WINDOW, signals.MIN_WINDOW_POINTS, 0.0, signals.SIGMA_FLOOR)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w, equal_nan=True), pattern


def test_trailing_robust_z_with_an_infinity_keeps_polars_arithmetic() -> None:
    """A series with an infinity (an infinite median or spread) takes the former path, unchanged."""
    rng = np.random.default_rng(3)
    x = _series(rng, 40_000, "noise")
    x[[100, 20_000]] = np.inf
    x[30_000] = np.nan
    got = stats.trailing_robust_z(x, window=128, min_points=12, abs_floor=0.01)
    want = _former_trailing(x, 128, 12, 0.0, 0.01)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w, equal_nan=True)
