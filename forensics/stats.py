"""Robust statistics over a run's own history (no fixed absolute thresholds alone).

Conventions of ``docs/detectors.md#conventions``: a trailing window of W=128
points (OLMo-core ``StabilityMonitorCallback`` default), robust z = (x - median_W) /
(1.4826 * MAD_W) (1.4826 makes the MAD a consistent estimator of sigma for a normal law),
computed on a log scale for positive, multiplicative series (loss, grad norm, update ratio).
"""

from __future__ import annotations

import numpy as np

MAD_TO_SIGMA = 1.4826
"""Consistency constant: sigma = 1.4826 * MAD for normally distributed data."""


def to_log(values: np.ndarray) -> np.ndarray:
    """Natural log of positive values; non-positive and non-finite values become NaN.

    Args:
        values: float array of any shape.

    Returns:
        Array of the same shape.
    """
    v = np.asarray(values, dtype=np.float64)
    out = np.full(v.shape, np.nan)
    ok = np.isfinite(v) & (v > 0)
    out[ok] = np.log(v[ok])
    return out


def trailing_robust_z(
    x: np.ndarray, window: int = 128, min_points: int = 16, rel_floor: float = 0.0, abs_floor: float = 1e-12
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Robust z of each point against the ``window`` points before it (the point itself excluded).

    Rolling medians come from polars (``rolling_median``, O(n log w), streaming-friendly); the
    spread is the trailing rolling median of |x - trailing median|, the usual rolling-MAD
    approximation (exact MAD needs the window's own median for every member).

    Args:
        x: float64 array, shape (n,); NaN entries are ignored in the window and get z = NaN.
        window: trailing window length in points (OLMo-core default 128).
        min_points: fewer finite points than this in the window -> z = NaN.
        rel_floor: lower bound on sigma as a fraction of |median| (guards perfectly smooth series).
        abs_floor: absolute lower bound on sigma.

    Returns:
        ``(z, median, sigma)``, each shape (n,). ``sigma`` is 1.4826 * MAD, floored.
    """
    import polars as pl

    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    nan = np.full(n, np.nan)
    if n < 2:
        return nan.copy(), nan.copy(), nan.copy()
    w = max(2, min(window, n - 1))
    need = min(min_points, max(2, n // 4))
    if n * w <= EXACT_LIMIT:
        return _trailing_robust_z_exact(x, w, need, rel_floor, abs_floor)
    ser = pl.Series("x", x).fill_nan(None)
    med = ser.rolling_median(window_size=w, min_samples=need).shift(1)
    dev = (ser - med).abs()
    mad = dev.rolling_median(window_size=w, min_samples=need).shift(1)
    m = med.fill_null(float("nan")).to_numpy().astype(np.float64)
    d = mad.fill_null(float("nan")).to_numpy().astype(np.float64)
    sig = np.maximum(MAD_TO_SIGMA * d, np.maximum(rel_floor * np.abs(m), abs_floor))
    sig[~np.isfinite(m)] = np.nan
    with np.errstate(all="ignore"):
        z = (x - m) / sig
    z[~np.isfinite(m)] = np.nan
    return z, m, sig


EXACT_LIMIT = 4_000_000
"""Up to this many window elements (n * w) the exact sliding MAD is used; beyond, rolling polars."""


def _trailing_robust_z_exact(
    x: np.ndarray, w: int, need: int, rel_floor: float, abs_floor: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact trailing median and MAD with ``sliding_window_view`` (memory n * w floats)."""
    from numpy.lib.stride_tricks import sliding_window_view

    n = x.shape[0]
    z, med, sig = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    windows = sliding_window_view(np.concatenate([np.full(w, np.nan), x]), w)[:n]
    ok = np.sum(np.isfinite(windows), axis=1) >= need
    if not np.any(ok):
        return z, med, sig
    with np.errstate(all="ignore"):
        m = np.nanmedian(windows[ok], axis=1)
        mad = np.nanmedian(np.abs(windows[ok] - m[:, None]), axis=1)
        s = np.maximum(MAD_TO_SIGMA * mad, np.maximum(rel_floor * np.abs(m), abs_floor))
        med[ok], sig[ok] = m, s
        z[ok] = (x[ok] - m) / s
    return z, med, sig


def backtrack_onset(z: np.ndarray, index: int, threshold: float = 3.0) -> int:
    """Walk back from a detection index while the robust z stays at or above ``threshold``.

    Args:
        z: robust z per point, shape (n,) (NaN counts as below threshold).
        index: the detection point.
        threshold: the back-tracking level (docs/detectors.md#conventions: z >= 3).

    Returns:
        The earliest index i <= ``index`` such that z[i..index] are all >= threshold (or non-finite
        data points flagged by the caller); ``index`` itself if z[index-1] is already below.
    """
    i = index
    while i - 1 >= 0 and np.isfinite(z[i - 1]) and z[i - 1] >= threshold:
        i -= 1
    return i
