"""Trailing rolling medians over a series with missing points, equal to polars' null-aware ones but cheaper.

Imports nothing from the project (:mod:`forensics.stats` and :mod:`forensics.signals` use it).
"""

from __future__ import annotations

import numpy as np


def shifted(a: np.ndarray, k: int) -> np.ndarray:
    """``a`` moved ``k`` places later (polars ``shift(k)``), NaN in front."""
    out = np.empty_like(a)
    out[:k] = np.nan
    out[k:] = a[:a.shape[0] - k]
    return out


SPLICE_SHARE = 0.25
"""Most share of windows holding a missing point for which :func:`rolling_median` splices (our choice: beyond, one
null-aware pass over the whole series costs less than the pieces)."""


def rolling_median(x: np.ndarray, missing: np.ndarray, window: int, min_points: int) -> np.ndarray:
    """Trailing median of the last ``window`` points, ``missing`` ones left out (NaN: fewer than ``min_points``).

    Equal, value for value, to polars ``rolling_median(window, min_samples)`` of ``x`` with the ``missing`` points
    null: polars' null-aware kernel costs ~4x its plain one (0.3 s against 0.07 s at 1M points, even for one null,
    and the spread's series always starts with nulls), so the plain kernel runs on ``x`` with the missing points
    filled, and only the windows that hold a missing point are computed again, null-aware, on their stretch of
    the series (the same windows, so the same medians: tested against the null-aware pass in
    tests/test_stats_rolling.py).

    Args:
        x: float64, shape (n,); every point not ``missing`` is a number (NaN only where missing).
        missing: bool, shape (n,).
        window: points per window (>= 1).
        min_points: fewest points present in a window for a median.

    Returns:
        float64, shape (n,).
    """
    import polars as pl

    def kernel(a: np.ndarray, miss: np.ndarray | None) -> np.ndarray:
        ser = pl.Series("x", a) if miss is None else pl.Series("x", np.where(miss, np.nan, a)).fill_nan(None)
        return ser.rolling_median(window_size=window, min_samples=min_points).fill_null(float("nan")).to_numpy()

    n = x.shape[0]
    c = np.concatenate([[0], np.cumsum(missing)])
    if c[-1] == 0:
        return kernel(x, None)
    held = c[1:] > c[np.maximum(np.arange(n) - window + 1, 0)]  # the window ending here holds a missing point
    edges = np.flatnonzero(np.diff(np.concatenate([[0], held.view(np.int8), [0]])))
    if held.sum() > SPLICE_SHARE * n or np.isnan(x[~missing]).any():
        return kernel(x, missing)
    out = kernel(np.where(missing, 0.0, x), None)
    out = out if out.flags.writeable else out.copy()  # polars may hand its own buffer out
    for a, b in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
        lo = max(0, a - window + 1)
        out[a:b] = kernel(x[lo:b], missing[lo:b])[a - lo:]
    return out
