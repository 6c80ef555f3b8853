"""Robust statistics over a run's own history (no fixed absolute thresholds alone).

Conventions of ``docs/detectors.md#conventions``: a trailing window of W=128
points (OLMo-core ``StabilityMonitorCallback`` default), robust z = (x - median_W) /
(1.4826 * MAD_W) (1.4826 makes the MAD a consistent estimator of sigma for a normal law),
computed on a log scale for positive, multiplicative series (loss, grad norm, update ratio).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forensics.rolling import rolling_median, shifted

MAD_TO_SIGMA = 1.4826
"""Consistency constant: sigma = 1.4826 * MAD for normally distributed data."""
TINY = 1e-12
"""Floor that keeps a log or a division finite, far below any logged value (our choice; not a threshold)."""
SHORT_SERIES_PART = 4
"""A series shorter than the window needs finite points in a quarter of its length (docs/detectors.md#conventions)."""
MIN_SLOPE_POINTS = 3
"""Fewest points a Theil-Sen slope after an onset is computed from (fewer: NaN; our choice, a slope of two points
is one difference)."""
IRLS_TOL = 1e-12
"""The Huber fit stops once no intercept or slope moves by more than this (standardised units; our choice)."""


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

    Rolling medians come from polars (:func:`rolling_median`: its ``rolling_median``, O(n log w)); the
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
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    nan = np.full(n, np.nan)
    if n < 2:
        return nan.copy(), nan.copy(), nan.copy()
    w = max(2, min(window, n - 1))
    need = min(min_points, max(2, n // SHORT_SERIES_PART))
    if n * w <= EXACT_LIMIT:
        return _trailing_robust_z_exact(x, w, need, rel_floor, abs_floor)
    missing = np.isnan(x)  # polars' nulls (``fill_nan(None)``): left out of every window
    if np.isinf(x).any():  # an infinite median or spread: polars' own arithmetic, as it always was
        return _trailing_polars(x, w, need, rel_floor, abs_floor)
    m = shifted(rolling_median(x, missing, w, need), 1)
    gone = missing | np.isnan(m)
    with np.errstate(invalid="ignore"):
        dev = np.abs(x - m)
    d = shifted(rolling_median(dev, gone, w, need), 1)
    return _robust_z(x, m, d, rel_floor, abs_floor)


def _trailing_polars(x: np.ndarray, w: int, need: int, rel_floor: float, abs_floor: float
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`trailing_robust_z` with polars' null-aware rolling medians throughout (a series with an infinity)."""
    import polars as pl

    ser = pl.Series("x", x).fill_nan(None)
    med = ser.rolling_median(window_size=w, min_samples=need).shift(1)
    mad = (ser - med).abs().rolling_median(window_size=w, min_samples=need).shift(1)
    m = med.fill_null(float("nan")).to_numpy().astype(np.float64)
    d = mad.fill_null(float("nan")).to_numpy().astype(np.float64)
    return _robust_z(x, m, d, rel_floor, abs_floor)


def _robust_z(x: np.ndarray, m: np.ndarray, d: np.ndarray, rel_floor: float, abs_floor: float
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(z, median, sigma)`` from the trailing medians ``m`` and spreads ``d`` (each shape (n,))."""
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


@dataclass(frozen=True)
class Drift:
    """A sustained rise of a series above the trend of its own early part.

    Attributes:
        onset_step: first step of the sustained excursion above the baseline trend.
        onset_index: its position.
        baseline: value the baseline trend predicts at the onset (linear units).
        last: last finite value; ``growth`` = last / value at onset (linear units).
        sigma: robust noise of the baseline residuals (log units when ``log``).
        slope_after: Theil-Sen slope after the onset (log units per step when ``log``).
    """

    onset_step: int
    onset_index: int
    baseline: float
    last: float
    growth: float
    sigma: float
    slope_after: float


def mad_sigma(x: np.ndarray) -> float:
    """Robust standard deviation: :data:`MAD_TO_SIGMA` * median(|x - median(x)|); NaN for an empty array.

    Args:
        x: float array of any shape (flattened); it must be finite (use ``np.nanmedian`` callers otherwise).
    """
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return float("nan")
    return MAD_TO_SIGMA * float(np.median(np.abs(x - np.median(x))))


def sustained_rise(
    steps: np.ndarray,
    values: np.ndarray,
    *,
    log: bool = True,
    baseline_frac: float = 0.25,
    min_baseline: int = 8,
    k_sigma: float = 4.0,
    min_rel: float = 0.05,
    min_run: int = 5,
    hold_frac: float = 0.8,
) -> Drift | None:
    """Find where a series leaves the robust linear trend of its early part for good.

    The baseline trend is a Huber robust linear fit (:func:`robust_trend`) over the first
    ``baseline_frac`` of the points (at least ``min_baseline``); the noise is 1.4826 * MAD of its
    residuals. The onset is the first point from which the residual exceeds
    max(k_sigma * sigma, log(1 + min_rel)) for ``min_run`` consecutive points and for at least
    ``hold_frac`` of all the remaining points (a drift that stays, not a spike).

    Args:
        steps: int array (n,), increasing.
        values: float array (n,); non-finite points are ignored.
        log: work on log values (positive series).
        baseline_frac: share of points used to fit the baseline.
        min_baseline: minimum number of baseline points.
        k_sigma: residual threshold in robust sigmas.
        min_rel: minimum relative excursion (guards perfectly smooth series).
        min_run: consecutive points above the threshold needed at the onset.
        hold_frac: share of the remaining points that must stay above.

    Returns:
        A :class:`Drift`, or None when there is no sustained rise.
    """
    v = np.asarray(values, dtype=np.float64)
    st = np.asarray(steps, dtype=np.float64)
    ok = np.isfinite(v) & ((v > 0) if log else True)
    return sustained_rise_many(st[ok], v[ok][None, :], np.flatnonzero(ok), log=log, baseline_frac=baseline_frac,
                               min_baseline=min_baseline, k_sigma=k_sigma, min_rel=min_rel, min_run=min_run,
                               hold_frac=hold_frac)[0]


def sustained_rise_many(
    steps: np.ndarray, values: np.ndarray, index: np.ndarray | None = None, *, log: bool = True,
    baseline_frac: float = 0.25, min_baseline: int = 8, k_sigma: float = 4.0, min_rel: float = 0.05,
    min_run: int = 5, hold_frac: float = 0.8,
) -> list[Drift | None]:
    """:func:`sustained_rise` of several series on one step axis at once (per-layer metrics as one frame).

    Args:
        steps: float or int array (n,), increasing, shared by every row.
        values: float array (L, n), or a list of L float64 arrays (n,), every value finite (and positive when ``log``).
        index: position of each column in the caller's series (``Drift.onset_index``); default 0..n-1.
        log: work on log values.
        baseline_frac: share of points used to fit the baseline.
        min_baseline: minimum number of baseline points.
        k_sigma: residual threshold in robust sigmas.
        min_rel: minimum relative excursion.
        min_run: consecutive points above the threshold needed at the onset.
        hold_frac: share of the remaining points that must stay above.

    Returns:
        One :class:`Drift` or None per row.
    """
    # a list of rows stays a list: no (L, n) copy of many long per-layer series (only the baseline points are stacked)
    v = values if isinstance(values, list) else np.asarray(values, dtype=np.float64)
    st = np.asarray(steps, dtype=np.float64)
    rows, n = len(v), len(v[0]) if len(v) else 0
    idx_map = np.arange(n) if index is None else np.asarray(index)
    nb = max(min_baseline, int(n * baseline_frac))
    if n < min_baseline + min_run or n - nb < min_run:
        return [None] * rows
    fit = _fit_points(nb)
    yb = v[:, :nb][:, fit] if isinstance(v, np.ndarray) else np.stack([np.asarray(r, np.float64)[:nb][fit] for r in v])
    a, b, mu, sd = robust_lines(st[:nb][fit], np.log(yb) if log else yb)
    ats = (st - mu) / sd
    out: list[Drift | None] = [None] * rows
    for r in range(rows):  # one layer at a time: its temporaries are (n,), not (layers, n)
        y = np.log(v[r]) if log else v[r]
        trend = a[r] + b[r] * ats
        resid = y - trend
        rb = resid[:nb]
        sigma = MAD_TO_SIGMA * np.median(np.abs(rb - np.median(rb)))
        floor = np.log1p(min_rel) if log else min_rel * np.maximum(np.abs(np.median(y[:nb])), TINY)
        # first i >= nb with min_run points above from i on, and hold_frac of all the points from i on above
        c = np.zeros(n + 1, np.int64)
        np.cumsum(resid > np.maximum(k_sigma * sigma, floor), out=c[1:])
        tail = c[nb:n - min_run + 1]  # from each candidate onset i = nb .. n - min_run
        left = n - np.arange(nb, n - min_run + 1)
        hit = ((c[nb + min_run:] - tail) == min_run) & ((c[n] - tail) >= hold_frac * left)
        if not hit.any():
            continue
        i = nb + int(np.argmax(hit))
        after = _theil_slope(y[i:], st[i:]) if n - i >= MIN_SLOPE_POINTS else float("nan")
        vr = v[r]
        out[r] = Drift(
            onset_step=int(st[i]), onset_index=int(idx_map[i]), baseline=float(np.exp(trend[i]) if log else trend[i]),
            last=float(vr[-1]), growth=float(vr[-1] / vr[i]) if vr[i] != 0 else float("inf"),
            sigma=float(sigma), slope_after=float(after),
        )
    return out


FIT_POINTS = 2048
"""Most points a trend fit uses (budget by design, docs/detectors.md#budget): a longer baseline is fitted on
this many evenly spaced points; residuals, noise and onsets still use every point."""
HUBER_EPSILON = 1.35
"""Huber's threshold in robust sigmas: 95% efficiency under Gaussian noise (Huber 1964; scikit-learn's default)."""


def _fit_points(n: int) -> np.ndarray | slice:
    """Positions of at most :data:`FIT_POINTS` evenly spaced points among ``n`` (all of them when fewer)."""
    if n <= FIT_POINTS:
        return slice(None)
    return np.unique(np.linspace(0, n - 1, FIT_POINTS).round().astype(np.int64))


def _theil_slope(y: np.ndarray, x: np.ndarray) -> float:
    """Theil-Sen slope of ``y`` on ``x`` over at most :data:`FIT_POINTS` evenly spaced points (O(m^2) pairs)."""
    from scipy.stats import theilslopes

    pick = _fit_points(y.shape[0])
    return float(theilslopes(y[pick], x[pick]).slope)


def robust_trend(x: np.ndarray, y: np.ndarray, at: np.ndarray) -> np.ndarray:
    """A robust straight-line trend of ``y`` on ``x``, evaluated at ``at`` (:func:`robust_trend_many`, one row).

    Args:
        x: baseline steps, shape (m,).
        y: baseline values, shape (m,) (finite).
        at: steps to evaluate the trend at, shape (k,).

    Returns:
        The trend values, shape (k,).
    """
    return robust_trend_many(x, np.asarray(y, dtype=np.float64)[None, :], at)[0]


def robust_trend_many(x: np.ndarray, y: np.ndarray, at: np.ndarray, iterations: int = 50) -> np.ndarray:
    """Huber robust straight lines of every row of ``y`` on ``x``, evaluated at ``at``.

    Iteratively re-weighted least squares (Huber 1964; Holland & Welsch 1977): weights
    min(1, epsilon / |r / s|) with :data:`HUBER_EPSILON` and the scale ``s`` re-estimated at each iteration as
    :data:`MAD_TO_SIGMA` * MAD of the residuals, so a few spikes in the baseline do not tilt the line. Every row
    is solved at once (closed-form weighted least squares per row), x standardised.

    Args:
        x: baseline steps, shape (m,).
        y: baseline values, shape (L, m) (finite).
        at: steps to evaluate the trends at, shape (k,).
        iterations: most IRLS iterations (stops earlier once every line moves by less than 1e-12).

    Returns:
        The trend values, shape (L, k).
    """
    a, b, mu, sd = robust_lines(x, y, iterations)
    ats = (np.asarray(at, dtype=np.float64) - mu) / sd
    return a[:, None] + b[:, None] * ats[None, :]


def robust_lines(x: np.ndarray, y: np.ndarray, iterations: int = 50) -> tuple[np.ndarray, np.ndarray, float, float]:
    """The Huber lines of :func:`robust_trend_many`: ``(a, b, mu, sd)``, each row's line ``a + b * (x - mu) / sd``.

    Args:
        x: baseline steps, shape (m,).
        y: baseline values, shape (L, m) (finite).
        iterations: most IRLS iterations.

    Returns:
        Intercepts and slopes, shape (L,) each, in standardised x; the mean and spread that standardise x.
    """
    x = np.asarray(x, dtype=np.float64)
    mu, sd = float(np.mean(x)), float(np.std(x)) or 1.0
    xs = (x - mu) / sd
    w = np.ones_like(y)
    a = b = np.zeros(y.shape[0])
    for _ in range(iterations):
        sw, sx, sxx = w.sum(1), (w * xs).sum(1), (w * xs * xs).sum(1)
        sy, sxy = (w * y).sum(1), (w * xs * y).sum(1)
        det = sw * sxx - sx * sx
        with np.errstate(all="ignore"):
            b_new = np.where(det > 0, (sw * sxy - sx * sy) / det, 0.0)
            a_new = (sy - b_new * sx) / sw
        done = np.all(np.abs(a_new - a) < IRLS_TOL) and np.all(np.abs(b_new - b) < IRLS_TOL)
        a, b = a_new, b_new
        if done:
            break
        r = y - a[:, None] - b[:, None] * xs
        s = MAD_TO_SIGMA * np.median(np.abs(r - np.median(r, axis=1, keepdims=True)), axis=1)
        with np.errstate(all="ignore"):
            u = np.abs(r) / s[:, None]
            w = np.where((s[:, None] > 0) & (u > HUBER_EPSILON), HUBER_EPSILON / u, 1.0)
    return a, b, mu, sd
